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
mod check;
mod list;
mod versions;

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::history::HistoryWriter;
use crate::metrics::Cause;
use crate::progress::RequestSchedule;
use crate::shared::Shared;
use crate::status::CacheStatus;
use crate::subscribers::mailbox::End;
use crate::upstream::{bounded, UpstreamWatch, WatchMsg};
use crate::view::Publisher;
use apply::Writer;
use versions::ServerVersions;

/// A re-list sooner than this after the previous one backs off first.
const RELIST_QUIET: Duration = Duration::from_secs(1);

/// Upstream messages already received that are applied before consumers are woken.
const DRAIN_READY: usize = 64;

/// How long the liveness check of a silent upstream may take.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(5);

/// A session that stayed up this long resets the reconnect backoff (at least; the
/// configured longest backoff if that is longer). A session that breaks sooner (a
/// flapping upstream, a watch that is compacted right after it is created) makes the
/// next delay grow.
const HEALTHY_AFTER: Duration = Duration::from_secs(1);

/// Connections closed by the server right after they were made, in a row and before etcd
/// ever answered the cache, after which the cache stops with
/// [`Error::ClosedAtConnect`]: etcd refusing a missing or untrusted client certificate
/// over TLS, whose alert the client only sometimes reads (fewer times the busier the
/// machine). etcd down is a refused connect, which does not count; one close at a time
/// is any broken connection, and a cache that was answered once never counts them.
const CLOSED_AT_CONNECT_LIMIT: u32 = 5;

/// Why a session ended.
enum SessionEnd {
    Shutdown,
    /// The consistency check found the store different from etcd: list again.
    Repair,
    /// The resume revision is gone: list again.
    Compacted(i64),
    /// Transport or server error: back off and resume.
    Broken(Error),
}

/// Runs until shutdown, or until etcd refuses the cache for good.
pub(crate) async fn run(
    shared: Arc<Shared>,
    publisher: Publisher,
    history: HistoryWriter,
    shutdown: watch::Receiver<bool>,
) {
    let prefix = String::from_utf8_lossy(&shared.config().prefix).into_owned();
    let span = info_span!("etcd_cache", prefix = %prefix);
    let repair = Arc::new(tokio::sync::Notify::new());
    let _check = shared.config().consistency_check.map(|period| {
        AbortOnDrop(tokio::spawn(
            check::run(shared.clone(), period, repair.clone()).instrument(span.clone()),
        ))
    });
    let _compaction = shared.config().follow_etcd_compaction.then(|| {
        AbortOnDrop(tokio::spawn(
            check::keep_compaction_current(shared.clone()).instrument(span.clone()),
        ))
    });
    Follower {
        writer: Writer::new(shared.clone(), publisher, history),
        versions: ServerVersions::start(shared.clone(), span.clone()),
        shared,
        need_list: true,
        repair,
        shutdown,
        schedule: RequestSchedule::default(),
        answered: false,
    }
    .run()
    .instrument(span)
    .await;
}

/// A background task of the follower, stopped with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Follower {
    shared: Arc<Shared>,
    writer: Writer,
    versions: ServerVersions,
    need_list: bool,
    /// Notified by the consistency check on a mismatch.
    repair: Arc<tokio::sync::Notify>,
    shutdown: watch::Receiver<bool>,
    /// When the next `RequestProgress` goes out.
    schedule: RequestSchedule,
    /// etcd answered the cache once (a list page or a watch creation).
    answered: bool,
}

