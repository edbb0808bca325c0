//! The Watch service: one task per gRPC Watch stream reads the client's requests, keeps
//! the stream's watches (through [`crate::watch`], the only user of the cache's watch
//! API) and sends their responses as etcd sends them (`api/v3rpc/watch.go`).
//!
//! ## Slow clients
//! Responses go through a bounded queue (`--watch-send-queue`). The task takes a reply
//! from the cache only when the queue has room, so a client that does not read stops
//! its own stream and nothing else: its cache subscribers fill and lag (caught up from
//! the history later), and one that falls out of the window is canceled with
//! `compact_revision`, as etcd cancels a watch behind compaction.
//!
//! ## Shutdown
//! At shutdown every stream ends with `Unavailable`, which etcd clients answer by
//! reconnecting and resuming each watch after its last revision.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::conn;
use crate::forwarded::Forwarded;
use crate::metrics::{GaugeGuard, Refusal, Served};
use crate::pb::etcdserverpb::{
    watch_create_request::FilterType, watch_request::RequestUnion, watch_server::Watch,
    WatchCreateRequest, WatchRequest, WatchResponse,
};
use crate::pb::mvccpb::{event::EventType, Event};
use crate::progress::{Item, Out, Progress, Side};
use crate::state::State;
use crate::status;
use crate::watch::{Create, Watches, DUPLICATE_ID, EMPTY_RANGE};

/// etcd's `clientv3.InvalidWatchID`.
const INVALID_WATCH_ID: i64 = -1;
/// How often a `hasleader` stream checks that the cache still follows etcd.
const LEADER_CHECK: Duration = Duration::from_millis(500);
/// How long the cache may be cut off from etcd before `hasleader` streams end.
const LEADER_LOST_AFTER: Duration = Duration::from_secs(3);
/// Replies of the cache taken in one round of [`Session::send_replies`] at most.
const BATCH_REPLIES: usize = 4096;
/// A merged events response takes no more events once it is this big (encoded).
const BATCH_BYTES: usize = 64 * 1024;
/// A round of [`Session::send_replies`] takes no more replies once it holds this many
/// bytes of events (a stream whose client does not read holds no more than this).
const BATCH_TOTAL_BYTES: usize = 4 * 1024 * 1024;

/// etcd's Watch service, from the cache.
pub(crate) struct WatchService {
    st: Arc<State>,
}

