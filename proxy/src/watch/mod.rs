//! etcd's Watch service (`api/v3rpc/watch.go`), from the cache: every gRPC Watch stream
//! is one task that reads the client's requests, keeps the stream's watches and sends
//! their responses as etcd sends them. This file is the tonic entry: it opens the stream
//! and spawns its task.
//!
//! The path, one role per file (as etcd's `server/proxy/grpcproxy/` splits its watch
//! into watch.go, watcher.go, watch_broadcast.go and watch_ranges.go):
//!
//! | file | role |
//! |---|---|
//! | `mod.rs` | [`WatchService`]: the stream's entry, and the reader of the client's requests |
//! | `session.rs` | the per-stream task: the client's requests handled, which side serves a create, ids, progress requests, auth rechecks, `hasleader` |
//! | `cached.rs` | the cache-served side: the only user of the cache's watch API (a create straight from etcd's request into `WatchOptions`), the per-connection cap |
//! | `forwarded.rs` | the etcd-forwarded side: one upstream Watch stream for the watches the cache cannot serve |
//! | `reply_order.rs` | the replies to creates and cancels in the order of the requests across both sides; the requests that wait for the other side |
//! | `progress.rs` | the stream-level progress machine over both sides (what is held back, when the answer goes) |
//! | `responses.rs` | what the client is sent: etcd's messages from the cache's, the merging of a batch of replies, fragments, the refusal of a create (a typed reason printed there) |
//!
//! The session uses each of the others; none of them uses the session or this file.
//!
//! ## Slow clients
//! Responses go through a bounded queue (`--watch-send-queue`). The task takes a reply
//! from the cache only when the queue has room, so a client that does not read stops
//! its own stream and nothing else: its cache subscribers fill and lag (caught up from
//! the history later). One that falls out of the window is not canceled: it is caught
//! up from etcd, under its id, from its next revision (`session.rs: catch_up`), and
//! stays forwarded. Only etcd's own compaction ends it with `compact_revision`, as etcd
//! ends a watch behind compaction.
//!
//! ## Shutdown
//! At shutdown every stream ends with `Unavailable`, which etcd clients answer by
//! reconnecting and resuming each watch after its last revision.

pub(crate) mod cached;
mod catch_up;
mod forwarded;
mod grpc;
mod progress;
mod reply_order;
mod responses;
mod session;
mod wire;

pub(crate) use grpc::WatchServer;

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::pb::etcdserverpb::WatchRequest;
use crate::state::State;
use session::{Queued, Session};
use wire::WireResponse;

/// Bytes of requests read from a client stream and not yet handled, at most: the stream
/// is read as fast as the client sends (h2 refuses a client whose small frames pile up
/// unread), and a client that sends more than this waits on flow control.
const QUEUED_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// etcd's Watch service, from the cache.
pub(crate) struct WatchService {
    state: Arc<State>,
}

impl WatchService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        WatchService { state }
    }
}

/// The responses of one Watch stream.
type WatchStream = Pin<Box<dyn Stream<Item = Result<WireResponse, Status>> + Send>>;

impl WatchService {
    /// Opens a Watch stream: its session task reads the client's requests and sends
    /// the responses.
    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let require_leader = req
            .metadata()
            .get("hasleader")
            .is_some_and(|v| v.as_bytes() == b"true");
        let conn = crate::conn::info(req.extensions());
        tracing::debug!(
            conn = conn.map(|c| c.id),
            remote = ?conn.and_then(|c| c.remote),
            require_leader,
            "watch stream"
        );
        let scope = conn.map(|c| c.watches.clone()).unwrap_or_default();
        let (tx, rx) = mpsc::channel(self.state.limits.watch_send_queue.max(1));
        let metadata = crate::upstream::passed(req.metadata());
        let session = Session::new(self.state.clone(), &scope, tx, metadata, require_leader);
        tokio::spawn(session.run(read_requests(req.into_inner())));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Reads a client's Watch requests as fast as they come, into a queue bounded in bytes
/// ([`QUEUED_REQUEST_BYTES`]): each request holds its share until it is handled. A
/// receive error is the last item.
fn read_requests(mut inbound: Streaming<WatchRequest>) -> mpsc::UnboundedReceiver<Queued> {
    let (tx, rx) = mpsc::unbounded_channel();
    let budget = Arc::new(tokio::sync::Semaphore::new(QUEUED_REQUEST_BYTES));
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = inbound.next() => next,
                _ = tx.closed() => return,
            };
            let Some(item) = next else { return };
            let size = match &item {
                Ok(r) => r.encoded_len().clamp(1, QUEUED_REQUEST_BYTES),
                Err(_) => 1,
            };
            let Ok(permit) = budget.clone().acquire_many_owned(size as u32).await else {
                return;
            };
            let failed = item.is_err();
            if tx.send((item, permit)).is_err() || failed {
                return;
            }
        }
    });
    rx
}
