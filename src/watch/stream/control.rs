//! What the two halves of a stream share (as tokio's `mpsc/chan.rs` for its sender and
//! receiver): the watches added but not yet taken by the response half, the ids in use,
//! and the progress requests; with the replies' compact form.

use std::collections::HashMap;
use std::num::NonZeroI64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::Result;
use crate::shared::Shared;
use crate::subscribers::{Scope, SubId};
use crate::watch::subscription::Subscription;

/// The watch id of a response to a stream-wide progress request, as etcd's.
pub(super) const STREAM_WATCH_ID: i64 = -1;

/// What the two halves of a stream share.
pub(super) struct Control {
    pub(super) shared: Arc<Shared>,
    pub(super) scope: Option<Arc<Scope>>,
    pub(super) inner: Mutex<ControlInner>,
    /// Set by the sender when `inner` has news for the response half, so that the
    /// response half takes the lock only then (not on every poll).
    pub(super) dirty: AtomicBool,
    /// The request half was dropped (only after a split). Set before the news of it.
    pub(super) sender_gone: AtomicBool,
    /// The response half's waker.
    pub(super) waker: AtomicWaker,
}

#[derive(Default)]
pub(super) struct ControlInner {
    /// Added and canceled by the sender, in order, not yet taken by the response half.
    pub(super) incoming: Vec<Incoming>,
    /// Watch ids in use on the stream, with their registry ids.
    pub(super) ids: Ids,
    /// The next id to try for a watch that did not choose one.
    pub(super) next_id: i64,
}

/// What the sender hands the response half, in the order of the requests.
pub(super) enum Incoming {
    /// A watch, registered, and the revision its `created` response reports.
    Watch(Subscription, i64),
    /// A watch from now whose start is being learned: a task asks for the cluster's
    /// revision and registers it the moment the answer comes (a slow reader of the
    /// stream does not hold it back). What follows it on the stream waits for it, so
    /// that replies keep the order of the requests.
    Opening {
        watch_id: i64,
        sub_id: SubId,
        task: JoinHandle<Result<(Subscription, i64)>>,
    },
    /// A cancel of the watch `watch_id` (registry id `sub_id`): its id is free already.
    Cancel { watch_id: i64, sub_id: SubId },
    /// The `canceled` reply of a watch that a cancel ended already (it was on the
    /// stream), waiting for its turn behind a watch that is opening.
    Canceled { watch_id: i64 },
    /// A stream-wide progress request. It does not wait behind a watch still opening
    /// (its answer does, in the response half's poll).
    Progress(UnansweredRequest),
}

impl Incoming {
    pub(super) fn watch_id(&self) -> Option<i64> {
        match self {
            Incoming::Watch(sub, _) => Some(sub.watch_id),
            Incoming::Opening { watch_id, .. } => Some(*watch_id),
            Incoming::Cancel { .. } | Incoming::Canceled { .. } | Incoming::Progress(_) => None,
        }
    }
}

/// A reply to a request on the stream, sent in the order of the requests (etcd sends
/// its `created` and `canceled` replies on one control channel, in order; a client maps
/// them to its requests by that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    Created { watch_id: i64, revision: i64 },
    Canceled { watch_id: i64 },
}

/// A [`Reply`] as a stream holds it until it is sent: 16 bytes, and an `Option` of it
/// too (a `Reply` takes 24). `code` is the created revision plus one (a revision is
/// never negative), or -1 for a cancel.
#[derive(Debug, Clone, Copy)]
pub(super) struct Queued {
    pub(super) watch_id: i64,
    pub(super) code: NonZeroI64,
}

impl Queued {
    pub(super) const CANCELED: NonZeroI64 = NonZeroI64::new(-1).expect("not zero");
}

impl From<Reply> for Queued {
    fn from(reply: Reply) -> Self {
        match reply {
            Reply::Created { watch_id, revision } => Queued {
                watch_id,
                code: NonZeroI64::new(revision.max(0).saturating_add(1)).expect("positive"),
            },
            Reply::Canceled { watch_id } => Queued {
                watch_id,
                code: Queued::CANCELED,
            },
        }
    }
}

impl From<Queued> for Reply {
    fn from(queued: Queued) -> Self {
        let watch_id = queued.watch_id;
        match queued.code.get() {
            -1 => Reply::Canceled { watch_id },
            code => Reply::Created {
                watch_id,
                revision: code - 1,
            },
        }
    }
}

/// Watch ids in use on a stream, with their registry ids (0 while registering): the
/// one watch most streams carry inline, a short list for a few, a boxed map beyond
/// [`Ids::FEW`] (so that a one-watch stream's control block holds no allocation for it).
#[derive(Default)]
pub(super) enum Ids {
    #[default]
    None,
    One(i64, SubId),
    Few(Vec<(i64, SubId)>),
    // Boxed on purpose: it keeps `Ids` (and every control block) at 24 bytes.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<i64, SubId>>),
}

