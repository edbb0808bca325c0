//! The checks: of every response against the truth, of the cache's counters after
//! every step, and the final drain.

use super::*;

impl Model {
    /// After every step: the cache's counters agree with the model.
    pub(super) fn check_counters(&mut self) -> Check {
        let t = &self.truth;
        let span = self.cache.history_span();
        let stats = self.cache.stats();
        if self.cache.revision() != t.applied
            || span != (t.floor, t.applied)
            || stats.history_len != t.hist.len()
        {
            return Err(format!(
                "the cache is at {} with history {span:?} ({} batches); the model says {} with ({}, {}) ({} batches: {:?})",
                self.cache.revision(),
                stats.history_len,
                t.applied,
                t.floor,
                t.applied,
                t.hist.len(),
                t.hist
            ));
        }
        let open = self.live_watches();
        let uncanceled = self.uncanceled_watches();
        if !(uncanceled..=open).contains(&self.cache.watcher_count()) {
            return Err(format!(
                "{} open watches, the model has {open}, {uncanceled} of them not canceled",
                self.cache.watcher_count()
            ));
        }
        let lagging = self.cache.lagging_count();
        if lagging > open {
            return Err(format!("{lagging} lagging watches of {open}"));
        }
        if lagging > 0 {
            self.stats.lagging_steps += 1;
        }
        Ok(())
    }

    /// A stream yielded `None`: allowed only when no watch is left on it.
    pub(super) fn check_end(&self, si: usize) -> Check {
        let s = &self.streams[si];
        // Open progress requests may go unanswered then: etcd answers one on the first
        // watcher of the stream, so not at all on a stream without watchers.
        if !s.watches.is_empty() {
            let mut ids: Vec<&i64> = s.watches.keys().collect();
            ids.sort_unstable();
            return Err(format!(
                "s{} ended with watches {ids:?} and {} progress requests open",
                s.name, s.progress_pending
            ));
        }
        Ok(())
    }

    pub(super) fn check_response(&mut self, si: usize, r: Result<Option<WatchResponse>>) -> Check {
        let Model {
            truth,
            streams,
            stats,
            log,
            step,
            ..
        } = self;
        let s = &mut streams[si];
        let resp = match r {
            Ok(Some(resp)) => resp,
            Ok(None) => unreachable!("handled by check_end"),
            Err(e) => return Err(format!("s{}: error {e}", s.name)),
        };
        stats.responses += 1;
        let rev = resp.revision();
        if resp.header().map(|h| h.revision()) != Some(rev) {
            return Err(format!("s{}: header and revision differ: {resp:?}", s.name));
        }
        let prev = s.reported;
        if rev < prev {
            return Err(format!(
                "s{}: the header revision went down from {prev} to {rev}: {resp:?}",
                s.name
            ));
        }
        s.reported = rev;
        let id = resp.watch_id();
        let line;
        if id == -1 {
            if !resp.is_progress_notify() || s.progress_pending == 0 {
                return Err(format!(
                    "s{}: watch id -1 for anything but an asked-for progress response: {resp:?}",
                    s.name
                ));
            }
            line = stream_progress(truth, stats, s, rev)?;
        } else if let Some(at) = s.canceling.iter().position(|(i, _)| *i == id) {
            // A canceled watch: its `created` if it was not read, then its `canceled`;
            // nothing else (etcd sends nothing of it after the cancel).
            let w = &mut s.canceling[at].1;
            if !w.created && resp.created() {
                w.check_created(rev, prev, truth.etcd_rev)?;
                w.created = true;
                line = format!("{}: created at {rev} (canceled)", w.label);
            } else if w.created && resp.canceled() && resp.compact_revision() == 0 {
                line = format!("{}: canceled", w.label);
                s.canceling.remove(at);
            } else {
                return Err(format!("{}: {resp:?} after its cancel", w.label));
            }
        } else {
            let Some(w) = s.watches.get_mut(&id) else {
                return Err(format!(
                    "s{}: a response for watch id {id}, which is not open: {resp:?}",
                    s.name
                ));
            };
            if !w.created {
                if !resp.created() {
                    return Err(format!(
                        "{}: first response is not created: {resp:?}",
                        w.label
                    ));
                }
                w.check_created(rev, prev, truth.etcd_rev)?;
                w.created = true;
                line = format!("{}: created at {rev}", w.label);
            } else if resp.created() {
                return Err(format!("{}: created twice", w.label));
            } else if resp.canceled() {
                w.settle_start_earliest();
                let c = resp.compact_revision();
                if c == 0 {
                    if !w.cancel_requested {
                        return Err(format!("{}: canceled without a cancel", w.label));
                    }
                    line = format!("{}: canceled", w.label);
                } else {
                    line = compacted(truth, stats, w, &resp, c)?;
                }
                s.watches.remove(&id);
                log.borrow_mut().push(format!("#{step:<3} {line}"));
                return Ok(());
            } else if w.compacted_at_creation.is_some() {
                return Err(format!(
                    "{}: below the window, yet not canceled: {resp:?}",
                    w.label
                ));
            } else if resp.is_progress_notify() {
                line = watch_progress(truth, stats, w, rev)?;
            } else {
                line = events(truth, stats, w, &resp, rev, prev)?;
            }
        }
        log.borrow_mut().push(format!("#{step:<3} {line}"));
        Ok(())
    }

