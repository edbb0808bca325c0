//! The registration of one watch with the cache: a slot, "now" for a watch without a
//! start revision, etcd's compaction for one with, and its place in the index.

use std::sync::Arc;

use super::options::Request;
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::subscribers::{Registered, Scope, Slot};

/// A registered watch, before its stream gives it an id.
pub(super) struct Registration {
    pub(super) request: Request,
    pub(super) registered: Registered,
    pub(super) slot: Slot,
    /// The cache's revision just after registration.
    pub(super) revision: i64,
}

/// Registers one watch: takes a slot, learns "now" for a watch without a start
/// revision, and puts it into the index. Its stream bookkeeping (the watch id) is the
/// caller's.
///
/// # Errors
/// [`Error::WatchLimit`]; [`Error::NotReady`] before the first snapshot is loaded
/// (call `Cache::wait_ready` first); [`Error::Closed`] / [`Error::Failed`].
pub(super) async fn register(
    shared: &Arc<Shared>,
    request: Request,
    scope: Option<&Arc<Scope>>,
) -> Result<Registration> {
    let started = tokio::time::Instant::now();
    let status = shared.view.status();
    if status.closed() {
        return Err(status.closed_error());
    }
    if !status.loaded {
        return Err(Error::NotReady);
    }
    let slot = shared.subscribers.acquire(scope).inspect_err(|e| {
        if matches!(e, Error::WatchLimit { .. }) {
            shared.metrics.watch_refused();
        }
    })?;
    // "From now", as etcd means it: after every write that completed before this
    // call, even those the cache has not applied yet.
    let now = if request.start_revision == 0 {
        cluster_revision_for_watch(shared).await
    } else {
        0
    };
    // From a past revision: refused as etcd refuses one it compacted. A failed check
    // leaves what is known (the window still bounds what is replayed).
    if request.start_revision > 0 && shared.config.follow_etcd_compaction {
        let floor = match shared.etcd_compacted(request.start_revision).await {
            Ok(floor) => floor,
            Err(e) => {
                tracing::debug!(error = %e, "compaction check failed; the known floor is used");
                shared.compaction.known_below(request.start_revision)
            }
        };
        if let Some(floor) = floor {
            shared.metrics.watch_opened(started.elapsed());
            let floor = crate::compaction::reported(floor, &shared.history);
            return Ok(Registration {
                request,
                registered: crate::subscribers::Registered::Compacted { floor },
                slot,
                revision: shared.view.revision(),
            });
        }
    }
    let registered = shared.subscribers.register(
        request.filter.clone(),
        request.start_revision,
        now,
        &shared.history,
        || shared.view.revision(),
        &slot,
    )?;
    shared.metrics.watch_opened(started.elapsed());
    Ok(Registration {
        request,
        registered,
        slot,
        revision: shared.view.revision(),
    })
}

/// The cluster's current revision for a watch "from now" (one linearizable round
/// trip, shared with concurrent callers), or 0 when it is not wanted or cannot be had
/// in time: then the watch starts after the cache's own revision, and a warning says
/// so.
async fn cluster_revision_for_watch(shared: &Shared) -> i64 {
    if !shared.config.linearizable_watch_start || !shared.view.is_ready() {
        return 0;
    }
    match shared.cluster_revision_now().await {
        Ok(rev) => rev,
        Err(e) => {
            tracing::warn!(error = %e, revision = shared.view.revision(), "could not learn the cluster's revision for a watch from now; it starts after the cache's revision");
            0
        }
    }
}