impl Follower {
    async fn run(mut self) {
        let cfg = self.shared.config();
        let mut backoff = Backoff::new(cfg.backoff_initial, cfg.backoff_max);
        let healthy_after = HEALTHY_AFTER.max(cfg.backoff_max);
        let mut last_relist: Option<Instant> = None;
        let mut attempts = 0u32;
        // Sessions in a row that ended in a close right after the connect, before etcd
        // ever answered (see `CLOSED_AT_CONNECT_LIMIT`).
        let mut closed_at_connect = 0u32;
        loop {
            let started = Instant::now();
            let (end, confirmed) = self.session().await;
            if confirmed.is_some_and(|t| t.elapsed() >= healthy_after) {
                backoff.reset();
                attempts = 0;
            }
            let end = match end {
                SessionEnd::Broken(e) if !self.answered && e.is_closed_after_connect() => {
                    closed_at_connect += 1;
                    if closed_at_connect >= CLOSED_AT_CONNECT_LIMIT {
                        SessionEnd::Broken(Error::ClosedAtConnect {
                            attempts: closed_at_connect,
                            source: Arc::new(e),
                        })
                    } else {
                        SessionEnd::Broken(e)
                    }
                }
                other => {
                    closed_at_connect = 0;
                    other
                }
            };
            match end {
                SessionEnd::Shutdown => break,
                SessionEnd::Repair => self.repair().await,
                SessionEnd::Compacted(compact_revision) => {
                    self.shared.compaction().raise(compact_revision);
                    self.shared.metrics().disconnected(Cause::Compacted);
                    warn!(
                        revision = self.writer.applied(),
                        compact_revision, "resume revision compacted; re-listing"
                    );
                    // Behind a gap: the data cannot be vouched for until the re-list.
                    self.writer
                        .set_state(CacheStatus::Relisting { compact_revision });
                    self.need_list = true;
                    // Re-listing again right after a re-list (compaction outruns the
                    // list and the watch): back off instead of listing in a loop.
                    if last_relist.is_some_and(|t| t.elapsed() < RELIST_QUIET) {
                        let delay = backoff.next_delay();
                        if self.sleep(delay).await {
                            break;
                        }
                    }
                    last_relist = Some(Instant::now());
                }
                SessionEnd::Broken(e) if e.is_permanent_upstream_failure() => {
                    error!(error = %e, "etcd refused the cache; it stops (retrying would not help)");
                    let error = Arc::new(e);
                    self.shared
                        .subscribers()
                        .end_all(End::Failed(error.clone()));
                    self.writer.set_state(CacheStatus::Failed { error });
                    break;
                }
                SessionEnd::Broken(e) => {
                    self.shared.metrics().disconnected(match e {
                        _ if e.is_too_many_data_frames() => {
                            warn_too_many_data_frames(self.shared.config().own_channel);
                            Cause::TooManyDataFrames
                        }
                        Error::Upstream(_) => Cause::Etcd,
                        Error::Protocol { .. } => Cause::Protocol,
                        _ => Cause::Transport,
                    });
                    attempts += 1;
                    let delay = backoff.next_delay();
                    warn!(
                        revision = self.writer.applied(),
                        error = %e,
                        attempts,
                        session = ?started.elapsed(),
                        ?delay,
                        "upstream disconnected; reconnecting"
                    );
                    self.writer.set_state(CacheStatus::Reconnecting {
                        error: Arc::new(e),
                        attempts,
                    });
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

    /// Re-lists at the applied revision and replaces the store (the history and the
    /// subscribers stay); if etcd compacted that revision, the next session lists at
    /// the latest one, as after a compaction gap.
    async fn repair(&mut self) {
        let revision = self.writer.applied();
        self.writer.set_state(CacheStatus::Relisting {
            compact_revision: 0,
        });
        match list::list(&self.shared, revision).await {
            Ok((map, at)) if at == revision => {
                info!(revision, keys = map.len(), "repaired the store from etcd");
                self.writer.repair(map, revision);
            }
            Ok(_) | Err(_) => {
                warn!(
                    revision,
                    "could not re-list at the cache's revision; listing the latest"
                );
                self.need_list = true;
            }
        }
    }

    /// Sleeps for `delay`; true if shutdown came first.
    async fn sleep(&self, delay: Duration) -> bool {
        let mut sd = self.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => false,
            _ = sd.wait_for(|s| *s) => true,
        }
    }

    /// One session: (re-)list if needed, watch, follow. Returns how it ended and when
    /// its watch was confirmed, if it was.
    async fn session(&mut self) -> (SessionEnd, Option<Instant>) {
        let mut sd = self.shutdown.clone();
        let mut confirmed = None;
        let end = tokio::select! {
            biased;
            _ = sd.wait_for(|s| *s) => SessionEnd::Shutdown,
            end = self.connect_and_follow(&mut confirmed) => end,
        };
        (end, confirmed)
    }

    async fn connect_and_follow(&mut self, confirmed: &mut Option<Instant>) -> SessionEnd {
        let config = self.shared.config();
        let upstream = self.shared.upstream().clone();
        // A new connection may reach other members: trust progress answers again only
        // once the versions have been probed anew (in the background).
        self.versions.recheck();

        if self.need_list {
            match list::list(&self.shared, 0).await {
                Ok((map, revision)) => {
                    self.answered = true;
                    self.shared.counters().heard();
                    self.shared.counters().saw_cluster_revision(revision);
                    self.writer.install(map, revision);
                    self.need_list = false;
                }
                Err(e) => return SessionEnd::Broken(e),
            }
        }
        let start = self.writer.applied() + 1;
        let mut watch = match bounded(
            config.upstream_idle_timeout,
            "the watch request",
            upstream.watch(self.shared.range().clone(), start),
        )
        .await
        {
            Ok(w) => w,
            Err(e) => return SessionEnd::Broken(e),
        };
        // Wait for the watch to be confirmed: etcd sends that first.
        match bounded(
            config.upstream_idle_timeout,
            "the watch creation",
            watch.message(),
        )
        .await
        {
            Ok(Some(WatchMsg::Created)) => {
                self.answered = true;
                self.shared.counters().set_identity(watch.header());
            }
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
        *confirmed = Some(Instant::now());
        self.shared.counters().connected();
        self.shared.metrics().connected();
        self.shared.counters().heard();
        info!(
            revision = self.writer.applied(),
            start_revision = start,
            member = format_args!("{:x}", watch.header().member_id),
            "upstream watch confirmed"
        );
        self.writer.set_state(CacheStatus::Ready);
        let end = self.follow(watch.as_mut()).await;
        self.writer.wake_consumers();
        end
    }

    async fn follow(&mut self, watch: &mut dyn UpstreamWatch) -> SessionEnd {
        let idle = self.shared.config().upstream_idle_timeout;
        // A request sent on an earlier stream is not answered on this one.
        self.schedule.answered();
        let mut last_heard = Instant::now();
        let shared = self.shared.clone();
        let mut trust_changes = self.versions.subscribe();
        loop {
            // Consumers are woken once per burst of upstream messages, not per revision.
            self.writer.wake_consumers();
            let next_request = self.schedule.next(
                shared.progress(),
                shared.counters().progress_trusted(),
                shared.config().progress_request_interval,
            );
            tokio::select! {
                biased;
                msg = watch.message() => {
                    last_heard = Instant::now();
                    shared.counters().heard();
                    shared.metrics().heard();
                    shared.counters().set_identity(watch.header());
                    if let Some(end) = self.handle(msg) {
                        return end;
                    }
                    // Take what is already here before waking anyone.
                    for _ in 0..DRAIN_READY {
                        let Some(msg) = watch.message().now_or_never() else {
                            break;
                        };
                        if let Some(end) = self.handle(msg) {
                            return end;
                        }
                    }
                },
                _ = tokio::time::sleep_until(last_heard + idle) => {
                    // A silent stream may be a quiet prefix or a dead connection that
                    // nothing reported (no keep-alive): one cheap unary call tells.
                    let check = shared.upstream().current_revision(shared.range().clone());
                    match tokio::time::timeout(idle.min(LIVENESS_TIMEOUT), check).await {
                        Ok(Ok(revision)) => {
                            last_heard = Instant::now();
                            shared.counters().heard();
                            shared.counters().saw_cluster_revision(revision);
                        }
                        Ok(Err(e)) => return SessionEnd::Broken(e),
                        Err(_) => return SessionEnd::Broken(Error::transport(format!(
                            "the upstream watch was silent for {idle:?} (upstream_idle_timeout) and a liveness check did not answer within {:?}",
                            idle.min(LIVENESS_TIMEOUT)
                        ))),
                    }
                }
                _ = async { tokio::time::sleep_until(next_request.unwrap_or_else(Instant::now)).await }, if next_request.is_some() => {
                    if shared.progress().waiting() == 0 {
                        // The reads finished while the timer ran.
                        continue;
                    }
                    // Counted first: a read that starts waiting while it is sent needs
                    // the next one (counted after, its freshness would be cleared and
                    // it would wait a whole interval).
                    shared.progress().record_sent();
                    if let Err(e) = watch.request_progress().await {
                        return SessionEnd::Broken(e);
                    }
                    shared.metrics().progress_requested();
                    self.schedule.sent();
                }
                _ = shared.progress().wake.notified() => {
                    // A read started waiting: look again.
                }
                _ = trust_changes.changed() => {
                    // The trust in progress answers changed: look again.
                }
                _ = self.repair.notified() => return SessionEnd::Repair,
                _ = shared.hooks().wake.notified() => {
                    self.writer.corrupt(shared.hooks().take());
                }
            }
        }
    }

    /// Handles one upstream message; `Some` ends the session.
    fn handle(&mut self, msg: Result<Option<WatchMsg>>) -> Option<SessionEnd> {
        match msg {
            Ok(Some(WatchMsg::Events(events))) => {
                if let Err(e) = self.writer.apply(events) {
                    return Some(SessionEnd::Broken(e));
                }
            }
            Ok(Some(WatchMsg::Progress {
                revision,
                requested,
            })) => {
                self.shared.counters().saw_cluster_revision(revision);
                if requested {
                    self.schedule.answered();
                }
                let used = !requested || self.shared.counters().progress_trusted();
                if requested {
                    self.shared.metrics().progress_answered(used);
                }
                if !used {
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

/// Warns, once per process, that the client's own h2 closed the connection to etcd
/// because too many small DATA frames sat unread (`own_channel`: the cache connected the
/// client itself, with [`EtcdChannel`](crate::EtcdChannel)'s windows).
fn warn_too_many_data_frames(own_channel: bool) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if own_channel {
            warn!(
                "the connection to etcd was closed by this process's own HTTP/2 stack \
                 (h2 too_many_data_frames: more small watch responses sat unread than its \
                 budget allows); the cache reconnects and resumes"
            );
        } else {
            warn!(
                "the connection to etcd was closed by this process's own HTTP/2 stack \
                 (h2 too_many_data_frames: more small watch responses sat unread than its \
                 budget allows, after a stall), failing every call on it; connect the \
                 etcd_client::Client with Client::connect_with_balanced_channel(.., \
                 etcd_cache::EtcdChannel::new()) (CacheBuilder::connect does), whose \
                 windows keep it open; see docs/RELIABILITY.md"
            );
        }
    });
}
