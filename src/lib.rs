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
//! // `None`: the stream ended (the cache was closed, or its last watch canceled).
//! # Ok(()) }
//! ```
//!
//! `None` from `stream.message()` means the stream has ended: the cache was closed (or
//! its last handle dropped), or the last watch on the stream was canceled (by
//! [`WatchStream::cancel`], or by the cache after a compaction response as above).
//! An outage does not end it (see [below](#how-it-differs-from-a-direct-watch)).
//!
//! ## Dependencies
//!
//! The builder takes an `etcd_client::Client`, so the application depends on the same
//! etcd-client as this crate (0.21; another version gives "two different versions of
//! crate `etcd_client`"), or names it through the re-export [`etcd_client`]:
//!
//! ```toml
//! [dependencies]
//! etcd-cache = "0.1"
//! etcd-client = "0.21"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! etcd-client's build runs `protoc` and needs the protobuf well-known types (Debian and
//! Ubuntu: `apt-get install protobuf-compiler libprotobuf-dev`). The minimum Rust version
//! is 1.88.
//!
//! ## Feature flags
//!
//! None is on by default.
//!
//! - `tls`: TLS toward etcd (rustls), through etcd-client's `tls` feature: the client's
//!   and the cache's own connections take `etcd_client::TlsOptions` (see
//!   [TLS and authentication](#tls-and-authentication)). Its crypto provider is ring,
//!   which has no ECDSA P-521 (the keys of etcd's `--auto-tls`).
//! - `tls-aws-lc`: the same with the aws-lc-rs provider, which has every key etcd makes
//!   or users deploy (RSA, P-256, P-384, P-521, Ed25519). With both on, install a process
//!   default provider (`rustls::crypto::CryptoProvider::install_default`), as
//!   etcd-cache-proxy installs aws-lc-rs.
//! - `metrics`: every counter and gauge of [`CacheStats`] (and more) through the
//!   [`metrics`](https://docs.rs/metrics) facade; the application installs the
//!   recorder. Zero cost when off. See `docs/METRICS.md`.
//!
//! Features whose name starts with `unstable-` (`unstable-bench-internals`,
//! `unstable-test-hooks`) are the crate's own test and benchmark support: they are not
//! part of the API, carry no semver promise and may change or go in any release.
//!
//! ## TLS and authentication
//!
//! [`CacheBuilder::connect`] connects the client and gives the cache the same
//! `ConnectOptions` for its own connections (the per-member version probe, which dials
//! each member's client URL): pass TLS and credentials once.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use etcd_cache::etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
//! use etcd_cache::CacheBuilder;
//!
//! let tls = TlsOptions::new()
//!     .ca_certificate(Certificate::from_pem(std::fs::read("ca.pem")?))
//!     // Only where etcd runs with --client-cert-auth (mutual TLS):
//!     .identity(Identity::from_pem(std::fs::read("client.pem")?, std::fs::read("client-key.pem")?));
//! let options = ConnectOptions::new()
//!     .with_tls(tls)
//!     .with_user("app", "secret")        // etcd's user/password auth
//!     .with_auto_token_refresh(true);   // re-authenticate when the token expires
//! let cache = CacheBuilder::connect(["https://etcd-0:2379", "https://etcd-1:2379"], Some(options))
//!     .await?
//!     .prefix("/app/")
//!     .build()
//!     .await?;
//! cache.wait_ready().await?;
//! # Ok(()) }
//! ```
//!
//! TLS needs the `tls` feature (of this crate, or of etcd-client); user/password alone
//! does not. With [`Cache::builder`] and a client of your own, pass the same options to
//! [`CacheBuilder::connect_options`] too: without them members behind TLS or auth read
//! as of unknown version, and consistent reads are then still correct but slower (they
//! go to etcd; `CacheStats::unknown_versions` and a warning say so). Bad credentials or
//! a refused certificate stop the cache: [`Cache::wait_ready`] returns
//! [`Error::Failed`] with the cause.
//!
//! ## The connection to etcd
//!
//! etcd sends each watch response in an HTTP/2 DATA frame of its own, and h2 (under
//! tonic) closes a connection when too many small frames sit unread (GOAWAY
//! `too_many_data_frames`), as they do after a process stalls for a few seconds while
//! etcd writes. [`CacheBuilder::connect`] connects with [`EtcdChannel`]'s windows, under
//! which that cannot happen; with [`Cache::builder`] and a client of your own, connect it
//! with `Client::connect_with_balanced_channel(endpoints, options, EtcdChannel::new())`.
//! Otherwise the cache reconnects after such a close, warns once and counts it as
//! `etcd_cache_upstream_disconnects_total{cause="too_many_data_frames"}`; every other call
//! on the client failed with it. See `docs/RELIABILITY.md`.
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
//! `linearizable_watch_start`, `connect_options`, `consistency_check`. Per tenant or
//! connection:
//! [`Cache::scope`].
//!
//! ## Shutdown
//!
//! [`Cache::close`], or dropping the last handle (a [`WatchScope`] counts as one),
//! stops the follower task; every open stream ends with `None` after what it was
//! already delivered.

