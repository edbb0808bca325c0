//! What one subscriber receives: which keys, with or without previous key-values,
//! and which event types.

use crate::events::SharedEvents;
use crate::history::Batch;
use crate::key_range::KeyRange;
use crate::kv::{Event, EventType};

/// A subscriber's filter. Subscribers with equal filters share one group in the index,
/// so a batch's payload is selected once per group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Filter {
    pub(crate) range: KeyRange,
    pub(crate) prev_kv: bool,
    pub(crate) no_put: bool,
    pub(crate) no_delete: bool,
}

impl Filter {
    /// Every event of `range`, without previous key-values.
    #[cfg(any(test, feature = "unstable-bench-internals"))]
    pub(crate) fn range(range: KeyRange) -> Self {
        Filter {
            range,
            prev_kv: false,
            no_put: false,
            no_delete: false,
        }
    }

    #[inline]
    fn wants(&self, ev: &Event) -> bool {
        match ev.event_type {
            EventType::Put if self.no_put => false,
            EventType::Delete if self.no_delete => false,
            _ => self.range.contains(ev.key()),
        }
    }

    /// The events of `batch` this filter passes: the batch's own shared slice when all
    /// of them pass, a new slice (of reference-counted events) when only some do.
    pub(crate) fn select(&self, batch: &Batch) -> Option<SharedEvents> {
        let all = batch.all();
        let matching = all.iter().filter(|e| self.wants(e)).count();
        if matching == 0 {
            None
        } else if matching == all.len() {
            Some(batch.events(self.prev_kv).clone())
        } else {
            let pick = all.iter().filter(|e| self.wants(e));
            Some(if self.prev_kv {
                pick.cloned().collect()
            } else {
                pick.map(Event::without_prev).collect()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_range::RangeSpec;
    use crate::kv::KeyValue;

    /// Every subscriber's mailbox holds its filter: a range of one `Bytes` and a boxed
    /// end, and three flags.
    #[test]
    fn a_filter_takes_56_bytes() {
        assert_eq!(std::mem::size_of::<Filter>(), 56);
    }

    #[test]
    fn select_shares_the_batch_when_everything_passes() {
        let batch = Batch::new(
            5,
            vec![
                Event::new(EventType::Put, KeyValue::new("a", "1", 5, 5, 1, 0), None),
                Event::new(EventType::Delete, KeyValue::new("b", "", 0, 5, 0, 0), None),
            ],
        );
        let all = Filter::range(KeyRange::new(b"", &RangeSpec::AllKeys).unwrap());
        assert!(all.select(&batch).unwrap().ptr_eq(batch.events(false)));
        let no_delete = Filter {
            no_delete: true,
            ..all.clone()
        };
        assert_eq!(no_delete.select(&batch).unwrap().len(), 1);
        let other = Filter::range(KeyRange::new(b"c", &RangeSpec::Single).unwrap());
        assert!(other.select(&batch).is_none());
    }
}
