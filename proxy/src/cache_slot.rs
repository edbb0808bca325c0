//! The cache the proxy serves from, built on the proxy's own identity for etcd's auth
//! state, and built again when that state makes the current one wrong.
//!
//! - Auth off: the cache's client carries no user (etcd refuses to authenticate while
//!   auth is off), whether or not `--user` is given.
//! - Auth on: with `--user`, the client authenticates as that user; with a client
//!   certificate, etcd takes its CN; with neither, there is no identity to follow etcd
//!   with, and every call is forwarded, as etcd's grpc-proxy forwards it.
//!
//! A cache that stops for good (etcd refused it: the proxy's user lost its read
//! permission, auth was turned on under an anonymous cache) is replaced after
//! [`REBUILD_AFTER`] by one for the auth state of that moment; meanwhile everything is
//! forwarded, so clients get etcd's answers, never a stale cache's. Watch streams on
//! the old cache end with `Unavailable`, and clients resume on the new one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use etcd_cache::{Cache, CacheStatus};

use crate::authz::Authz;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::upstream::Upstream;

/// Pause before a cache that stopped for good is built again.
const REBUILD_AFTER: Duration = Duration::from_secs(2);

/// Which identity a cache follows etcd with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Identity {
    /// No user: auth is off.
    Anonymous,
    /// `--user` (auth on).
    User,
    /// The client certificate's CN (auth on, no `--user`).
    Certificate,
}

/// The current cache, if there is one that can serve.
pub(crate) struct CacheSlot {
    current: ArcSwapOption<(Cache, Identity)>,
    /// Set by [`close`](CacheSlot::close): no cache is built again after it.
    closed: AtomicBool,
}

impl CacheSlot {
    /// The cache to serve from: `None` while there is none that can (auth on and no
    /// identity, or a replacement being built). Callers forward to etcd then.
    pub(crate) fn get(&self) -> Option<Cache> {
        let cur = self.current.load();
        let (cache, _) = cur.as_deref()?;
        match cache.status() {
            CacheStatus::Failed { .. } | CacheStatus::Closed => None,
            _ => Some(cache.clone()),
        }
    }

    /// Whether the proxy forwards everything because it has no identity for etcd's
    /// auth (the health service says SERVING then: etcd answers every call).
    pub(crate) fn forwarding_by_design(&self, authz: &Authz, config: &Config) -> bool {
        self.current.load().is_none() && wanted(authz, config).is_none()
    }

    /// A slot without a cache: everything is forwarded until [`CacheSlot::start`].
    pub(crate) fn empty() -> Arc<CacheSlot> {
        Arc::new(CacheSlot {
            current: ArcSwapOption::empty(),
            closed: AtomicBool::new(false),
        })
    }

    /// Builds the first cache for etcd's auth state (learned by `authz`), and starts
    /// the task that replaces it when needed.
    pub(crate) async fn start(
        self: &Arc<Self>,
        config: &Config,
        authz: Arc<Authz>,
        cache_prefix: Vec<u8>,
    ) -> Result<tokio::task::JoinHandle<()>> {
        let slot = self.clone();
        match wanted(&authz, config) {
            Some(id) => {
                let cache = build(config, authz.upstream(), id, &cache_prefix).await?;
                slot.current.store(Some(Arc::new((cache, id))));
            }
            None => tracing::warn!(
                "etcd's auth is on and the proxy has no identity of its own (--user or a \
                 client certificate with a CN): nothing is cached, every call is forwarded to etcd"
            ),
        }
        let task = tokio::spawn(supervise(
            Arc::downgrade(&slot),
            config.clone(),
            authz,
            cache_prefix,
        ));
        Ok(task)
    }

    /// Closes the current cache for good (shutdown): none is built again, so a stopping
    /// proxy lists nothing and opens no watch on etcd.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(cur) = self.current.swap(None) {
            cur.0.close().await;
        }
    }
}

/// The identity a cache should have now; `None`: no cache can follow etcd.
fn wanted(authz: &Authz, config: &Config) -> Option<Identity> {
    if !authz.enabled() {
        Some(Identity::Anonymous)
    } else if config.credentials().is_some() {
        Some(Identity::User)
    } else if config.cert.is_some() && config.upstream_tls() {
        Some(Identity::Certificate)
    } else {
        None
    }
}

/// Replaces the cache when it stopped for good or no longer has the right identity.
async fn supervise(
    slot: std::sync::Weak<CacheSlot>,
    config: Config,
    authz: Arc<Authz>,
    prefix: Vec<u8>,
) {
    let mut epoch = authz.epoch();
    loop {
        let Some(s) = slot.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let cur = s.current.load_full();
        let want = wanted(&authz, &config);
        let (stopped, have) = match cur.as_deref() {
            Some((cache, id)) => (
                matches!(cache.status(), CacheStatus::Failed { .. }),
                Some(*id),
            ),
            None => (false, None),
        };
        if stopped || have != want {
            if let Some((cache, _)) = cur.as_deref() {
                if let CacheStatus::Failed { error } = cache.status() {
                    tracing::error!(error = %error, "the cache stopped; forwarding everything until it is built again");
                }
            }
            // Nothing is served from a cache with the wrong identity meanwhile.
            if let Some(old) = s.current.swap(None) {
                old.0.close().await;
            }
            if let Some(id) = want {
                tokio::time::sleep(if stopped {
                    REBUILD_AFTER
                } else {
                    Duration::ZERO
                })
                .await;
                match build(&config, authz.upstream(), id, &prefix).await {
                    Ok(cache) if s.closed.load(Ordering::Acquire) => {
                        cache.close().await;
                        return;
                    }
                    Ok(cache) => {
                        tracing::info!(identity = ?id, "cache built again");
                        s.current.store(Some(Arc::new((cache, id))));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "building the cache failed; retrying");
                        drop(s);
                        tokio::time::sleep(REBUILD_AFTER).await;
                        continue;
                    }
                }
            } else {
                tracing::warn!("etcd's auth is on and the proxy has no identity of its own: every call is forwarded to etcd");
            }
            continue;
        }
        let status = cur.as_deref().map(|(c, _)| c.status_stream());
        drop(s);
        drop(cur);
        tokio::select! {
            _ = epoch.changed() => {}
            _ = failed(status) => {}
        }
    }
}

