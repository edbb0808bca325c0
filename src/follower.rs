//! The upstream task: the only writer of the store, the history and the revision.
//!
//! ## Recovery
//! When the upstream watch breaks (etcd restarted, member lost, connection cut), the
//! task marks the cache not ready, waits with exponential backoff and jitter, and
//! watches again from its last applied revision + 1. Events at or below the applied
//! revision are dropped, so subscribers see no duplicate, and nothing in between is
//! skipped, so they see no gap. If etcd answers that the resume revision was
//! compacted, the task lists the prefix again; subscribers whose position falls in the
//! unrecoverable gap end with `Compacted`. The others continue: those waiting for a
//! future revision, and those watching a single key that provably did not change in the
//! gap (present before and after with the same `mod_revision`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::FutureExt;
use imbl::OrdSet;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::backoff::Backoff;
use crate::cache::Shared;
use crate::config::ProgressTrust;
use crate::dispatch::End;
use crate::error::{Error, Result};
use crate::history::Batch;
use crate::key_range::KeyRange;
use crate::kv::{EventType, KeyValue};
use crate::store::{Entry, KvMap, Store};
use crate::upstream::{version_trusts_progress, UpstreamWatch, WatchMsg};

/// A re-list sooner than this after the previous one backs off first.
const RELIST_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// Upstream messages already received that are applied before consumers are woken.
const DRAIN_READY: usize = 64;

/// How long a liveness probe of a silent upstream may take.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A spawned page request that is cancelled if the list is abandoned.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
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
        self.0.end_all(End::Closed);
        self.0.status.send_modify(|s| {
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
        shared: shared.clone(),
        store: Store::default(),
        applied: 0,
        need_list: true,
        shutdown,
        wakers: Vec::new(),
        request_sent: None,
    }
    .run()
    .instrument(span)
    .await;
}

