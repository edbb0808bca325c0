//! The registration of one watch with the cache: a slot, "now" for a watch without a
//! start revision, etcd's compaction for one with, and its place in the index.

use std::sync::Arc;

use tokio::time::Instant;

use super::options::Request;
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::subscribers::{Registered, Scope, Slot, SubId};

/// A registered watch, before its stream gives it an id.
pub(super) struct Registration {
    /// The request's start revision (0: from now).
    pub(super) start_revision: i64,
    /// The request asked for progress notifications.
    pub(super) progress_notify: bool,
    pub(super) registered: Registered,
    pub(super) slot: Slot,
    /// The cache's revision just after registration.
    pub(super) revision: i64,
}

/// A watch that holds its slot and its registry id, before it learns where it starts.
pub(super) struct Prepared {
    request: Request,
    slot: Slot,
    sub_id: SubId,
    started: Instant,
}

/// Takes a slot and a registry id for one watch.
///
/// # Errors
/// [`Error::WatchLimit`]; [`Error::NotReady`] before the first snapshot is loaded
/// (call `Cache::wait_ready` first); [`Error::Closed`] / [`Error::Failed`].
fn prepare(shared: &Shared, request: Request, scope: Option<&Arc<Scope>>) -> Result<Prepared> {
    let started = Instant::now();
    let status = shared.view().status();
    if status.closed() {
        return Err(status.closed_error());
    }
    if !status.loaded {
        return Err(Error::NotReady);
    }
    let slot = shared.subscribers().acquire(scope).inspect_err(|e| {
        if matches!(e, Error::WatchLimit { .. }) {
            shared.metrics().watch_refused();
        }
    })?;
    Ok(Prepared {
        request,
        slot,
        sub_id: shared.subscribers().reserve_id(),
        started,
    })
}

impl Prepared {
    /// Puts the watch into the index, starting after `now` (a watch from now; 0: after
    /// the cache's revision) or at its start revision.
    fn finish(self, shared: &Shared, now: i64) -> Result<Registration> {
        let Prepared {
            request,
            slot,
            sub_id,
            started,
        } = self;
        // The filter moves into the watch's mailbox: stored once, not copied.
        let Request {
            filter,
            start_revision,
            progress_notify,
        } = request;
        let registered = shared.subscribers().register_as(
            sub_id,
            filter,
            start_revision,
            now,
            shared.history(),
            || shared.view().revision(),
            &slot,
        )?;
        shared.metrics().watch_opened(started.elapsed());
        Ok(Registration {
            start_revision,
            progress_notify,
            registered,
            slot,
            revision: shared.view().revision(),
        })
    }
}

/// Registers one watch: takes a slot, learns "now" for a watch without a start
/// revision, and puts it into the index. Its stream bookkeeping (the watch id) is the
/// caller's.
///
/// # Errors
/// As [`prepare`]; [`Error::Closed`] if the cache closes meanwhile.
pub(super) async fn register(
    shared: &Arc<Shared>,
    request: Request,
    scope: Option<&Arc<Scope>>,
) -> Result<Registration> {
    let start_revision = request.start_revision;
    let prepared = prepare(shared, request, scope)?;
    // "From now", as etcd means it: after every write that completed before this
    // call, even those the cache has not applied yet.
    let now = if start_revision == 0 {
        cluster_revision_for_watch(shared).await
    } else {
        0
    };
    // From a past revision: refused as etcd refuses one it compacted. A failed check
    // leaves what is known (the window still bounds what is replayed).
    if start_revision > 0 && shared.config().follow_etcd_compaction {
        let floor = match shared.etcd_compacted(start_revision).await {
            Ok(floor) => floor,
            Err(e) => {
                tracing::debug!(error = %e, "compaction check failed; the known floor is used");
                shared.compaction().known_below(start_revision)
            }
        };
        if let Some(floor) = floor {
            shared.metrics().watch_opened(prepared.started.elapsed());
            let floor = crate::compaction::reported(floor, shared.history());
            return Ok(Registration {
                start_revision,
                progress_notify: prepared.request.progress_notify,
                registered: Registered::Compacted { floor },
                slot: prepared.slot,
                revision: shared.view().revision(),
            });
        }
    }
    prepared.finish(shared, now)
}

/// A watch from now that holds its slot and registry id while it learns the cluster's
/// revision (one barrier read shared with every watch and read asking meanwhile), so
/// that watches added one after another on a stream share one round trip instead of
/// waiting for one each.
pub(super) struct Opening {
    prepared: Prepared,
}

impl Opening {
    /// The registry id the watch will have (a cancel can name it meanwhile).
    pub(super) fn sub_id(&self) -> SubId {
        self.prepared.sub_id
    }

    /// Learns the cluster's revision (from a barrier read sent after this call, or the
    /// cache's own if it cannot: a warning says so) and registers the watch after it,
    /// at once (its reader may be slow), as [`register`] does.
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closed meanwhile.
    pub(super) async fn open(self, shared: &Shared) -> Result<Registration> {
        let now = cluster_revision_for_watch(shared).await;
        self.prepared.finish(shared, now)
    }
}

/// A watch added to a stream: registered now when its start needs no round trip, else
/// an [`Opening`].
pub(super) enum Added {
    Registered(Registration),
    Opening(Opening),
}

/// Adds one watch without waiting for etcd: a watch from now that needs the
/// cluster's revision becomes an [`Opening`]; any other is registered as by
/// [`register`].
///
/// # Errors
/// As [`register`].
pub(super) async fn add(
    shared: &Arc<Shared>,
    request: Request,
    scope: Option<&Arc<Scope>>,
) -> Result<Added> {
    if request.start_revision != 0 || !wants_cluster_revision(shared) {
        return register(shared, request, scope)
            .await
            .map(Added::Registered);
    }
    Ok(Added::Opening(Opening {
        prepared: prepare(shared, request, scope)?,
    }))
}

fn wants_cluster_revision(shared: &Shared) -> bool {
    shared.config().linearizable_watch_start && shared.view().is_ready()
}

/// The cluster's current revision for a watch "from now" (one linearizable round
/// trip, shared with concurrent callers), or 0 when it is not wanted or cannot be had
/// in time: then the watch starts after the cache's own revision, and a warning says
/// so.
async fn cluster_revision_for_watch(shared: &Shared) -> i64 {
    if !wants_cluster_revision(shared) {
        return 0;
    }
    match shared.cluster_revision_now().await {
        Ok(rev) => rev,
        Err(e) => {
            tracing::warn!(error = %e, revision = shared.view().revision(), "could not learn the cluster's revision for a watch from now; it starts after the cache's revision");
            0
        }
    }
}
