//! HTTP/1.1 on the gRPC port, as grpc-proxy serves it there: `GET /proxy/health` (the
//! proxy's health, etcd's JSON) and `GET /metrics` (the proxy's metrics, as at
//! `--metrics-addr`). tonic's server takes HTTP/1.1 connections (`accept_http1`, hyper's
//! own sniff of the HTTP/2 preface; over TLS, ALPN offers `http/1.1` beside `h2`) and
//! [`HttpFrontLayer`], outermost of the layers, answers every request that is not gRPC
//! (its content-type is not `application/grpc…`): those two paths, and 404 for any
//! other. gRPC requests pass on to the services untouched. The read side of a connection
//! that is not HTTP/2 passes the `:authority` shim unchanged (`authority_header/`).
//!
//! grpc-proxy's `/metrics` is etcd's metrics fetched from one of its endpoints, and its
//! own at `/proxy/metrics`; here both paths serve the proxy's own (with the cache's):
//! etcd's metrics are etcd's to serve, at its own `/metrics`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;
use tower::{Layer, Service};

/// grpc-proxy's health path (etcd's `etcdhttp.PathProxyHealth`).
pub(crate) const HEALTH_PATH: &str = "/proxy/health";
/// The proxy's metrics; `/proxy/metrics` (grpc-proxy's path for its own) answers the same.
pub(crate) const METRICS_PATHS: [&str; 2] = ["/metrics", "/proxy/metrics"];

/// The layer; see the module docs.
#[derive(Clone)]
pub(crate) struct HttpFrontLayer {
    /// True while the proxy serves (the gRPC health service's `SERVING`).
    pub(crate) serving: watch::Receiver<bool>,
    pub(crate) metrics: PrometheusHandle,
}

impl<S> Layer<S> for HttpFrontLayer {
    type Service = HttpFront<S>;

    fn layer(&self, inner: S) -> HttpFront<S> {
        HttpFront {
            inner,
            front: self.clone(),
        }
    }
}

/// The service of [`HttpFrontLayer`].
#[derive(Clone)]
pub(crate) struct HttpFront<S> {
    inner: S,
    front: HttpFrontLayer,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, R> Service<http::Request<B>> for HttpFront<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if is_grpc(&req) {
            let fut = self.inner.call(req);
            return Box::pin(async move { Ok(fut.await?.map(tonic::body::Body::new)) });
        }
        let resp = self.front.respond(&req);
        Box::pin(async move { Ok(resp.map(tonic::body::Body::new)) })
    }
}

/// A gRPC request (any `application/grpc` content-type: `+proto`, `-web` and so on).
fn is_grpc<B>(req: &http::Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl HttpFrontLayer {
    /// The answer to a request that is not gRPC.
    fn respond<B>(&self, req: &http::Request<B>) -> http::Response<Full<Bytes>> {
        let path = req.uri().path();
        if METRICS_PATHS.contains(&path) {
            return crate::metrics::respond(&self.metrics, &req_for_metrics(req));
        }
        if path != HEALTH_PATH {
            return text(http::StatusCode::NOT_FOUND, "404 page not found\n");
        }
        if req.method() != http::Method::GET {
            // As etcd's health handler.
            let mut resp = text(http::StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
            resp.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("GET"));
            return resp;
        }
        let (status, body) = health(*self.serving.borrow());
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    }
}

/// etcd's health JSON (`etcdhttp.Health`) and status: 200 when the proxy serves, 503 when
/// not.
fn health(serving: bool) -> (http::StatusCode, &'static str) {
    if serving {
        (http::StatusCode::OK, r#"{"health":"true","reason":""}"#)
    } else {
        (
            http::StatusCode::SERVICE_UNAVAILABLE,
            r#"{"health":"false","reason":"the proxy's cache does not follow etcd"}"#,
        )
    }
}

/// `req`'s method at `/metrics`, for `metrics::respond`, which knows that path only.
fn req_for_metrics<B>(req: &http::Request<B>) -> http::Request<()> {
    http::Request::builder()
        .method(req.method().clone())
        .uri("/metrics")
        .body(())
        .expect("a valid request")
}

fn text(status: http::StatusCode, body: &'static str) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("a valid response")
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures::future::{ready, Ready};
    use http_body_util::BodyExt;

    use super::*;

    type Resp = http::Response<Full<Bytes>>;

    /// The layer over a "service" that answers `grpc` to everything.
    fn front(
        serving: bool,
    ) -> HttpFront<
        impl Service<
            http::Request<()>,
            Response = Resp,
            Error = Infallible,
            Future = Ready<Result<Resp, Infallible>>,
        >,
    > {
        let (tx, serving) = watch::channel(serving);
        std::mem::forget(tx);
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        HttpFrontLayer { serving, metrics }.layer(tower::service_fn(|_: http::Request<()>| {
            ready(Ok::<_, Infallible>(http::Response::new(Full::new(
                Bytes::from_static(b"grpc"),
            ))))
        }))
    }

    async fn get<S>(svc: &mut HttpFront<S>, method: &str, path: &str, grpc: bool) -> (u16, String)
    where
        S: Service<
            http::Request<()>,
            Response = Resp,
            Error = Infallible,
            Future = Ready<Result<Resp, Infallible>>,
        >,
    {
        let mut req = http::Request::builder().method(method).uri(path);
        if grpc {
            req = req.header("content-type", "application/grpc");
        }
        let resp = svc.call(req.body(()).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// `/proxy/health` as etcd's handler answers it; `/metrics` in Prometheus' format;
    /// 404 for another path; a gRPC request (any path) reaches the services.
    #[tokio::test]
    async fn http_paths_are_answered_and_grpc_passes() {
        let mut svc = front(true);
        assert_eq!(
            get(&mut svc, "GET", "/proxy/health", false).await,
            (200, r#"{"health":"true","reason":""}"#.into())
        );
        assert_eq!(get(&mut svc, "POST", "/proxy/health", false).await.0, 405);
        assert_eq!(get(&mut svc, "GET", "/metrics", false).await.0, 200);
        assert_eq!(get(&mut svc, "GET", "/proxy/metrics", false).await.0, 200);
        assert_eq!(get(&mut svc, "GET", "/elsewhere", false).await.0, 404);
        assert_eq!(
            get(&mut svc, "POST", "/proxy/health", true).await,
            (200, "grpc".into())
        );
        let mut down = front(false);
        let (status, body) = get(&mut down, "GET", "/proxy/health", false).await;
        assert!(
            status == 503 && body.contains(r#""health":"false""#),
            "{status} {body}"
        );
    }
}