    /// The end of a run: the cache reconnects, etcd writes once more (up to every
    /// watch's start at least: a stream-wide progress waits for those, as fixed etcd's),
    /// and every stream must answer a progress request covering that write; then
    /// everything is dropped and nothing may be left behind.
    pub(super) async fn drain(&mut self) -> Check {
        if self.conn.is_none() {
            self.reconnect(false).await?;
            settle().await;
        }
        // A final write the cache must get, inside its range, at or after every start.
        let before = self.truth.etcd_rev;
        let starts = (self.streams.iter())
            .flat_map(|s| s.watches.values().map(|w| w.start))
            .max()
            .unwrap_or(0);
        let r = loop {
            let r = self.etcd_txn();
            if !self.truth.cache_events(r).is_empty() && r >= starts {
                break r;
            }
        };
        self.up.set_current_revision(r);
        let revs = self.truth.cache_revisions(before, r);
        self.send(&revs, Vec::new());
        self.note(format!("drain: final write at {r}"));
        settle().await;
        self.check_counters()?;
        for si in 0..self.streams.len() {
            let s = &mut self.streams[si];
            bounded("request_progress", s.stream.request_progress())
                .await?
                .map_err(|e| format!("request_progress: {e}"))?;
            s.progress_pending += 1;
            let mut reads = 0;
            while self.streams[si].progress_pending > 0 {
                reads += 1;
                if reads > 100_000 {
                    return Err(format!(
                        "s{} never answers its progress request",
                        self.streams[si].name
                    ));
                }
                match self.ready_response(si).await {
                    Some(Ok(None)) => {
                        self.check_end(si)?;
                        break;
                    }
                    Some(resp) => self.check_response(si, resp)?,
                    None => {
                        let s = &self.streams[si];
                        return Err(format!(
                            "s{} stalled with {} progress requests unanswered",
                            s.name, s.progress_pending
                        ));
                    }
                }
            }
            let s = &self.streams[si];
            for w in s.watches.values() {
                if !w.created || w.compacted_at_creation.is_some() || w.cancel_requested {
                    return Err(format!(
                        "{}: still open at a stream-wide progress (created {}, canceled {})",
                        w.label, w.created, w.cancel_requested
                    ));
                }
                if w.covered < r {
                    return Err(format!(
                        "{}: covered only to {} after the final progress",
                        w.label, w.covered
                    ));
                }
            }
        }
        self.streams.clear();
        settle().await;
        if self.cache.watcher_count() != 0 || self.cache.lagging_count() != 0 {
            return Err(format!(
                "after dropping every stream: {} watches, {} lagging",
                self.cache.watcher_count(),
                self.cache.lagging_count()
            ));
        }
        Ok(())
    }
}

/// A stream-wide progress response at `rev`: every created watch of the stream has been
/// sent everything it is owed up to `rev`.
fn stream_progress(
    truth: &Truth,
    stats: &mut Stats,
    s: &mut Stream,
    rev: i64,
) -> Result<String, String> {
    s.progress_pending -= 1;
    stats.stream_progress += 1;
    if rev > truth.etcd_rev {
        return Err(format!(
            "s{}: progress at {rev}, beyond etcd's {}",
            s.name, truth.etcd_rev
        ));
    }
    for w in s.watches.values_mut() {
        if !w.created || w.compacted_at_creation.is_some() {
            continue;
        }
        w.settle_start(None);
        if rev < w.start {
            return Err(format!(
                "s{}: stream progress at {rev}, below the start {} of {}",
                s.name, w.start, w.label
            ));
        }
        if let Some(m) = truth.next_match(w, w.covered).filter(|&m| m <= rev) {
            return Err(format!(
                "s{}: stream progress at {rev}, but {} has not been delivered {m} (covered to {})",
                s.name, w.label, w.covered
            ));
        }
        w.covered = w.covered.max(rev);
    }
    Ok(format!("s{}: stream progress at {rev}", s.name))
}

