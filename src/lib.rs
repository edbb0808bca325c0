//! # etcd-cache
//!
//! One etcd watch, many local subscribers. A [`Cache`] loads a key prefix once (a paged
//! list at one revision), follows it with a single upstream watch, keeps a
//! revision-ordered history, and fans events out to any number of local
//! [`WatchStream`]s. Reads are served from memory, linearizably by default.
//!
//! The API mirrors `etcd-client`: switching from `client.watch(..)` / `client.get(..)`
//! to `cache.watch(..)` / `cache.get(..)` changes the receiver and the import.
//!
//! ```no_run
//! use etcd_cache::{Cache, GetOptions, WatchOptions};
//!
//! # async fn run() -> etcd_cache::Result<()> {
//! let client = etcd_client::Client::connect(["127.0.0.1:2379"], None).await?;
//! let cache = Cache::builder(client).prefix("/app/").build().await?;
//! cache.wait_ready().await?;
//!
//! let mut stream = cache.watch("/app/", Some(WatchOptions::new().with_prefix().with_prev_key())).await?;
//! let resp = cache.get("/app/", Some(GetOptions::new().with_prefix())).await?;
//! println!("{} keys at revision {}", resp.count(), resp.revision());
//! while let Some(resp) = stream.message().await? {
//!     for ev in resp.events() {
//!         println!("{:?} {:?} at {}", ev.event_type(), ev.kv().map(|kv| kv.key()), resp.revision());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Guarantees, as etcd gives a watcher: ordered, unique, reliable (no gap), atomic (a
//! revision's events in one response), resumable and bookmarkable (progress responses).
//! See `docs/GUARANTEES.md` and `docs/ARCHITECTURE.md`.

// The handle and the flows behind it.
mod cache;
mod follower;
mod read;
mod shared;
mod subscribers;
mod upstream;
mod watch;

// The pieces they share.
mod backoff;
mod config;
mod error;
mod history;
mod key_range;
mod kv;
mod progress;
mod range_request;
mod store;

#[cfg(test)]
mod tests;

pub use cache::Cache;
pub use config::{
    CacheBuilder, ProgressTrust, ReadFallback, DEFAULT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX,
    DEFAULT_CONSISTENT_READ_TIMEOUT, DEFAULT_HISTORY_WINDOW, DEFAULT_MAX_WATCHERS,
    DEFAULT_PAGE_SIZE, DEFAULT_PROGRESS_NOTIFY_INTERVAL, DEFAULT_PROGRESS_REQUEST_INTERVAL,
    DEFAULT_SUBSCRIBER_BUFFER, DEFAULT_UPSTREAM_IDLE_TIMEOUT, MAX_DURATION,
};
pub use error::{Error, Result};
pub use kv::{Event, EventType, KeyValue};
pub use range_request::{SortOrder, SortTarget};
pub use read::{GetOptions, GetResponse};
pub use shared::{CacheStats, CacheStatus, StatusStream};
pub use watch::{
    ResponseHeader, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse,
    WatchResponseStream, WatchScope, WatchStream,
};

#[allow(dead_code)]
trait AssertSendSync: Send + Sync {}
impl AssertSendSync for Cache {}
impl AssertSendSync for WatchScope {}
impl AssertSendSync for CacheBuilder {}
#[allow(dead_code)]
trait AssertSendUnpin: Send + Unpin {}
impl AssertSendUnpin for WatchStream {}
impl AssertSendUnpin for WatchResponseStream {}
impl AssertSendSync for WatchRequestSender {}
impl AssertSendSync for WatchResponse {}
impl AssertSendSync for Error {}

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod internals;
