//! Cross-cutting concerns as tower layers around every service: [`CallsLayer`] counts
//! the calls in flight (reported at shutdown) and logs each call's method and duration
//! at `debug`. Size limits are tonic's codec limits, set per service in `server.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

/// Calls (unary or streaming) currently in flight.
#[derive(Debug, Default, Clone)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// The layer; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct CallsLayer {
    pub(crate) in_flight: InFlight,
}

impl<S> Layer<S> for CallsLayer {
    type Service = Calls<S>;

    fn layer(&self, inner: S) -> Calls<S> {
        Calls {
            inner,
            in_flight: self.in_flight.clone(),
        }
    }
}

/// The service of [`CallsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Calls<S> {
    inner: S,
    in_flight: InFlight,
}

struct Guard(InFlight);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S, B> Service<http::Request<B>> for Calls<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.in_flight.0.fetch_add(1, Ordering::Relaxed);
        let guard = Guard(self.in_flight.clone());
        let method = req.uri().path().to_string();
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            // For a stream this is when its response headers are ready.
            tracing::debug!(method, elapsed = ?started.elapsed(), "call");
            drop(guard);
            res
        })
    }
}
