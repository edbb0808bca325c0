//! One gRPC Watch stream's task: it reads the client's requests (as fast as they come,
//! bounded in bytes), decides which side serves each create (the cache through
//! [`cached`], or etcd through [`forwarded`](super::forwarded)), gives
//! ids from one id space, keeps the replies to creates and cancels in the order of the
//! requests across both sides, runs stream-level progress requests through
//! [`progress`](super::progress), checks its cached watches again when etcd's auth state
//! moves, ends a `hasleader` stream whose cache lost etcd, and sends what both sides
//! answer through [`outbound`](super::outbound), as etcd sends it
//! (`api/v3rpc/watch.go`).
//!
//! The session's methods in three files: this one (the stream's state, its loop, the
//! client's requests, revocations), [`replies`] (what both sides answer, on its way to
//! the client) and [`moves`] (a watch's moves between the cache and etcd); [`pending`]
//! is the queue of creates waiting for their `created`. Each cache watch's state is one
//! entry in [`Entries`] (`entries.rs`), whose methods are its transitions.

mod away;
mod moves;
mod pending;
mod replies;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Status;

use super::ahead::{Ahead, Checked, CHECK_TIMEOUT};
use super::cached::{self, NotTaken, Watches};
use super::entries::{Entries, Phase};
use super::forwarded::Forwarded;
use super::id_map::IdMap;
use super::outbound::Outbound;
use super::progress::{Progress, Side};
use super::refusal::{self, Refusal};
use super::reply_order::{Deferred, ReplyOrder};
use super::wire::WireResponse;
use crate::etcd_errors;
use crate::metrics::{GaugeGuard, Served};
use crate::pb::etcdserverpb::{
    watch_request::RequestUnion, WatchCreateRequest, WatchRequest, WatchResponse,
};
use crate::state::State;
use pending::PendingCreate;

/// How often a `hasleader` stream checks that the cache still follows etcd.
const LEADER_CHECK: Duration = Duration::from_millis(500);
/// How long the cache may be cut off from etcd before `hasleader` streams end.
const LEADER_LOST_AFTER: Duration = Duration::from_secs(3);

/// A client's request as the reader queued it, with its share of the queue's bytes
/// (held until the request is handled); a receive error is the last one. Boxed: the
/// channel's blocks hold 32 slots each, and a stream keeps its first block for life
/// (8 KiB per stream with the request inline, under 1 KiB boxed).
pub(super) type Queued = (Result<Box<WatchRequest>, Status>, crate::conn::Share);

/// What woke the session.
enum Step {
    Shutdown,
    Request(Option<Result<Box<WatchRequest>, Status>>),
    Reply(Option<etcd_cache::WatchResponse>),
    Forwarded(Result<WatchResponse, Status>),
    LeaderCheck(tokio::time::Instant),
    /// A progress request held responses for too long (see `progress.rs`).
    ProgressExpired,
    /// etcd's auth state moved: the cached watches are checked again.
    AuthChanged,
    /// The cached watches etcd no longer allows this caller, with etcd's refusal.
    Revoked(Vec<(i64, Status)>),
    /// etcd's revision, for progress requests on a stream with a watch from beyond
    /// the proxy's (see `ahead.rs`).
    AheadChecked(Checked),
}

/// Whether `id` names a watch of the stream, of either side, or one being created (a
/// create waiting for its `created` has an entry until the client cancels it).
fn id_in_use(entries: &Entries, forwarded: &Forwarded, id: i64) -> bool {
    entries.contains(id) || forwarded.contains(id)
}

/// A check of the stream's cached watches against etcd's current decisions.
type Recheck = futures::future::BoxFuture<'static, Vec<(i64, Status)>>;

