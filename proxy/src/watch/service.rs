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
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::session::{Queued, Session};
use super::wire::{WatchCodec, WireResponse};
use crate::config::DEFAULT_QUEUED_REQUEST_BYTES;
use crate::conn::{Over, RequestBudget};
use crate::pb::etcdserverpb::{watch_request::RequestUnion, WatchRequest};
use crate::state::State;

/// How long a Watch stream that the proxy ended (its session is done, or it went over
/// the connection's queue) is still read, its requests dropped, while the client has not
/// ended it: h2 (0.4.20) charges the small DATA frames that arrive for a stream nobody
/// reads, or that it reset, against the connection's small-frame budget and never gives
/// them back, so a stream is not dropped under a client that is still sending. grpc-go
/// resets its stream as soon as it reads the status.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// What a queued request costs besides its encoded bytes: its place in the queue.
const QUEUED_SIZE: usize = std::mem::size_of::<Queued>();
/// And a request's box.
const BOXED_SIZE: usize = std::mem::size_of::<WatchRequest>();

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
        let conn_id = conn.map(|c| c.id);
        let budget = conn.map_or_else(
            || {
                RequestBudget::new(
                    DEFAULT_QUEUED_REQUEST_BYTES,
                    &RequestBudget::total(DEFAULT_QUEUED_REQUEST_BYTES),
                )
            },
            |c| c.requests.clone(),
        );
        let (tx, rx) = mpsc::channel(self.state.limits.watch_send_queue.max(1));
        let metadata = crate::upstream::passed(req.metadata());
        let session = Session::new(self.state.clone(), &scope, tx, metadata, require_leader);
        let requests = read_requests(req.into_inner(), budget, self.state.shutdown.clone());
        // Each stream's log lines name it (a connection holds several).
        static STREAMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let stream = STREAMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let span = tracing::debug_span!("watch_stream", conn = conn_id, stream);
        tokio::spawn(tracing::Instrument::instrument(session.run(requests), span));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Reads a client's Watch requests as fast as they come (h2 closes a connection whose
/// small frames pile up unread, see `conn.rs`), into a queue bounded in bytes by
/// `budget`, the connection's (`--max-queued-watch-request-bytes`) within the proxy's
/// (`--max-queued-watch-request-bytes-total`): each request holds its share
/// until its session takes it. A request that finds the share spent ends the stream with
/// [`too_many_requests`], after the requests before it; a receive error ends it too.
/// Either is the last item. Then the stream is drained (see [`DRAIN_LIMIT`]).
fn read_requests(
    mut inbound: Streaming<WatchRequest>,
    budget: RequestBudget,
    shutdown: watch::Receiver<bool>,
) -> mpsc::UnboundedReceiver<Queued> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = inbound.next() => next,
                _ = tx.closed() => break,
            };
            // The client ended its side: nothing more comes.
            let Some(item) = next else { return };
            let failed = item.is_err();
            let item = item.map(|r| Box::new(owned(r)));
            let size = QUEUED_SIZE + item.as_ref().map_or(0, |r| BOXED_SIZE + r.encoded_len());
            let (item, share, over) = match budget.take(size) {
                Ok(share) => (item, share, None),
                Err(over) => (Err(too_many_requests(over)), budget.nothing(), Some(over)),
            };
            if tx.send((item, share)).is_err() || failed {
                break;
            }
            if let Some(over) = over {
                tracing::debug!(
                    queued = budget.queued(),
                    ?over,
                    "a Watch stream went over the queued requests' bound; it ends"
                );
                break;
            }
        }
        drain(inbound, shutdown).await;
    });
    rx
}

/// The request as the session keeps it: a create's key and range end in allocations of
/// their own, so that a watch does not keep the whole receive buffer they were decoded
/// from (tonic decodes `bytes` fields as slices of it) for as long as it lives.
fn owned(mut request: WatchRequest) -> WatchRequest {
    if let Some(RequestUnion::CreateRequest(create)) = &mut request.request_union {
        create.key = Bytes::copy_from_slice(&create.key);
        create.range_end = Bytes::copy_from_slice(&create.range_end);
    }
    request
}

/// The end of a stream whose client sent more than its connection's queue holds: etcd's
/// code for a resource limit, for this stream only.
fn too_many_requests(over: Over) -> Status {
    Status::resource_exhausted(match over {
        Over::Connection(limit) => format!(
            "etcd-cache-proxy: more than {limit} bytes of Watch requests queued on this \
             connection (--max-queued-watch-request-bytes); the stream ends"
        ),
        Over::Total(limit) => format!(
            "etcd-cache-proxy: more than {limit} bytes of Watch requests queued over every \
             connection (--max-queued-watch-request-bytes-total); the stream ends"
        ),
    })
}

/// Reads and drops what the client still sends on a stream the proxy ended, until the
/// client ends it, [`DRAIN_LIMIT`] passes, or the proxy shuts down.
async fn drain(mut inbound: Streaming<WatchRequest>, mut shutdown: watch::Receiver<bool>) {
    let until_end = async { while let Some(Ok(_)) = inbound.next().await {} };
    tokio::select! {
        _ = tokio::time::timeout(DRAIN_LIMIT, until_end) => {}
        _ = shutdown.wait_for(|s| *s) => {}
    }
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
