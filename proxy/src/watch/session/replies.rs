//! What both sides answer, on its way to the client: the cache's replies (taken in
//! rounds and merged, the bookkeeping of creates and cancels), etcd's responses to
//! forwarded watches (prev_kv filled in, split between revisions), and the progress
//! machine's items, in order.

use super::Session;
use crate::etcd_errors;
use crate::metrics::{RefusalKind, Served};
use crate::pb::etcdserverpb::WatchResponse;
use crate::watch::cached::Watches;
use crate::watch::forwarded::take_one;
use crate::watch::id_map::release_drained;
use crate::watch::messages::{self, Merge, INVALID_WATCH_ID};
use crate::watch::progress::{Item, Out, Side};
use crate::watch::wire::{EncodedEvents, WireResponse};

impl Session {
    /// Does what the progress bookkeeping asks: asks the sides again, then sends its
    /// items in order.
    pub(super) async fn apply(&mut self, mut out: Out) -> Result<(), ()> {
        loop {
            let unasked = self.apply_once(out).await?;
            if unasked == 0 {
                return Ok(());
            }
            // A stream without a cache side: that side never limits the answer.
            out = self.progress.answer(Side::Cache, i64::MAX);
        }
    }

    /// [`apply`](Self::apply) once; returns how many asks had no cache side to go to.
    pub(super) async fn apply_once(&mut self, out: Out) -> Result<usize, ()> {
        let mut unasked = 0;
        for _ in 0..out.ask[Side::Cache as usize] {
            tracing::trace!("progress: asking the cache");
            match self.watches.as_mut() {
                Some(w) => w.request_progress().await,
                None => unasked += 1,
            }
        }
        for _ in 0..out.ask[Side::Etcd as usize] {
            tracing::trace!("progress: asking etcd");
            if let Err(e) = self.forwarded.request_progress().await {
                self.outbound.fail(e).await;
                return Err(());
            }
        }
        for item in out.items {
            match item {
                Item::Resp(resp) => self.outbound.emit(resp).await?,
                Item::Progress(revision) => {
                    tracing::trace!(revision, "progress: answered");
                    let header = self.state.upstream.header(revision);
                    self.outbound.send(messages::progress(header)).await?;
                }
            }
        }
        Ok(unasked)
    }

    /// Sends a response of a watch now or after the pending progress answer.
    pub(super) async fn out(&mut self, resp: impl Into<WireResponse>) -> Result<(), ()> {
        let resp = resp.into();
        if self.progress.sends_now(&resp) {
            return self.outbound.emit(resp).await;
        }
        let out = self.progress.push(resp);
        self.apply(out).await
    }

    /// A response of a forwarded watch, with keys moved out of the namespace.
    pub(super) async fn send_forwarded(&mut self, mut resp: WatchResponse) -> Result<(), ()> {
        if messages::is_progress(&resp) {
            let revision = resp.header.as_ref().map_or(0, |h| h.revision);
            tracing::trace!(revision, "progress: etcd answered");
            let out = self.progress.answer(Side::Etcd, revision);
            self.apply(out).await?;
            return self.away_progress(revision).await;
        }
        if self.forwarded.took_resumed() {
            // etcd's `created` of a watch resumed from the cache's side: the client had
            // its own. (A refusal of it comes as the watch's `canceled`.)
            if !resp.canceled {
                return Ok(());
            }
            self.outbound.forget(resp.watch_id);
            messages::out_of_namespace(&mut resp, &self.state.namespace);
            return self.out(resp).await;
        }
        if resp.created && resp.canceled {
            crate::metrics::get().watch_refused(RefusalKind::Etcd);
        }
        let mut after = if resp.created || (resp.canceled && self.forwarded.took_cancel()) {
            self.order.answered(Side::Etcd)
        } else {
            Vec::new()
        };
        // Cancels of a create etcd refused: etcd sends nothing for them.
        for _ in 0..self.forwarded.take_dead_cancels() {
            after.extend(self.order.answered(Side::Etcd));
        }
        if resp.canceled {
            self.outbound.forget(resp.watch_id);
        }
        if let Err(e) = self.forwarded.fill_prev_kv(&mut resp).await {
            self.outbound.fail(e).await;
            return Err(());
        }
        let (watch_id, through) = (resp.watch_id, messages::sent_through(&resp));
        let ended = resp.canceled;
        if ended {
            self.entries.remove(watch_id);
        }
        messages::out_of_namespace(&mut resp, &self.state.namespace);
        for part in messages::by_revision(resp) {
            self.out(part).await?;
        }
        for refusal in after {
            self.outbound.send(refusal).await?;
        }
        if ended {
            return self.forwarded_left().await;
        }
        let cache = self.watches.as_ref();
        let span = cache.map(Watches::history_span);
        let zero_free = cache.is_some_and(Watches::gives_zero);
        if let Some(create) = span
            .zip(through)
            .and_then(|(span, through)| self.entries.returning(watch_id, through, span, zero_free))
        {
            return self.rejoin(create).await;
        }
        Ok(())
    }

