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

use tracing::Instrument;

use crate::config::ReadFallback;
use crate::error::{Error, Result};
use crate::kv::KeyValue;
use crate::range_request::RangeRequest;
use crate::shared::Shared;
pub use options::{GetOptions, GetResponse};

/// Answers `request` from memory at its revision (0: the newest snapshot). The
/// header carries the newest revision applied, at least `known` (the cluster revision
/// a consistent read learned).
fn read_local(shared: &Shared, request: &RangeRequest, known: i64) -> Result<GetResponse> {
    // etcd >= 3.7 answers keys-only reads without leases: so does the cache that follows it.
    let drop_lease = shared.counters().keys_only_without_lease();
    let snap = shared.view().snapshot();
    let header = shared.header(snap.revision.max(known));
    let revision = request.revision;
    if revision == 0 || revision == snap.revision {
        return Ok(GetResponse::new(
            snap.revision,
            header,
            request.answer_as(snap.range(&request.range), drop_lease),
        ));
    }
    if revision > snap.revision {
        return Err(Error::FutureRevision {
            requested: revision,
            current: snap.revision,
        });
    }
    let history = shared.history().read();
    // Events in (revision, snap.revision] must all be held.
    if revision + 1 < history.floor() {
        // The same number a watch gets: reads and watches from it are served.
        return Err(Error::Compacted {
            compact_revision: history.floor(),
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
    Ok(GetResponse::new(
        revision,
        header,
        request.answer_as(kvs.iter(), drop_lease),
    ))
}

/// The refusal of a read below etcd's compaction at `floor`.
fn compacted(shared: &Shared, floor: i64) -> Error {
    Error::Compacted {
        compact_revision: crate::compaction::reported(floor, shared.history()),
    }
}

/// Answers `request` by etcd itself.
async fn read_from_etcd(shared: &Shared, request: &RangeRequest) -> Result<GetResponse> {
    if shared.view().is_closed() {
        return Err(shared.view().status().closed_error());
    }
    shared.counters().read_from_etcd();
    tracing::debug!(revision = shared.view().revision(), "read answered by etcd");
    // Linearizable at etcd: a serializable read there could reach a member that has
    // not applied the revision yet.
    let request = RangeRequest {
        serializable: false,
        ..request.clone()
    };
    let mut resp = shared.upstream().range(request.clone()).await?;
    shared.counters().saw_cluster_revision(resp.revision);
    if !request.keys_only {
        share_held(shared, &mut resp.result.kvs);
    }
    // As from memory: the revision the answer reflects; the header is etcd's.
    let revision = if request.revision > 0 {
        request.revision
    } else {
        resp.revision
    };
    let header = resp.header.at(resp.revision);
    Ok(GetResponse::new(revision, header, resp.result).answered_by_etcd())
}

/// Replaces each key-value etcd sent that the cache holds in the same version (same
/// key and `mod_revision`) by the cache's own: one copy in memory, and what was
/// derived from it (a typed view's decoded object) is shared instead of made again.
fn share_held(shared: &Shared, kvs: &mut [KeyValue]) {
    shared.view().with_snapshot(|snapshot| {
        for kv in kvs.iter_mut() {
            if let Some(held) = snapshot.map.get(kv.key()) {
                if held.0.mod_revision() == kv.mod_revision() {
                    *kv = held.0.clone();
                }
            }
        }
    });
}

/// What a read does when the cache cannot answer it in time: etcd answers, or the
/// error is returned, as `read_fallback` says. A closed cache answers nothing.
async fn fallback(shared: &Shared, request: &RangeRequest, err: Error) -> Result<GetResponse> {
    if matches!(err, Error::Closed | Error::Failed { .. }) {
        return Err(err);
    }
    match shared.config().read_fallback {
        ReadFallback::Etcd => read_from_etcd(shared, request).await,
        _ => Err(err),
    }
}

/// Answers `request` once the cache has applied `need` — from memory when the cache
/// gets there in time, else as `read_fallback` says. On a server whose progress
/// answers cannot be trusted the cache cannot prove it will get there (a quiet prefix
/// is only advanced by events or the periodic notification), so etcd answers at once.
async fn answer_at(shared: &Shared, request: &RangeRequest, need: i64) -> Result<GetResponse> {
    if shared.view().revision() < need {
        let can_wait = shared.counters().progress_trusted()
            || shared.config().read_fallback == ReadFallback::Error;
        if !can_wait {
            // etcd#15220: without trustworthy progress answers the cache cannot prove
            // it is current, so etcd answers.
            return read_from_etcd(shared, request).await;
        }
        let limit = shared.config().consistent_read_timeout;
        let waited = tokio::time::timeout(limit, shared.wait_for_revision(need))
            .await
            .map_err(|_| Error::timeout("the cache to reach the read's revision", limit))
            .and_then(|r| r);
        if let Err(e) = waited {
            return fallback(shared, request, e).await;
        }
    }
    read_local(shared, request, need)
}

/// The read path of [`Cache::get`](crate::Cache::get).
pub(crate) async fn get(shared: &Arc<Shared>, key: &[u8], opts: GetOptions) -> Result<GetResponse> {
    // Fast path: a serializable read of one key at the latest revision is one map
    // lookup in the current snapshot, without building a range or a span.
    if opts.is_plain_serializable_get(key) && shared.range().contains(key) {
        let request = opts.shaping()?;
        let answered = shared.view().with_serving_snapshot(|snap| {
            GetResponse::new(
                snap.revision,
                shared.header(snap.revision),
                request.answer(snap.map.get(key).map(|e| &e.0).into_iter()),
            )
        });
        if let Some(resp) = answered {
            return Ok(resp);
        }
    }
    let span = tracing::debug_span!(
        "etcd_cache.get",
        key = %String::from_utf8_lossy(key),
        serializable = opts.serializable(),
        revision = tracing::field::Empty,
        served = tracing::field::Empty,
    );
    let started = tokio::time::Instant::now();
    let consistent = !opts.serializable();
    let result = answer(shared, key, opts).instrument(span.clone()).await;
    if let Ok(resp) = &result {
        let from_memory = !resp.from_etcd();
        span.record("revision", resp.revision());
        span.record("served", if from_memory { "memory" } else { "etcd" });
        if consistent {
            shared
                .metrics()
                .consistent_read(from_memory, started.elapsed());
        }
    }
    result
}

async fn answer(shared: &Arc<Shared>, key: &[u8], opts: GetOptions) -> Result<GetResponse> {
    let request = opts.request(key)?;
    request.range.check_within(shared.range())?;
    let status = shared.view().status();
    if status.closed() {
        return Err(status.closed_error());
    }
    if !status.loaded {
        if opts.serializable() {
            shared
                .view()
                .wait_loaded(shared.config().consistent_read_timeout)
                .await?;
        } else {
            return fallback(shared, &request, Error::NotReady).await;
        }
    }
    // Data at a revision the cache has applied never changes: a serializable read at
    // such a revision needs no round trip. A consistent one does, for its header: as
    // etcd's (after a ReadIndex) it must be at least every revision committed before
    // the call, so it passes the same barrier as a read of the latest revision.
    // So is what the cache knows of etcd's compaction (kept current in the background).
    if opts.serializable() && request.revision <= shared.view().revision() {
        let known = shared.compaction().known_below(request.revision);
        if let Some(floor) = known.filter(|_| shared.config().follow_etcd_compaction) {
            return Err(compacted(shared, floor));
        }
        return read_local(shared, &request, 0);
    }
    if !opts.serializable() && !shared.view().is_ready() {
        return fallback(shared, &request, Error::NotReady).await;
    }
    // A consistent read, or a read at a revision the cache has not applied: learn how
    // far the cluster is, and, at a past revision, whether etcd compacted it (beside
    // it, so the read waits one round trip).
    let check = async {
        if shared.config().follow_etcd_compaction && request.revision > 0 {
            shared.etcd_compacted(request.revision).await
        } else {
            Ok(None)
        }
    };
    let (current, compaction) = tokio::join!(shared.cluster_revision_now(), check);
    let current = match (current, compaction) {
        (_, Ok(Some(floor))) => return Err(compacted(shared, floor)),
        (Ok(current), Ok(None)) => current,
        // etcd could not be asked one of them: etcd answers the read itself.
        (Err(e), _) | (_, Err(e)) => return fallback(shared, &request, e).await,
    };
    if request.revision > current {
        return Err(Error::FutureRevision {
            requested: request.revision,
            current,
        });
    }
    // A consistent read waits for the cluster's revision whatever its own; a
    // serializable one for its revision only.
    let need = if opts.serializable() {
        request.revision
    } else {
        request.revision.max(current)
    };
    answer_at(shared, &request, need).await
}
