//! The proxy's metrics and the `--metrics-addr` endpoint.
//!
//! At start [`install`] puts a Prometheus recorder behind the `metrics` facade before
//! anything records, so the cache's own metrics (etcd-cache's `metrics` feature,
//! `etcd_cache_*`) and the proxy's (`etcd_cache_proxy_*`, below) are rendered together at
//! `GET /metrics` in Prometheus' text format: on the gRPC port over HTTP/1.1, as
//! grpc-proxy serves them (`http_front.rs`), and with `--metrics-addr` on a listener of
//! their own ([`listen`]).
//!
//! Every label has a fixed, small set of values: gRPC services and methods come from
//! etcd's protos (anything else is `unknown`), codes are gRPC's 17, and there is no
//! per-client, per-key or per-watch label. The names are listed in `docs/METRICS.md`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use metrics::{Counter, Gauge};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

/// How often the exporter's histograms are rolled up (its documented default).
const UPKEEP: Duration = Duration::from_secs(5);
/// Bucket bounds (seconds) of the cache's `*_seconds` histograms.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The content type of Prometheus' text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The services the proxy serves and their methods, as in etcd's protos: the only
/// values the `service` and `method` labels take (besides `unknown`).
const SERVICES: &[(&str, &[&str])] = &[
    (
        "etcdserverpb.KV",
        &[
            "Range",
            "RangeStream",
            "Put",
            "DeleteRange",
            "Txn",
            "Compact",
        ],
    ),
    ("etcdserverpb.Watch", &["Watch"]),
    (
        "etcdserverpb.Lease",
        &[
            "LeaseGrant",
            "LeaseRevoke",
            "LeaseKeepAlive",
            "LeaseTimeToLive",
            "LeaseLeases",
        ],
    ),
    (
        "etcdserverpb.Cluster",
        &[
            "MemberAdd",
            "MemberRemove",
            "MemberUpdate",
            "MemberList",
            "MemberPromote",
        ],
    ),
    (
        "etcdserverpb.Maintenance",
        &[
            "Alarm",
            "Status",
            "Defragment",
            "Hash",
            "HashKV",
            "Snapshot",
            "MoveLeader",
            "Downgrade",
        ],
    ),
    (
        "etcdserverpb.Auth",
        &[
            "AuthEnable",
            "AuthDisable",
            "AuthStatus",
            "Authenticate",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        ],
    ),
    (
        "v3electionpb.Election",
        &["Campaign", "Proclaim", "Leader", "Observe", "Resign"],
    ),
    ("v3lockpb.Lock", &["Lock", "Unlock"]),
    ("grpc.health.v1.Health", &["Check", "Watch"]),
];

/// gRPC's status codes by number, spelled as grpc-go spells them (`codes.Code.String`).
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The label values of a request path `/<service>/<method>`.
pub(crate) fn classify(path: &str) -> (&'static str, &'static str) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (service, method) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match SERVICES.iter().find(|(s, _)| *s == service) {
        Some((s, methods)) => (
            s,
            methods.iter().find(|m| **m == method).unwrap_or(&"unknown"),
        ),
        None => ("unknown", "unknown"),
    }
}

/// The label value of a `grpc-status` header or trailer.
fn code_name(value: Option<&http::HeaderValue>) -> &'static str {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .and_then(|n| CODES.get(n).copied())
        .unwrap_or("Unknown")
}

/// Which side serves a watch or a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// From the cache's memory.
    Cache,
    /// Forwarded to etcd.
    Etcd,
}

/// The `reason` label of a refused watch create (`watch::refusal::Refusal::kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalKind {
    /// `--max-watches-per-connection`.
    ConnectionLimit,
    /// `--max-watches`.
    ProxyLimit,
    /// A request etcd would refuse too (empty range, duplicate id, negative revision).
    Invalid,
    /// etcd refused a forwarded create.
    Etcd,
}