// The handle and the flows behind it.
mod cache;
mod compaction;
mod follower;
mod read;
mod shared;
mod status;
mod subscribers;
mod upstream;
mod view;
mod watch;

// The pieces they share.
mod backoff;
mod config;
mod error;
mod events;
mod history;
mod key_range;
mod kv;
mod list_watch;
mod metrics;
mod progress;
mod range_request;
mod stats;
mod store;
mod typed;

#[cfg(test)]
mod tests;

/// The etcd-client this crate is built against (0.21), for naming its types
/// (`etcd_cache::etcd_client::ConnectOptions`, `Client`, `TlsOptions`, ...) without a
/// dependency of your own that has to match it.
pub use etcd_client;

// The README's examples are compiled as doc tests (they are not run).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// So are docs/TYPED.md's.
#[cfg(doctest)]
#[doc = include_str!("../docs/TYPED.md")]
struct TypedDoctests;

pub use cache::Cache;
pub use compaction::CompactionCheck;
pub use config::{
    CacheBuilder, ProgressTrust, ReadFallback, DEFAULT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX,
    DEFAULT_CONSISTENT_READ_TIMEOUT, DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_WINDOW,
    DEFAULT_MAX_WATCHERS, DEFAULT_PAGE_SIZE, DEFAULT_PROGRESS_NOTIFY_INTERVAL,
    DEFAULT_PROGRESS_REQUEST_INTERVAL, DEFAULT_SUBSCRIBER_BUFFER, DEFAULT_UPSTREAM_IDLE_TIMEOUT,
    MAX_DURATION,
};
pub use error::{Error, InvalidReason, Result};
pub use kv::{Event, EventType, KeyValue};
pub use list_watch::{ListItem, ListWatch, ListWatchEvent};
pub use range_request::{SortOrder, SortTarget};
pub use read::{GetOptions, GetResponse};
pub use stats::CacheStats;
pub use status::{CacheStatus, StatusStream};
#[cfg(feature = "json")]
pub use typed::JsonCodec;
#[cfg(feature = "prost")]
pub use typed::ProstCodec;
pub use typed::{
    decode_with, BoxError, Codec, DecodeError, Decoded, FnCodec, TypedEvent, TypedKv, TypedList,
    TypedView, TypedViewBuilder, TypedWatchResponse, TypedWatchStream,
};
pub use upstream::channel::{EtcdChannel, UPSTREAM_CONNECTION_WINDOW, UPSTREAM_STREAM_WINDOW};
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
impl AssertSendSync for EtcdChannel {}

#[cfg(feature = "unstable-bench-internals")]
#[doc(hidden)]
pub mod internals;
