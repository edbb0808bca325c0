//! The follower: the one task that owns the upstream. It lists the prefix, follows it
//! with one watch, and is the only writer of the store, the history and the published
//! view.
//!
//! - this file: the session loop (server versions, backoff, liveness, progress
//!   requests);
//! - [`list`]: the paged list;
//! - [`apply`]: the single writer (store, history, subscribers, publish).
//!
//! ## Recovery
//! When the upstream watch breaks (etcd restarted, member lost, connection cut), the
//! follower marks the cache not ready, waits with exponential backoff and jitter, and
//! watches again from its last applied revision + 1. Events at or below the applied
//! revision are dropped, so subscribers see no duplicate, and nothing in between is
//! skipped, so they see no gap. If etcd answers that the resume revision was
//! compacted, the follower lists the prefix again; subscribers whose position falls in
//! the unrecoverable gap get the compaction signal (see [`apply::Writer::install`]).

mod apply;
mod list;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::backoff::Backoff;
use crate::config::{Config, ProgressTrust};
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::subscribers::mailbox::End;
use crate::upstream::{version_trusts_progress, UpstreamWatch, WatchMsg};
use apply::Writer;

/// A re-list sooner than this after the previous one backs off first.
const RELIST_QUIET: Duration = Duration::from_secs(1);

/// Upstream messages already received that are applied before consumers are woken.
const DRAIN_READY: usize = 64;

/// How long a liveness probe of a silent upstream may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// An upstream call that must answer within `upstream_idle_timeout`: a connection that
/// died without a reset must not stall the cache forever.
pub(super) async fn bounded<T>(
    config: &Config,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    let limit = config.upstream_idle_timeout;
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Error::transport(format!(
            "etcd did not answer {what} within {limit:?} (upstream_idle_timeout)"
        )))
    })
}

/// Why a session ended.
enum SessionEnd {
    Shutdown,
    /// The resume revision is gone: list again.
    Compacted(i64),
    /// Transport or server error: back off and resume.
    Broken(Error),
}

/// Ends every stream and marks the cache closed when the task ends, also by a panic,
/// so that no waiter and no stream is left hanging.
struct CloseOnExit(Arc<Shared>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        self.0.subscribers.end_all(End::Closed);
        self.0.update_status(|s| {
            s.ready = false;
            s.closed = true;
        });
    }
}

/// Runs until shutdown.
pub(crate) async fn run(shared: Arc<Shared>, shutdown: watch::Receiver<bool>) {
    let _close = CloseOnExit(shared.clone());
    let prefix = String::from_utf8_lossy(&shared.config.prefix).into_owned();
    let span = info_span!("etcd_cache", prefix = %prefix);
    Follower {
        writer: Writer::new(shared.clone()),
        shared,
        need_list: true,
        shutdown,
        request_sent: None,
    }
    .run()
    .instrument(span)
    .await;
}

struct Follower {
    shared: Arc<Shared>,
    writer: Writer,
    need_list: bool,
    shutdown: watch::Receiver<bool>,
    /// When the unanswered `RequestProgress` was sent, if one is outstanding.
    request_sent: Option<Instant>,
}

impl Follower {
    async fn run(mut self) {
        let cfg = &self.shared.config;
        let mut backoff = Backoff::new(cfg.backoff_initial, cfg.backoff_max);
        let mut last_relist: Option<Instant> = None;
        loop {
            match self.session(&mut backoff).await {
                SessionEnd::Shutdown => break,
                SessionEnd::Compacted(compact_revision) => {
                    warn!(
                        revision = self.writer.applied(),
                        compact_revision, "resume revision compacted; re-listing"
                    );
                    // Behind a gap: the data cannot be vouched for until the re-list.
                    self.set_ready(false);
                    self.need_list = true;
                    // Re-listing again right after a re-list (aggressive compaction): back
                    // off instead of listing the prefix in a tight loop.
                    if last_relist.is_some_and(|t| t.elapsed() < RELIST_QUIET) {
                        let delay = backoff.next_delay();
                        if self.sleep(delay).await {
                            break;
                        }
                    }
                    last_relist = Some(Instant::now());
                }
                SessionEnd::Broken(e) => {
                    let delay = backoff.next_delay();
                    warn!(revision = self.writer.applied(), error = %e, ?delay, "upstream disconnected; reconnecting");
                    self.set_ready(false);
                    if self.sleep(delay).await {
                        break;
                    }
                }
            }
            if *self.shutdown.borrow() {
                break;
            }
        }
        info!(revision = self.writer.applied(), "cache closed");
    }