struct Follower {
    shared: Arc<Shared>,
    store: Store,
    /// Newest revision applied (mirrors `shared.revision`).
    applied: i64,
    need_list: bool,
    shutdown: watch::Receiver<bool>,
    /// Consumers to wake (collected while the index lock is held, woken after).
    wakers: Vec<std::task::Waker>,
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
                        revision = self.applied,
                        compact_revision, "resume revision compacted; re-listing"
                    );
                    // Behind a gap: the data cannot be vouched for until the re-list.
                    self.set_ready(false);
                    self.need_list = true;
                    // Re-listing again right after a re-list (aggressive compaction): back
                    // off instead of listing the prefix in a tight loop.
                    if last_relist.is_some_and(|t| t.elapsed() < RELIST_QUIET) {
                        let delay = backoff.next_delay();
                        let mut sd = self.shutdown.clone();
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = sd.wait_for(|s| *s) => break,
                        }
                    }
                    last_relist = Some(Instant::now());
                }
                SessionEnd::Broken(e) => {
                    let delay = backoff.next_delay();
                    warn!(revision = self.applied, error = %e, source = ?std::error::Error::source(&e), ?delay, "upstream disconnected; reconnecting");
                    self.set_ready(false);
                    let mut sd = self.shutdown.clone();
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = sd.wait_for(|s| *s) => break,
                    }
                }
            }
            if *self.shutdown.borrow() {
                break;
            }
        }
        info!(revision = self.applied, "cache closed");
    }

    /// An upstream call that must answer within `upstream_idle_timeout`: a connection
    /// that died without a reset must not stall the cache forever.
    async fn bounded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let limit = self.shared.config.upstream_idle_timeout;
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(Error::invalid(format!(
                "etcd did not answer within {limit:?} (upstream_idle_timeout)"
            )))
        })
    }

    fn set_ready(&self, ready: bool) {
        self.shared.status.send_if_modified(|s| {
            let changed = s.ready != ready;
            s.ready = ready;
            changed
        });
    }

    async fn session(&mut self, backoff: &mut Backoff) -> SessionEnd {
        let mut sd = self.shutdown.clone();
        tokio::select! {
            biased;
            _ = sd.wait_for(|s| *s) => SessionEnd::Shutdown,
            end = self.connect_and_follow(backoff) => end,
        }
    }

    async fn connect_and_follow(&mut self, backoff: &mut Backoff) -> SessionEnd {
        let upstream = self.shared.upstream.clone();
        // Server versions decide whether progress answers may be trusted.
        let trusted = match self.shared.config.progress_trust {
            ProgressTrust::Always => true,
            ProgressTrust::Never => false,
            _ => match self.bounded(upstream.versions()).await {
                Ok(versions) => {
                    let ok =
                        !versions.is_empty() && versions.iter().all(|v| version_trusts_progress(v));
                    debug!(?versions, trusted = ok, "server versions");
                    ok
                }
                Err(e) => return SessionEnd::Broken(e),
            },
        };
        self.shared.trust_progress.store(trusted, Ordering::Release);

        if self.need_list {
            if let Err(e) = self.list().await {
                return SessionEnd::Broken(e);
            }
        }
        let start = self.applied + 1;
        let mut watch = match self
            .bounded(upstream.watch(self.shared.range.clone(), start))
            .await
        {
            Ok(w) => w,
            Err(e) => return SessionEnd::Broken(e),
        };
        // Wait for the watch to be confirmed: etcd sends that first.
        match self.bounded(watch.message()).await {
            Ok(Some(WatchMsg::Created)) => {}
            Ok(Some(WatchMsg::Canceled {
                compact_revision,
                reason,
            })) => {
                if compact_revision > 0 {
                    return SessionEnd::Compacted(compact_revision);
                }
                return SessionEnd::Broken(Error::invalid(format!("watch refused: {reason}")));
            }
            Ok(Some(other)) => {
                // Dropping this would be a silent gap, so start over instead.
                return SessionEnd::Broken(Error::invalid(format!(
                    "etcd sent {other:?} before confirming the watch"
                )));
            }
            Ok(None) => {
                return SessionEnd::Broken(Error::invalid(
                    "watch stream ended before it was created",
                ))
            }
            Err(e) => return SessionEnd::Broken(e),
        }
        self.shared.connects.fetch_add(1, Ordering::Relaxed);
        info!(
            revision = self.applied,
            start_revision = start,
            trusted,
            "upstream watch confirmed"
        );
        self.set_ready(true);
        backoff.reset();
        let end = self.follow(watch.as_mut(), trusted).await;
        self.wake_consumers();
        end
    }

    /// Loads the prefix with a paged list at one revision and installs it.
    async fn list(&mut self) -> Result<()> {
        let upstream = self.shared.upstream.clone();
        let page_size = self.shared.config.page_size;
        let started = Instant::now();
        let mut map: KvMap = OrdSet::new();
        // The next page is requested before the current one is inserted, so etcd and
        // the insertion work at the same time.
        let fetch = |range: KeyRange, revision: i64| {
            let up = upstream.clone();
            AbortOnDrop(tokio::spawn(async move {
                up.list_page(range, revision, page_size).await
            }))
        };
        let mut pending = Some(fetch(self.shared.range.clone(), 0));
        let mut revision = 0;
        while let Some(mut task) = pending.take() {
            let page = self
                .bounded(async {
                    (&mut task.0)
                        .await
                        .map_err(|e| Error::invalid(format!("list task failed: {e}")))?
                })
                .await?;
            if revision == 0 {
                revision = page.revision;
            }
            if page.more {
                if let Some(last) = page.kvs.last() {
                    let mut next = last.0.key.to_vec();
                    next.push(0);
                    let range = KeyRange {
                        start: next.into(),
                        end: self.shared.range.end.clone(),
                    };
                    pending = Some(fetch(range, revision));
                }
            }
            for kv in page.kvs {
                map.insert(Entry(kv));
            }
        }
        self.shared.lists.fetch_add(1, Ordering::Relaxed);
        info!(revision, keys = map.len(), elapsed = ?started.elapsed(), "listed prefix");
        self.install(map, revision);
        Ok(())
    }

    /// Replaces the store with a fresh list at `revision`.
    fn install(&mut self, map: KvMap, revision: i64) {
        let first = !self.shared.status().loaded;
        let revision = revision.max(self.applied);
        let shared = self.shared.clone();
        let mut index = shared.index.lock();
        if !first {
            // Subscribers positioned before `revision` may have missed events in the gap,
            // unless they watch one key that exists before and after with the same
            // mod_revision: any put or delete in between would have changed it. (An absent
            // key proves nothing: it may have been created and deleted in the gap.)
            let mut gone = Vec::new();
            let mut kept = 0usize;
            for (id, shape, mailbox) in index.all() {
                if mailbox.last_rev() >= revision {
                    continue;
                }
                let unchanged = shape.range.is_single() && {
                    let key = &shape.range.start;
                    match (self.store.get(key), map.get(&key[..])) {
                        (Some(old), Some(new)) => old.0.mod_revision == new.0 .0.mod_revision,
                        _ => false,
                    }
                };
                if unchanged && mailbox.skip_to(revision) {
                    kept += 1;
                } else {
                    gone.push(id);
                }
            }
            for id in &gone {
                if let Some(mailbox) = index.remove(*id) {
                    if mailbox.end(End::Compacted(revision + 1)) {
                        shared.lagging.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            warn!(
                revision,
                compacted_watchers = gone.len(),
                kept_watchers = kept,
                "re-listed after a compaction gap"
            );
        }
        self.store.replace(map);
        shared.history.write().reset(revision);
        self.need_list = false;
        self.publish(revision);
        drop(index);
        shared.status.send_modify(|s| s.loaded = true);
    }

    /// Publishes the snapshot and the revision. Call with the index lock held.
    fn publish(&mut self, revision: i64) {
        self.applied = revision;
        self.shared
            .snapshot
            .store(Arc::new(self.store.snapshot(revision)));
        self.shared.keys.store(self.store.len(), Ordering::Relaxed);
        self.shared
            .store_bytes
            .store(self.store.bytes(), Ordering::Relaxed);
        self.shared.revision.store(revision, Ordering::Release);
        self.shared.revision_tx.send_replace(revision);
    }

    async fn follow(&mut self, watch: &mut dyn UpstreamWatch, trusted: bool) -> SessionEnd {
        let interval = self.shared.config.progress_request_interval;
        let idle = self.shared.config.upstream_idle_timeout;
        self.request_sent = None;
        let mut last_heard = Instant::now();
        let shared = self.shared.clone();
        loop {
            // Consumers are woken once per burst of upstream messages, not per revision.
            self.wake_consumers();
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
                    let probe = self.shared.upstream.current_revision(self.shared.range.clone());
                    match tokio::time::timeout(idle.min(PROBE_TIMEOUT), probe).await {
                        Ok(Ok(_)) => last_heard = Instant::now(),
                        Ok(Err(e)) => return SessionEnd::Broken(e),
                        Err(_) => return SessionEnd::Broken(Error::invalid(format!(
                            "upstream silent for {idle:?} and a liveness probe timed out"
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
            Ok(Some(WatchMsg::Events(events))) => self.apply(events),
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
                    self.progress(revision);
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
                return Some(SessionEnd::Broken(Error::invalid(format!(
                    "watch cancelled by etcd: {reason}"
                ))));
            }
            Ok(None) => {
                return Some(SessionEnd::Broken(Error::invalid(
                    "upstream watch stream ended",
                )))
            }
            Err(e) => return Some(SessionEnd::Broken(e)),
        }
        None
    }

    /// Wakes the consumers that got deliveries since the last call.
    fn wake_consumers(&mut self) {
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
    }

    /// Applies one upstream message: one batch per revision, dispatched in order.
    fn apply(&mut self, events: Vec<(EventType, KeyValue)>) {
        let shared = self.shared.clone();
        let mut index = shared.index.lock();
        let mut last = self.applied;
        let mut batch_events = Vec::new();
        let mut lagged = 0;
        let mut iter = events.into_iter().peekable();
        while let Some((t, kv)) = iter.next() {
            let rev = kv.0.mod_revision;
            if rev <= self.applied {
                // A resumed or buggy watch (etcd#20221) may repeat old events.
                continue;
            }
            batch_events.push(self.store.apply(t, kv));
            let boundary = iter
                .peek()
                .map_or(true, |(_, next)| next.0.mod_revision != rev);
            if boundary {
                let batch = Batch::new(rev, std::mem::take(&mut batch_events));
                shared.history.write().push(batch.clone());
                let stats = index.dispatch(&batch, &shared.lagging);
                lagged += stats.lagged;
                last = rev;
            }
        }
        if lagged > 0 {
            debug!(
                lagged,
                revision = last,
                "subscribers fell behind; they will catch up from history"
            );
        }
        if last > self.applied {
            self.publish(last);
        }
        index.take_wakers(&mut self.wakers);
        drop(index);
    }

    /// A trusted progress notification: nothing happened in the prefix up to `revision`.
    fn progress(&mut self, revision: i64) {
        if revision <= self.applied {
            return;
        }
        let shared = self.shared.clone();
        let index = shared.index.lock();
        shared.history.write().advance(revision);
        self.publish(revision);
        drop(index);
    }
}
