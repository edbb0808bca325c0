//! The Lease service, forwarded. Keep-alives are coalesced per token: the clients that
//! call with the same token (or none) share one upstream LeaseKeepAlive stream carrying
//! that token (etcd >= 3.6 checks the caller of a renewal), and while a keep-alive for a
//! lease is in flight, more requests for the same lease wait for its answer instead of
//! going to etcd. A stream never carries the proxy's own token.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::etcd_errors;
use crate::forward_macros::{call_upstream, forward};
use crate::pb::etcdserverpb::*;
use crate::state::State;
use crate::upstream::Upstream;

/// A keep-alive in flight longer than this is sent again for the next asker.
const RESEND_AFTER: Duration = Duration::from_secs(5);
/// Keep-alive requests queued toward etcd.
const UPSTREAM_QUEUE: usize = 1024;
/// Responses queued toward one client stream.
const CLIENT_QUEUE: usize = 64;

type Answer = Result<LeaseKeepAliveResponse, Status>;

/// The coalescer's handle: ask for one keep-alive of a lease.
#[derive(Clone)]
pub(crate) struct KeepAlives {
    tx: mpsc::UnboundedSender<Ask>,
}

impl KeepAlives {
    /// Starts the coalescer of the callers of `metadata` (their token, or none); it stops
    /// when every handle is dropped.
    pub(crate) fn start(upstream: Arc<Upstream>, metadata: MetadataMap) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(coalesce(upstream, metadata, rx));
        KeepAlives { tx }
    }

    /// Renews lease `id` once, sharing the upstream round trip with concurrent askers.
    pub(crate) async fn keep_alive(&self, id: i64) -> Answer {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((id, tx))
            .map_err(|_| etcd_errors::shutting_down())?;
        rx.await.map_err(|_| etcd_errors::shutting_down())?
    }
}

struct InFlight {
    /// When the keep-alive was last sent upstream (`None`: not yet).
    sent: Option<Instant>,
    waiters: Vec<oneshot::Sender<Answer>>,
}

struct UpstreamStream {
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    rx: Streaming<LeaseKeepAliveResponse>,
}

async fn coalesce(
    upstream: Arc<Upstream>,
    metadata: MetadataMap,
    mut asks: mpsc::UnboundedReceiver<(i64, oneshot::Sender<Answer>)>,
) {
    let mut inflight: HashMap<i64, InFlight> = HashMap::new();
    let mut stream: Option<UpstreamStream> = None;
    loop {
        tokio::select! {
            ask = asks.recv() => {
                let Some((id, waiter)) = ask else { return };
                let entry = inflight.entry(id).or_insert_with(|| InFlight {
                    sent: None,
                    waiters: Vec::new(),
                });
                entry.waiters.push(waiter);
                if entry.sent.is_some_and(|t| t.elapsed() < RESEND_AFTER) {
                    continue; // coalesced with the keep-alive in flight
                }
                entry.sent = Some(Instant::now());
                if stream.is_none() {
                    match open(&upstream, &metadata, id).await {
                        Ok(s) => stream = Some(s),
                        Err(e) => fail_all(&mut inflight, &e),
                    }
                    continue;
                }
                let s = stream.as_ref().expect("checked above");
                if s.tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                    stream = None;
                    fail_all(&mut inflight, &Status::unavailable("lease keep-alive stream to etcd closed"));
                }
            }
            resp = next(&mut stream) => match resp {
                Some(Ok(r)) => {
                    upstream.observe(r.header.as_ref());
                    if let Some(f) = inflight.remove(&r.id) {
                        for w in f.waiters {
                            let _ = w.send(Ok(r));
                        }
                    }
                }
                Some(Err(e)) => {
                    stream = None;
                    fail_all(&mut inflight, &e);
                }
                None => {
                    stream = None;
                    fail_all(&mut inflight, &Status::unavailable("lease keep-alive stream to etcd ended"));
                }
            }
        }
    }
}

