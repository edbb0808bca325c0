//! etcd's compaction, as the proxy knows it: the cache keeps its own window, which an
//! etcd compaction does not shrink, but a client must get what etcd would give it, so a
//! read or a watch at a revision etcd has compacted is forwarded (etcd answers
//! `mvcc: required revision has been compacted`, or cancels the watch with
//! `compact_revision`), never answered from the cache's window.
//!
//! The floor is learned three ways: a Compact forwarded through the proxy raises it at
//! once; a read or a watch at a past revision asks etcd first
//! ([`CompactFloor::compacted_now`], one probe shared by every such request that came
//! while it was under way), so a compaction made elsewhere (another client, another
//! proxy, etcd's `--auto-compaction-*`) is never missed; and every [`PROBE_INTERVAL`] in
//! the background. A probe is one watch create from revision 1 on a key that never
//! exists: etcd cancels it with its compact revision, or creates it when nothing is
//! compacted (the probe then cancels it).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::pb::etcdserverpb::{
    watch_request::RequestUnion, WatchCancelRequest, WatchCreateRequest, WatchRequest,
};
use crate::upstream::Upstream;

/// How often compactions made elsewhere are learned.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// The highest revision etcd is known to have compacted (0: none known).
pub(crate) struct CompactFloor {
    floor: AtomicI64,
    up: Arc<Upstream>,
    /// A key inside the cached prefix (the proxy's user may read it) that never exists.
    key: Bytes,
    /// When the newest finished probe was sent; one probe at a time.
    probed: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl CompactFloor {
    /// The floor of the etcd behind `up`, probed with a key inside `prefix`.
    pub(crate) fn new(up: Arc<Upstream>, prefix: &[u8]) -> Arc<CompactFloor> {
        Arc::new(CompactFloor {
            floor: AtomicI64::new(0),
            up,
            key: Bytes::from([prefix, b"\0etcd-cache-proxy compaction probe"].concat()),
            probed: tokio::sync::Mutex::new(None),
        })
    }

    /// Whether a read or a watch at `revision` is below etcd's compaction, asking etcd
    /// first: a probe sent after this call (shared with the requests that wait with it).
    /// A failed probe leaves what is known.
    pub(crate) async fn compacted_now(&self, revision: i64) -> bool {
        if revision <= 0 {
            return false;
        }
        let asked = tokio::time::Instant::now();
        let mut probed = self.probed.lock().await;
        if probed.is_none_or(|at| at < asked) {
            let sent = tokio::time::Instant::now();
            match probe(&self.up, self.key.clone()).await {
                Ok(rev) => {
                    self.raise(rev);
                    *probed = Some(sent);
                }
                Err(e) => tracing::debug!(error = %e, "compaction probe failed"),
            }
        }
        drop(probed);
        self.compacted(revision)
    }

    /// Whether a read or a watch at `revision` (0: the latest) is below etcd's
    /// compaction, so that etcd must answer it.
    pub(crate) fn compacted(&self, revision: i64) -> bool {
        revision > 0 && revision < self.floor.load(Ordering::Acquire)
    }

    /// etcd compacted up to `revision`.
    pub(crate) fn raise(&self, revision: i64) {
        let old = self.floor.fetch_max(revision, Ordering::AcqRel);
        if revision > old {
            tracing::debug!(revision, "etcd's compaction floor");
        }
    }

    /// Learns etcd's compact revision every [`PROBE_INTERVAL`], until dropped.
    pub(crate) fn spawn_probe(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(floor) = weak.upgrade() else { return };
                match probe(&floor.up, floor.key.clone()).await {
                    Ok(rev) => floor.raise(rev),
                    Err(e) => tracing::debug!(error = %e, "compaction probe failed"),
                }
                drop(floor);
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        })
    }
}

/// etcd's compact revision (0 when nothing is compacted), from one watch create.
async fn probe(up: &Upstream, key: Bytes) -> Result<i64, Status> {
    let (tx, rx) = mpsc::channel(2);
    let create = WatchCreateRequest {
        key,
        start_revision: 1,
        ..Default::default()
    };
    tx.try_send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(create)),
    })
    .expect("an empty queue has room");
    let mut stream = up
        .watch()
        .watch(up.own_request(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .map_err(|_| Status::deadline_exceeded("compaction probe"))?;
    let resp = match first {
        Some(r) => r?,
        None => return Err(Status::unavailable("compaction probe stream ended")),
    };
    if resp.compact_revision > 0 {
        return Ok(resp.compact_revision);
    }
    // Created: nothing below it is compacted. etcd sends the cancel of a compacted watch
    // right after `created` on some versions: read one more response briefly.
    if resp.created && !resp.canceled {
        if let Ok(Some(Ok(r))) =
            tokio::time::timeout(Duration::from_millis(200), stream.next()).await
        {
            if r.compact_revision > 0 {
                return Ok(r.compact_revision);
            }
        }
        let _ = tx
            .send(WatchRequest {
                request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
                    watch_id: resp.watch_id,
                })),
            })
            .await;
    }
    Ok(0)
}
