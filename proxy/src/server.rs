//! Start-up, the router of every service, and graceful shutdown.
//!
//! ## Shutdown
//! On SIGTERM or SIGINT the listener closes, Watch and LeaseKeepAlive streams end with
//! `Unavailable` (clients reconnect and resume), unary calls in flight finish, and the
//! process exits once every connection is closed or `--shutdown-timeout` has passed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tonic::transport::Server;
use tonic_health::ServingStatus;

use crate::authz::Authz;
use crate::cache_slot::CacheSlot;
use crate::config::Config;
use crate::conn;
use crate::error::{Error, Result};
use crate::http_front::HttpFrontLayer;
use crate::layers::{CallsLayer, InFlight};
use crate::namespace::Namespace;
use crate::pb::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer,
};
use crate::pb::v3electionpb::election_server::ElectionServer;
use crate::pb::v3lockpb::lock_server::LockServer;
use crate::register::Registration;
use crate::services::auth::AuthService;
use crate::services::cluster::ClusterService;
use crate::services::election::ElectionService;
use crate::services::kv::KvService;
use crate::services::lease::LeaseService;
use crate::services::lock::LockService;
use crate::services::maintenance::MaintenanceService;
use crate::state::{Limits, State};
use crate::upstream::{self, Upstream};
use crate::watch::{WatchServer, WatchService};

/// How long start-up waits for the cache's first load to tell a refusal (a start-up
/// error) from a slow start (served meanwhile by forwarding).
const START_CHECK: Duration = Duration::from_secs(10);
/// How often the health service follows the cache's readiness.
const HEALTH_POLL: Duration = Duration::from_millis(500);