/// Every handle of the proxy's own metrics, registered once.
pub(crate) struct Metrics {
    connections: Gauge,
    watch_streams: Gauge,
    watches_cache: Gauge,
    watches_etcd: Gauge,
    created_cache: Counter,
    created_etcd: Counter,
    refused_connection: Counter,
    refused_proxy: Counter,
    refused_invalid: Counter,
    refused_etcd: Counter,
    ranges_cache: Counter,
    ranges_etcd: Counter,
    auth_asks: Counter,
    auth_asks_refused: Counter,
    auth_dropped: Counter,
    hedged: Counter,
    connections_refused: Counter,
    auth_revoked: Counter,
    caught_up: Counter,
    rejoined: Counter,
    registrations: Counter,
    registration_renewals: Counter,
    registration_failures: Counter,
    registered: Gauge,
    /// `etcd_cache_proxy_sent_bytes_total` per entry of [`SERVICES`], then `unknown`.
    sent_bytes: Vec<Counter>,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The proxy's metrics (registered at first use: after [`install`] when there is one).
pub(crate) fn get() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        describe();
        let served = |name: &'static str, v: &'static str| metrics::counter!(name, "served" => v);
        let refused = |v: &'static str| metrics::counter!("etcd_cache_proxy_watches_refused_total", "reason" => v);
        let sent = |s: &'static str| metrics::counter!("etcd_cache_proxy_sent_bytes_total", "service" => s);
        Metrics {
            connections: metrics::gauge!("etcd_cache_proxy_connections"),
            watch_streams: metrics::gauge!("etcd_cache_proxy_watch_streams"),
            watches_cache: metrics::gauge!("etcd_cache_proxy_watches", "served" => "cache"),
            watches_etcd: metrics::gauge!("etcd_cache_proxy_watches", "served" => "etcd"),
            created_cache: served("etcd_cache_proxy_watches_created_total", "cache"),
            created_etcd: served("etcd_cache_proxy_watches_created_total", "etcd"),
            refused_connection: refused("connection_limit"),
            refused_proxy: refused("proxy_limit"),
            refused_invalid: refused("invalid"),
            refused_etcd: refused("etcd"),
            ranges_cache: served("etcd_cache_proxy_ranges_total", "cache"),
            ranges_etcd: served("etcd_cache_proxy_ranges_total", "etcd"),
            auth_asks: metrics::counter!("etcd_cache_proxy_auth_asks_total"),
            auth_asks_refused: metrics::counter!("etcd_cache_proxy_auth_asks_refused_total"),
            auth_dropped: metrics::counter!("etcd_cache_proxy_auth_decisions_dropped_total"),
            hedged: metrics::counter!("etcd_cache_proxy_hedged_calls_total"),
            connections_refused: metrics::counter!("etcd_cache_proxy_connections_refused_total"),
            auth_revoked: metrics::counter!("etcd_cache_proxy_auth_revoked_watches_total"),
            caught_up: metrics::counter!("etcd_cache_proxy_watches_caught_up_total"),
            rejoined: metrics::counter!("etcd_cache_proxy_watches_rejoined_total"),
            registrations: metrics::counter!("etcd_cache_proxy_registrations_total"),
            registration_renewals: metrics::counter!(
                "etcd_cache_proxy_registration_renewals_total"
            ),
            registration_failures: metrics::counter!(
                "etcd_cache_proxy_registration_failures_total"
            ),
            registered: metrics::gauge!("etcd_cache_proxy_registered"),
            sent_bytes: SERVICES
                .iter()
                .map(|(s, _)| sent(s))
                .chain([sent("unknown")])
                .collect(),
        }
    }

    /// Whether etcd's TLS certificate goes unverified (`--insecure-skip-tls-verify`).
    pub(crate) fn upstream_tls_unverified(&self, on: bool) {
        metrics::gauge!("etcd_cache_proxy_upstream_tls_unverified").set(if on { 1.0 } else { 0.0 });
    }

    /// An endpoint set by `--endpoints-auto-sync-interval` (`auto_sync.rs`).
    pub(crate) fn endpoints_synced(&self, endpoints: usize) {
        metrics::gauge!("etcd_cache_proxy_upstream_endpoints").set(endpoints as f64);
    }

    /// One ask to etcd for a caller's permission on a range (`authz/`).
    pub(crate) fn auth_ask(&self) {
        self.auth_asks.increment(1);
    }

    /// A client connection closed at once: `--max-connections` were open.
    pub(crate) fn connection_refused(&self) {
        self.connections_refused.increment(1);
    }

    /// A permission check refused because asks in flight hold `--auth-ask-bytes`.
    pub(crate) fn auth_ask_refused(&self) {
        self.auth_asks_refused.increment(1);
    }

    /// Every cached permission decision was dropped: etcd's auth state moved, an Auth
    /// change went through the proxy, or (etcd without an auth revision) the periodic drop.
    pub(crate) fn auth_decisions_dropped(&self) {
        self.auth_dropped.increment(1);
    }

    /// A hedged call (an ask, an auth poll) went to every member: the one the balance
    /// picked had not answered in time.
    pub(crate) fn hedged(&self) {
        self.hedged.increment(1);
    }

    /// A cached watch canceled because etcd no longer allows its caller.
    pub(crate) fn auth_revoked(&self) {
        self.auth_revoked.increment(1);
    }

    /// A cached watch that fell behind the cache's window, caught up from etcd from its
    /// next revision instead of being canceled.
    pub(crate) fn watch_caught_up(&self) {
        self.caught_up.increment(1);
    }

    /// The proxy registered under --resolver-prefix (a new lease and key).
    pub(crate) fn registration(&self) {
        self.registrations.increment(1);
    }

    /// The registration's lease was renewed.
    pub(crate) fn registration_renewed(&self) {
        self.registration_renewals.increment(1);
    }

    /// A registration failed or was lost (it is retried).
    pub(crate) fn registration_failed(&self) {
        self.registration_failures.increment(1);
    }

    /// Whether the proxy is registered now.
    pub(crate) fn registered(&self, now: bool) {
        self.registered.set(if now { 1.0 } else { 0.0 });
    }

    /// A watch caught up from etcd returned to the cache.
    pub(crate) fn watch_rejoined(&self) {
        self.rejoined.increment(1);
    }

    /// A client connection opened; closed when the guard drops.
    pub(crate) fn connection(&self) -> GaugeGuard {
        GaugeGuard::new(self.connections.clone(), 1)
    }

    /// A Watch stream opened; closed when the guard drops.
    pub(crate) fn watch_stream(&self) -> GaugeGuard {
        GaugeGuard::new(self.watch_streams.clone(), 1)
    }

    /// The open watches served by `served` on one stream (all closed when it drops).
    pub(crate) fn open_watches(&self, served: Served) -> GaugeGuard {
        let gauge = match served {
            Served::Cache => &self.watches_cache,
            Served::Etcd => &self.watches_etcd,
        };
        GaugeGuard::new(gauge.clone(), 0)
    }

    /// A watch was created (its `created` response is on its way to the client).
    pub(crate) fn watch_created(&self, served: Served) {
        match served {
            Served::Cache => self.created_cache.increment(1),
            Served::Etcd => self.created_etcd.increment(1),
        }
    }

    /// A watch create was refused, for `why`.
    pub(crate) fn watch_refused(&self, why: RefusalKind) {
        match why {
            RefusalKind::ConnectionLimit => self.refused_connection.increment(1),
            RefusalKind::ProxyLimit => self.refused_proxy.increment(1),
            RefusalKind::Invalid => self.refused_invalid.increment(1),
            RefusalKind::Etcd => self.refused_etcd.increment(1),
        }
    }

    /// A Range (or RangeStream) answered by `served`.
    pub(crate) fn range(&self, served: Served) {
        match served {
            Served::Cache => self.ranges_cache.increment(1),
            Served::Etcd => self.ranges_etcd.increment(1),
        }
    }

    fn sent_bytes(&self, service: &str) -> Counter {
        let i = SERVICES
            .iter()
            .position(|(s, _)| *s == service)
            .unwrap_or(SERVICES.len());
        self.sent_bytes[i].clone()
    }
}