    /// Sends `first` and the cache's replies that are ready after it, merged
    /// ([`Merge`]): the events of one watch in one response where they follow each
    /// other. Created, canceled and progress responses are not merged: the merged
    /// responses before them go out first.
    pub(super) async fn send_replies(
        &mut self,
        first: etcd_cache::WatchResponse,
    ) -> Result<(), ()> {
        let mut merge = Merge::default();
        let mut ready = Vec::with_capacity(merge.room());
        ready.push(first);
        loop {
            for r in ready.drain(..) {
                merge.took();
                if Merge::merges(&r, &self.outbound) {
                    let state = &self.state;
                    let header = state.upstream.header_from_cache(r.header(), r.revision());
                    merge.push(EncodedEvents::from_cache(&r, header, &state.namespace));
                } else {
                    self.flush(&mut merge).await?;
                    self.entries.sent(&r);
                    self.send_reply(r).await?;
                }
            }
            let room = merge.room();
            let Some(watches) = self.watches.as_mut().filter(|_| room > 0) else {
                break;
            };
            if watches.take_ready(&mut ready, room) == 0 {
                break;
            }
        }
        self.flush(&mut merge).await
    }

    /// Sends the merged responses so far, in order; each is recorded as sent to its
    /// watch (what a catch-up from etcd resumes after) as it goes.
    pub(super) async fn flush(&mut self, merge: &mut Merge) -> Result<(), ()> {
        for resp in merge.drain() {
            self.entries.sent_up_to(resp.watch_id, resp.last_revision());
            self.out(resp).await?;
        }
        Ok(())
    }

    /// A reply of the cache's that is not merged: the bookkeeping of creates and
    /// cancels, then the reply (and the refusals that waited for it).
    pub(super) async fn send_reply(&mut self, r: etcd_cache::WatchResponse) -> Result<(), ()> {
        let watch_id = r.watch_id();
        if watch_id == INVALID_WATCH_ID && r.is_progress_notify() {
            tracing::trace!(revision = r.revision(), "progress: the cache answered");
            let out = self.progress.answer(Side::Cache, r.revision());
            return self.apply(out).await;
        }
        let mut after = Vec::new();
        if r.created() && self.pending_creates.front().is_some_and(|p| p.rejoin) {
            return self.rejoined(r).await;
        }
        let mut refusal = None;
        if r.created() {
            let pending = self.pending_creates.pop_front();
            release_drained(&mut self.pending_creates);
            if let Some(p) = pending {
                if r.canceled() || p.canceled {
                    // Refused by the cache (its entry ends), or canceled by the client
                    // before this came (its entry is gone, its id free already).
                    if !p.canceled {
                        self.entries.remove(p.id);
                    }
                } else {
                    if self.entries.created(p.id, r.revision()) {
                        self.open.add();
                        crate::metrics::get().watch_created(Served::Cache);
                    }
                    if p.fragment {
                        self.outbound.add_fragment(watch_id);
                    }
                }
                after = self.order.answered(Side::Cache);
            }
        } else if r.canceled() && r.compact_revision() == 0 && self.took_cache_cancel(watch_id) {
            // The reply to the client's cancel (whose id was freed when it was read).
            after = self.order.answered(Side::Cache);
        } else if r.canceled() {
            if r.compact_revision() > 0 {
                if let Some(create) = self.entries.fell_behind(watch_id) {
                    // Behind the cache's window, not (as far as the cache knows) etcd's
                    // compaction: etcd serves it from where it is, and answers itself
                    // if that revision is compacted.
                    self.open.sub();
                    return self.catch_up(create).await;
                }
            }
            if let Some(e) = self.entries.remove(watch_id) {
                if e.counted() {
                    self.open.sub();
                }
                refusal = e.refusal();
            }
            self.outbound.forget(watch_id);
        }
        let state = &self.state;
        let mut resp = messages::from_cache(&r, &state.upstream, &state.namespace);
        if let Some(refusal) = refusal {
            resp.cancel_reason = etcd_errors::watch_refusal(&refusal);
        }
        self.out(resp).await?;
        for refusal in after {
            self.outbound.send(refusal).await?;
        }
        Ok(())
    }

    /// Whether a `canceled` of the cache for `watch_id` answers a cancel of the client's.
    pub(super) fn took_cache_cancel(&mut self, watch_id: i64) -> bool {
        take_one(&mut self.cache_cancels, watch_id)
    }
}
