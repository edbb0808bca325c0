//! The per-member version probe, in the background: whether etcd's answers to a
//! stream-level `RequestProgress` may be trusted (etcd#15220, etcd#17507).
//!
//! Trust needs every member on a fixed version (>= 3.4.31 / 3.5.13), because the
//! cache cannot tell which member serves its watch. The probe runs off the reconnect
//! path, so a black-holed member costs the follower nothing: after every reconnect the
//! answers are untrusted until a fresh probe says otherwise (a reconnect may reach a
//! member that was just replaced), and the probe repeats every [`REFRESH`], so a
//! rolling upgrade moves the cache to the fast path without a restart once the last
//! member is fixed. A member whose version cannot be learned counts as not fixed, is
//! logged at warn level and counted in `CacheStats::unknown_versions`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn};

use crate::config::ProgressTrust;
use crate::shared::Shared;
use crate::upstream::version_trusts_progress;

/// How often the versions are probed again while the cache runs.
pub(super) const REFRESH: Duration = Duration::from_secs(30);

/// How soon a probe that failed is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// How long one probe of every member may take.
const PROBE_LIMIT: Duration = Duration::from_secs(10);

/// The background probe and what the follower sees of it.
pub(super) struct ServerVersions {
    shared: Arc<Shared>,
    recheck: Arc<Notify>,
    trust: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ServerVersions {
    /// Starts probing (for [`ProgressTrust::Auto`]); the other settings fix the trust.
    pub(super) fn start(shared: Arc<Shared>, span: tracing::Span) -> Self {
        let fixed = match shared.config().progress_trust {
            ProgressTrust::Always => Some(true),
            ProgressTrust::Never => Some(false),
            _ => None,
        };
        let trust = watch::Sender::new(fixed.unwrap_or(false));
        shared
            .counters()
            .set_progress_trusted(fixed.unwrap_or(false));
        let recheck = Arc::new(Notify::new());
        let task = fixed.is_none().then(|| {
            let probe = probe_loop(shared.clone(), recheck.clone(), trust.clone());
            tokio::spawn(tracing::Instrument::instrument(probe, span))
        });
        ServerVersions {
            shared,
            recheck,
            trust,
            task,
        }
    }

    /// Untrusts progress answers until a fresh probe (started now) trusts them again.
    pub(super) fn recheck(&self) {
        if self.task.is_some() {
            self.shared.counters().set_progress_trusted(false);
            self.trust.send_replace(false);
            self.recheck.notify_one();
        }
    }

    /// A receiver that changes whenever the trust does.
    pub(super) fn subscribe(&self) -> watch::Receiver<bool> {
        self.trust.subscribe()
    }
}

impl Drop for ServerVersions {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn probe_loop(shared: Arc<Shared>, recheck: Arc<Notify>, trust: watch::Sender<bool>) {
    // The first probe comes with the first session's recheck.
    recheck.notified().await;
    // The verdict last logged at info: a new or changed one is worth an operator's eye.
    let mut told: Option<bool> = None;
    loop {
        let next = match tokio::time::timeout(PROBE_LIMIT, shared.upstream().versions()).await {
            Ok(Ok(versions)) => {
                let unknown: Vec<&String> = versions
                    .iter()
                    .filter(|v| v.starts_with("unreachable:"))
                    .collect();
                if !unknown.is_empty() {
                    warn!(
                        ?unknown,
                        "could not learn the etcd version of some members; progress answers are not trusted (consistent reads are slower, never wrong)"
                    );
                }
                let ok =
                    !versions.is_empty() && versions.iter().all(|v| version_trusts_progress(v));
                if told == Some(ok) {
                    debug!(?versions, trusted = ok, "server versions");
                } else {
                    info!(?versions, trusted = ok, "server versions");
                    told = Some(ok);
                }
                shared.counters().set_versions(versions);
                shared.counters().set_progress_trusted(ok);
                trust.send_replace(ok);
                REFRESH
            }
            Ok(Err(e)) => {
                debug!(error = %e, "version probe failed; progress answers stay untrusted");
                RETRY
            }
            Err(_) => {
                debug!(limit = ?PROBE_LIMIT, "version probe timed out; progress answers stay untrusted");
                RETRY
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = recheck.notified() => {}
        }
    }
}