/// `HELP` lines for the proxy's metrics.
fn describe() {
    use metrics::{describe_counter, describe_gauge, Unit};
    describe_gauge!(
        "etcd_cache_proxy_upstream_tls_unverified",
        "1 when etcd's TLS certificate is not verified (--insecure-skip-tls-verify), else 0"
    );
    describe_gauge!(
        "etcd_cache_proxy_upstream_endpoints",
        "etcd endpoints forwarded calls balance over, as --endpoints-auto-sync-interval last set them"
    );
    describe_counter!(
        "etcd_cache_proxy_grpc_started_total",
        "gRPC calls started, by service and method"
    );
    describe_counter!(
        "etcd_cache_proxy_grpc_handled_total",
        "gRPC calls finished, by service, method and status code"
    );
    describe_counter!(
        "etcd_cache_proxy_sent_bytes_total",
        Unit::Bytes,
        "gRPC message bytes sent to clients, by service"
    );
    describe_gauge!("etcd_cache_proxy_connections", "open client connections");
    describe_gauge!("etcd_cache_proxy_watch_streams", "open gRPC Watch streams");
    describe_gauge!(
        "etcd_cache_proxy_watches",
        "open watches, by who serves them (cache or etcd)"
    );
    describe_counter!(
        "etcd_cache_proxy_watches_created_total",
        "watches created, by who serves them (cache or etcd)"
    );
    describe_counter!(
        "etcd_cache_proxy_watches_refused_total",
        "watch creates refused, by reason"
    );
    describe_counter!(
        "etcd_cache_proxy_ranges_total",
        "Range calls, by who answered them (cache or etcd)"
    );
    describe_counter!(
        "etcd_cache_proxy_auth_asks_total",
        "asks to etcd whether a caller may read a range (once per token and range while etcd's auth state holds)"
    );
    describe_counter!(
        "etcd_cache_proxy_auth_decisions_dropped_total",
        "times every cached permission decision was dropped (etcd's auth state moved, an Auth change through the proxy, or every 2 s on etcd without an auth revision)"
    );
    describe_counter!(
        "etcd_cache_proxy_hedged_calls_total",
        "permission asks and auth polls sent to every member because the one the balance picked had not answered within 150 ms"
    );
    describe_counter!(
        "etcd_cache_proxy_connections_refused_total",
        "client connections closed at once because --max-connections were open"
    );
    describe_counter!(
        "etcd_cache_proxy_auth_asks_refused_total",
        "permission checks refused because the asks in flight already held --auth-ask-bytes"
    );
    describe_counter!(
        "etcd_cache_proxy_auth_revoked_watches_total",
        "cached watches canceled because etcd no longer allows their caller"
    );
    describe_counter!(
        "etcd_cache_proxy_watches_caught_up_total",
        "cached watches that fell behind the cache's window, moved to etcd from their next revision (not canceled)"
    );
    describe_counter!(
        "etcd_cache_proxy_registrations_total",
        "registrations under --resolver-prefix (a lease granted and the proxy's key put on it)"
    );
    describe_counter!(
        "etcd_cache_proxy_registration_renewals_total",
        "renewals of the registration's lease"
    );
    describe_counter!(
        "etcd_cache_proxy_registration_failures_total",
        "registrations that failed or were lost (lease expired or not renewed in time); each is retried"
    );
    describe_gauge!(
        "etcd_cache_proxy_registered",
        "1 while the proxy is registered under --resolver-prefix, else 0"
    );
    describe_counter!(
        "etcd_cache_proxy_watches_rejoined_total",
        "watches caught up from etcd that returned to the cache once in the newer half of its window"
    );
}

