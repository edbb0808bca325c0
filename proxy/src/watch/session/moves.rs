//! A watch's moves between the cache and etcd, under its id and with no gap or
//! duplicate: to etcd when it falls behind what the cache's history holds
//! ([`catch_up`](Session::catch_up)), back to the cache once etcd has brought it into the
//! newer half of the window ([`rejoin`](Session::rejoin), then
//! [`rejoined`](Session::rejoined) when the cache's `created` comes). Where each watch
//! is and the revision it needs next is its entry's (`entries.rs`). A watch away on a
//! quiet range gets nothing from etcd to tell it has caught up: etcd is asked for
//! stream-level progress now and then instead ([`ask_for_away`](Session::ask_for_away)).

use tokio::time::Instant;

use super::pending::PendingCreate;
use super::Session;
use crate::pb::etcdserverpb::WatchCreateRequest;
use crate::watch::cached::Watches;
use crate::watch::id_map::release_drained;
use crate::watch::progress::Side;

impl Session {
    /// Brings a watch caught up from etcd back to the cache, under its id, from its
    /// next revision: the cache takes it first (its `created` is not the client's), then
    /// etcd's watch is ended (nothing more of it is sent). If the cache does not take it,
    /// it stays with etcd.
    pub(super) async fn rejoin(&mut self, create: WatchCreateRequest) -> Result<(), ()> {
        let id = create.watch_id;
        let (key, end) = (create.key.clone(), create.range_end.clone());
        // The cache serves only a caller etcd allows the range now (`authz/`); one it
        // does not (or cannot be asked about) stays with etcd, which checked it.
        let allowed = self
            .state
            .authz
            .check(&self.metadata, &key, &end)
            .await
            .is_ok();
        let Some(watches) = self.watches.as_mut().filter(|_| allowed) else {
            self.entries.away(create);
            return Ok(());
        };
        if watches.create(&create, &key, &end, id).await.is_err() {
            self.entries.away(create);
            return Ok(());
        }
        tracing::debug!(
            watch_id = id,
            next = create.start_revision,
            "a watch caught up from etcd returns to the cache"
        );
        crate::metrics::get().watch_rejoined();
        if let Err(e) = self.forwarded.retire(id).await {
            self.outbound.fail(e).await;
            return Err(());
        }
        self.pending_creates.push_back(PendingCreate {
            id,
            canceled: false,
            fragment: create.fragment,
            rejoin: true,
        });
        self.entries.rejoining(create);
        // Progress requests waiting now need an answer of the cache's made after it.
        let out = self.progress.moved_to(Side::Cache);
        self.apply(out).await?;
        self.forwarded_left().await
    }

    /// Moves a cached watch that fell behind the cache's window to etcd, from its next
    /// revision, under its id: the client sees its events go on, with no gap and no
    /// duplicate (etcd's `created` for it is not sent: the client had its own), or
    /// etcd's own compaction answer if etcd compacted that revision.
    pub(super) async fn catch_up(&mut self, create: WatchCreateRequest) -> Result<(), ()> {
        let id = create.watch_id;
        tracing::debug!(
            watch_id = id,
            next = create.start_revision,
            "a watch fell behind the cache's window: caught up from etcd"
        );
        crate::metrics::get().watch_caught_up();
        match self.forwarded.resume(create).await {
            Ok(Some(_)) => {
                // Progress requests waiting now need an answer of etcd's made after it.
                let out = self.progress.moved_to(Side::Etcd);
                self.apply(out).await
            }
            Ok(None) => {
                // The id is a forwarded watch's already (cannot be: one id space).
                self.outbound.forget(id);
                Ok(())
            }
            Err(e) => {
                self.outbound.fail(e).await;
                Err(())
            }
        }
    }

    /// When the session's timer is next due: the progress requests' deadline, or the
    /// next question for the watches away (armed while there are some).
    pub(super) fn deadline(&mut self) -> Option<Instant> {
        let check = self.away_check.arm(self.entries.away_count());
        match (self.progress.deadline(), check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The timer: progress requests given up or asked again, then, if due, etcd asked
    /// whether the watches away have caught up.
    pub(super) async fn progress_expired(&mut self) -> Result<(), ()> {
        let now = Instant::now();
        let out = self.progress.expire(now);
        self.apply(out).await?;
        if self.away_check.take_due(now, self.entries.away_count()) {
            self.ask_for_away(now).await?;
        }
        Ok(())
    }

    /// A watch away gets no response from etcd while nothing is written in its range
    /// (after a proxy restart, kube-apiserver resumes each of its watches from below the
    /// new cache's window, most of them on quiet resources), so it would stay with etcd.
    /// etcd is asked for stream-level progress instead (unless a request is in flight):
    /// its answer, once every watch of the stream is synced, says each has been sent
    /// everything up to it, and brings the ones in the cache's window back
    /// ([`away_progress`](Self::away_progress)). Only where etcd's answers are trusted
    /// (etcd#15220: earlier versions answer before a new watch has caught up).
    async fn ask_for_away(&mut self, now: Instant) -> Result<(), ()> {
        let trusted = self.watches.as_ref().is_some_and(Watches::progress_trusted);
        if !trusted || !self.entries.has_away() || !self.progress.ask_etcd(now) {
            return Ok(());
        }
        tracing::trace!("progress: asking etcd for the watches away");
        if let Err(e) = self.forwarded.request_progress().await {
            self.outbound.fail(e).await;
            return Err(());
        }
        Ok(())
    }

    /// etcd answered a stream-level progress request at `revision`: each watch away that
    /// the answer covers (`forwarded.rs: Forwarded::progress_covered`) has been sent
    /// everything up to it, and comes back to the cache if that is in the cache's window
    /// (`entries.rs: Entries::returning`).
    pub(super) async fn away_progress(&mut self, revision: i64) -> Result<(), ()> {
        let Some(cache) = self.watches.as_ref().filter(|w| w.progress_trusted()) else {
            return Ok(());
        };
        if !self.entries.has_away() {
            return Ok(());
        }
        let covered = self.forwarded.progress_covered();
        let (span, zero_free) = (cache.history_span(), cache.gives_zero());
        let mut back = false;
        for id in covered {
            if let Some(create) = self.entries.returning(id, revision, span, zero_free) {
                back = true;
                self.rejoin(create).await?;
            }
        }
        self.away_check.answered(back, self.entries.away_count());
        Ok(())
    }

    /// The cache's `created` of a watch returning from etcd (`rejoin`): the cache serves
    /// it again, and the client, which had its own `created`, is sent nothing. Refused
    /// (or canceled by the client meanwhile), it goes back to etcd or ends.
    pub(super) async fn rejoined(&mut self, r: etcd_cache::WatchResponse) -> Result<(), ()> {
        let Some(p) = self.pending_creates.pop_front() else {
            return Ok(());
        };
        release_drained(&mut self.pending_creates);
        if p.canceled {
            // The client's cancel came meanwhile: the cache's `canceled` answers it.
            return Ok(());
        }
        if r.canceled() {
            // Not taken: etcd serves it from where it is.
            return match self.entries.stays_away(p.id) {
                Some(create) => self.catch_up(create).await,
                None => Ok(()),
            };
        }
        if self.entries.created(p.id, r.revision()) {
            self.open.add();
        }
        Ok(())
    }
}