    /// Sleeps for `delay`; true if shutdown came first.
    async fn sleep(&self, delay: Duration) -> bool {
        let mut sd = self.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => false,
            _ = sd.wait_for(|s| *s) => true,
        }
    }

    fn set_ready(&self, ready: bool) {
        self.shared.update_status(|s| s.ready = ready);
    }

    async fn session(&mut self, backoff: &mut Backoff) -> SessionEnd {
        let mut sd = self.shutdown.clone();
        tokio::select! {
            biased;
            _ = sd.wait_for(|s| *s) => SessionEnd::Shutdown,
            end = self.connect_and_follow(backoff) => end,
        }
    }

    /// Whether the servers' answers to `RequestProgress` may be trusted.
    async fn progress_trust(&self) -> Result<bool> {
        Ok(match self.shared.config.progress_trust {
            ProgressTrust::Always => true,
            ProgressTrust::Never => false,
            _ => {
                let versions = bounded(
                    &self.shared.config,
                    "the version probe",
                    self.shared.upstream.versions(),
                )
                .await?;
                let ok =
                    !versions.is_empty() && versions.iter().all(|v| version_trusts_progress(v));
                debug!(?versions, trusted = ok, "server versions");
                ok
            }
        })
    }

    async fn connect_and_follow(&mut self, backoff: &mut Backoff) -> SessionEnd {
        let config = &self.shared.config;
        let upstream = self.shared.upstream.clone();
        let trusted = match self.progress_trust().await {
            Ok(t) => t,
            Err(e) => return SessionEnd::Broken(e),
        };
        self.shared.counters.set_progress_trusted(trusted);

        if self.need_list {
            match list::list(&self.shared).await {
                Ok((map, revision)) => {
                    self.writer.install(map, revision);
                    self.need_list = false;
                }
                Err(e) => return SessionEnd::Broken(e),
            }
        }
        let start = self.writer.applied() + 1;
        let mut watch = match bounded(
            config,
            "the watch request",
            upstream.watch(self.shared.range.clone(), start),
        )
        .await
        {
            Ok(w) => w,
            Err(e) => return SessionEnd::Broken(e),
        };
        // Wait for the watch to be confirmed: etcd sends that first.
        match bounded(config, "the watch creation", watch.message()).await {
            Ok(Some(WatchMsg::Created)) => {}
            Ok(Some(WatchMsg::Canceled {
                compact_revision,
                reason,
            })) => {
                if compact_revision > 0 {
                    return SessionEnd::Compacted(compact_revision);
                }
                return SessionEnd::Broken(Error::protocol(format!("watch refused: {reason}")));
            }
            Ok(Some(other)) => {
                // Dropping this would be a silent gap, so start over instead.
                return SessionEnd::Broken(Error::protocol(format!(
                    "etcd sent {other:?} before confirming the watch"
                )));
            }
            Ok(None) => {
                return SessionEnd::Broken(Error::transport(
                    "the watch stream ended before the watch was created",
                ))
            }
            Err(e) => return SessionEnd::Broken(e),
        }
        self.shared.counters.connected();
        info!(
            revision = self.writer.applied(),
            start_revision = start,
            trusted,
            "upstream watch confirmed"
        );
        self.set_ready(true);
        backoff.reset();
        let end = self.follow(watch.as_mut(), trusted).await;
        self.writer.wake_consumers();
        end
    }

    async fn follow(&mut self, watch: &mut dyn UpstreamWatch, trusted: bool) -> SessionEnd {
        let interval = self.shared.config.progress_request_interval;
        let idle = self.shared.config.upstream_idle_timeout;
        self.request_sent = None;
        let mut last_heard = Instant::now();
        let shared = self.shared.clone();
        loop {
            // Consumers are woken once per burst of upstream messages, not per revision.
            self.writer.wake_consumers();
            let want_progress = trusted && shared.progress.waiting() > 0;
            // One request at a time serves every waiting read: send at once when none
            // is outstanding; re-send an unanswered one after the interval (etcd#17507).
            let next_request = match self.request_sent {
                None => Instant::now(),
                Some(sent) => sent + interval,
            };
            tokio::select! {
                biased;
                msg = watch.message() => {
                    last_heard = Instant::now();
                    if let Some(end) = self.handle(msg, trusted) {
                        return end;
                    }
                    // Take what is already here before waking anyone.
                    for _ in 0..DRAIN_READY {
                        let Some(msg) = watch.message().now_or_never() else {
                            break;
                        };
                        if let Some(end) = self.handle(msg, trusted) {
                            return end;
                        }
                    }
                },
                _ = tokio::time::sleep_until(last_heard + idle) => {
                    // A silent stream may be a quiet prefix or a dead connection that
                    // nothing reported (no keep-alive): one cheap unary call tells.
                    let probe = shared.upstream.current_revision(shared.range.clone());
                    match tokio::time::timeout(idle.min(PROBE_TIMEOUT), probe).await {
                        Ok(Ok(_)) => last_heard = Instant::now(),
                        Ok(Err(e)) => return SessionEnd::Broken(e),
                        Err(_) => return SessionEnd::Broken(Error::transport(format!(
                            "the upstream watch was silent for {idle:?} (upstream_idle_timeout) and a liveness probe did not answer within {:?}",
                            idle.min(PROBE_TIMEOUT)
                        ))),
                    }
                }
                _ = tokio::time::sleep_until(next_request), if want_progress => {
                    if shared.progress.waiting() == 0 {
                        // The reads finished while the timer ran.
                        continue;
                    }
                    if let Err(e) = watch.request_progress().await {
                        return SessionEnd::Broken(e);
                    }
                    shared.progress.record_sent();
                    self.request_sent = Some(Instant::now());
                }
                _ = shared.progress.wake.notified(), if !want_progress => {
                    // A read started waiting: look again.
                }
            }
        }
    }

    /// Handles one upstream message; `Some` ends the session.
    fn handle(&mut self, msg: Result<Option<WatchMsg>>, trusted: bool) -> Option<SessionEnd> {
        match msg {
            Ok(Some(WatchMsg::Events(events))) => self.writer.apply(events),
            Ok(Some(WatchMsg::Progress {
                revision,
                requested,
            })) => {
                if requested {
                    self.request_sent = None;
                }
                if requested && !trusted {
                    debug!(
                        revision,
                        "ignoring RequestProgress answer from a server with etcd#15220"
                    );
                } else {
                    self.writer.progress(revision);
                }
            }
            Ok(Some(WatchMsg::Created)) => {}
            Ok(Some(WatchMsg::Canceled {
                compact_revision,
                reason,
            })) => {
                if compact_revision > 0 {
                    return Some(SessionEnd::Compacted(compact_revision));
                }
                return Some(SessionEnd::Broken(Error::protocol(format!(
                    "etcd cancelled the watch: {reason}"
                ))));
            }
            Ok(None) => {
                return Some(SessionEnd::Broken(Error::transport(
                    "the upstream watch stream ended",
                )))
            }
            Err(e) => return Some(SessionEnd::Broken(e)),
        }
        None
    }
}
