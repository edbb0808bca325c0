//! Cross-cutting concerns as tower layers around every service: [`CallsLayer`] counts
//! the calls in flight (reported at shutdown), counts every call by service, method and
//! status code and the bytes of its response (`crate::metrics`), logs each call's method
//! and duration at `debug`, and gives an oversized request etcd's answer. Size limits
//! themselves are tonic's codec limits, set per service in `server.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

use crate::metrics::{Call, Counted};

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

/// tonic refuses a request above the receive limit with `OutOfRange` ("Error, decoded
/// message length too large: found N bytes, the limit is: M bytes"); etcd's grpc-go
/// answers `ResourceExhausted` "grpc: received message larger than max (N vs. M)". The
/// status of such a refusal travels in the response headers (a trailers-only response),
/// so it is rewritten there.
fn as_grpc_go_size_error(headers: &mut http::HeaderMap) {
    const PREFIX: &str = "Error, decoded message length too large: found ";
    if headers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"11") {
        return;
    }
    let Some(msg) = headers.get("grpc-message").and_then(|v| v.to_str().ok()) else {
        return;
    };
    // The message is percent-encoded on the wire.
    let msg = msg
        .replace("%20", " ")
        .replace("%3A", ":")
        .replace("%2C", ",");
    let Some(rest) = msg.strip_prefix(PREFIX) else {
        return;
    };
    let numbers: Vec<&str> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let [found, limit] = numbers[..] else {
        return;
    };
    let text = format!("grpc: received message larger than max ({found} vs. {limit})");
    headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    if let Ok(v) = http::HeaderValue::from_str(&text.replace(' ', "%20").replace(':', "%3A")) {
        headers.insert("grpc-message", v);
    }
}

impl<S, B, R> Service<http::Request<B>> for Calls<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<Counted<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.in_flight.0.fetch_add(1, Ordering::Relaxed);
        let guard = Guard(self.in_flight.clone());
        let method = req.uri().path().to_string();
        let call = Call::start(&method);
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut res = fut.await;
            if let Ok(resp) = res.as_mut() {
                as_grpc_go_size_error(resp.headers_mut());
            }
            // For a stream this is when its response headers are ready.
            tracing::debug!(method, elapsed = ?started.elapsed(), "call");
            drop(guard);
            res.map(|resp| call.response(resp))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_requests_get_grpc_gos_status() {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_static("11"));
        h.insert(
            "grpc-message",
            http::HeaderValue::from_static(
                "Error,%20decoded%20message%20length%20too%20large%3A%20found%20100010%20bytes,%20the%20limit%20is%3A%2065536%20bytes",
            ),
        );
        as_grpc_go_size_error(&mut h);
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(
            h["grpc-message"],
            "grpc%3A%20received%20message%20larger%20than%20max%20(100010%20vs.%2065536)"
        );
        // Any other status is left alone.
        let mut other = http::HeaderMap::new();
        other.insert("grpc-status", http::HeaderValue::from_static("11"));
        other.insert(
            "grpc-message",
            http::HeaderValue::from_static("etcdserver%3A%20mvcc"),
        );
        as_grpc_go_size_error(&mut other);
        assert_eq!(other["grpc-status"], "11");
    }
}