/// A watch canceled as compacted at `c`: at creation below the window (with the floor),
/// or only once what it is owed next has left the window.
fn compacted(
    truth: &Truth,
    stats: &mut Stats,
    w: &Watch,
    resp: &WatchResponse,
    c: i64,
) -> Result<String, String> {
    if resp.cancel_reason().is_empty() {
        return Err(format!("{}: compacted without a reason", w.label));
    }
    if let Some(floor) = w.compacted_at_creation {
        if c != floor {
            return Err(format!(
                "{}: compacted at creation with {c}, the floor was {floor}",
                w.label
            ));
        }
        stats.compacted_at_creation += 1;
    } else {
        // The revision up to which the cache could know the watch
        // was served: before its next owed revision, and before the
        // first re-list gap after what it was delivered.
        let next = truth.next_match(w, w.covered);
        let gap = truth
            .gaps
            .iter()
            .find(|(_, at)| *at > w.covered)
            .map(|(before, _)| (*before).max(w.covered));
        let known = match (next, gap) {
            (Some(m), Some(g)) => (m - 1).min(g),
            (Some(m), None) => m - 1,
            (None, Some(g)) => g,
            (None, None) => i64::MAX / 2,
        };
        if known + 1 >= c {
            return Err(format!(
                "{}: canceled as compacted at {c}, but everything it is owed after {} (next: {next:?}) is still in the window (floor {}, history {:?})",
                w.label, w.covered, truth.floor, truth.hist
            ));
        }
        if c > truth.floor {
            return Err(format!(
                "{}: compact revision {c} above the window's floor {}",
                w.label, truth.floor
            ));
        }
        if gap.is_some_and(|g| g < next.map_or(i64::MAX, |m| m - 1)) {
            stats.compacted_relist += 1;
        } else {
            stats.compacted_evicted += 1;
        }
    }
    Ok(format!(
        "{}: compacted at {c} (covered {})",
        w.label, w.covered
    ))
}

/// A watch's own progress response at `rev`: asked for, and nothing owed up to it.
fn watch_progress(
    truth: &Truth,
    stats: &mut Stats,
    w: &mut Watch,
    rev: i64,
) -> Result<String, String> {
    if !w.progress_notify {
        return Err(format!("{}: progress it did not ask for", w.label));
    }
    stats.watch_progress += 1;
    if rev > truth.etcd_rev {
        return Err(format!(
            "{}: progress at {rev}, beyond etcd's {}",
            w.label, truth.etcd_rev
        ));
    }
    w.settle_start(None);
    if rev < w.start {
        return Err(format!(
            "{}: progress at {rev}, below its start {}",
            w.label, w.start
        ));
    }
    if let Some(m) = truth.next_match(w, w.covered).filter(|&m| m <= rev) {
        return Err(format!(
            "{}: progress at {rev}, but {m} has not been delivered (covered to {})",
            w.label, w.covered
        ));
    }
    w.covered = w.covered.max(rev);
    Ok(format!("{}: progress at {rev}", w.label))
}

/// A watch's events: one revision, the next one it is owed, exactly the truth's events.
fn events(
    truth: &Truth,
    stats: &mut Stats,
    w: &mut Watch,
    resp: &WatchResponse,
    rev: i64,
    prev: i64,
) -> Result<String, String> {
    let evs = resp.events();
    let Some(first) = evs.first() else {
        return Err(format!("{}: a response of no kind: {resp:?}", w.label));
    };
    let r = first.revision();
    if evs.iter().any(|e| e.revision() != r) {
        return Err(format!(
            "{}: one response, several revisions: {}",
            w.label,
            show(evs)
        ));
    }
    if rev != prev.max(r) {
        return Err(format!(
            "{}: events of {r} with header {rev} (stream at {prev})",
            w.label
        ));
    }
    w.settle_start(Some(r));
    if r <= w.covered {
        return Err(format!(
            "{}: revision {r} after {} (a duplicate or out of order)",
            w.label, w.covered
        ));
    }
    if let Some(m) = truth.next_match(w, w.covered).filter(|&m| m < r) {
        return Err(format!(
            "{}: revision {r} delivered, but {m} (matching) was skipped",
            w.label
        ));
    }
    let want = truth.expected(w, r);
    if evs != &want[..] {
        return Err(format!(
            "{}: events of {r}: got {}, want {}",
            w.label,
            show(evs),
            show(&want)
        ));
    }
    stats.events += evs.len() as u64;
    w.covered = r;
    Ok(format!("{}: events of {r} ({})", w.label, evs.len()))
}