impl Ids {
    pub(super) const FEW: usize = 16;

    pub(super) fn get(&self, watch_id: i64) -> Option<SubId> {
        match self {
            Ids::None => None,
            Ids::One(id, sub) => (*id == watch_id).then_some(*sub),
            Ids::Few(few) => few.iter().find(|e| e.0 == watch_id).map(|e| e.1),
            Ids::Many(many) => many.get(&watch_id).copied(),
        }
    }

    pub(super) fn contains(&self, watch_id: i64) -> bool {
        self.get(watch_id).is_some()
    }

    /// Sets the registry id of `watch_id`, adding it if it is new.
    pub(super) fn insert(&mut self, watch_id: i64, sub_id: SubId) {
        match self {
            Ids::None => *self = Ids::One(watch_id, sub_id),
            Ids::One(id, sub) if *id == watch_id => *sub = sub_id,
            Ids::One(id, sub) => *self = Ids::Few(vec![(*id, *sub), (watch_id, sub_id)]),
            Ids::Few(few) => {
                if let Some(e) = few.iter_mut().find(|e| e.0 == watch_id) {
                    e.1 = sub_id;
                } else if few.len() < Self::FEW {
                    crate::watch::ready_set::push_lean(few, (watch_id, sub_id));
                } else {
                    let mut many: HashMap<_, _> = few.drain(..).collect();
                    many.insert(watch_id, sub_id);
                    *self = Ids::Many(Box::new(many));
                }
            }
            Ids::Many(many) => {
                many.insert(watch_id, sub_id);
            }
        }
    }

    pub(super) fn remove(&mut self, watch_id: i64) {
        match self {
            Ids::None => {}
            Ids::One(id, _) => {
                if *id == watch_id {
                    *self = Ids::None;
                }
            }
            Ids::Few(few) => few.retain(|e| e.0 != watch_id),
            Ids::Many(many) => {
                many.remove(&watch_id);
            }
        }
    }
}

impl Control {
    /// Frees the id of a watch that has ended, unless a cancel freed it already and a
    /// new watch took it.
    pub(super) fn forget(&self, watch_id: i64, sub_id: SubId) {
        let mut inner = self.inner.lock();
        if inner.ids.get(watch_id) == Some(sub_id) {
            inner.ids.remove(watch_id);
        }
    }

    /// Tells the response half that there is news.
    pub(super) fn notify(&self) {
        self.dirty.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A stream-wide progress request: answered at a revision at least `at_least` (the
/// cluster's revision when it was asked, as etcd answers with its current one), or,
/// once `deadline` has passed, at what the cache can prove.
#[derive(Debug, Clone, Copy)]
pub(super) struct UnansweredRequest {
    pub(super) at_least: i64,
    pub(super) deadline: Instant,
}

impl Control {
    /// The control block of a new stream on `shared`, counting its watches against
    /// `scope`.
    pub(super) fn new(shared: Arc<Shared>, scope: Option<Arc<Scope>>) -> Arc<Control> {
        Arc::new(Control {
            shared,
            scope,
            inner: Mutex::default(),
            dirty: AtomicBool::new(false),
            sender_gone: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Ids, Queued, Reply};

    #[test]
    fn a_queued_reply_is_the_reply_in_16_bytes() {
        assert_eq!(std::mem::size_of::<Option<Queued>>(), 16);
        for reply in [
            Reply::Created {
                watch_id: 0,
                revision: 0,
            },
            Reply::Created {
                watch_id: -7,
                revision: i64::MAX - 1,
            },
            Reply::Canceled { watch_id: 0 },
            Reply::Canceled { watch_id: i64::MIN },
        ] {
            assert_eq!(Reply::from(Queued::from(reply)), reply);
        }
    }

    #[test]
    fn ids_stay_right_when_the_short_list_turns_into_a_map() {
        let mut ids = Ids::default();
        for id in 0..40 {
            assert!(!ids.contains(id));
            ids.insert(id, 0);
            ids.insert(id, id as u64 + 100);
            assert!(matches!(ids, Ids::Many(_)) == (id >= Ids::FEW as i64));
        }
        for id in (0..40).step_by(3) {
            ids.remove(id);
        }
        for id in 0..40 {
            let expected = (id % 3 != 0).then_some(id as u64 + 100);
            assert_eq!(ids.get(id), expected, "watch id {id}");
        }
        let mut few = Ids::default();
        few.insert(7, 1);
        few.insert(9, 2);
        few.remove(7);
        assert_eq!((few.get(7), few.get(9)), (None, Some(2)));
        let mut one = Ids::default();
        one.insert(7, 1);
        one.insert(7, 3);
        one.remove(8);
        assert!(matches!(one, Ids::One(7, 3)));
        one.remove(7);
        assert!(matches!(one, Ids::None) && one.get(7).is_none());
    }
}
