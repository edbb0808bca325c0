//! Watches the cache cannot serve, forwarded to etcd: a watch on keys outside the cached
//! prefix, or whose start revision is below the cache's window (right after the proxy
//! started, older than its first list), is sent to etcd on one upstream Watch stream per
//! client stream, opened when the first such watch comes. So a client resuming after a
//! proxy restart gets etcd's own replay (or etcd's own compaction answer) instead of a
//! compaction only the cache has.
//!
//! A forwarded watch has the id the session gave it: the client's own, or the stream's
//! next automatic one (one id space with the cache's watches). etcd reads id 0 in a
//! create as "any id", so the watch the client knows as 0 is [`ZERO`] on etcd's stream.
//!
//! etcd registers a watch before it records that the watch wants prev_kv
//! (`serverWatchStream.recvLoop`: `watchStream.Watch`, then `prevKV[id] = true`), so
//! events its send loop picks up in between come without prev_kv. The proxy fills those
//! in as etcd's send loop would have ([`Forwarded::fill_prev_kv`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Status, Streaming};

use crate::forward_macros::call_upstream;
use crate::metrics::{GaugeGuard, Served};
use crate::pb::etcdserverpb::{
    watch_request::RequestUnion, RangeRequest, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use crate::pb::mvccpb::event::EventType;
use crate::upstream::Upstream;

/// The id on etcd's stream of the watch the client knows as 0.
const ZERO: i64 = i64::MAX;
/// Requests queued toward etcd.
const QUEUE: usize = 64;

/// The forwarded watches of one client stream.
pub(crate) struct Forwarded {
    upstream: Arc<Upstream>,
    /// The client's metadata (token, `hasleader`), passed on.
    metadata: MetadataMap,
    tx: Option<mpsc::Sender<WatchRequest>>,
    rx: Option<Streaming<WatchResponse>>,
    ids: HashSet<i64>,
    /// The ones that asked for prev_kv.
    prev_kv: HashSet<i64>,
    /// Ids of creates etcd has not answered yet, in order (etcd answers in order; a
    /// refused create is answered with id -1).
    creating: VecDeque<i64>,
    /// Cancels sent whose `canceled` has not come, by id (their ids are free already).
    canceling: HashMap<i64, usize>,
    /// The last response was the reply to a cancel.
    cancel_reply: bool,
    /// Cancels etcd will never answer: their watch's create was refused.
    dead_cancels: usize,
    /// Ids of creates that resume a watch the client has already had `created` for
    /// (a cached watch caught up from etcd): their `created` is not the client's.
    resuming: HashSet<i64>,
    /// The last response was the `created` of a resumed watch.
    resumed_reply: bool,
    /// Counts the created ones in `etcd_cache_proxy_watches{served="etcd"}`.
    open: GaugeGuard,
}

impl Forwarded {
    pub(crate) fn new(upstream: Arc<Upstream>, metadata: MetadataMap) -> Self {
        Forwarded {
            upstream,
            metadata,
            tx: None,
            rx: None,
            ids: HashSet::new(),
            prev_kv: HashSet::new(),
            creating: VecDeque::new(),
            canceling: HashMap::new(),
            cancel_reply: false,
            dead_cancels: 0,
            resuming: HashSet::new(),
            resumed_reply: false,
            open: crate::metrics::get().open_watches(Served::Etcd),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub(crate) fn contains(&self, watch_id: i64) -> bool {
        self.ids.contains(&watch_id)
    }

    /// Sends `c` (in etcd's keyspace, with the id the session gave it) to etcd and
    /// returns that id; etcd's `created` response follows from [`next`](Self::next).
    /// `Ok(None)`: the id is taken.
    pub(crate) async fn create(
        &mut self,
        mut c: WatchCreateRequest,
    ) -> Result<Option<i64>, Status> {
        if self.ids.contains(&c.watch_id) || c.watch_id == ZERO {
            return Ok(None);
        }
        // The proxy splits responses itself, at its own limit.
        c.fragment = false;
        let id = c.watch_id;
        if id == 0 {
            c.watch_id = ZERO;
        }
        self.ids.insert(id);
        if c.prev_kv {
            self.prev_kv.insert(id);
        }
        if let Err(e) = self.send(RequestUnion::CreateRequest(c)).await {
            self.ids.remove(&id);
            self.prev_kv.remove(&id);
            return Err(e);
        }
        self.creating.push_back(id);
        Ok(Some(id))
    }

    /// Sends `c` as [`create`](Self::create) does, for a watch the client already has
    /// (with its id): etcd's `created` for it is marked (see
    /// [`took_resumed`](Self::took_resumed)), the rest of its responses are the
    /// client's.
    pub(crate) async fn resume(&mut self, c: WatchCreateRequest) -> Result<Option<i64>, Status> {
        let id = self.create(c).await?;
        if let Some(id) = id {
            self.resuming.insert(id);
        }
        Ok(id)
    }

    /// Whether the last response [`next`](Self::next) gave was etcd's `created` (or its
    /// refusal) of a resumed watch (asked once per response).
    pub(crate) fn took_resumed(&mut self) -> bool {
        std::mem::take(&mut self.resumed_reply)
    }

    /// Cancels a forwarded watch (etcd answers `canceled`). False if it is not one.
    pub(crate) async fn cancel(&mut self, watch_id: i64) -> Result<bool, Status> {
        if !self.ids.contains(&watch_id) {
            return Ok(false);
        }
        // As etcd: the id is free once the cancel is read (a create after it may take
        // it); etcd's `canceled` reply to it comes before the replies to what follows.
        self.ids.remove(&watch_id);
        self.prev_kv.remove(&watch_id);
        *self.canceling.entry(watch_id).or_default() += 1;
        let watch_id = if watch_id == 0 { ZERO } else { watch_id };
        self.send(RequestUnion::CancelRequest(WatchCancelRequest { watch_id }))
            .await?;
        Ok(true)
    }

    /// Takes one pending cancel of `watch_id`, if there is one.
    fn took(&mut self, watch_id: i64) -> bool {
        take_one(&mut self.canceling, watch_id)
    }

    /// How many cancels etcd will not answer (their create was refused) since asked.
    pub(crate) fn take_dead_cancels(&mut self) -> usize {
        std::mem::take(&mut self.dead_cancels)
    }

    /// Whether the last response [`next`](Self::next) gave was etcd's reply to a cancel
    /// (asked once per response).
    pub(crate) fn took_cancel(&mut self) -> bool {
        std::mem::take(&mut self.cancel_reply)
    }

    /// Asks etcd for a stream-level progress response (watch id -1).
    pub(crate) async fn request_progress(&mut self) -> Result<(), Status> {
        self.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await
    }

    async fn send(&mut self, req: RequestUnion) -> Result<(), Status> {
        let req = WatchRequest {
            request_union: Some(req),
        };
        if let Some(tx) = &self.tx {
            return tx
                .send(req)
                .await
                .map_err(|_| Status::unavailable("watch stream to etcd closed"));
        }
        // Opened with the first request queued: etcd sends its response headers with
        // its first answer.
        let (tx, rx) = mpsc::channel(QUEUE);
        tx.try_send(req).expect("an empty queue has room");
        let call =
            self.upstream
                .caller_request("watch", &self.metadata, ReceiverStream::new(rx))?;
        let stream = self.upstream.watch().watch(call).await?.into_inner();
        self.tx = Some(tx);
        self.rx = Some(stream);
        Ok(())
    }

    /// Fills in the prev_kv that etcd left out of events of a watch that asked for it
    /// (see the module docs): the key at the event's revision - 1, read from etcd as its
    /// send loop reads it. A create (a put whose create revision is its revision) has
    /// none; a read that fails (e.g. compacted) leaves it out, as etcd does.
    pub(crate) async fn fill_prev_kv(&self, resp: &mut WatchResponse) {
        if !self.prev_kv.contains(&resp.watch_id) {
            return;
        }
        for e in &mut resp.events {
            let Some(kv) = e.kv.as_ref() else { continue };
            let created =
                e.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
            if e.prev_kv.is_some() || created {
                continue;
            }
            let req = RangeRequest {
                key: kv.key.clone(),
                revision: kv.mod_revision - 1,
                ..Default::default()
            };
            match call_upstream!(&self.upstream, &self.metadata, req, kv.range).await {
                Ok(r) => {
                    tracing::debug!(
                        watch_id = resp.watch_id,
                        revision = kv.mod_revision,
                        "filled in the prev_kv etcd left out"
                    );
                    e.prev_kv = r.into_inner().kvs.into_iter().next();
                }
                Err(s) => tracing::debug!(error = %s, "could not read the prev_kv etcd left out"),
            }
        }
    }

    /// etcd's next response; never resolves while no forwarded watch was made.
    ///
    /// # Errors
    /// The upstream stream failed or ended (the client stream should end, so that the
    /// client resumes its watches).
    pub(crate) async fn next(&mut self) -> Result<WatchResponse, Status> {
        let Some(rx) = self.rx.as_mut() else {
            return futures::future::pending().await;
        };
        match rx.message().await {
            Ok(Some(mut r)) => {
                if r.watch_id == ZERO {
                    r.watch_id = 0;
                }
                if r.created {
                    let asked = self.creating.pop_front();
                    if let Some(id) = asked.filter(|id| self.resuming.remove(id)) {
                        self.resumed_reply = true;
                        if r.canceled {
                            // Refused: to the client, the end of its watch.
                            r.watch_id = id;
                            r.created = false;
                        }
                    }
                    if r.canceled {
                        // Refused by etcd (id -1): the id it was asked with is free.
                        if let Some(id) = asked {
                            self.ids.remove(&id);
                            self.prev_kv.remove(&id);
                            // Canceled before etcd refused it: etcd ignores that cancel.
                            self.dead_cancels += self.canceling.remove(&id).unwrap_or(0);
                        }
                    } else {
                        self.open.add();
                        crate::metrics::get().watch_created(Served::Etcd);
                    }
                } else if r.canceled && self.took(r.watch_id) {
                    self.cancel_reply = true;
                    self.open.sub();
                } else if r.canceled && self.ids.remove(&r.watch_id) {
                    self.prev_kv.remove(&r.watch_id);
                    self.open.sub();
                }
                self.upstream.observe(r.header.as_ref());
                Ok(r)
            }
            Ok(None) => Err(Status::unavailable("watch stream to etcd ended")),
            Err(e) => Err(e),
        }
    }
}

/// Takes one of `id` from a count of cancels in flight per watch id; false if none.
pub(crate) fn take_one(counts: &mut HashMap<i64, usize>, id: i64) -> bool {
    let Some(n) = counts.get_mut(&id) else {
        return false;
    };
    *n -= 1;
    if *n == 0 {
        counts.remove(&id);
    }
    true
}
