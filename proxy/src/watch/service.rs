//! The entry of the Watch path: the Watch service's gRPC server, written out instead of
//! generated (tonic's generated `WatchServer` writes every response with prost; this one
//! writes [`WireResponse`]s with [`WatchCodec`], events the cache encoded once, see
//! `wire.rs`), which opens each stream's session, and the reader of a client's requests.
//! The server does what the generated one does: the route `/etcdserverpb.Watch/Watch`,
//! `Unimplemented` for any other method of the service, and the message size limits.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::session::{Queued, Session};
use super::wire::{WatchCodec, WireResponse};
use crate::pb::etcdserverpb::WatchRequest;
use crate::state::State;

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

/// etcd's Watch service over gRPC.
#[derive(Clone)]
pub(crate) struct WatchServer {
    inner: Arc<WatchService>,
    max_decoding_message_size: Option<usize>,
    max_encoding_message_size: Option<usize>,
}

impl WatchServer {
    pub(crate) fn new(inner: WatchService) -> Self {
        WatchServer {
            inner: Arc::new(inner),
            max_decoding_message_size: None,
            max_encoding_message_size: None,
        }
    }

    /// The largest request taken (as the generated servers' option).
    #[must_use]
    pub(crate) fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }

    /// The largest response sent (as the generated servers' option).
    #[must_use]
    pub(crate) fn max_encoding_message_size(mut self, limit: usize) -> Self {
        self.max_encoding_message_size = Some(limit);
        self
    }
}

impl NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

/// The one method, as tonic's streaming handler.
struct WatchMethod(Arc<WatchService>);

impl StreamingService<WatchRequest> for WatchMethod {
    type Response = super::wire::WireResponse;
    type ResponseStream = WatchStream;
    type Future = BoxFuture<Response<WatchStream>, Status>;

    fn call(&mut self, request: Request<Streaming<WatchRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.watch(request).await })
    }
}

impl<B> Service<http::Request<B>> for WatchServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != "/etcdserverpb.Watch/Watch" {
            return Box::pin(async move { Ok(Status::unimplemented("").into_http()) });
        }
        let method = WatchMethod(self.inner.clone());
        let (decoding, encoding) = (
            self.max_decoding_message_size,
            self.max_encoding_message_size,
        );
        Box::pin(async move {
            let mut grpc = Grpc::new(WatchCodec).apply_max_message_size_config(decoding, encoding);
            Ok(grpc.streaming(method, req).await)
        })
    }
}