/// One Watch stream's watches, of both sides, and what is owed to its client.
pub(super) struct Session {
    state: Arc<State>,
    /// The cache's side of the stream; `None` when there was no cache to serve from
    /// when the stream opened (every watch is forwarded).
    watches: Option<Watches>,
    /// The client's queue, and which watches take fragments.
    outbound: Outbound,
    /// The client's token (and `hasleader`): what etcd decides by.
    metadata: tonic::metadata::MetadataMap,
    /// The cache creates waiting for their `created`, in order (the cache answers
    /// creates in the order they were made).
    pending_creates: VecDeque<PendingCreate>,
    /// The creates and cancels not answered yet, of both sides, and the requests that
    /// wait for the other side.
    order: ReplyOrder,
    /// The client's cancels of cache watches whose `canceled` has not come, by id: the
    /// cache's `canceled` replies to them answer an unanswered request (a cancel the
    /// proxy made, for a revoked permission, or a compaction does not).
    cache_cancels: IdMap<usize>,
    /// The cache's watches, one entry each: being created, cached, revoked, away with
    /// etcd for now, rejoining (`entries.rs`).
    entries: Entries,
    /// While watches are away: when etcd is next asked whether they have caught up
    /// (`away.rs`).
    away_check: away::AwayCheck,
    /// Moves when etcd's auth state moved (`authz/`).
    epoch: tokio::sync::watch::Receiver<u64>,
    /// The check of the cached watches under way.
    recheck: Option<Recheck>,
    /// Watches outside the cache's prefix or below its window, forwarded to etcd.
    forwarded: Forwarded,
    /// The next automatic watch id (etcd's: counted from 0 per stream, skipping ids in
    /// use), given to both sides, so one id never names two watches.
    next_id: i64,
    /// Stream-level progress requests waiting for their answers, from the cache and from
    /// etcd when watches are forwarded, and the responses held back meanwhile so that the
    /// one answer holds for every watch (see `progress.rs`).
    progress: Progress,
    /// The stream's watches from a revision the proxy had not reached when they were
    /// created: a progress request while one is ahead asks etcd whether etcd would drop
    /// it, and waits here for etcd's revision (see `ahead.rs`).
    ahead: Ahead,
    require_leader: bool,
    /// Counts the stream in `etcd_cache_proxy_watch_streams` while it is open.
    _stream: GaugeGuard,
    /// Counts its cache watches in `etcd_cache_proxy_watches{served="cache"}`.
    open: GaugeGuard,
}

impl Session {
    /// The session of a new stream: the cache's side if there is a cache to serve from
    /// now (counted against the connection's `scope`), `tx` the client's queue,
    /// `metadata` the client's (passed to etcd).
    pub(super) fn new(
        state: Arc<State>,
        scope: &crate::conn::ConnScope,
        tx: mpsc::Sender<Result<WireResponse, Status>>,
        metadata: tonic::metadata::MetadataMap,
        require_leader: bool,
    ) -> Self {
        let limits = &state.limits;
        Session {
            watches: state
                .cache()
                .map(|cache| Watches::new(&cache, scope, limits.watches_per_connection)),
            outbound: Outbound::new(tx, limits.max_request_bytes),
            pending_creates: VecDeque::new(),
            order: ReplyOrder::default(),
            cache_cancels: IdMap::default(),
            entries: Entries::default(),
            away_check: away::AwayCheck::default(),
            epoch: state.authz.epoch(),
            recheck: None,
            forwarded: Forwarded::new(state.upstream.clone(), metadata.clone()),
            metadata,
            next_id: 0,
            progress: Progress::default(),
            ahead: Ahead::default(),
            require_leader,
            _stream: crate::metrics::get().watch_stream(),
            open: crate::metrics::get().open_watches(Served::Cache),
            state,
        }
    }

