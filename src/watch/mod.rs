//! Watching through the cache: [`WatchOptions`], [`WatchStream`] (one stream carrying
//! any number of watches, as etcd's and etcd-client's), [`WatchResponse`] and
//! [`WatchScope`].
//!
//! - [`options`]: [`WatchOptions`] and their validation into a request;
//! - [`register`]: the registration of one watch with the cache;
//! - [`subscription`]: one watch on a stream, over its mailbox;
//! - [`stream`]: the stream, its request sender and response half;
//! - [`ready_set`]: a stream's watches after its first, polled as they are woken;
//! - [`response`]: the responses;
//! - [`scope`]: watch budgets.
//!
//! ## Ordering
//! Each watch sees revisions in strictly increasing order, each revision's matching
//! events in one response, no gap and no duplicate, across upstream reconnects and
//! while lagging. On one stream, the header revision of the responses never goes
//! down, as etcd's does not.
//!
//! ## Lagging
//! A watch that does not keep up fills its buffer (`subscriber_buffer` responses) and
//! becomes lagging. Nothing waits for it: when its stream is polled again it catches up
//! from the cache's history, in order, and then rejoins the live stream. If its
//! position has left the history window by then, it gets what etcd sends a watch
//! behind compaction: a canceled response with `compact_revision`, and then that watch
//! ends (the others on the stream continue).
//!
//! ## Outages
//! Unlike a direct etcd watch, whose stream breaks when the connection does, a cache
//! watch stays open while the cache reconnects and resumes where it was, with nothing
//! lost or repeated. `Cache::status_stream` tells when etcd is unreachable.
//!
//! ## Shutdown
//! When the cache closes, every watch gets what was already delivered to it (a lagging
//! one its catch-up too), and then the stream ends with `None`.

mod options;
mod ready_set;
mod register;
pub(crate) mod response;
mod scope;
mod stream;
mod subscription;

pub use options::WatchOptions;
pub use response::{ResponseHeader, WatchResponse};
pub use scope::WatchScope;
pub use stream::{WatchRequestSender, WatchResponseStream, WatchStream};

/// Server-side style event filters, applied per watch (etcd-client's type).
pub use etcd_client::WatchFilterType;
