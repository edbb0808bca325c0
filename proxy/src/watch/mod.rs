//! etcd's Watch service (`api/v3rpc/watch.go`), from the cache: every gRPC Watch stream
//! is one task that reads the client's requests, keeps the stream's watches and sends
//! their responses as etcd sends them.
//!
//! The path, one role per file (as etcd's `server/proxy/grpcproxy/` splits its watch
//! into watch.go, watcher.go, watch_broadcast.go and watch_ranges.go):
//!
//! | file | role |
//! |---|---|
//! | `service.rs` | the entry: the Watch service's gRPC server (written out, for pre-encoded responses), which opens a stream's session, and the reader of the client's requests |
//! | `session/` | the per-stream task: the client's requests handled, which side serves a create, ids, progress requests, auth rechecks, `hasleader` (`mod.rs`); what both sides answer, on its way to the client (`replies.rs`); a watch's moves between the cache and etcd (`moves.rs`), and when etcd is next asked whether the watches away have caught up (`away.rs`) |
//! | `entries.rs` | the stream's cache watches, one entry each in one map: its phase (creating, cached, revoked, away with etcd, rejoining), the create that moves it and the revision it needs next |
//! | `cached.rs` | the cache-served side: the only user of the cache's watch API (a create straight from etcd's request into `WatchOptions`), the per-connection cap |
//! | `forwarded.rs` | the etcd-forwarded side: one upstream Watch stream for the watches the cache cannot serve |
//! | `prev_kv.rs` | the prev_kv etcd leaves out of a forwarded watch's first events, read from etcd |
//! | `reply_order.rs` | the replies to creates and cancels in the order of the requests across both sides; the requests that wait for the other side |
//! | `progress.rs` | the stream-level progress machine over both sides (what is held back, when the answer goes) |
//! | `ahead.rs` | progress requests on a stream with a watch from beyond the proxy's revision: etcd's revision asked, the ones etcd drops dropped |
//! | `wire.rs` | a response as it is written: a message, or the cache's events encoded once per revision and shared by every watch of the same options; the codec |
//! | `id_map.rs` | maps and sets keyed by watch id (foldhash); queues that give back a burst's room |
//! | `messages.rs` | etcd's messages from the cache's replies and etcd's responses: the merging of a round of replies, a forwarded response split between revisions, the stream-level progress answer |
//! | `outbound.rs` | the client's queue, and etcd's fragments |
//! | `refusal.rs` | a refused create: its typed reason, printed as etcd prints it |
//!
//! The service opens sessions; the session uses each of the others; none of them uses
//! the session or this file.
//!
//! ## Slow clients
//! Responses go through a bounded queue (`--watch-send-queue`). The task takes a reply
//! from the cache only when the queue has room, so a client that does not read stops
//! its own stream and nothing else: its cache subscribers fill and lag (caught up from
//! the history later). One that falls out of the window is not canceled: it is caught
//! up from etcd, under its id, from its next revision (`session/moves.rs`), and returns
//! to the cache once etcd has brought it into the newer half of the window (or just
//! ahead of the cache; a quiet one once etcd answers the session's progress question,
//! `session/away.rs`). Only etcd's
//! own compaction ends it with `compact_revision`, as etcd ends a watch behind
//! compaction.
//!
//! ## Shutdown
//! At shutdown every stream ends with `Unavailable`, which etcd clients answer by
//! reconnecting and resuming each watch after its last revision.

mod ahead;
pub(crate) mod cached;
mod entries;
mod forwarded;
mod id_map;
mod messages;
mod outbound;
mod prev_kv;
mod progress;
mod refusal;
mod reply_order;
mod service;
mod session;
mod wire;

pub(crate) use service::{WatchServer, WatchService};
