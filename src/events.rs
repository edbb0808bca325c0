//! The events one response carries, stored once and shared by every subscriber that
//! gets them (the subscribers of one key range and options get the same events of a
//! revision), with a memo: a value a consumer derives from those events once, such as
//! etcd-cache-proxy's wire encoding, kept beside them for every later holder.

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use crate::kv::Event;

/// Shared events; a clone is one reference count.
#[derive(Clone)]
pub(crate) struct SharedEvents(Arc<Inner>);

/// Aligned to a cache line, so that the events' pointer and length sit on a line apart
/// from the `Arc`'s reference counts: every delivery of a revision changes its count,
/// from both cores, and each consumer's first read of the events then missed.
#[repr(align(64))]
struct Inner {
    events: Box<[Event]>,
    /// The first value derived from `events` by [`SharedEvents::memo`].
    memo: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl SharedEvents {
    /// The value `derive` makes of the events: made by the first caller, shared with
    /// every later one. `None` when the memo already holds a value of another type
    /// (one memo per set of events).
    pub(crate) fn memo<T: Any + Send + Sync>(
        &self,
        derive: impl FnOnce(&[Event]) -> T,
    ) -> Option<&T> {
        self.0
            .memo
            .get_or_init(|| Box::new(derive(&self.0.events)))
            .downcast_ref()
    }

    /// Whether `self` and `other` are the same shared events (not equal copies).
    #[cfg(test)]
    pub(crate) fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for SharedEvents {
    type Target = [Event];

    #[inline]
    fn deref(&self) -> &[Event] {
        &self.0.events
    }
}

impl From<Vec<Event>> for SharedEvents {
    fn from(events: Vec<Event>) -> Self {
        SharedEvents(Arc::new(Inner {
            events: events.into_boxed_slice(),
            memo: OnceLock::new(),
        }))
    }
}

impl FromIterator<Event> for SharedEvents {
    fn from_iter<I: IntoIterator<Item = Event>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

impl fmt::Debug for SharedEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.events.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{EventType, KeyValue};

    #[test]
    fn a_memo_is_derived_once_and_shared_by_every_clone() {
        let events: SharedEvents = vec![Event::new(
            EventType::Put,
            KeyValue::new("a", "1", 2, 2, 1, 0),
            None,
        )]
        .into();
        let other = events.clone();
        let mut calls = 0;
        let first = *events
            .memo(|evs| {
                calls += 1;
                evs.len()
            })
            .unwrap();
        let again = *other
            .memo(|_| -> usize {
                calls += 1;
                99
            })
            .unwrap();
        assert_eq!((first, again, calls), (1, 1, 1));
        assert!(other.memo(|_| "another type").is_none());
        assert!(events.ptr_eq(&other));
    }
}
