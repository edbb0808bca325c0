//! The published view: the newest snapshot (which carries its revision) and the
//! lifecycle status, as one value, so that a reader never sees a revision without its
//! data or a status from another moment.
//!
//! Only the follower publishes, and the types say so: [`channel`] makes the one
//! [`Publisher`] (held by the follower's writer) and the [`Viewer`] (held in
//! [`Shared`](crate::shared::Shared), read by every handle, stream and reader), as
//! kube-runtime's reflector splits its `Writer` from its `Store` and tokio's `watch`
//! its `Sender` from its `Receiver`. The waits on the status are in
//! [`status`](crate::status).

use std::borrow::Borrow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::error::Result;
use crate::status::{self, CacheStatus, Status, StatusStream};
use crate::store::Snapshot;

/// What the follower publishes: the newest snapshot and the status, as one value.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    pub(crate) snapshot: Arc<Snapshot>,
    pub(crate) status: Status,
}

/// What the status waits read of a view.
impl Borrow<Status> for View {
    fn borrow(&self) -> &Status {
        &self.status
    }
}

/// The publishing side of a new view and its reading side.
pub(crate) fn channel() -> (Publisher, Viewer) {
    let (tx, rx) = watch::channel(View::default());
    let revision = Arc::new(PublishedRevision::default());
    (
        Publisher {
            tx,
            revision: revision.clone(),
        },
        Viewer { rx, revision },
    )
}

/// The published snapshot's revision, beside the channel: every watch reads it when it
/// finds its queue empty (once per wake-up, from every core), and a look into the
/// channel takes its lock's reader count, one line that every such read changes. On a
/// cache line of its own; written once per published snapshot.
#[derive(Debug, Default)]
#[repr(align(64))]
struct PublishedRevision(AtomicI64);

/// The only way to change the view: held by the follower's writer. Dropping it closes
/// the view, so that no waiter is left hanging.
#[derive(Debug)]
pub(crate) struct Publisher {
    tx: watch::Sender<View>,
    revision: Arc<PublishedRevision>,
}

impl Publisher {
    /// Publishes a new snapshot (after its dispatch, under the index lock). Its revision
    /// is stored after the snapshot is in the channel, so that a reader that sees the
    /// revision finds at least that snapshot there.
    pub(crate) fn publish(&self, snapshot: Snapshot) {
        let revision = snapshot.revision;
        self.tx.send_modify(|v| v.snapshot = Arc::new(snapshot));
        self.revision.0.store(revision, Ordering::Release);
    }

    /// Marks a snapshot as loaded.
    pub(crate) fn set_loaded(&self) {
        self.tx
            .send_if_modified(|v| !std::mem::replace(&mut v.status.loaded, true));
    }

    /// Moves to `state`; waiters wake only on a change. A closed or failed cache stays
    /// so.
    pub(crate) fn set_state(&self, state: CacheStatus) {
        self.tx.send_if_modified(|v| {
            if v.status.closed() || v.status.state.same(&state) {
                return false;
            }
            v.status.state = state;
            true
        });
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // The follower's writer says why it ended first (closed, failed, panicked);
        // this covers a follower that never ran.
        self.set_state(CacheStatus::Closed);
    }
}

/// A future that resolves at the next published change.
pub(crate) type Changed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The reading side of the view: every look at the revision, the snapshot or the
/// status goes through it.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    rx: watch::Receiver<View>,
    revision: Arc<PublishedRevision>,
}

impl Viewer {
    /// Newest revision applied and dispatched (an atomic load: no lock).
    #[inline]
    pub(crate) fn revision(&self) -> i64 {
        self.revision.0.load(Ordering::Acquire)
    }

    /// The newest snapshot.
    #[inline]
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.rx.borrow().snapshot.clone()
    }

    /// Runs `f` on the newest snapshot without taking a reference to it.
    #[inline]
    pub(crate) fn with_snapshot<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> T {
        f(&self.rx.borrow().snapshot)
    }

    /// Runs `f` on the newest snapshot if the cache is loaded and not closed (one look
    /// at the view: the fast path of a serializable read).
    #[inline]
    pub(crate) fn with_serving_snapshot<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> Option<T> {
        let v = self.rx.borrow();
        (v.status.loaded && !v.status.closed()).then(|| f(&v.snapshot))
    }

    /// The status now (a clone: cheap, but not for hot paths; see `is_*`).
    pub(crate) fn status(&self) -> Status {
        self.rx.borrow().status.clone()
    }

    #[inline]
    pub(crate) fn is_ready(&self) -> bool {
        self.rx.borrow().status.ready()
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.rx.borrow().status.closed()
    }

    /// A future that resolves at the next published change (a revision or a status),
    /// or at once once the follower is gone (the view is closed then).
    pub(crate) fn changed(&self) -> Changed {
        let mut rx = self.rx.clone();
        rx.mark_unchanged();
        Box::pin(async move {
            let _ = rx.changed().await;
        })
    }

    /// A receiver of every change from now on.
    fn receiver(&self) -> watch::Receiver<View> {
        let mut rx = self.rx.clone();
        rx.mark_unchanged();
        rx
    }

    /// The status now, then every change of it; ends after the cache stopped.
    pub(crate) fn status_stream(&self) -> StatusStream {
        StatusStream::new(self.receiver())
    }

    /// See [`status::wait_ready`].
    pub(crate) async fn wait_ready(&self) -> Result<()> {
        status::wait_ready(self.receiver()).await
    }

    /// See [`status::wait_closed`].
    pub(crate) async fn wait_closed(&self) {
        status::wait_closed(self.receiver()).await
    }

    /// See [`status::wait_loaded`].
    pub(crate) async fn wait_loaded(&self, limit: std::time::Duration) -> Result<()> {
        status::wait_loaded(self.receiver(), limit).await
    }

    /// Waits until the applied revision is at least `revision` or the cache stopped;
    /// the view then.
    pub(crate) async fn wait_revision(&self, revision: i64) -> View {
        let mut rx = self.receiver();
        let result = rx
            .wait_for(|v| v.snapshot.revision >= revision || v.status.closed())
            .await
            .map(|v| v.clone());
        result.unwrap_or_else(|_| rx.borrow().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// The revision a reader sees without a lock is the published snapshot's, never
    /// ahead of the snapshot in the channel.
    #[test]
    fn the_revision_read_without_a_lock_follows_the_published_snapshot() {
        let (publisher, viewer) = channel();
        assert_eq!(viewer.revision(), 0);
        let store = Store::default();
        for revision in [5, 9] {
            publisher.publish(store.snapshot(revision));
            assert_eq!(viewer.revision(), revision);
            assert_eq!(viewer.snapshot().revision, revision);
        }
        let reader = std::thread::spawn(move || {
            let mut last = 0;
            for _ in 0..10_000 {
                let revision = viewer.revision();
                assert!(revision >= last, "never backwards");
                assert!(
                    viewer.snapshot().revision >= revision,
                    "never ahead of the data"
                );
                last = revision;
            }
        });
        for revision in 10..2_000 {
            publisher.publish(store.snapshot(revision));
        }
        reader.join().expect("reader");
    }
}