impl WatchService {
    pub(crate) fn new(st: Arc<State>) -> Self {
        WatchService { st }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let require_leader = req
            .metadata()
            .get("hasleader")
            .is_some_and(|v| v.as_bytes() == b"true");
        let conn = conn::info(req.extensions());
        tracing::debug!(
            conn = conn.map(|c| c.id),
            remote = ?conn.and_then(|c| c.remote),
            require_leader,
            "watch stream"
        );
        let scope = conn.map(|c| c.watches.clone()).unwrap_or_default();
        let (tx, rx) = mpsc::channel(self.st.limits.watch_send_queue.max(1));
        let md = crate::upstream::passed(req.metadata());
        let session = Session {
            watches: self
                .st
                .cache()
                .map(|cache| Watches::new(&cache, &scope, self.st.limits.watches_per_connection)),
            st: self.st.clone(),
            tx,
            fragment: HashSet::new(),
            pending_creates: VecDeque::new(),
            unanswered: VecDeque::new(),
            deferred: VecDeque::new(),
            cache_cancels: HashMap::new(),
            cached: HashMap::new(),
            revoked: HashMap::new(),
            epoch: self.st.authz.epoch(),
            recheck: None,
            forwarded: Forwarded::new(self.st.up.clone(), md.clone()),
            md,
            cache_ids: HashSet::new(),
            next_id: 0,
            progress: Progress::default(),
            require_leader,
            _stream: crate::metrics::get().watch_stream(),
            open: crate::metrics::get().open_watches(Served::Cache),
        };
        tokio::spawn(session.run(req.into_inner()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A cache create waiting for its `created`: the id it was given, its `fragment` flag and
/// key range.
struct PendingCreate {
    id: i64,
    /// The client canceled it before its `created` came: its id is free (as etcd frees
    /// it when it reads the cancel), and it is not counted as open.
    canceled: bool,
    fragment: bool,
    key: bytes::Bytes,
    end: bytes::Bytes,
}

/// A create of either side not answered yet, in the order of the creates, with the
/// refusals of the creates that came after it: they are sent after its `created`, so
/// replies to creates keep the order of the creates, as on etcd.
struct Unanswered {
    side: Side,
    then: Vec<WatchResponse>,
}

/// A request that waits until the other side has answered (see `Session::deferred`).
enum Deferred {
    Create(WatchCreateRequest),
    Cancel(i64),
    /// A progress request behind them: whether the stream has watches when etcd would
    /// read it is known only once they are made.
    Progress,
}

/// Bytes of requests read from a client stream and not yet handled, at most: the stream
/// is read as fast as the client sends (h2 refuses a client whose small frames pile up
/// unread), and a client that sends more than this waits on flow control.
const QUEUED_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// What woke the session.
enum Step {
    Shutdown,
    Request(Option<Result<WatchRequest, Status>>),
    Reply(Option<etcd_cache::WatchResponse>),
    Forwarded(Result<WatchResponse, Status>),
    LeaderCheck(tokio::time::Instant),
    /// A progress request held responses for too long (see `progress.rs`).
    ProgressExpired,
    /// etcd's auth state moved: the cached watches are checked again.
    AuthChanged,
    /// The cached watches etcd no longer allows this caller, with etcd's refusal.
    Revoked(Vec<(i64, String)>),
}

/// A check of the stream's cached watches against etcd's current decisions.
type Recheck = futures::future::BoxFuture<'static, Vec<(i64, String)>>;

struct Session {
    st: Arc<State>,
    /// The cache's side of the stream; `None` when there was no cache to serve from
    /// when the stream opened (every watch is forwarded).
    watches: Option<Watches>,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
    /// The client's token (and `hasleader`): what etcd decides by.
    md: tonic::metadata::MetadataMap,
    /// Watches created with `fragment`.
    fragment: HashSet<i64>,
    /// Each accepted cache create's `fragment` flag and key range (etcd's keyspace), in
    /// order, until its `created` response names its id (the cache answers creates in
    /// the order they were made).
    pending_creates: VecDeque<PendingCreate>,
    /// Every create not answered yet, of both sides, in order.
    unanswered: VecDeque<Unanswered>,
    /// Creates waiting until the other side has answered its creates (each side answers
    /// its own in order; one side at a time keeps the replies in the creates' order).
    deferred: VecDeque<Deferred>,
    /// The client's cancels of cache watches whose `canceled` has not come, by id: the
    /// cache's `canceled` replies to them answer an `unanswered` entry (a cancel the
    /// proxy made, for a revoked permission, or a compaction does not).
    cache_cancels: HashMap<i64, usize>,
    /// The cache's open watches and their ranges, checked again when etcd's auth moves.
    cached: HashMap<i64, (bytes::Bytes, bytes::Bytes)>,
    /// Cache watches canceled because etcd no longer allows them, with etcd's refusal
    /// (their `canceled` response carries it as the reason).
    revoked: HashMap<i64, String>,
    /// Moves when etcd's auth state moved (`authz.rs`).
    epoch: tokio::sync::watch::Receiver<u64>,
    /// The check of the cached watches under way.
    recheck: Option<Recheck>,
    /// Watches outside the cache's prefix or below its window, forwarded to etcd.
    forwarded: Forwarded,
    /// Ids of the cache's watches on this stream (from their `created` responses), so a
    /// forwarded watch cannot take one.
    cache_ids: HashSet<i64>,
    /// The next automatic watch id (etcd's: counted from 0 per stream, skipping ids in
    /// use), given to both sides, so one id never names two watches.
    next_id: i64,
    /// Stream-level progress requests waiting for their answers, from the cache and from
    /// etcd when watches are forwarded, and the responses held back meanwhile so that the
    /// one answer holds for every watch (see `progress.rs`).
    progress: Progress,
    require_leader: bool,
    /// Counts the stream in `etcd_cache_proxy_watch_streams` while it is open.
    _stream: GaugeGuard,
    /// Counts its cache watches in `etcd_cache_proxy_watches{served="cache"}`.
    open: GaugeGuard,
}

impl Session {
    async fn run(mut self, inbound: Streaming<WatchRequest>) {
        let mut shutdown = self.st.shutdown.clone();
        let tx = self.tx.clone();
        let mut inbound_open = true;
        let mut requests = read_requests(inbound);
        let mut leader_check = tokio::time::interval(LEADER_CHECK);
        let mut not_ready_since: Option<tokio::time::Instant> = None;
        loop {
            let has_room = tx.capacity() > 0;
            let progress_deadline = self.progress.deadline();
            let step = tokio::select! {
                _ = crate::state::stopped(&mut shutdown) => Step::Shutdown,
                _ = tx.closed() => return,
                req = requests.recv(), if inbound_open => Step::Request(req.map(|(r, _permit)| r)),
                reply = next_reply(&mut self.watches), if has_room => Step::Reply(reply),
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
            };
            match step {
                Step::Shutdown => {
                    let _ = tx.send(Err(status::shutting_down())).await;
                    return;
                }
                // etcd keeps sending after the client half-closes (until it cancels).
                Step::Request(None) => inbound_open = false,
                Step::Request(Some(Err(e))) => {
                    // etcd ends the stream with the receive error's status (a message
                    // over the limit, one that does not decode), so the client learns why.
                    tracing::debug!(error = %e, "watch stream receive failed");
                    let _ = tx.send(Err(status::from_receive(e))).await;
                    return;
                }
                Step::Request(Some(Ok(req))) => {
                    if self.handle(req).await.is_err() {
                        return;
                    }
                }
                Step::Reply(None) => {
                    let _ = tx.send(Err(status::shutting_down())).await;
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
                    let out = self.progress.expire(tokio::time::Instant::now());
                    if self.apply(out).await.is_err() {
                        return;
                    }
                }
                Step::AuthChanged => self.start_recheck(),
                Step::Revoked(ids) => {
                    self.recheck = None;
                    for (id, reason) in ids {
                        if self.cached.remove(&id).is_some() {
                            tracing::info!(
                                watch_id = id,
                                "watch canceled: etcd no longer allows it"
                            );
                            crate::metrics::get().auth_revoked();
                            self.revoked.insert(id, reason);
                            if let Some(w) = self.watches.as_mut() {
                                w.cancel(id).await;
                            }
                        }
                    }
                }
                Step::LeaderCheck(now) => {
                    let ready = match self.st.cache() {
                        Some(c) => c.is_ready(),
                        // Nothing cached: every watch is etcd's, which says so itself.
                        None => self.watches.is_none(),
                    };
                    if ready {
                        not_ready_since = None;
                    } else if now - *not_ready_since.get_or_insert(now) >= LEADER_LOST_AFTER {
                        let _ = tx.send(Err(status::no_leader())).await;
                        return;
                    }
                }
            }
            // The other side answered: the creates that waited for it go now.
            if !self.deferred.is_empty() && self.drain_deferred().await.is_err() {
                return;
            }
        }
    }

    async fn handle(&mut self, req: WatchRequest) -> Result<(), ()> {
        match req.request_union {
            // Behind creates that wait, in order.
            Some(RequestUnion::CreateRequest(c)) if !self.deferred.is_empty() => {
                self.deferred.push_back(Deferred::Create(c));
                Ok(())
            }
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) if !self.deferred.is_empty() => {
                self.deferred.push_back(Deferred::Cancel(c.watch_id));
                Ok(())
            }
            Some(RequestUnion::CancelRequest(c)) => self.cancel(c.watch_id).await,
            Some(RequestUnion::ProgressRequest(_)) if !self.deferred.is_empty() => {
                self.deferred.push_back(Deferred::Progress);
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
        // Answered as etcd answers it, at a revision that covers every write completed
        // before the request: the cache's answer is at least the cluster's revision when
        // it is asked (one round trip it shares), and etcd's is its own. The floor above
        // which responses wait is what the cache has applied now (nothing sent is above
        // it); no round trip here, which would hold up the whole stream while etcd is
        // slow or away. Without a cache side, etcd answers for the stream.
        let (floor, etcd) = match &self.watches {
            Some(w) => (w.revision(), !self.forwarded.is_empty()),
            None => (self.progress.sent_max(), true),
        };
        let out = self
            .progress
            .request(floor, etcd, tokio::time::Instant::now());
        self.apply(out).await
    }

    /// Makes the creates and cancels that waited for the other side, in order, until
    /// one has to wait again.
    async fn drain_deferred(&mut self) -> Result<(), ()> {
        while let Some(d) = self.deferred.pop_front() {
            let waiting = self.deferred.len();
            match d {
                Deferred::Create(c) => self.create(c).await?,
                Deferred::Cancel(id) => self.cancel(id).await?,
                Deferred::Progress => self.progress_request().await?,
            }
            if self.deferred.len() > waiting {
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
            if self.must_wait(Side::Etcd) {
                self.deferred.push_front(Deferred::Cancel(id));
                return Ok(());
            }
            match self.forwarded.cancel(id).await {
                Ok(true) => self.unanswered.push_back(Unanswered {
                    side: Side::Etcd,
                    then: Vec::new(),
                }),
                Ok(false) => {}
                Err(e) => {
                    let _ = self.tx.send(Err(e)).await;
                    return Err(());
                }
            }
            return Ok(());
        }
        let pending = self
            .pending_creates
            .iter()
            .any(|p| p.id == id && !p.canceled);
        // A watch the proxy canceled itself (a revoked permission): that `canceled` is
        // on its way.
        let cached = self.cache_ids.contains(&id) && !self.revoked.contains_key(&id);
        if !(pending || cached) || self.watches.is_none() {
            return Ok(());
        }
        if self.must_wait(Side::Cache) {
            self.deferred.push_front(Deferred::Cancel(id));
            return Ok(());
        }
        if self.cache_ids.remove(&id) {
            self.open.sub();
        }
        self.fragment.remove(&id);
        self.cached.remove(&id);
        if let Some(p) = self
            .pending_creates
            .iter_mut()
            .find(|p| p.id == id && !p.canceled)
        {
            p.canceled = true;
        }
        *self.cache_cancels.entry(id).or_default() += 1;
        self.unanswered.push_back(Unanswered {
            side: Side::Cache,
            then: Vec::new(),
        });
        if let Some(w) = self.watches.as_mut() {
            w.cancel(id).await;
        }
        Ok(())
    }

    /// Whether the stream has a watch, as etcd counts them when it reads a request: the
    /// ones created or being created, not canceled.
    fn has_watches(&self) -> bool {
        !self.cache_ids.is_empty()
            || !self.forwarded.is_empty()
            || self.pending_creates.iter().any(|p| !p.canceled)
    }

    /// Whether etcd drops a progress request on a stream without watches: 3.5 and later
    /// do (`progressIfSync` answers through a watch); 3.4 answers it. Members whose
    /// version is unknown (unreachable when last probed) are left out; with none known
    /// it is taken as answered.
    fn lone_progress_dropped(&self) -> bool {
        let Some(cache) = self.st.cache() else {
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

    /// Whether a create for `side` must wait: the other side has creates unanswered.
    fn must_wait(&self, side: Side) -> bool {
        self.unanswered.iter().any(|u| u.side != side)
    }

    async fn create(&mut self, c: WatchCreateRequest) -> Result<(), ()> {
        if c.start_revision < 0 {
            // As etcd >= 3.5 (3.4 lets the watch start from the oldest revision).
            return self
                .refuse("etcdserver: mvcc: required revision has been compacted".into())
                .await;
        }
        let key = if c.key.is_empty() {
            bytes::Bytes::from_static(b"\0")
        } else {
            c.key.clone()
        };
        let (key, range_end) = self.st.ns.range(&key, &c.range_end);
        let end = range_end.as_ref();
        if !end.is_empty() && end != b"\0" && key.as_ref() >= end {
            return self.refuse(EMPTY_RANGE.into()).await;
        }
        // A negative id of the client's own: etcd takes it (the cache's ids are never
        // negative), so etcd serves that watch.
        if c.watch_id < 0 {
            return self.forward(c, key, range_end).await;
        }
        // No cache, outside the cached prefix, or below the cache's window: etcd serves it.
        let floor = match &self.watches {
            Some(w) => w.history_span().0,
            None => return self.forward(c, key, range_end).await,
        };
        if !self.st.in_cache(&key, &range_end)
            || (c.start_revision > 0 && c.start_revision < floor)
            || self.st.compacted(c.start_revision).await
        {
            return self.forward(c, key, range_end).await;
        }
        // The cache serves only a caller etcd allows this range (`authz.rs`).
        match self.st.authz.check(&self.md, &key, &range_end).await {
            Ok(()) => {}
            Err(s) if crate::authz::is_auth_refusal(&s) => {
                return self.refuse(status::watch_refusal(&s)).await;
            }
            // etcd could not be asked: etcd decides when it serves the watch itself.
            Err(_) => return self.forward(c, key, range_end).await,
        }
        let id = match self.take_id(Side::Cache, &c) {
            Ok(id) => id,
            Err(Some(())) => return self.refuse(DUPLICATE_ID.into()).await,
            Err(None) => return Ok(()),
        };
        let create = Create {
            key: key.clone(),
            range_end: range_end.clone(),
            start_revision: c.start_revision,
            progress_notify: c.progress_notify,
            prev_kv: c.prev_kv,
            no_put: c.filters.contains(&(FilterType::Noput as i32)),
            no_delete: c.filters.contains(&(FilterType::Nodelete as i32)),
            watch_id: id,
        };
        let watches = self.watches.as_mut().expect("checked above");
        match watches.create(create).await {
            Ok(()) => {
                self.pending_creates.push_back(PendingCreate {
                    id,
                    canceled: false,
                    fragment: c.fragment,
                    key,
                    end: range_end,
                });
                self.unanswered.push_back(Unanswered {
                    side: Side::Cache,
                    then: Vec::new(),
                });
                Ok(())
            }
            // Right after start, before the cache's first list: etcd serves it (a
            // client resuming after a proxy restart must not be refused).
            Err(refused) if refused.not_ready => self.forward(c, key, range_end).await,
            Err(refused) => self.refuse(refused.reason).await,
        }
    }

    /// A watch outside the cache's prefix or below its window goes to etcd (see
    /// `forwarded.rs`).
    async fn forward(
        &mut self,
        c: WatchCreateRequest,
        key: bytes::Bytes,
        range_end: bytes::Bytes,
    ) -> Result<(), ()> {
        tracing::debug!(
            start_revision = c.start_revision,
            "watch outside the cache's prefix or window: forwarded to etcd"
        );
        let id = match self.take_id(Side::Etcd, &c) {
            Ok(id) => id,
            Err(Some(())) => return self.refuse(DUPLICATE_ID.into()).await,
            Err(None) => return Ok(()),
        };
        // Over the proxy's certificate a caller without a token would be the
        // certificate's CN: refused as etcd refuses a caller without a user.
        if self.st.up.cert_identity().is_some()
            && self.md.get(crate::upstream::TOKEN).is_none()
            && self.st.authz.enabled()
        {
            return self
                .refuse(status::watch_refusal(&status::user_empty()))
                .await;
        }
        let fragment = c.fragment;
        let req = WatchCreateRequest {
            key,
            range_end,
            watch_id: id,
            ..c
        };
        match self.forwarded.create(req).await {
            Ok(Some(id)) => {
                self.unanswered.push_back(Unanswered {
                    side: Side::Etcd,
                    then: Vec::new(),
                });
                if fragment {
                    self.fragment.insert(id);
                }
                // Progress requests made before it now need etcd's answer too.
                let out = self.progress.forwarded_created();
                self.apply(out).await
            }
            Ok(None) => self.refuse(DUPLICATE_ID.into()).await,
            Err(e) => {
                let _ = self.tx.send(Err(e)).await;
                Err(())
            }
        }
    }

    /// Does what the progress bookkeeping asks: asks the sides again, then sends its
    /// items in order.
    async fn apply(&mut self, mut out: Out) -> Result<(), ()> {
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
    async fn apply_once(&mut self, out: Out) -> Result<usize, ()> {
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
                let _ = self.tx.send(Err(e)).await;
                return Err(());
            }
        }
        for item in out.items {
            match item {
                Item::Resp(resp) => self.emit(resp).await?,
                Item::Progress(revision) => {
                    let resp = WatchResponse {
                        header: Some(self.st.up.header(revision)),
                        watch_id: INVALID_WATCH_ID,
                        ..Default::default()
                    };
                    send(&self.tx, resp).await?;
                }
            }
        }
        Ok(unasked)
    }

    /// The revision of the proxy's own responses: the cache's, or what was sent.
    fn revision(&self) -> i64 {
        match &self.watches {
            Some(w) => w.revision(),
            None => self.progress.sent_max(),
        }
    }

    /// Checks the stream's cached watches against etcd's decisions for this caller now
    /// (one ask per distinct range, shared with every stream of the same token).
    fn start_recheck(&mut self) {
        if self.cached.is_empty() || !self.st.authz.enabled() {
            return;
        }
        let mut by_range: HashMap<(bytes::Bytes, bytes::Bytes), Vec<i64>> = HashMap::new();
        for (id, range) in &self.cached {
            by_range.entry(range.clone()).or_default().push(*id);
        }
        let authz = self.st.authz.clone();
        let md = self.md.clone();
        self.recheck = Some(Box::pin(async move {
            let mut denied = Vec::new();
            for ((key, end), ids) in by_range {
                if let Err(s) = authz.check(&md, &key, &end).await {
                    if crate::authz::is_auth_refusal(&s) {
                        let reason = status::watch_refusal(&s);
                        denied.extend(ids.into_iter().map(|id| (id, reason.clone())));
                    }
                }
            }
            denied
        }));
    }

    /// Sends a response of a watch now or after the pending progress answer.
    async fn out(&mut self, resp: WatchResponse) -> Result<(), ()> {
        let out = self.progress.push(resp);
        self.apply(out).await
    }

    /// Sends a response of a watch, in fragments if it asked for them.
    async fn emit(&mut self, resp: WatchResponse) -> Result<(), ()> {
        if self.fragment.contains(&resp.watch_id) && resp.events.len() > 1 {
            for part in fragments(resp, self.st.limits.max_request_bytes) {
                send(&self.tx, part).await?;
            }
            return Ok(());
        }
        send(&self.tx, resp).await
    }

    /// A response of a forwarded watch, with keys moved out of the namespace.
    async fn send_forwarded(&mut self, mut resp: WatchResponse) -> Result<(), ()> {
        if resp.watch_id == INVALID_WATCH_ID
            && !resp.created
            && !resp.canceled
            && resp.events.is_empty()
        {
            let revision = resp.header.as_ref().map_or(0, |h| h.revision);
            tracing::trace!(revision, "progress: etcd answered");
            let out = self.progress.answer(Side::Etcd, revision);
            return self.apply(out).await;
        }
        if resp.created && resp.canceled {
            crate::metrics::get().watch_refused(Refusal::Etcd);
        }
        let mut after = if resp.created || (resp.canceled && self.forwarded.took_cancel()) {
            self.answered(Side::Etcd)
        } else {
            Vec::new()
        };
        // Cancels of a create etcd refused: etcd sends nothing for them.
        for _ in 0..self.forwarded.take_dead_cancels() {
            after.extend(self.answered(Side::Etcd));
        }
        if resp.canceled {
            self.fragment.remove(&resp.watch_id);
        }
        self.forwarded.fill_prev_kv(&mut resp).await;
        for e in &mut resp.events {
            if let Some(kv) = e.kv.as_mut() {
                self.st.ns.kv_out(kv);
            }
            if let Some(kv) = e.prev_kv.as_mut() {
                self.st.ns.kv_out(kv);
            }
        }
        self.out(resp).await?;
        for refusal in after {
            send(&self.tx, refusal).await?;
        }
        Ok(())
    }

    /// A create etcd would refuse: created and canceled at once, with watch id -1.
    async fn refuse(&mut self, reason: String) -> Result<(), ()> {
        crate::metrics::get().watch_refused(Refusal::of(&reason));
        let resp = WatchResponse {
            header: Some(self.st.up.header(self.revision())),
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: reason,
            ..Default::default()
        };
        // After the replies to the creates before it, as etcd answers creates in order.
        match self.unanswered.back_mut() {
            Some(u) => {
                u.then.push(resp);
                Ok(())
            }
            None => send(&self.tx, resp).await,
        }
    }

    /// The first unanswered create of `side` was answered: the refusals that wait for
    /// it, if no earlier create is still unanswered (else they wait for that one).
    fn answered(&mut self, side: Side) -> Vec<WatchResponse> {
        let Some(at) = self.unanswered.iter().position(|u| u.side == side) else {
            return Vec::new();
        };
        let done = self.unanswered.remove(at).expect("found above");
        match at.checked_sub(1).and_then(|i| self.unanswered.get_mut(i)) {
            Some(earlier) => {
                earlier.then.extend(done.then);
                Vec::new()
            }
            None => done.then,
        }
    }

    /// The id of a create for `side`: the client's, checked against both sides (also
    /// against creates not yet answered), or etcd's next automatic one. `Err(None)`: the
    /// create waits until the other side has answered its creates (it is queued);
    /// `Err(Some(()))`: the client's id is taken.
    fn take_id(&mut self, side: Side, c: &WatchCreateRequest) -> Result<i64, Option<()>> {
        if self.must_wait(side) {
            self.deferred.push_front(Deferred::Create(c.clone()));
            return Err(None);
        }
        match c.watch_id {
            0 => Ok(self.alloc_id()),
            id if self.id_in_use(id) => Err(Some(())),
            id => Ok(id),
        }
    }

    /// Whether `id` names a watch of this stream, or one being created.
    fn id_in_use(&self, id: i64) -> bool {
        self.cache_ids.contains(&id)
            || self.forwarded.contains(id)
            || self
                .pending_creates
                .iter()
                .any(|p| p.id == id && !p.canceled)
    }

    /// etcd's next automatic id: the lowest from the last one on that is not in use.
    fn alloc_id(&mut self) -> i64 {
        while self.id_in_use(self.next_id) {
            self.next_id += 1;
        }
        self.next_id += 1;
        self.next_id - 1
    }

    /// Sends `first` and the cache's replies that are ready after it, with the events of
    /// one watch in one response where they follow each other: etcd sends a watcher
    /// that is catching up many revisions in one response (`syncWatchers`), and a remote
    /// watcher pays per message more than per event. A watch's responses keep their
    /// order; responses of different watches may pass each other, as on etcd's streams.
    /// Created, canceled and progress responses are not merged: the merged responses
    /// before them go out first.
    async fn send_replies(&mut self, first: etcd_cache::WatchResponse) -> Result<(), ()> {
        let mut batch: Vec<WatchResponse> = Vec::new();
        // Per watch: the index in `batch` of its response still taking events, and its
        // encoded size.
        let mut open: HashMap<i64, (usize, usize)> = HashMap::new();
        let mut next = Some(first);
        let mut taken = 0;
        let mut total = 0;
        while let Some(r) = next.take() {
            taken += 1;
            let id = r.watch_id();
            let plain = !r.created()
                && !r.canceled()
                && !r.events().is_empty()
                && !self.fragment.contains(&id);
            if plain {
                let resp = self.to_pb(&r);
                let size = resp.events.iter().map(Message::encoded_len).sum::<usize>();
                total += size;
                match open.get_mut(&id) {
                    Some((at, bytes)) if *bytes < BATCH_BYTES => {
                        let merged = &mut batch[*at];
                        merged.header = resp.header;
                        merged.events.extend(resp.events);
                        *bytes += size;
                    }
                    _ => {
                        open.insert(id, (batch.len(), size));
                        batch.push(resp);
                    }
                }
            } else {
                self.flush(&mut batch).await?;
                open.clear();
                self.send_reply(r).await?;
            }
            // What is gathered waits for the client's queue: at most BATCH_REPLIES replies
            // and BATCH_TOTAL_BYTES, so a client that does not read holds up only that
            // much (and its own stream).
            if taken < BATCH_REPLIES && total < BATCH_TOTAL_BYTES {
                next = self
                    .watches
                    .as_mut()
                    .and_then(|w| w.next().now_or_never().flatten());
            }
        }
        self.flush(&mut batch).await
    }

    /// Sends the merged responses, with header revisions that do not go down along the
    /// batch (a merged response carries its last event's header).
    async fn flush(&mut self, batch: &mut Vec<WatchResponse>) -> Result<(), ()> {
        let mut revision = 0;
        for mut resp in batch.drain(..) {
            if let Some(h) = resp.header.as_mut() {
                h.revision = h.revision.max(revision);
                revision = h.revision;
            }
            self.out(resp).await?;
        }
        Ok(())
    }

    /// The cache's response as etcd's message.
    fn to_pb(&self, r: &etcd_cache::WatchResponse) -> WatchResponse {
        WatchResponse {
            header: Some(self.st.up.header_from_cache(r.header(), r.revision())),
            watch_id: r.watch_id(),
            created: r.created(),
            canceled: r.canceled(),
            compact_revision: r.compact_revision(),
            // etcd gives no reason with a compaction (its clients read compact_revision).
            cancel_reason: if r.compact_revision() > 0 {
                String::new()
            } else {
                r.cancel_reason().to_string()
            },
            fragment: false,
            events: r.events().iter().map(|e| self.event(e)).collect(),
        }
    }

    async fn send_reply(&mut self, r: etcd_cache::WatchResponse) -> Result<(), ()> {
        let watch_id = r.watch_id();
        if watch_id == INVALID_WATCH_ID && r.is_progress_notify() {
            tracing::trace!(revision = r.revision(), "progress: the cache answered");
            let out = self.progress.answer(Side::Cache, r.revision());
            return self.apply(out).await;
        }
        let mut after = Vec::new();
        if r.created() {
            let pending = self.pending_creates.pop_front();
            // Canceled by the client before this came: its id is free already.
            let live = !r.canceled() && !pending.as_ref().is_some_and(|p| p.canceled);
            if live && self.cache_ids.insert(watch_id) {
                self.open.add();
                crate::metrics::get().watch_created(Served::Cache);
            }
            if let Some(p) = pending {
                if live {
                    if p.fragment {
                        self.fragment.insert(watch_id);
                    }
                    self.cached.insert(watch_id, (p.key, p.end));
                }
                after = self.answered(Side::Cache);
            }
        } else if r.canceled() && r.compact_revision() == 0 && self.took_cache_cancel(watch_id) {
            // The reply to the client's cancel (whose id was freed when it was read).
            after = self.answered(Side::Cache);
        } else if r.canceled() {
            if self.cache_ids.remove(&watch_id) {
                self.open.sub();
            }
            self.fragment.remove(&watch_id);
            self.cached.remove(&watch_id);
        }
        let mut resp = self.to_pb(&r);
        if r.canceled() && !r.created() {
            if let Some(reason) = self.revoked.remove(&watch_id) {
                resp.cancel_reason = reason;
            }
        }
        self.out(resp).await?;
        for refusal in after {
            send(&self.tx, refusal).await?;
        }
        Ok(())
    }

    /// Whether a `canceled` of the cache for `watch_id` answers a cancel of the client's.
    fn took_cache_cancel(&mut self, watch_id: i64) -> bool {
        crate::forwarded::take_one(&mut self.cache_cancels, watch_id)
    }

    fn event(&self, e: &etcd_cache::Event) -> Event {
        let kind = match e.event_type() {
            etcd_cache::EventType::Put => EventType::Put,
            etcd_cache::EventType::Delete => EventType::Delete,
        };
        Event {
            r#type: kind as i32,
            kv: e.kv().map(|kv| self.st.ns.kv_from_cache(kv)),
            prev_kv: e.prev_kv().map(|kv| self.st.ns.kv_from_cache(kv)),
        }
    }
}

/// Reads a client's Watch requests as fast as they come, into a queue bounded in bytes
/// ([`QUEUED_REQUEST_BYTES`]): each request holds its share until it is handled. A
/// receive error is the last item.
fn read_requests(
    mut inbound: Streaming<WatchRequest>,
) -> mpsc::UnboundedReceiver<(
    Result<WatchRequest, Status>,
    tokio::sync::OwnedSemaphorePermit,
)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let budget = Arc::new(tokio::sync::Semaphore::new(QUEUED_REQUEST_BYTES));
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = inbound.next() => next,
                _ = tx.closed() => return,
            };
            let Some(item) = next else { return };
            let size = match &item {
                Ok(r) => r.encoded_len().clamp(1, QUEUED_REQUEST_BYTES),
                Err(_) => 1,
            };
            let Ok(permit) = budget.clone().acquire_many_owned(size as u32).await else {
                return;
            };
            let failed = item.is_err();
            if tx.send((item, permit)).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// The cache side's next response (never, without a cache side).
async fn next_reply(watches: &mut Option<Watches>) -> Option<etcd_cache::WatchResponse> {
    match watches {
        Some(w) => w.next().await,
        None => futures::future::pending().await,
    }
}

/// Sleeps until `at` (never without one).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

/// Queues a response for the client (waits while the queue is full).
async fn send(
    tx: &mpsc::Sender<Result<WatchResponse, Status>>,
    resp: WatchResponse,
) -> Result<(), ()> {
    tx.send(Ok(resp)).await.map_err(drop)
}

/// etcd's `sendFragments`: a response of two or more events at or above `max_bytes` is
/// sent as several, each with `fragment = true` but the last.
fn fragments(resp: WatchResponse, max_bytes: usize) -> Vec<WatchResponse> {
    if resp.encoded_len() < max_bytes || resp.events.len() < 2 {
        return vec![resp];
    }
    let mut out = Vec::new();
    let mut events = resp.events.clone().into_iter().peekable();
    while events.peek().is_some() {
        let mut cur = WatchResponse {
            events: Vec::new(),
            fragment: true,
            ..resp.clone()
        };
        while let Some(ev) = events.peek() {
            cur.events.push(ev.clone());
            if cur.events.len() > 1 && cur.encoded_len() >= max_bytes {
                cur.events.pop();
                break;
            }
            events.next();
        }
        if events.peek().is_none() {
            cur.fragment = false;
        }
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::mvccpb::KeyValue;

    fn put(key: &str, value_len: usize) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.as_bytes().to_vec().into(),
                value: vec![b'x'; value_len].into(),
                mod_revision: 7,
                create_revision: 7,
                version: 1,
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    #[test]
    fn fragments_split_as_etcd() {
        let resp = WatchResponse {
            watch_id: 3,
            events: (0..10).map(|i| put(&format!("k{i}"), 100)).collect(),
            ..Default::default()
        };
        // Below the limit: one response, not marked.
        let one = fragments(resp.clone(), 1 << 20);
        assert_eq!(one.len(), 1);
        assert!(!one[0].fragment);
        // Each event is ~110 bytes: at most 2 per part below 300 bytes.
        let parts = fragments(resp.clone(), 300);
        assert!(parts.len() >= 4, "{}", parts.len());
        assert!(parts[..parts.len() - 1].iter().all(|p| p.fragment));
        assert!(!parts.last().unwrap().fragment);
        let events: Vec<_> = parts.iter().flat_map(|p| p.events.clone()).collect();
        assert_eq!(events, resp.events);
        assert!(parts.iter().all(|p| p.watch_id == 3));
        // A single event is never split, whatever its size.
        let big = WatchResponse {
            events: vec![put("k", 1000)],
            ..Default::default()
        };
        assert_eq!(fragments(big, 10).len(), 1);
    }
}