/// Runs the proxy until SIGTERM or SIGINT.
pub(crate) async fn run(mut config: Config) -> Result<()> {
    config.check().map_err(Error::Config)?;
    config.load_password_file().map_err(Error::Config)?;
    // First: the recorder must be in place before the cache and the services register
    // their metrics. It is served on the gRPC port (`http_front.rs`) and at --metrics-addr.
    let recorder = crate::metrics::install().map_err(Error::Metrics)?;
    let metrics = match config.metrics_addr {
        Some(addr) => Some(
            crate::metrics::listen(addr, recorder.clone())
                .await
                .map_err(|source| Error::Listen { addr, source })?,
        ),
        None => None,
    };
    crate::metrics::get()
        .upstream_tls_unverified(config.insecure_skip_tls_verify && config.upstream_tls());
    if config.insecure_skip_tls_verify {
        tracing::warn!(
            upstream_tls_unverified = config.upstream_tls(),
            "--insecure-skip-tls-verify was given: etcd's TLS certificate is not verified, so \
             whoever is between the proxy and etcd can read and change every call, tokens and \
             passwords included. Use it for tests only"
        );
    }
    // The TLS served to clients: files read and checked before anything reaches etcd.
    let tls = crate::server_tls::server_config(&config)?;
    // The client port is bound before anything reaches etcd, as etcd binds its client
    // listeners before it serves: a client that connects while the proxy starts (beside a
    // member that restarts with it) waits in the accept queue and is served once the proxy
    // serves, instead of being refused and backing off (grpc-go waits a second or more
    // before its next attempt). A port in use is a start-up error at once.
    let listener = bind(config.listen_addr).await?;
    let namespace = Namespace::new(Bytes::from(config.namespace.clone().into_bytes()));
    let cache_prefix = [config.namespace.as_bytes(), config.prefix.as_bytes()].concat();
    log_start(&config, &cache_prefix, metrics);
    for (url, version) in upstream::versions(&config).await {
        match version {
            Ok(v) => tracing::info!(endpoint = %url, version = %v, "etcd version"),
            Err(e) => tracing::warn!(endpoint = %url, error = %e, "etcd version unknown"),
        }
    }

    let upstream = Upstream::new(&config)?;
    let _reachability = AbortOnDrop(upstream.spawn_reachability());
    let _auto_sync = (!config.endpoints_auto_sync_interval.is_zero()).then(|| {
        AbortOnDrop(crate::auto_sync::spawn(
            upstream.clone(),
            config.endpoints_auto_sync_interval,
        ))
    });
    let authz = Authz::new(
        upstream.clone(),
        config.auth_token_ttl,
        config.auth_cache_bytes,
        config.auth_ask_bytes,
    );
    let slot = CacheSlot::empty();
    let _followed = start_cache(&config, &upstream, &authz, &slot, cache_prefix.clone()).await?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let limits = Limits {
        watches_per_connection: config.max_watches_per_connection,
        max_request_bytes: config.max_request_bytes,
        watch_send_queue: config.watch_send_queue,
    };
    let state = State::new(
        slot.clone(),
        &cache_prefix,
        upstream,
        authz.clone(),
        namespace,
        limits,
        config.advertise_client_url.clone(),
        config.resolver_prefix.clone(),
        shutdown_rx.clone(),
    );
    let (health, health_service) = tonic_health::server::health_reporter();
    let (serving_tx, serving) = watch::channel(false);
    let _health = AbortOnDrop(tokio::spawn(follow_health(
        health,
        serving_tx,
        slot.clone(),
        authz.clone(),
        config.clone(),
    )));
    let in_flight = InFlight::default();
    let router = router(
        &config,
        &state,
        HttpFrontLayer {
            serving,
            metrics: recorder,
        },
        in_flight.clone(),
        health_service,
    );
    serve(
        config,
        listener,
        router,
        tls,
        &state,
        in_flight,
        (shutdown_tx, shutdown_rx),
    )
    .await?;
    slot.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// The start-up log line: every setting that shapes what the proxy does.
fn log_start(config: &Config, cache_prefix: &[u8], metrics: Option<std::net::SocketAddr>) {
    tracing::info!(
        endpoints = ?config.endpoint_urls(),
        listen = %config.listen_addr,
        advertise = ?config.advertise_client_url,
        namespace = %config.namespace,
        prefix = %String::from_utf8_lossy(cache_prefix),
        listen_tls = config.cert_file.is_some(),
        client_cert_auth = config.trusted_ca_file.is_some(),
        client_crl = config.client_crl_file.is_some(),
        upstream_tls = config.upstream_tls(),
        upstream_tls_unverified = config.insecure_skip_tls_verify && config.upstream_tls(),
        endpoints_auto_sync_interval = ?config.endpoints_auto_sync_interval,
        tls_versions = %format_args!("{}..={}", config.tls_min_version, config.tls_max_version),
        user = config.credentials().map(|c| c.0).unwrap_or_default(),
        history_window = config.history_window,
        history_bytes = config.history_bytes,
        subscriber_buffer = config.subscriber_buffer,
        watch_send_queue = config.watch_send_queue,
        max_watches_per_connection = config.max_watches_per_connection,
        max_watches = config.max_watches,
        max_send_bytes = config.max_send_bytes,
        max_recv_bytes = config.max_recv_bytes,
        max_request_bytes = config.max_request_bytes,
        progress_notify_interval = ?config.progress_notify_interval,
        metrics = ?metrics,
        "etcd-cache-proxy starting"
    );
    if let Some(addr) = metrics {
        tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
    }
}

/// Starts the cache in `slot` (see [`follow`]), and the task that keeps what it started
/// running until the server stops. In front of a learner the cache waits for its
/// promotion, and every call is forwarded meanwhile.
///
/// # Errors
/// A cache etcd refuses (the proxy's user may not read the prefix), or a start that
/// [`follow`] refuses: start-up errors, not endless retries.
async fn start_cache(
    config: &Config,
    upstream: &Arc<Upstream>,
    authz: &Arc<Authz>,
    slot: &Arc<CacheSlot>,
    prefix: Vec<u8>,
) -> Result<AbortOnDrop> {
    // A learner refuses what the cache and the auth checks need (Watch, linearizable
    // reads, AuthStatus): until etcd promotes it, every call is forwarded and etcd
    // answers it (as grpc-proxy forwards it); the cache starts once it is a voter.
    let learner = upstream.status().await.is_ok_and(|s| s.is_learner);
    let followed = if learner {
        tracing::warn!(
            "the etcd member behind --endpoints is a learner: every call is forwarded to it \
             (it refuses watches and linearizable reads) until it is promoted; the cache \
             starts then"
        );
        let (config, upstream, authz, slot) = (
            config.clone(),
            upstream.clone(),
            authz.clone(),
            slot.clone(),
        );
        AbortOnDrop(tokio::spawn(async move {
            wait_promoted(&upstream, config.auth_check_interval).await;
            tracing::info!("the etcd member was promoted: starting the cache");
            match follow(&config, &upstream, &authz, &slot, prefix).await {
                // Keeps the tasks `follow` started until the server stops.
                Ok(tasks) => {
                    let _tasks = tasks;
                    std::future::pending::<()>().await;
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "after the promotion the cache cannot start; every call is forwarded"
                ),
            }
        }))
    } else {
        let tasks = follow(config, upstream, authz, slot, prefix).await?;
        if let Some(cache) = slot.get() {
            // A cache that etcd refuses (the proxy's user may not read the prefix) is a
            // start-up error, not an endless retry.
            match tokio::time::timeout(START_CHECK, cache.wait_ready()).await {
                Ok(Err(e)) if matches!(cache.status(), etcd_cache::CacheStatus::Failed { .. }) => {
                    return Err(Error::Cache(e));
                }
                Ok(_) => {}
                Err(_) => tracing::warn!(
                    ?START_CHECK,
                    "the cache is not ready yet; serving meanwhile (calls are forwarded)"
                ),
            }
        }
        if let Err(e) = upstream.status().await {
            tracing::warn!(error = %e, "Status toward etcd failed");
        }
        AbortOnDrop(tokio::spawn(async move {
            let _tasks = tasks;
            std::future::pending::<()>().await;
        }))
    };
    Ok(followed)
}

/// The services behind the limits, metrics and the HTTP/1.1 front.
type Router = tonic::transport::server::Router<
    tower::layer::util::Stack<
        CallsLayer,
        tower::layer::util::Stack<HttpFrontLayer, tower::layer::util::Identity>,
    >,
>;

/// Every etcd service on `state`, each with the message size limits, behind the HTTP/1.1
/// front (`/proxy/health`, `/metrics`) and the calls layer.
fn router(
    config: &Config,
    state: &Arc<State>,
    front: HttpFrontLayer,
    in_flight: InFlight,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Router {
    let (send, recv) = (config.max_send_bytes, config.max_recv_bytes);
    macro_rules! limited {
        ($server:ident, $svc:expr) => {
            $server::new($svc)
                .max_decoding_message_size(recv)
                .max_encoding_message_size(send)
        };
    }
    // Windows sized so that h2's small-frame guard never closes a connection that etcd
    // would keep (grpc-go clients pipelining thousands of tiny requests): see conn.rs.
    let builder = crate::conn::http2(Server::builder())
        .max_concurrent_streams(config.max_concurrent_streams)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        // `/proxy/health` and `/metrics` over HTTP/1.1, as grpc-proxy (`http_front.rs`).
        .accept_http1(true);
    builder
        .layer(front)
        .layer(CallsLayer { in_flight })
        .add_service(limited!(KvServer, KvService::new(state.clone())))
        .add_service(limited!(WatchServer, WatchService::new(state.clone())))
        .add_service(limited!(LeaseServer, LeaseService::new(state.clone())))
        .add_service(limited!(ClusterServer, ClusterService::new(state.clone())))
        .add_service(limited!(
            MaintenanceServer,
            MaintenanceService::new(state.clone())
        ))
        .add_service(limited!(AuthServer, AuthService::new(state.clone())))
        .add_service(limited!(
            ElectionServer,
            ElectionService::new(state.clone())
        ))
        .add_service(limited!(LockServer, LockService::new(state.clone())))
        .add_service(health_service)
}

/// The client port, `--listen-addr`.
async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })
}

