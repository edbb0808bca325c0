//! Watches the cache cannot serve, forwarded to etcd: a watch on keys outside the cached
//! prefix, or whose start revision is below the cache's window (right after the proxy
//! started, older than its first list), is sent to etcd on one upstream Watch stream per
//! client stream, opened when the first such watch comes. So a client resuming after a
//! proxy restart gets etcd's own replay (or etcd's own compaction answer) instead of a
//! compaction only the cache has.
//!
//! A forwarded watch has the id the session gave it: the client's own, or the stream's
//! next automatic one (one id space with the cache's watches). etcd reads id 0 in a
//! create as "any id", so the watch the client knows as 0 is [`ZERO`] on etcd's stream;
//! a client may still ask for [`ZERO`] itself (another proxy in front of this one does,
//! for its own clients' watch 0) as long as its watch 0 is not live, and the other way
//! round.
//!
//! etcd registers a watch before it records that the watch wants prev_kv, so its first
//! events may come without it; the proxy fills those in ([`Forwarded::fill_prev_kv`],
//! `prev_kv.rs`).
//!
//! etcd before 3.4.38 / 3.5.22 / 3.6.2 sends a watch from a revision it has not reached
//! progress notifications below that start (etcd#20221), and answers a stream-level
//! progress request below it; a client that resumes from one is sent events before the
//! start it asked for. The proxy drops those, as fixed etcd never sends them (it drops
//! such a stream-level request unanswered).

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Status, Streaming};

use crate::metrics::{GaugeGuard, Served};
use crate::pb::etcdserverpb::{
    watch_request::RequestUnion, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest,
    WatchRequest, WatchResponse,
};

use super::id_map::IdMap;
use super::messages::INVALID_WATCH_ID;
use crate::upstream::Upstream;

/// The id on etcd's stream of the watch the client knows as 0.
const ZERO: i64 = i64::MAX;
/// Requests queued toward etcd.
const QUEUE: usize = 64;
/// One live forwarded watch.
#[derive(Debug, Clone, Copy)]
struct Watch {
    /// It asked for prev_kv (see [`Forwarded::fill_prev_kv`]).
    prev_kv: bool,
    /// Its start revision, while etcd has not been heard to reach it (see the module
    /// docs): no progress below it goes to the client.
    ahead: Option<i64>,
    /// How many stream-level progress requests had been sent on the stream when its
    /// `created` came (`None` before): see [`Forwarded::progress_covered`].
    created_after: Option<u64>,
}

/// A create sent to etcd and not answered yet.
#[derive(Debug, Clone, Copy)]
struct Creating {
    id: i64,
    /// It resumes a watch the client has already had `created` for (a cached watch
    /// caught up from etcd): its `created` is not the client's.
    resuming: bool,
}

/// What the last response given to the session was (asked once per response).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Last {
    #[default]
    Other,
    /// etcd's reply to a cancel of the client's.
    CancelReply,
    /// etcd's `created` (or its refusal) of a resumed watch.
    ResumedReply,
}

/// The forwarded watches of one client stream.
pub(crate) struct Forwarded {
    upstream: Arc<Upstream>,
    /// The client's metadata (token, `hasleader`), passed on.
    metadata: MetadataMap,
    tx: Option<mpsc::Sender<WatchRequest>>,
    rx: Option<Streaming<WatchResponse>>,
    /// The live forwarded watches, one entry each, by the client's id.
    watches: IdMap<Watch>,
    /// How many of them are [`Watch::ahead`] (a response is checked only while one is).
    ahead: usize,
    /// The creates etcd has not answered yet, in order (etcd answers in order; a refused
    /// create is answered with id -1).
    creating: VecDeque<Creating>,
    /// Cancels sent whose `canceled` has not come, by id (their ids are free already).
    canceling: IdMap<usize>,
    /// Cancels etcd will never answer: their watch's create was refused.
    dead_cancels: usize,
    /// The proxy's own cancels (a watch returning to the cache), by id: etcd's reply is
    /// not the client's.
    retiring: IdMap<usize>,
    /// What the last response [`next`](Self::next) gave was, for the session.
    last: Last,
    /// Stream-level progress requests sent on the stream, and answers (watch id -1)
    /// received: see [`progress_covered`](Self::progress_covered).
    progress_asked: u64,
    progress_answers: u64,
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
            watches: IdMap::default(),
            ahead: 0,
            creating: VecDeque::new(),
            canceling: IdMap::default(),
            dead_cancels: 0,
            retiring: IdMap::default(),
            last: Last::Other,
            progress_asked: 0,
            progress_answers: 0,
            open: crate::metrics::get().open_watches(Served::Etcd),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    pub(crate) fn contains(&self, watch_id: i64) -> bool {
        self.watches.contains_key(&watch_id)
    }