/// A share of a gauge: added at once, taken back when dropped.
pub(crate) struct GaugeGuard {
    gauge: Gauge,
    n: u64,
}

impl GaugeGuard {
    fn new(gauge: Gauge, n: u64) -> GaugeGuard {
        if n > 0 {
            gauge.increment(n as f64);
        }
        GaugeGuard { gauge, n }
    }

    pub(crate) fn add(&mut self) {
        self.n += 1;
        self.gauge.increment(1.0);
    }

    pub(crate) fn sub(&mut self) {
        if self.n > 0 {
            self.n -= 1;
            self.gauge.decrement(1.0);
        }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        if self.n > 0 {
            self.gauge.decrement(self.n as f64);
        }
    }
}

/// What is counted of one call: its start now, its end (with its code) once, and the
/// bytes of its response body.
pub(crate) struct Call {
    service: &'static str,
    method: &'static str,
    done: bool,
}

impl Call {
    pub(crate) fn start(path: &str) -> Call {
        let (service, method) = classify(path);
        metrics::counter!("etcd_cache_proxy_grpc_started_total", "service" => service, "method" => method)
            .increment(1);
        Call {
            service,
            method,
            done: false,
        }
    }

    fn finish(&mut self, code: &'static str) {
        if !self.done {
            self.done = true;
            metrics::counter!(
                "etcd_cache_proxy_grpc_handled_total",
                "service" => self.service,
                "method" => self.method,
                "code" => code
            )
            .increment(1);
        }
    }

