//! The gRPC server of etcd's Watch service, written out instead of generated: tonic's
//! generated `WatchServer` writes every response with prost, and this one writes
//! [`WireResponse`]s with [`WatchCodec`] (events the cache encoded once, see `wire.rs`).
//! Everything else is what the generated server does: the route
//! `/etcdserverpb.Watch/Watch`, `Unimplemented` for any other method of the service, and
//! the message size limits.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::wire::WatchCodec;
use super::{WatchService, WatchStream};
use crate::pb::etcdserverpb::WatchRequest;

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
