//! # etcd-cache
//!
//! One etcd watch, many local subscribers. A [`Cache`] loads a key prefix once (a paged
//! list at one revision), follows it with a single upstream watch, keeps a
//! revision-ordered history, and fans events out to any number of local
//! [`WatchStream`]s. Reads are served from memory, linearizably by default. A service
//! that needs thousands of watches (config subscribers, schedulers, service discovery,
//! controllers) holds one `Cache` per prefix; etcd carries one watch and one list.
//!
//! ## Quick start
//!
//! ```no_run
//! use etcd_cache::{Cache, GetOptions, WatchOptions};
//!
//! # async fn run() -> etcd_cache::Result<()> {
//! let client = etcd_client::Client::connect(["127.0.0.1:2379"], None).await?;
//! let cache = Cache::builder(client).prefix("/app/").build().await?;
//! cache.wait_ready().await?;
//!
//! // A consistent read, answered from memory.
//! let resp = cache.get("/app/", Some(GetOptions::new().with_prefix())).await?;
//! let revision = resp.header().unwrap().revision();
//!
//! // Watch from the read's revision + 1: nothing missed, nothing twice.
//! let opts = WatchOptions::new().with_prefix().with_prev_key().with_start_revision(revision + 1);
//! let mut stream = cache.watch("/app/", Some(opts)).await?;
//! while let Some(resp) = stream.message().await? {
//!     if resp.canceled() && resp.compact_revision() > 0 {
//!         // Fell behind the cache's history window: re-list and watch again.
//!         break;
//!     }
//!     for ev in resp.events() {
//!         println!("{:?} {:?} at {}", ev.event_type(), ev.kv().map(|kv| kv.key()), resp.revision());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! ## A drop-in for etcd-client
//!
//! The API mirrors `etcd-client` 0.21: switch `client.watch(..)` / `client.get(..)` to
//! `cache.watch(..)` / `cache.get(..)` and the imports; the options, the responses and
//! their accessors have the same names and meaning. A [`WatchStream`] carries many
//! watches ([`WatchStream::watch`], [`WatchStream::cancel`] by id,
//! [`WatchStream::request_progress`], [`WatchStream::split`]); a watch that falls behind
//! gets a canceled response with `compact_revision`, as etcd sends it. `EventType`,
//! `WatchFilterType`, `SortOrder`, `SortTarget` and `ResponseHeader` are etcd-client's
//! own types; `KeyValue` and `Event` convert both ways. `docs/MIGRATING.md` has a real
//! before/after and the list of remaining differences.
//!
//! ## Guarantees
//!
//! What etcd promises a watcher, kept across upstream reconnects, member failover and
//! slow subscribers: **ordered** (strictly increasing revisions per watch), **unique**
//! (no event twice), **reliable** (no gap), **atomic** (a revision's events in one
//! response), **resumable** (start at any revision inside the history window) and
//! **bookmarkable** (progress responses promise that every event up to their revision
//! was delivered). Consistent reads are linearizable on every etcd version; on servers
//! with etcd#15220 they are answered by etcd where the cache cannot prove it is
//! current. See `docs/GUARANTEES.md`.
//!
//! ## How it differs from a direct watch
//!
//! - A cache watch does not break when etcd does: it stays open while the cache
//!   reconnects and resumes without loss. Follow [`Cache::status_stream`] to see
//!   outages (`Reconnecting` with the error).
//! - A slow subscriber never slows the others or etcd: its buffer fills, it catches up
//!   from the history later; behind the window it gets the compaction signal.
//! - The history window ([`CacheBuilder::history_window`]) is the cache's, not etcd's:
//!   `compact_revision` is the oldest revision the cache can replay.
//! - A permanent refusal (permission denied, bad credentials) stops the cache:
//!   [`Cache::wait_ready`] returns [`Error::Failed`] with the cause.
//!
//! ## The knobs
//!
//! On [`CacheBuilder`], each with a named default: `history_window`,
//! `subscriber_buffer`, `max_watchers`, `page_size`, `backoff`,
//! `progress_notify_interval`, `progress_request_interval`, `consistent_read_timeout`,
//! `read_fallback`, `progress_trust`, `upstream_idle_timeout`,
//! `linearizable_watch_start`, `connect_options`. Per tenant or connection:
//! [`Cache::scope`].
//!
//! ## Shutdown
//!
//! [`Cache::close`], or dropping the last handle (a [`WatchScope`] counts as one),
//! stops the follower task; every open stream ends with `None` after what it was
//! already delivered.

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
mod metrics;
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