/// Resolves when the cache behind `status` has stopped for good.
async fn failed(status: Option<etcd_cache::StatusStream>) {
    let Some(mut status) = status else {
        return futures::future::pending().await;
    };
    while let Some(s) = status.next().await {
        if matches!(s, CacheStatus::Failed { .. } | CacheStatus::Closed) {
            return;
        }
    }
}

/// A cache following etcd as `id`; retried until etcd answers. Its client dials the
/// endpoints forwarded calls use (those of `--endpoints`, or the members
/// `--endpoints-auto-sync-interval` last learned) and follows their changes.
async fn build(config: &Config, upstream: &Upstream, id: Identity, prefix: &[u8]) -> Result<Cache> {
    let options = connect_options(config, id)?;
    let mut changes = upstream.endpoint_changes();
    let endpoints = changes.borrow_and_update().clone();
    let mut retry = crate::upstream::StartRetry::new();
    let client = loop {
        // The cache's HTTP/2 windows toward etcd (a stall of the proxy while etcd sends
        // many small events does not make h2 close the connection: too_many_data_frames),
        // and `--insecure-skip-tls-verify`.
        let connect = etcd_client::Client::connect_with_balanced_channel(
            &endpoints,
            Some(options.clone()),
            crate::upstream::CacheChannel::new(config)?,
        );
        match connect.await {
            Ok(c) => break c,
            Err(e) if is_permanent(&e) => {
                return Err(Error::Cache(etcd_cache::Error::Upstream(e)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach etcd yet; retrying");
                retry.wait().await;
            }
        }
    };
    let cache = Cache::builder(client.clone())
        // The cache's own dials (its per-member version probe) use the same TLS and
        // credentials.
        .connect_options(options)
        .prefix(prefix.to_vec())
        .history_window(config.history_window)
        .history_bytes(config.history_bytes)
        // A burst its clients cannot keep up with is caught up from memory, within
        // --history-bytes, rather than from etcd one watch at a time.
        .keep_history_while_lagging(true)
        .subscriber_buffer(config.subscriber_buffer)
        .max_watchers(config.max_watches)
        .progress_notify_interval(config.progress_notify_interval)
        // Below etcd's compaction the proxy lets etcd answer (`State::compacted` asks
        // before the cache is used), so the cache need not ask again.
        .follow_etcd_compaction(false)
        .build()
        .await
        .map_err(Error::Cache)?;
    tokio::spawn(follow_endpoints(
        client,
        endpoints,
        changes,
        cache.status_stream(),
    ));
    Ok(cache)
}

/// Gives the cache's client every change of the endpoints (`--endpoints-auto-sync-interval`)
/// until the cache stops: without it the cache would stay on the members of `--endpoints`
/// and be unready while they are down, though forwarded calls reach the others.
async fn follow_endpoints(
    client: etcd_client::Client,
    mut have: Vec<String>,
    mut changes: tokio::sync::watch::Receiver<Vec<String>>,
    status: etcd_cache::StatusStream,
) {
    let ended = failed(Some(status));
    tokio::pin!(ended);
    loop {
        tokio::select! {
            _ = &mut ended => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        let want = changes.borrow_and_update().clone();
        for url in want.iter().filter(|u| !have.contains(u)) {
            if let Err(e) = client.add_endpoint(url).await {
                tracing::warn!(endpoint = %url, error = %e, "the cache's client cannot add the endpoint");
            }
        }
        for url in have.iter().filter(|u| !want.contains(u)) {
            if let Err(e) = client.remove_endpoint(url).await {
                tracing::warn!(endpoint = %url, error = %e, "the cache's client cannot remove the endpoint");
            }
        }
        tracing::debug!(endpoints = ?want, "the cache's client follows the synced endpoints");
        have = want;
    }
}

/// A refusal that connecting again cannot change (bad password).
fn is_permanent(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("authentication failed"))
}

/// How the cache connects to etcd: the proxy's TLS, and its user when auth is on.
fn connect_options(config: &Config, id: Identity) -> Result<etcd_client::ConnectOptions> {
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(10));
    if id == Identity::User {
        if let Some((name, password)) = config.credentials() {
            options = options.with_user(name, password);
        }
    }
    if let Some(tls) = crate::upstream::client_tls(config)? {
        options = options.with_tls(tls);
    }
    Ok(options)
}