    /// Sends `c` (in etcd's keyspace, with the id the session gave it) to etcd and
    /// returns that id; etcd's `created` response follows from [`next`](Self::next).
    /// `Ok(None)`: the id is taken.
    pub(crate) async fn create(
        &mut self,
        mut c: WatchCreateRequest,
    ) -> Result<Option<i64>, Status> {
        let taken = match c.watch_id {
            0 => self.uses_zero(ZERO),
            ZERO => self.uses_zero(0),
            id => self.contains(id),
        };
        if taken || self.contains(c.watch_id) {
            return Ok(None);
        }
        // The proxy splits responses itself, at its own limit.
        c.fragment = false;
        let id = c.watch_id;
        if id == 0 {
            c.watch_id = ZERO;
        }
        self.live(id, c.prev_kv, c.start_revision);
        if let Err(e) = self.send(RequestUnion::CreateRequest(c)).await {
            self.forget(id);
            return Err(e);
        }
        self.creating.push_back(Creating {
            id,
            resuming: false,
        });
        Ok(Some(id))
    }

    /// Sends `c` as [`create`](Self::create) does, for a watch the client already has
    /// (with its id): etcd's `created` for it is marked (see
    /// [`took_resumed`](Self::took_resumed)), the rest of its responses are the
    /// client's.
    pub(crate) async fn resume(&mut self, c: WatchCreateRequest) -> Result<Option<i64>, Status> {
        let id = self.create(c).await?;
        if id.is_some() {
            if let Some(sent) = self.creating.back_mut() {
                sent.resuming = true;
            }
        }
        Ok(id)
    }

    /// Whether the last response [`next`](Self::next) gave was etcd's `created` (or its
    /// refusal) of a resumed watch (asked once per response).
    pub(crate) fn took_resumed(&mut self) -> bool {
        self.took_last(Last::ResumedReply)
    }

    /// Cancels a forwarded watch (etcd answers `canceled`). False if it is not one.
    pub(crate) async fn cancel(&mut self, watch_id: i64) -> Result<bool, Status> {
        if !self.contains(watch_id) {
            return Ok(false);
        }
        // As etcd: the id is free once the cancel is read (a create after it may take
        // it); etcd's `canceled` reply to it comes before the replies to what follows.
        self.forget(watch_id);
        *self.canceling.entry(watch_id).or_default() += 1;
        let watch_id = if watch_id == 0 { ZERO } else { watch_id };
        self.send(RequestUnion::CancelRequest(WatchCancelRequest { watch_id }))
            .await?;
        Ok(true)
    }

    /// Ends forwarded watch `watch_id` for the proxy's own reason (it returns to the
    /// cache under the same id): as [`cancel`](Self::cancel), but etcd's `canceled`
    /// reply is not the client's, and neither is anything else etcd still sends of it.
    pub(crate) async fn retire(&mut self, watch_id: i64) -> Result<(), Status> {
        if !self.forget(watch_id) {
            return Ok(());
        }
        *self.retiring.entry(watch_id).or_default() += 1;
        let watch_id = if watch_id == 0 { ZERO } else { watch_id };
        self.send(RequestUnion::CancelRequest(WatchCancelRequest { watch_id }))
            .await
    }

    /// Watch `id` is live, with prev_kv if asked; ahead until a response of it at or past
    /// its `start` (its `created`, for a start etcd has reached). [`forget`](Self::forget)
    /// undoes it.
    fn live(&mut self, id: i64, prev_kv: bool, start: i64) {
        let ahead = (start > 0).then_some(start);
        self.ahead += usize::from(ahead.is_some());
        self.watches.insert(
            id,
            Watch {
                prev_kv,
                ahead,
                created_after: None,
            },
        );
    }

    /// Forgets live watch `watch_id`; false if it was not one.
    fn forget(&mut self, watch_id: i64) -> bool {
        match self.watches.remove(&watch_id) {
            Some(w) => {
                self.ahead -= usize::from(w.ahead.is_some());
                true
            }
            None => false,
        }
    }

    /// Whether the last response given was `what` (asked once per response).
    fn took_last(&mut self, what: Last) -> bool {
        if self.last == what {
            self.last = Last::Other;
            return true;
        }
        false
    }