async fn next(
    stream: &mut Option<UpstreamStream>,
) -> Option<Result<LeaseKeepAliveResponse, Status>> {
    match stream {
        Some(s) => s.rx.next().await,
        None => futures::future::pending().await,
    }
}

/// Opens the upstream stream with a first keep-alive already queued (etcd sends its
/// response headers with its first answer, so the call resolves only after one).
async fn open(
    upstream: &Upstream,
    metadata: &MetadataMap,
    first: i64,
) -> Result<UpstreamStream, Status> {
    let (tx, rx) = mpsc::channel(UPSTREAM_QUEUE);
    tx.try_send(LeaseKeepAliveRequest { id: first })
        .expect("an empty queue has room");
    // The callers' token, never the proxy's.
    let req = upstream.request(metadata, ReceiverStream::new(rx));
    let rx = upstream.lease().lease_keep_alive(req).await?.into_inner();
    Ok(UpstreamStream { tx, rx })
}

fn fail_all(inflight: &mut HashMap<i64, InFlight>, e: &Status) {
    for (_, f) in inflight.drain() {
        for w in f.waiters {
            let _ = w.send(Err(Status::new(e.code(), e.message())));
        }
    }
}

/// etcd's Lease service.
pub(crate) struct LeaseService {
    state: Arc<State>,
    /// One coalescer per token (none: the key `-`), while a client stream uses it.
    keep_alives: parking_lot::Mutex<HashMap<Vec<u8>, mpsc::WeakUnboundedSender<Ask>>>,
}

type Ask = (i64, oneshot::Sender<Answer>);

impl LeaseService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        LeaseService {
            state,
            keep_alives: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The coalescer of the callers with the token of `metadata`.
    fn keep_alives(&self, metadata: &MetadataMap) -> KeepAlives {
        let metadata = crate::upstream::passed(metadata);
        let key = match metadata.get(crate::upstream::TOKEN) {
            Some(t) => [b"+", t.as_bytes()].concat(),
            None => b"-".to_vec(),
        };
        let mut map = self.keep_alives.lock();
        if let Some(tx) = map.get(&key).and_then(|w| w.upgrade()) {
            return KeepAlives { tx };
        }
        // Coalescers whose clients are all gone have stopped: forget them.
        map.retain(|_, w| w.strong_count() > 0);
        let k = KeepAlives::start(self.state.upstream.clone(), metadata);
        map.insert(key, k.tx.downgrade());
        k
    }
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl lease_server::Lease for LeaseService {
    forward!(lease_grant, lease, LeaseGrantRequest, LeaseGrantResponse);
    forward!(lease_revoke, lease, LeaseRevokeRequest, LeaseRevokeResponse);
    forward!(lease_leases, lease, LeaseLeasesRequest, LeaseLeasesResponse);

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let metadata = req.metadata().clone();
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(
            upstream,
            &metadata,
            req.into_inner(),
            lease.lease_time_to_live
        )
        .await?
        .into_inner();
        // Keys outside the namespace are not the client's to see.
        let namespace = &self.state.namespace;
        resp.keys = std::mem::take(&mut resp.keys)
            .into_iter()
            .filter(|k| namespace.contains(k))
            .map(|k| namespace.strip(k))
            .collect();
        Ok(Response::new(resp))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let keep_alives = self.keep_alives(req.metadata());
        let mut inbound = req.into_inner();
        let mut shutdown = self.state.shutdown.clone();
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
        tokio::spawn(async move {
            let mut pending = FuturesUnordered::new();
            loop {
                tokio::select! {
                    _ = crate::state::stopped(&mut shutdown) => {
                        let _ = tx.send(Err(etcd_errors::shutting_down())).await;
                        return;
                    }
                    _ = tx.closed() => return,
                    r = inbound.next() => match r {
                        Some(Ok(r)) => {
                            let k = keep_alives.clone();
                            pending.push(async move { k.keep_alive(r.id).await });
                        }
                        _ => return,
                    },
                    Some(answer) = pending.next(), if !pending.is_empty() => {
                        if tx.send(answer).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