/// Serves `router` on `listener` (`--listen-addr`) until SIGTERM or SIGINT (registered
/// meanwhile with `--resolver-prefix`), then shuts down gracefully within
/// `--shutdown-timeout`.
async fn serve(
    config: Config,
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: &Arc<State>,
    in_flight: InFlight,
    (shutdown_tx, shutdown_rx): (watch::Sender<bool>, watch::Receiver<bool>),
) -> Result<()> {
    let local = listener.local_addr().map_err(|source| Error::Listen {
        addr: config.listen_addr,
        source,
    })?;
    tracing::info!(addr = %local, "serving etcd's v3 gRPC API");
    // Registered once it serves; deregistered when it stops (`register.rs`).
    let registration = match (&config.resolver_prefix, &config.advertise_client_url) {
        (Some(prefix), Some(url)) => Some(Registration::start(
            state.upstream.clone(),
            prefix.clone(),
            url.clone(),
            config.resolver_ttl,
        )),
        _ => None,
    };

    let mut signalled = shutdown_rx.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = shutdown_tx.send(true);
    });
    let serve = router.serve_with_incoming_shutdown(
        conn::incoming(
            listener,
            tls,
            config.max_connections,
            config.max_queued_watch_request_bytes,
            config.max_queued_watch_request_bytes_total,
        ),
        async move {
            let _ = signalled.wait_for(|s| *s).await;
            tracing::info!("shutting down: streams end, calls in flight finish");
        },
    );
    tokio::pin!(serve);
    let mut stopping = shutdown_rx.clone();
    let timeout = config.shutdown_timeout;
    tokio::select! {
        r = &mut serve => r.map_err(Error::Serve)?,
        _ = async {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(timeout).await;
        } => {
            tracing::warn!(in_flight = in_flight.get(), ?timeout, "shutdown timeout: exiting with calls in flight");
        }
    }
    if let Some(r) = registration {
        r.stop().await;
    }
    Ok(())
}