    /// Whether client id `id` (0 or [`ZERO`], which share etcd's id [`ZERO`]) names a
    /// watch of this stream that etcd may still answer for: live, being canceled, or
    /// being retired.
    fn uses_zero(&self, id: i64) -> bool {
        self.contains(id) || self.canceling.contains_key(&id) || self.retiring.contains_key(&id)
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
        self.took_last(Last::CancelReply)
    }

    /// Asks etcd for a stream-level progress response (watch id -1).
    pub(crate) async fn request_progress(&mut self) -> Result<(), Status> {
        self.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await?;
        self.progress_asked += 1;
        Ok(())
    }

    /// The live watches etcd's latest stream-level progress answer covers (each has
    /// been sent everything up to its revision). etcd answers requests in order, each
    /// once at most, and drops some (a watch unsynced, or one from beyond its
    /// revision): the m-th answer answers the m-th request or a later one, so it covers
    /// the watches whose `created` came before the m-th request was sent. Not those
    /// whose `created` came after it: etcd sends the answer on the watches' channel and
    /// `created` on another (`api/v3rpc/watch.go: sendLoop`, which holds a new watch's
    /// events until its `created` is out), so an answer can come before a new watch's
    /// `created` and its events; nor a late answer to a request taken as dropped.
    pub(crate) fn progress_covered(&self) -> Vec<i64> {
        let answers = self.progress_answers;
        (self.watches.iter())
            .filter(|(_, w)| w.created_after.is_some_and(|asked| asked < answers))
            .map(|(&id, _)| id)
            .collect()
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
        let call = self
            .upstream
            .request(&self.metadata, ReceiverStream::new(rx));
        let stream = self.upstream.watch().watch(call).await?.into_inner();
        self.tx = Some(tx);
        self.rx = Some(stream);
        (self.progress_asked, self.progress_answers) = (0, 0);
        Ok(())
    }

    /// Fills in the prev_kv that etcd left out of events of a watch that asked for it
    /// (see the module docs and `prev_kv.rs`).
    ///
    /// # Errors
    /// etcd could not be asked: the client's stream ends with the status, so the client
    /// resumes its watches from their last revision and gets the event again, whole.
    pub(crate) async fn fill_prev_kv(&self, resp: &mut WatchResponse) -> Result<(), Status> {
        if !self.watches.get(&resp.watch_id).is_some_and(|w| w.prev_kv) {
            return Ok(());
        }
        super::prev_kv::fill(&self.upstream, &self.metadata, resp).await
    }

    /// etcd's next response; never resolves while no forwarded watch was made. Events
    /// and progress of a watch the client has canceled (etcd's `canceled` not yet come)
    /// are not the client's any more: they are dropped, as the cache side drops them
    /// (etcd's send loop may still send what it had queued, and without the prev_kv
    /// asked for, since etcd forgets that flag when it reads the cancel).
    ///
    /// # Errors
    /// The upstream stream failed or ended (the client stream should end, so that the
    /// client resumes its watches).
    ///
    /// # Cancel safety
    /// Cancel safe: a response is taken from etcd's stream only when it is returned or
    /// dropped.
    pub(crate) async fn next(&mut self) -> Result<WatchResponse, Status> {
        loop {
            let Some(rx) = self.rx.as_mut() else {
                return futures::future::pending().await;
            };
            match rx.message().await {
                Ok(Some(r)) => {
                    if let Some(r) = self.take(r) {
                        return Ok(r);
                    }
                }
                Ok(None) => return Err(Status::unavailable("watch stream to etcd ended")),
                Err(e) => return Err(e),
            }
        }
    }

