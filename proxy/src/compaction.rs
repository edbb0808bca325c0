//! etcd's compaction, as the proxy knows it: the cache keeps its own window, which an
//! etcd compaction does not shrink, but a client must get what etcd would give it, so a
//! read or a watch at a revision etcd has compacted is forwarded (etcd answers
//! `mvcc: required revision has been compacted`, or cancels the watch with
//! `compact_revision`), never answered from the cache's window.
//!
//! The floor is learned two ways: a Compact forwarded through the proxy raises it at once;
//! compactions made elsewhere (another client, etcd's `--auto-compaction-*`) are learned
//! every [`PROBE_INTERVAL`] by one watch create from revision 1 on a key that never
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
#[derive(Debug, Default)]
pub(crate) struct CompactFloor(AtomicI64);

impl CompactFloor {
    /// Whether a read or a watch at `revision` (0: the latest) is below etcd's
    /// compaction, so that etcd must answer it.
    pub(crate) fn compacted(&self, revision: i64) -> bool {
        revision > 0 && revision < self.0.load(Ordering::Acquire)
    }

    /// etcd compacted up to `revision`.
    pub(crate) fn raise(&self, revision: i64) {
        let old = self.0.fetch_max(revision, Ordering::AcqRel);
        if revision > old {
            tracing::debug!(revision, "etcd's compaction floor");
        }
    }

    /// Learns etcd's compact revision every [`PROBE_INTERVAL`], with a probe key inside
    /// `prefix` (the proxy's user may read it), until dropped.
    pub(crate) fn spawn_probe(
        self: &Arc<Self>,
        up: Arc<Upstream>,
        prefix: Bytes,
    ) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let key =
                Bytes::from([prefix.as_ref(), b"\0etcd-cache-proxy compaction probe"].concat());
            loop {
                let Some(floor) = weak.upgrade() else { return };
                match probe(&up, key.clone()).await {
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