/// Learns etcd's auth state (retried until etcd answers; a refused certificate is an
/// error), authenticates the proxy's user when auth is on, checks its identity, and starts
/// the cache in `slot` with the tasks that keep all of it current (returned: they stop
/// when dropped).
async fn follow(
    config: &Config,
    upstream: &Arc<Upstream>,
    authz: &Arc<Authz>,
    slot: &Arc<CacheSlot>,
    cache_prefix: Vec<u8>,
) -> Result<Vec<AbortOnDrop>> {
    // etcd's auth state decides how the cache follows etcd and who may be served what.
    let mut retry = upstream::StartRetry::new();
    let auth_on = loop {
        match authz.learn().await {
            Ok(on) => break on,
            // etcd's certificate is refused (not signed by --cacert, a CA used as a
            // server certificate, ...): no retry can change that.
            Err(e) if e.message().contains("invalid peer certificate") => {
                let hint = if e.message().contains("CaUsedAsEndEntity") {
                    // etcd's --auto-tls makes exactly such a certificate.
                    "etcd serves a CA certificate as its own, as etcd's --auto-tls makes it; \
                     give etcd a certificate signed by the CA of --cacert (or, for tests only, \
                     pass --insecure-skip-tls-verify)"
                } else {
                    "check --cacert and --upstream-server-name"
                };
                return Err(Error::UpstreamCertificate {
                    reason: e.message().to_string(),
                    hint,
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot learn etcd's auth state yet; retrying");
                retry.wait().await;
            }
        }
    };
    tracing::info!(
        auth = auth_on,
        "etcd's auth is {}",
        if auth_on { "on" } else { "off" }
    );
    if auth_on {
        upstream
            .authenticate()
            .await
            .map_err(|s| Error::Authenticate {
                user: config.credentials().map(|c| c.0).unwrap_or_default(),
                status: s,
            })?;
    }
    crate::authz::check_upstream_identity(upstream, config).await?;
    let auth_poll = AbortOnDrop(authz.spawn_poll(config.auth_check_interval));
    let supervisor = AbortOnDrop(slot.start(config, authz.clone(), cache_prefix).await?);
    let identity = AbortOnDrop(upstream.spawn_identity_refresh());
    Ok(vec![auth_poll, supervisor, identity])
}

/// Returns once the member behind `up` is no longer a learner (Status, every
/// `interval`); a Status that fails is asked again.
async fn wait_promoted(upstream: &Upstream, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        if upstream.status().await.is_ok_and(|s| !s.is_learner) {
            return;
        }
    }
}

/// The gRPC health service says SERVING while the cache follows etcd, or while the
/// proxy forwards everything by design (etcd's auth is on and it has no identity);
/// `serving` says the same to `/proxy/health` (`http_front.rs`).
async fn follow_health(
    health: tonic_health::server::HealthReporter,
    serving_tx: watch::Sender<bool>,
    slot: std::sync::Arc<CacheSlot>,
    authz: std::sync::Arc<Authz>,
    config: Config,
) {
    let mut last = None;
    loop {
        let serving = match slot.get() {
            Some(cache) => cache.is_ready(),
            None => slot.forwarding_by_design(&authz, &config),
        };
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            health.set_service_status("", status).await;
            serving_tx.send_replace(serving);
            last = Some(status);
        }
        tokio::time::sleep(HEALTH_POLL).await;
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}

/// Aborts a background task when the server stops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