    /// Books one of etcd's responses; `None` when it is not for the client (see
    /// [`next`](Self::next)).
    fn take(&mut self, mut r: WatchResponse) -> Option<WatchResponse> {
        if r.watch_id == ZERO && self.uses_zero(0) {
            r.watch_id = 0;
        }
        self.upstream.observe(r.header.as_ref());
        if super::messages::is_progress(&r) {
            // An answer to a stream-level progress request (counted even if it is not
            // passed on, below).
            self.progress_answers += 1;
        }
        self.last = Last::Other;
        if r.created {
            let asked = self.creating.pop_front();
            if let Some(Creating { id, .. }) = asked.filter(|c| c.resuming) {
                self.last = Last::ResumedReply;
                if r.canceled {
                    // Refused: to the client, the end of its watch.
                    r.watch_id = id;
                    r.created = false;
                }
            }
            if r.canceled {
                // Refused by etcd (id -1): the id it was asked with is free.
                if let Some(Creating { id, .. }) = asked {
                    self.forget(id);
                    // Canceled before etcd refused it: etcd ignores that cancel.
                    self.dead_cancels += self.canceling.remove(&id).unwrap_or(0);
                }
            } else {
                self.open.add();
                crate::metrics::get().watch_created(Served::Etcd);
                let asked = asked.and_then(|c| self.watches.get_mut(&c.id));
                if let Some(w) = asked {
                    w.created_after = Some(self.progress_asked);
                }
            }
        } else if r.canceled && take_one(&mut self.retiring, r.watch_id) {
            // The reply to the proxy's own cancel (or etcd's end of that watch).
            self.open.sub();
            self.close_if_idle();
            return None;
        } else if r.canceled && self.took(r.watch_id) {
            self.last = Last::CancelReply;
            self.open.sub();
        } else if r.canceled && self.forget(r.watch_id) {
            self.open.sub();
        } else if r.watch_id != INVALID_WATCH_ID
            && (self.canceling.contains_key(&r.watch_id) || self.retiring.contains_key(&r.watch_id))
            && !self.contains(r.watch_id)
        {
            tracing::trace!(
                watch_id = r.watch_id,
                events = r.events.len(),
                "etcd's response of a watch the client canceled: dropped"
            );
            return None;
        }
        if r.canceled {
            self.close_if_idle();
        }
        if self.ahead > 0 && !self.past_starts(&r) {
            return None;
        }
        Some(r)
    }

    /// Ends the stream to etcd once it has nothing left to do: no watch live or being
    /// created, no cancel unanswered. etcd keeps a Watch stream (and its goroutines)
    /// while it is open, so a client stream whose watches all went back to the cache
    /// would otherwise hold one on etcd for its whole life; the next forwarded create
    /// opens a new one. A progress request in flight goes unanswered, as with no watch
    /// etcd (3.5 on) would not answer it either.
    fn close_if_idle(&mut self) {
        let idle = self.watches.is_empty()
            && self.creating.is_empty()
            && self.canceling.is_empty()
            && self.retiring.is_empty()
            && self.dead_cancels == 0;
        if idle && self.tx.is_some() {
            tracing::trace!("no forwarded watch left: the stream to etcd ends");
            self.tx = None;
            self.rx = None;
        }
    }

    /// False for a progress response below the start of a watch etcd has not reached
    /// (see the module docs): a watch's own, or the stream's (watch id -1), which then
    /// counts as dropped, as fixed etcd drops it. A watch's response at or past its
    /// start ends its check.
    fn past_starts(&mut self, r: &WatchResponse) -> bool {
        let revision = r.header.as_ref().map_or(0, |h| h.revision);
        let progress = !r.created && !r.canceled && r.events.is_empty();
        let below = if r.watch_id == INVALID_WATCH_ID {
            self.watches
                .values()
                .any(|w| w.ahead.is_some_and(|start| revision < start))
        } else {
            match self.watches.get_mut(&r.watch_id) {
                Some(w) if w.ahead.is_some_and(|start| revision >= start) => {
                    w.ahead = None;
                    self.ahead -= 1;
                    false
                }
                Some(w) => w.ahead.is_some(),
                None => false,
            }
        };
        if below && progress {
            tracing::debug!(
                watch_id = r.watch_id,
                revision,
                "etcd's progress below a watch's start (etcd#20221): dropped"
            );
        }
        !(below && progress)
    }
}

