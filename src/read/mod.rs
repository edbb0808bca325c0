//! Reads from memory: the path of [`Cache::get`](crate::Cache::get).
//!
//! - **Serializable** (`with_serializable`): answered from the newest snapshot, or from
//!   the snapshot and the history for an older revision inside the window.
//! - **Consistent** (the default, as in etcd): one cheap round trip learns the cluster's
//!   current revision (a count-only, limit-1 read, shared between concurrent callers);
//!   the read waits until the cache has applied it, then answers from memory. Where the
//!   cache cannot prove it is current in time, etcd answers (`ReadFallback`). See
//!   `docs/GUARANTEES.md` for why this is linearizable on every etcd version.
//!
//! [`options`] holds [`GetOptions`] and [`GetResponse`]; etcd's range semantics are in
//! `range_request`, shared with the upstream's fallback.

pub(crate) mod options;

use std::sync::Arc;
use std::time::Duration;

use crate::config::ReadFallback;
use crate::error::{Error, Result};
use crate::range_request::RangeRequest;
use crate::shared::Shared;
pub use options::{GetOptions, GetResponse};

/// Answers `request` from memory at its revision (0: the newest snapshot).
fn read_local(shared: &Shared, request: &RangeRequest) -> Result<GetResponse> {
    let snap = shared.snapshot();
    let revision = request.revision;
    if revision == 0 || revision == snap.revision {
        return Ok(GetResponse::new(
            snap.revision,
            request.answer(snap.range(&request.range)),
        ));
    }
    if revision > snap.revision {
        return Err(Error::FutureRevision {
            requested: revision,
            current: snap.revision,
        });
    }
    let history = shared.history.read();
    // Events in (revision, snap.revision] must all be held.
    if revision + 1 < history.floor() {
        return Err(Error::Compacted {
            compact_revision: (history.floor() - 1).max(1),
        });
    }
    // Take the few batches needed and let the writer go before merging.
    let later: Vec<Arc<crate::history::Batch>> = history
        .after(revision)
        .take_while(|b| b.revision <= snap.revision)
        .cloned()
        .collect();
    drop(history);
    let kvs = snap.range_at(&request.range, later.iter());
    Ok(GetResponse::new(revision, request.answer(kvs.iter())))
}

/// Answers `request` by etcd itself.
async fn read_from_etcd(shared: &Shared, request: &RangeRequest) -> Result<GetResponse> {
    shared.counters.read_from_etcd();
    tracing::debug!(revision = shared.revision(), "read answered by etcd");
    let resp = shared.upstream.range(request.clone()).await?;
    // As from memory: the revision the answer reflects.
    let revision = if request.revision > 0 {
        request.revision
    } else {
        resp.revision
    };
    Ok(GetResponse::new(revision, resp.result))
}

/// What a consistent read does when the cache cannot answer in time.
async fn fallback(shared: &Shared, request: &RangeRequest, err: Error) -> Result<GetResponse> {
    match shared.config.read_fallback {
        ReadFallback::Etcd => read_from_etcd(shared, request).await,
        _ => Err(err),
    }
}

/// The cluster's current revision (one linearizable round trip), bounded by `limit`
/// so that a stalled connection cannot hang a read.
async fn cluster_revision(shared: &Shared, limit: Duration) -> Result<i64> {
    tokio::time::timeout(limit, shared.probe.current(&shared.upstream, &shared.range))
        .await
        .map_err(|_| Error::timeout("etcd to report its current revision", limit))?
}

async fn wait_applied(shared: &Shared, rev: i64, limit: Duration) -> Result<()> {
    tokio::time::timeout(limit, shared.wait_for_revision(rev))
        .await
        .map_err(|_| Error::timeout("the cache to reach the read's revision", limit))?
}

/// The read path of [`Cache::get`](crate::Cache::get).
pub(crate) async fn get(shared: &Arc<Shared>, key: &[u8], opts: GetOptions) -> Result<GetResponse> {
    // Fast path: a serializable read of one key at the latest revision is one map
    // lookup in the current snapshot, without building a range.
    if opts.is_plain_serializable_get(key) && shared.range.contains(key) {
        let status = shared.status();
        if status.loaded && !status.closed {
            let request = opts.shaping()?;
            return Ok(shared.with_snapshot(|snap| {
                GetResponse::new(
                    snap.revision,
                    request.answer(snap.map.get(key).map(|e| &e.0).into_iter()),
                )
            }));
        }
    }
    let request = opts.request(key)?;
    request.range.check_within(&shared.range)?;
    let status = shared.status();
    if status.closed {
        return Err(Error::Closed);
    }
    let timeout = shared.config.consistent_read_timeout;
    if opts.serializable() {
        if !status.loaded {
            shared.wait_loaded(timeout).await?;
        }
        if request.revision > shared.revision() {
            // Wait for it if the cluster has it; refuse it if the cluster does not.
            let current = cluster_revision(shared, timeout).await?;
            if request.revision > current {
                return Err(Error::FutureRevision {
                    requested: request.revision,
                    current,
                });
            }
            wait_applied(shared, request.revision, timeout).await?;
        }
        return read_local(shared, &request);
    }
    // Consistent read. Data at a revision the cache has applied never changes, so a
    // read at such a revision needs no round trip.
    if request.revision > 0 && request.revision <= shared.revision() {
        return read_local(shared, &request);
    }
    if !status.ready {
        return fallback(shared, &request, Error::NotReady).await;
    }
    let current = cluster_revision(shared, timeout).await?;
    if request.revision > current {
        return Err(Error::FutureRevision {
            requested: request.revision,
            current,
        });
    }
    let need = if request.revision > 0 {
        request.revision
    } else {
        current
    };
    if shared.revision() < need {
        let can_wait = shared.counters.progress_trusted()
            || shared.config.read_fallback == ReadFallback::Error;
        if !can_wait {
            // etcd#15220: without trustworthy progress answers the cache cannot prove
            // it is current, so etcd answers.
            return read_from_etcd(shared, &request).await;
        }
        if let Err(e) = wait_applied(shared, need, timeout).await {
            return fallback(shared, &request, e).await;
        }
    }
    read_local(shared, &request)
}