    /// Wraps a response: a trailers-only response (status in the headers) ends the call
    /// now; otherwise the body's trailers end it, or its drop (the client went away:
    /// `Canceled`, as grpc-go counts it).
    pub(crate) fn response<B>(mut self, resp: http::Response<B>) -> http::Response<Counted<B>> {
        if let Some(status) = resp.headers().get("grpc-status") {
            self.finish(code_name(Some(status)));
        }
        let sent = get().sent_bytes(self.service);
        resp.map(|inner| Counted {
            inner,
            call: self,
            sent,
        })
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish("Canceled");
    }
}

/// A response body that counts its bytes and ends its [`Call`] at its trailers.
pub(crate) struct Counted<B> {
    inner: B,
    call: Call,
    sent: Counter,
}

impl<B> Body for Counted<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sent.increment(data.remaining() as u64);
                } else if let Some(trailers) = frame.trailers_ref() {
                    this.call.finish(code_name(trailers.get("grpc-status")));
                }
            }
            Poll::Ready(Some(Err(_))) => this.call.finish("Unknown"),
            // A body that ends without trailers carries no status.
            Poll::Ready(None) => this.call.finish("Unknown"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Installs the Prometheus recorder (before anything records) and returns its handle,
/// which renders the metrics.
///
/// # Errors
/// A recorder is installed already.
pub(crate) fn install() -> std::io::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| b.install_recorder())
        .map_err(std::io::Error::other)?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Serves `handle` at `http://<addr>/metrics` (`--metrics-addr`) until the process exits.
/// Returns the bound address.
///
/// # Errors
/// `addr` cannot be bound.
pub(crate) async fn listen(
    addr: SocketAddr,
    handle: PrometheusHandle,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve(listener, handle));
    Ok(local)
}

/// The HTTP/1.1 endpoint: `GET /metrics`; anything else is 404 (405 for another method).
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let handle = handle.clone();
                async move { Ok::<_, Infallible>(respond(&handle, &req)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics endpoint: connection failed");
            }
        });
    }
}

/// The answer to `req` for `/metrics`: the metrics to GET and HEAD, 405 to another
/// method, 404 to another path.
pub(crate) fn respond<B>(
    handle: &PrometheusHandle,
    req: &http::Request<B>,
) -> http::Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&http::Method::GET | &http::Method::HEAD, "/metrics") => {
            (http::StatusCode::OK, CONTENT_TYPE, handle.render())
        }
        (_, "/metrics") => (
            http::StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".to_string(),
        ),
        _ => (
            http::StatusCode::NOT_FOUND,
            "text/plain",
            "not found: the metrics are at /metrics\n".to_string(),
        ),
    };
    let body = if req.method() == http::Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from(body)
    };
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(body))
        .expect("a valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded() {
        assert_eq!(
            classify("/etcdserverpb.KV/Range"),
            ("etcdserverpb.KV", "Range")
        );
        assert_eq!(
            classify("/etcdserverpb.Watch/Watch"),
            ("etcdserverpb.Watch", "Watch")
        );
        assert_eq!(
            classify("/etcdserverpb.KV/Nonsense"),
            ("etcdserverpb.KV", "unknown")
        );
        assert_eq!(classify("/x.Y/Z"), ("unknown", "unknown"));
        assert_eq!(classify(""), ("unknown", "unknown"));
        let v = |s: &'static str| http::HeaderValue::from_static(s);
        assert_eq!(code_name(Some(&v("0"))), "OK");
        assert_eq!(code_name(Some(&v("14"))), "Unavailable");
        assert_eq!(code_name(Some(&v("99"))), "Unknown");
        assert_eq!(code_name(None), "Unknown");
    }
}