    /// Serves the stream until the client goes, the cache or etcd ends it, or shutdown.
    pub(super) async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Queued>) {
        let mut shutdown = self.state.shutdown.clone();
        let tx = self.outbound.sender().clone();
        let mut inbound_open = true;
        let mut leader_check = tokio::time::interval(LEADER_CHECK);
        let mut not_ready_since: Option<tokio::time::Instant> = None;
        loop {
            let has_room = tx.capacity() > 0;
            let progress_deadline = self.deadline();
            let step = tokio::select! {
                _ = crate::state::stopped(&mut shutdown) => Step::Shutdown,
                _ = tx.closed() => return,
                req = requests.recv(), if inbound_open => Step::Request(req.map(|(r, _permit)| r)),
                reply = cached::next(&mut self.watches), if has_room => Step::Reply(reply),
                resp = self.forwarded.next(), if has_room => Step::Forwarded(resp),
                permit = tx.reserve(), if !has_room => {
                    drop(permit);
                    continue;
                }
                now = leader_check.tick(), if self.require_leader => Step::LeaderCheck(now),
                _ = sleep_until_some(progress_deadline), if progress_deadline.is_some() => Step::ProgressExpired,
                changed = self.epoch.changed() => match changed {
                    Ok(()) => Step::AuthChanged,
                    Err(_) => continue,
                },
                denied = async { self.recheck.as_mut().expect("guarded").await }, if self.recheck.is_some() => Step::Revoked(denied),
                checked = self.ahead.next(), if self.ahead.busy() => Step::AheadChecked(checked),
            };
            match step {
                Step::Shutdown => {
                    let _ = tx.send(Err(etcd_errors::shutting_down())).await;
                    return;
                }
                // etcd keeps sending after the client half-closes (until it cancels).
                Step::Request(None) => inbound_open = false,
                Step::Request(Some(Err(e))) => {
                    // etcd ends the stream with the receive error's status (a message
                    // over the limit, one that does not decode), so the client learns why.
                    tracing::debug!(error = %e, "watch stream receive failed");
                    let _ = tx.send(Err(etcd_errors::from_receive(e))).await;
                    return;
                }
                Step::Request(Some(Ok(req))) => {
                    if self.handle(*req).await.is_err() {
                        return;
                    }
                }
                Step::Reply(None) => {
                    let _ = tx.send(Err(etcd_errors::shutting_down())).await;
                    return;
                }
                Step::Reply(Some(reply)) => {
                    if self.send_replies(reply).await.is_err() {
                        return;
                    }
                }
                Step::Forwarded(Err(e)) => {
                    // The client resumes its watches on a new stream.
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                Step::Forwarded(Ok(resp)) => {
                    if self.send_forwarded(resp).await.is_err() {
                        return;
                    }
                }
                Step::ProgressExpired => {
                    if self.progress_expired().await.is_err() {
                        return;
                    }
                }
                Step::AuthChanged => self.start_recheck(),
                Step::AheadChecked(checked) => {
                    if self.ahead_checked(checked).await.is_err() {
                        return;
                    }
                }
                Step::Revoked(ids) => self.revoked(ids).await,
                Step::LeaderCheck(now) => {
                    let ready = match self.state.cache() {
                        Some(c) => c.is_ready(),
                        // Nothing cached: every watch is etcd's, which says so itself.
                        None => self.watches.is_none(),
                    };
                    if ready {
                        not_ready_since = None;
                    } else if now - *not_ready_since.get_or_insert(now) >= LEADER_LOST_AFTER {
                        let _ = tx.send(Err(etcd_errors::no_leader())).await;
                        return;
                    }
                }
            }
            // The other side answered: the creates that waited for it go now.
            if self.order.waiting() && self.drain_deferred().await.is_err() {
                return;
            }
        }
    }

    async fn handle(&mut self, req: WatchRequest) -> Result<(), ()> {
        match req.request_union {
            // Behind creates that wait, in order.
            Some(RequestUnion::CreateRequest(create)) if self.order.waiting() => {
                self.order.defer(Deferred::Create(create));
                Ok(())
            }
            Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
            Some(RequestUnion::CancelRequest(cancel)) if self.order.waiting() => {
                self.order.defer(Deferred::Cancel(cancel.watch_id));
                Ok(())
            }
            Some(RequestUnion::CancelRequest(cancel)) => self.cancel(cancel.watch_id).await,
            Some(RequestUnion::ProgressRequest(_)) if self.order.waiting() => {
                self.order.defer(Deferred::Progress);
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => self.progress_request().await,
            None => Ok(()),
        }
    }

    /// A stream-level progress request.
    async fn progress_request(&mut self) -> Result<(), ()> {
        // etcd >= 3.5 answers through one of the stream's watches: without any, not at
        // all.
        if !self.has_watches() && self.lone_progress_dropped() {
            tracing::trace!(
                "progress request on a stream without watches: dropped, as etcd drops it"
            );
            return Ok(());
        }
        // A watch from beyond the proxy's revision: etcd decides (`ahead.rs`).
        let start = self.progress_floor();
        if start > self.revision() {
            let (upstream, metadata) = (&self.state.upstream, &self.metadata);
            let asked = self.ahead.check(start, || {
                let (upstream, metadata) = (upstream.clone(), metadata.clone());
                std::sync::Arc::new(move || {
                    let (upstream, metadata) = (upstream.clone(), metadata.clone());
                    Box::pin(etcd_revision(upstream, metadata))
                })
            });
            if !asked {
                tracing::debug!("progress request dropped: too many wait for etcd's revision");
            }
            return Ok(());
        }
        self.take_progress_request().await
    }

    /// A create (of either side) was taken under `id`, from `start_revision`.
    fn created_from(&mut self, id: i64, start_revision: i64) {
        let revision = self.revision();
        self.ahead.created(id, start_revision, revision);
    }

    /// etcd's revision came for progress requests with a watch from beyond the proxy's:
    /// each one etcd would drop is dropped, the others are taken.
    async fn ahead_checked(&mut self, checked: Checked) -> Result<(), ()> {
        let known = self.revision();
        for &start in &checked.starts {
            if checked.dropped(start, known) {
                tracing::debug!(
                    start,
                    revision = checked.revision,
                    "progress request with a watch from beyond etcd's revision: dropped, as \
                     etcd drops it (etcd#20221)"
                );
            } else {
                self.take_progress_request().await?;
            }
        }
        Ok(())
    }

    /// A progress request that is answered: held responses and the sides' answers
    /// (`progress.rs`).
    async fn take_progress_request(&mut self) -> Result<(), ()> {
        // Answered as etcd answers it, at a revision that covers every write completed
        // before the request: the cache's answer is at least the cluster's revision when
        // it is asked (one round trip it shares), and etcd's is its own. The floor above
        // which responses wait is what the cache has applied now (nothing sent is above
        // it); no round trip here, which would hold up the whole stream while etcd is
        // slow or away. Without a cache side, etcd answers for the stream.
        // The floor is raised to the highest start of a watch of the stream from beyond
        // it: no answer below a watch's start (etcd#20221). The cache's answer never is;
        // etcd's (for the forwarded watches) may be, when etcd is behind the start or is
        // a proxy whose cache is (a tier whose first proxy lost etcd), and the answer is
        // the lower of the two: such an answer is below the floor, so it does not count.
        let etcd = self.watches.is_none() || !self.forwarded.is_empty();
        let floor = self.progress_floor();
        let out = self
            .progress
            .request(floor, etcd, tokio::time::Instant::now());
        self.apply(out).await
    }

    /// When the stream's last forwarded watch is gone (canceled, ended by etcd, or back
    /// in the cache) while the cache serves the rest, the progress requests waiting for
    /// etcd's answer would get none (etcd >= 3.5 answers through a watch of its
    /// stream): they need none.
    pub(super) async fn forwarded_left(&mut self) -> Result<(), ()> {
        if self.watches.is_none() || !self.forwarded.is_empty() {
            return Ok(());
        }
        let out = self.progress.vacated(Side::Etcd);
        self.apply(out).await
    }

    /// The lowest answer a stream-level progress request may get now: the cache's
    /// revision, or the highest start of a watch of the stream beyond it.
    fn progress_floor(&mut self) -> i64 {
        let revision = self.revision();
        let (entries, forwarded) = (&self.entries, &self.forwarded);
        let in_use = |id| id_in_use(entries, forwarded, id);
        self.ahead
            .highest(revision, in_use)
            .map_or(revision, |start| start.max(revision))
    }

    /// Makes the creates and cancels that waited for the other side, in order, until
    /// one has to wait again.
    async fn drain_deferred(&mut self) -> Result<(), ()> {
        while let Some(deferred) = self.order.next_deferred() {
            let waiting = self.order.waiting_len();
            match deferred {
                Deferred::Create(create) => self.create(create).await?,
                Deferred::Cancel(id) => self.cancel(id).await?,
                Deferred::Progress => self.progress_request().await?,
            }
            if self.order.waiting_len() > waiting {
                break;
            }
        }
        Ok(())
    }

    /// A client's cancel, as etcd takes it: the id is free at once (a create after it
    /// may take it), and its `canceled` reply keeps its place among the replies to the
    /// requests before and after it. It waits (with what follows it) while the other
    /// side has creates or cancels unanswered. An id no watch has is ignored, as etcd
    /// ignores it.
    async fn cancel(&mut self, id: i64) -> Result<(), ()> {
        if self.forwarded.contains(id) {
            if self.order.must_wait(Side::Etcd) {
                self.order.defer_again(Deferred::Cancel(id));
                return Ok(());
            }
            self.entries.remove(id);
            match self.forwarded.cancel(id).await {
                Ok(true) => self.order.sent(Side::Etcd),
                Ok(false) => {}
                Err(e) => {
                    self.outbound.fail(e).await;
                    return Err(());
                }
            }
            return self.forwarded_left().await;
        }
        // A watch the proxy canceled itself once created (a revoked permission): that
        // `canceled` is on its way.
        let cancelable = self.entries.phase(id).is_some_and(Phase::client_may_cancel);
        if !cancelable || self.watches.is_none() {
            return Ok(());
        }
        if self.order.must_wait(Side::Cache) {
            self.order.defer_again(Deferred::Cancel(id));
            return Ok(());
        }
        if self.entries.remove(id).is_some_and(|e| e.counted()) {
            self.open.sub();
        }
        self.outbound.forget(id);
        if let Some(p) = self
            .pending_creates
            .iter_mut()
            .find(|p| p.id == id && !p.canceled)
        {
            p.canceled = true;
        }
        *self.cache_cancels.entry(id).or_default() += 1;
        self.order.sent(Side::Cache);
        if let Some(w) = self.watches.as_mut() {
            w.cancel(id).await;
        }
        Ok(())
    }

    /// Whether the stream has a watch, as etcd counts them when it reads a request: the
    /// ones created or being created, not canceled.
    fn has_watches(&self) -> bool {
        // A create waiting for its `created` has an entry until the client cancels it.
        !self.entries.is_empty() || !self.forwarded.is_empty()
    }

    /// Whether etcd drops a progress request on a stream without watches: 3.5 and later
    /// do (`progressIfSync` answers through a watch); 3.4 answers it. Members whose
    /// version is unknown (unreachable when last probed) are left out; with none known
    /// it is taken as answered.
    fn lone_progress_dropped(&self) -> bool {
        let Some(cache) = self.state.cache() else {
            return false;
        };
        let known: Vec<(u64, u64)> = cache
            .server_versions()
            .iter()
            .filter_map(|v| {
                let mut parts = v.trim_start_matches('v').split('.').map(|p| p.parse().ok());
                Some((parts.next()??, parts.next()??))
            })
            .collect();
        !known.is_empty() && known.iter().all(|&v| v >= (3, 5))
    }

    /// A client's create: refused as etcd refuses it, served by the cache, or forwarded
    /// to etcd.
    async fn create(&mut self, request: WatchCreateRequest) -> Result<(), ()> {
        if request.start_revision < 0 {
            // As etcd >= 3.5 (3.4 lets the watch start from the oldest revision).
            return self.refuse(Refusal::NegativeRevision).await;
        }
        let key = if request.key.is_empty() {
            bytes::Bytes::from_static(b"\0")
        } else {
            request.key.clone()
        };
        let (key, range_end) = self.state.namespace.range(&key, &request.range_end);
        let end = range_end.as_ref();
        if !end.is_empty() && end != b"\0" && key.as_ref() >= end {
            return self.refuse(Refusal::EmptyRange).await;
        }
        // A negative id of the client's own: etcd takes it (the cache's ids are never
        // negative), so etcd serves that watch.
        if request.watch_id < 0 {
            return self.forward(request, key, range_end, false).await;
        }
        // No cache, outside the cached prefix, or below the cache's window: etcd serves it.
        let floor = match &self.watches {
            Some(w) => w.history_span().0,
            None => return self.forward(request, key, range_end, false).await,
        };
        if !self.state.in_cache(&key, &range_end) {
            return self.forward(request, key, range_end, false).await;
        }
        // The cache serves only a caller etcd allows this range (`authz/`), asked
        // first, as etcd checks a watch before it looks at its start: a caller etcd
        // refuses costs the proxy no read of its own.
        match self
            .state
            .authz
            .check(&self.metadata, &key, &range_end)
            .await
        {
            Ok(()) => {}
            Err(s) if etcd_errors::is_auth_refusal(&s) => {
                return self.refuse(Refusal::NotAllowed(s)).await;
            }
            // etcd could not be asked: etcd decides when it serves the watch itself.
            Err(_) => return self.forward(request, key, range_end, false).await,
        }
        // Below the window (or etcd's compaction, which etcd answers): etcd serves it,
        // and once etcd has brought it into the window it comes to the cache. A start
        // after the cache's revision asks etcd nothing (a watch-cache's watch from its
        // list's revision + 1): no compaction the cache could know of covers it, and one
        // etcd made since is after the cache's upstream watch, which delivers every
        // event from the start on.
        if (request.start_revision > 0 && request.start_revision < floor)
            || (request.start_revision <= self.state.revision()
                && self.state.compacted(request.start_revision).await)
        {
            return self.forward(request, key, range_end, true).await;
        }
        let id = match self.take_id(Side::Cache, &request) {
            Ok(id) => id,
            Err(Some(())) => return self.refuse(Refusal::DuplicateId).await,
            Err(None) => return Ok(()),
        };
        let watches = self.watches.as_mut().expect("checked above");
        match watches.create(&request, &key, &range_end, id).await {
            Ok(()) => {
                self.entries.creating(WatchCreateRequest {
                    key,
                    range_end,
                    watch_id: id,
                    ..request.clone()
                });
                self.pending_creates.push_back(PendingCreate {
                    id,
                    canceled: false,
                    fragment: request.fragment,
                    rejoin: false,
                });
                self.created_from(id, request.start_revision);
                self.order.sent(Side::Cache);
                Ok(())
            }
            // Right after start, before the cache's first list: etcd serves it (a
            // client resuming after a proxy restart must not be refused).
            Err(NotTaken::NotReady) => self.forward(request, key, range_end, true).await,
            Err(NotTaken::Refused(refusal)) => self.refuse(refusal).await,
        }
    }

    /// A watch outside the cache's prefix or below its window goes to etcd (see
    /// `forwarded.rs`). One in the prefix (`rejoins`) comes to the cache once etcd has
    /// brought it into the newer half of the window (see `rejoin`).
    async fn forward(
        &mut self,
        request: WatchCreateRequest,
        key: bytes::Bytes,
        range_end: bytes::Bytes,
        rejoins: bool,
    ) -> Result<(), ()> {
        tracing::debug!(
            start_revision = request.start_revision,
            returns_to_cache = rejoins,
            "watch outside the cache's prefix or window: forwarded to etcd"
        );
        let id = match self.take_id(Side::Etcd, &request) {
            Ok(id) => id,
            Err(Some(())) => return self.refuse(Refusal::DuplicateId).await,
            Err(None) => return Ok(()),
        };
        let (fragment, start_revision) = (request.fragment, request.start_revision);
        let request = WatchCreateRequest {
            key,
            range_end,
            watch_id: id,
            ..request
        };
        let away = (rejoins && self.watches.is_some()).then(|| request.clone());
        match self.forwarded.create(request).await {
            Ok(Some(id)) => {
                if let Some(create) = away {
                    self.entries.away(create);
                }
                self.created_from(id, start_revision);
                self.order.sent(Side::Etcd);
                if fragment {
                    self.outbound.add_fragment(id);
                }
                // Progress requests made before it now need etcd's answer too.
                let out = self.progress.forwarded_created();
                self.apply(out).await
            }
            Ok(None) => self.refuse(Refusal::DuplicateId).await,
            Err(e) => {
                self.outbound.fail(e).await;
                Err(())
            }
        }
    }

    /// The revision of the proxy's own responses: the cache's, or what was sent.
    fn revision(&self) -> i64 {
        match &self.watches {
            Some(w) => w.revision(),
            None => self.progress.sent_max(),
        }
    }

    /// Checks the stream's cached watches, and the cached creates not answered yet,
    /// against etcd's decisions for this caller now (one ask per distinct range, shared
    /// with every stream of the same token).
    fn start_recheck(&mut self) {
        let by_range = self.entries.to_recheck();
        if by_range.is_empty() || !self.state.authz.enabled() {
            return;
        }
        let authz = self.state.authz.clone();
        let metadata = self.metadata.clone();
        self.recheck = Some(Box::pin(async move {
            let mut denied = Vec::new();
            for ((key, end), ids) in by_range {
                if let Err(s) = authz.check(&metadata, &key, &end).await {
                    if etcd_errors::is_auth_refusal(&s) {
                        denied.extend(ids.into_iter().map(|id| (id, s.clone())));
                    }
                }
            }
            denied
        }));
    }

    /// Ends the watches a re-check found etcd no longer allows (open, or created and
    /// not answered yet: its `created` goes out first, then the cancel, as for an open
    /// one), with etcd's refusal as the reason.
    async fn revoked(&mut self, ids: Vec<(i64, Status)>) {
        self.recheck = None;
        for (id, refusal) in ids {
            // Open, or created and not answered yet (its `created` goes out
            // first, then the cancel, as for an open one).
            if self.entries.revoke(id, refusal) {
                tracing::info!(watch_id = id, "watch canceled: etcd no longer allows it");
                crate::metrics::get().auth_revoked();
                if let Some(w) = self.watches.as_mut() {
                    w.cancel(id).await;
                }
            }
        }
    }

    /// A create etcd would refuse: created and canceled at once, with watch id -1.
    async fn refuse(&mut self, refusal: Refusal) -> Result<(), ()> {
        crate::metrics::get().watch_refused(refusal.kind());
        let resp = refusal::refused(self.state.upstream.header(self.revision()), &refusal);
        // After the replies to the creates before it, as etcd answers creates in order.
        match self.order.after_earlier(resp) {
            Some(resp) => self.outbound.send(resp).await,
            None => Ok(()),
        }
    }

    /// The id of a create for `side`: the client's, checked against both sides (also
    /// against creates not yet answered), or etcd's next automatic one. `Err(None)`: the
    /// create waits until the other side has answered its creates (it is queued);
    /// `Err(Some(()))`: the client's id is taken.
    fn take_id(&mut self, side: Side, request: &WatchCreateRequest) -> Result<i64, Option<()>> {
        if self.order.must_wait(side) {
            self.order.defer_again(Deferred::Create(request.clone()));
            return Err(None);
        }
        match request.watch_id {
            0 => Ok(self.alloc_id()),
            id if self.id_in_use(id) => Err(Some(())),
            id => Ok(id),
        }
    }

    /// Whether `id` names a watch of this stream, or one being created.
    fn id_in_use(&self, id: i64) -> bool {
        id_in_use(&self.entries, &self.forwarded, id)
    }

    /// etcd's next automatic id: the lowest from the last one on that is not in use.
    fn alloc_id(&mut self) -> i64 {
        while self.id_in_use(self.next_id) {
            self.next_id += 1;
        }
        self.next_id += 1;
        self.next_id - 1
    }
}

/// etcd's revision as the member that answers `Status` for the caller has it (with the
/// caller's token: the proxy lends it nothing); `None` if etcd could not tell in time.
async fn etcd_revision(
    upstream: std::sync::Arc<crate::upstream::Upstream>,
    metadata: tonic::metadata::MetadataMap,
) -> Option<i64> {
    let maintenance = upstream.maintenance();
    let status = upstream.call(&metadata, crate::pb::etcdserverpb::StatusRequest {}, |r| {
        let mut m = maintenance.clone();
        async move { m.status(r).await }
    });
    match tokio::time::timeout(CHECK_TIMEOUT, status).await {
        Ok(Ok(resp)) => resp.into_inner().header.map(|h| h.revision),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "etcd's revision for a progress request: not known");
            None
        }
        Err(_) => None,
    }
}

/// Sleeps until `at` (never without one).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}