/// Takes one of `id` from a count of cancels in flight per watch id; false if none.
pub(crate) fn take_one(counts: &mut IdMap<usize>, id: i64) -> bool {
    let Some(n) = counts.get_mut(&id) else {
        return false;
    };
    *n -= 1;
    if *n == 0 {
        counts.remove(&id);
    }
    true
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Config;
    use crate::pb::mvccpb::{Event, KeyValue};

    fn forwarded() -> Forwarded {
        let config = Config::parse_from(["etcd-cache-proxy", "--endpoints", "http://127.0.0.1:1"]);
        Forwarded::new(Upstream::new(&config).unwrap(), MetadataMap::new())
    }

    fn events(watch_id: i64, revision: i64) -> WatchResponse {
        WatchResponse {
            watch_id,
            events: vec![Event {
                kv: Some(KeyValue {
                    key: b"/x/a".to_vec().into(),
                    create_revision: 2,
                    mod_revision: revision,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The client's watch 0 and its own watch [`ZERO`] (another proxy's watch 0, in a
    /// tier) share etcd's id [`ZERO`]: responses go to whichever is live.
    #[tokio::test]
    async fn etcds_zero_is_the_clients_zero_or_its_own() {
        let mut f = forwarded();
        f.live(ZERO, false, 0);
        assert_eq!(
            f.take(events(ZERO, 5)).unwrap().watch_id,
            ZERO,
            "the client's own"
        );
        assert!(f.forget(ZERO));
        f.live(0, false, 0);
        assert_eq!(
            f.take(events(ZERO, 6)).unwrap().watch_id,
            0,
            "the client's 0"
        );
    }

    /// What etcd's send loop had queued for a watch the client canceled (it may come
    /// without the prev_kv asked for: etcd forgets the flag when it reads the cancel) is
    /// not sent; the `canceled` reply is, and a watch that took the id again gets its own.
    #[tokio::test]
    async fn a_canceled_watch_gets_nothing_more_from_etcd() {
        let mut f = forwarded();
        // Watch 2 with prev_kv, then the client's cancel (`cancel`'s bookkeeping; its
        // send needs etcd).
        f.live(2, true, 0);
        assert!(f.forget(2));
        f.canceling.insert(2, 1);
        assert!(f.take(events(2, 10)).is_none(), "queued events dropped");
        let progress = WatchResponse {
            watch_id: 2,
            ..Default::default()
        };
        assert!(f.take(progress).is_none(), "its progress dropped");
        let other = f.take(events(3, 10)).expect("another watch's events pass");
        assert_eq!(other.watch_id, 3);
        let stream_progress = WatchResponse {
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        };
        assert!(
            f.take(stream_progress).is_some(),
            "stream-level progress passes"
        );
        // A new watch took id 2 before etcd's `canceled` came: its events are its own.
        f.live(2, false, 0);
        assert!(f.take(events(2, 11)).is_some());
        assert!(f.forget(2));
        let canceled = WatchResponse {
            watch_id: 2,
            canceled: true,
            ..Default::default()
        };
        assert!(f.take(canceled).is_some(), "the canceled reply is sent");
        assert!(f.took_cancel());
        assert!(f.canceling.is_empty());
    }

    fn at(mut r: WatchResponse, revision: i64) -> WatchResponse {
        r.header = Some(crate::pb::etcdserverpb::ResponseHeader {
            revision,
            ..Default::default()
        });
        r
    }

    /// etcd#20221 (etcd before 3.4.38 / 3.5.22 / 3.6.2): a forwarded watch from a start
    /// etcd has not reached gets no progress below it, its own or the stream's; once a
    /// response of it is at its start, its progress passes as any watch's.
    #[tokio::test]
    async fn no_progress_from_etcd_below_a_forwarded_watchs_start() {
        let mut f = forwarded();
        f.live(4, false, 12);
        f.live(5, false, 0);
        let progress = |id| WatchResponse {
            watch_id: id,
            ..Default::default()
        };
        assert!(f.take(at(progress(4), 9)).is_none(), "its own, at 9");
        assert!(
            f.take(at(progress(INVALID_WATCH_ID), 9)).is_none(),
            "the stream's"
        );
        assert!(
            f.take(at(progress(5), 9)).is_some(),
            "another watch's passes"
        );
        assert!(f.take(at(events(5, 10), 10)).is_some());
        assert!(f.take(at(progress(4), 11)).is_none(), "at 11");
        let first = f.take(at(events(4, 12), 12)).expect("its first event");
        assert_eq!(first.events.len(), 1);
        assert_eq!(f.ahead, 0, "past its start");
        assert!(f.take(at(progress(4), 12)).is_some());
        assert!(f.take(at(progress(INVALID_WATCH_ID), 12)).is_some());
        // A cancel forgets its start.
        f.live(6, false, 30);
        assert!(f.forget(6));
        assert_eq!(f.ahead, 0);
        assert!(f.take(at(progress(INVALID_WATCH_ID), 13)).is_some());
    }

    /// etcd's `created` of watch `id`.
    fn created(id: i64) -> WatchResponse {
        WatchResponse {
            watch_id: id,
            created: true,
            ..Default::default()
        }
    }

    /// A stream-level progress answer at revision 10.
    fn answer() -> WatchResponse {
        at(
            WatchResponse {
                watch_id: INVALID_WATCH_ID,
                ..Default::default()
            },
            10,
        )
    }

    /// The m-th answer covers the watches whose `created` came before the m-th request
    /// was sent: not one created after (etcd may send the answer before its `created`
    /// and events), nor one created between a request taken as dropped (answered late)
    /// and the next. CI's pair test: requests A and B sent while the proxy was slow,
    /// then a watch from revision 1, the answers to A and B after it: the second is
    /// B's, not the next request's, and must not bring that watch back.
    #[tokio::test]
    async fn a_progress_answer_covers_the_watches_created_before_its_request() {
        let mut f = forwarded();
        let (tx, mut rx) = mpsc::channel(8);
        f.tx = Some(tx);
        let create = |watch_id, start_revision| WatchCreateRequest {
            key: b"/x/".to_vec().into(),
            watch_id,
            start_revision,
            ..Default::default()
        };
        assert_eq!(f.create(create(4, 0)).await.unwrap(), Some(4));
        assert!(f.take(created(4)).is_some());
        f.request_progress().await.unwrap(); // A
        f.request_progress().await.unwrap(); // B
        assert_eq!(f.create(create(5, 1)).await.unwrap(), Some(5));
        assert!(f.progress_covered().is_empty(), "nothing answered yet");
        assert!(f.take(answer()).is_some()); // A's
        assert_eq!(f.progress_covered(), [4], "5 is not created yet");
        assert!(f.take(created(5)).is_some());
        f.request_progress().await.unwrap(); // C
        assert!(f.take(answer()).is_some()); // B's (or C's: not known)
        assert_eq!(f.progress_covered(), [4], "B's answer does not cover 5");
        assert!(f.take(answer()).is_some()); // C's, or later
        let mut both = f.progress_covered();
        both.sort_unstable();
        assert_eq!(both, [4, 5]);
        for _ in 0..5 {
            assert!(rx.recv().await.is_some(), "each create and request sent");
        }
    }

    /// The stream to etcd ends once its last watch is gone (here: back to the cache, and
    /// etcd's reply to that cancel has come); a later create would open a new one.
    #[tokio::test]
    async fn the_stream_to_etcd_ends_once_nothing_is_left_on_it() {
        let mut f = forwarded();
        let (tx, mut rx) = mpsc::channel(8);
        f.tx = Some(tx);
        f.live(4, false, 0);
        f.live(5, false, 0);
        f.retire(4).await.unwrap();
        let canceled = |watch_id| WatchResponse {
            watch_id,
            canceled: true,
            ..Default::default()
        };
        assert!(f.take(canceled(4)).is_none(), "the proxy's own cancel");
        assert!(f.tx.is_some(), "5 is still live");
        assert!(f.cancel(5).await.unwrap());
        assert!(f.tx.is_some(), "its cancel is not answered yet");
        assert!(f.take(canceled(5)).is_some(), "the client's cancel's reply");
        assert!(f.tx.is_none() && f.rx.is_none(), "ended");
        for _ in 0..2 {
            assert!(rx.recv().await.is_some(), "each cancel sent");
        }
        // The last one going back to the cache ends it too.
        let (tx, _rx) = mpsc::channel(8);
        f.tx = Some(tx);
        f.live(6, false, 0);
        f.retire(6).await.unwrap();
        assert!(f.tx.is_some(), "its cancel is not answered yet");
        assert!(f.take(canceled(6)).is_none());
        assert!(f.tx.is_none(), "ended");
    }

    /// Each create etcd has not answered knows whether it resumes a watch: a plain create
    /// of id 5 that the client canceled, then a resumed one under the same id, both sent
    /// before etcd answered the first: the first `created` is the client's, the second
    /// is marked resumed.
    #[tokio::test]
    async fn a_resumed_create_is_told_apart_from_an_earlier_one_with_its_id() {
        let mut f = forwarded();
        f.creating.push_back(Creating {
            id: 5,
            resuming: false,
        });
        f.creating.push_back(Creating {
            id: 5,
            resuming: true,
        });
        f.live(5, false, 0);
        let created = || WatchResponse {
            watch_id: 5,
            created: true,
            ..Default::default()
        };
        assert!(f.take(created()).is_some());
        assert!(
            !f.took_resumed(),
            "the plain create's `created` is the client's"
        );
        assert!(f.take(created()).is_some());
        assert!(f.took_resumed(), "the resumed one's is marked");
        assert!(!f.took_resumed(), "asked once per response");
        assert!(f.creating.is_empty());
    }
}
