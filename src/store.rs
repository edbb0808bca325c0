//! The cache's copy of the keyspace: a persistent ordered map, so a reader takes an
//! immutable snapshot in O(1) while the upstream task keeps writing.
//!
//! Reads at an older revision inside the window are answered from the newest snapshot
//! and the history: for every key changed after the requested revision, the value at
//! that revision is the previous key-value of its first later event.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use imbl::OrdSet;

use crate::history::Batch;
use crate::key_range::KeyRange;
use crate::kv::{Event, EventType, KeyValue};

/// A store entry: a key-value, ordered, compared and looked up by its key alone. The key
/// is not stored a second time as a map key, and an entry is one pointer, so the
/// persistent tree's nodes stay small and cheap to copy when a snapshot shares them.
#[derive(Debug, Clone)]
pub(crate) struct Entry(pub(crate) KeyValue);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0 .0.key == other.0 .0.key
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0 .0.key.cmp(&other.0 .0.key)
    }
}

impl std::borrow::Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        &self.0 .0.key
    }
}

/// The map type of the store: a persistent ordered set of entries keyed by key.
pub(crate) type KvMap = OrdSet<Entry>;

/// An immutable view of the keyspace at one revision.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub(crate) revision: i64,
    pub(crate) map: KvMap,
    /// Key and value bytes held.
    pub(crate) bytes: usize,
}

impl Snapshot {
    /// Key-values in `range` at the snapshot's revision, in key order.
    pub(crate) fn range<'a>(&'a self, range: &KeyRange) -> impl Iterator<Item = &'a KeyValue> + 'a {
        self.map
            .range::<_, [u8]>(range.slice_bounds())
            .map(|e| &e.0)
    }

    /// Key-values in `range` at `revision <= self.revision`, given every batch after
    /// `revision` up to the snapshot (oldest first).
    pub(crate) fn range_at<'a>(
        &self,
        range: &KeyRange,
        later: impl Iterator<Item = &'a Arc<Batch>>,
    ) -> Vec<KeyValue> {
        let mut overrides: BTreeMap<Bytes, Option<KeyValue>> = BTreeMap::new();
        for batch in later {
            if batch.revision > self.revision {
                break;
            }
            for ev in batch.all() {
                if range.contains(ev.key()) && !overrides.contains_key(ev.key()) {
                    overrides.insert(ev.kv.0.key.clone(), ev.prev_kv.clone());
                }
            }
        }
        if overrides.is_empty() {
            return self.range(range).cloned().collect();
        }
        let mut merged: BTreeMap<Bytes, KeyValue> = self
            .range(range)
            .map(|kv| (kv.0.key.clone(), kv.clone()))
            .collect();
        for (key, old) in overrides {
            match old {
                Some(kv) => {
                    merged.insert(key, kv);
                }
                None => {
                    merged.remove(&key);
                }
            }
        }
        merged.into_values().collect()
    }
}

/// The writer's side: applies upstream events and attaches previous key-values.
#[derive(Debug, Default)]
pub(crate) struct Store {
    map: KvMap,
    bytes: usize,
}

impl Store {
    /// Replaces the content (after a full list).
    pub(crate) fn replace(&mut self, map: KvMap) {
        self.bytes = map.iter().map(|e| e.0.payload_len()).sum();
        self.map = map;
    }

    /// Replaces the content after a re-list, keeping each key-value that did not change
    /// (same key and `mod_revision`: the same version in etcd) instead of its fresh
    /// copy, so that what was derived from it (a typed view's decoded object) is kept,
    /// and the copy is freed.
    pub(crate) fn relisted(&mut self, mut map: KvMap) {
        for old in self.map.iter() {
            let unchanged = map
                .get(&old.0 .0.key[..])
                .is_some_and(|new| new.0.mod_revision() == old.0.mod_revision());
            if unchanged {
                map.insert(old.clone());
            }
        }
        self.replace(map);
    }

    /// Applies one upstream event and returns it with its previous key-value.
    pub(crate) fn apply(&mut self, event_type: EventType, kv: KeyValue) -> Event {
        let prev_kv = match event_type {
            EventType::Put => {
                self.bytes += kv.payload_len();
                self.map.insert(Entry(kv.clone())).map(|e| e.0)
            }
            EventType::Delete => self.map.remove(&kv.0.key[..]).map(|e| e.0),
        };
        if let Some(p) = &prev_kv {
            self.bytes -= p.payload_len();
        }
        Event {
            event_type,
            kv,
            prev_kv,
        }
    }

    /// An O(1) snapshot at `revision`.
    pub(crate) fn snapshot(&self, revision: i64) -> Snapshot {
        Snapshot {
            revision,
            map: self.map.clone(),
            bytes: self.bytes,
        }
    }

    /// The current value of `key`.
    pub(crate) fn get(&self, key: &[u8]) -> Option<&KeyValue> {
        self.map.get(key).map(|e| &e.0)
    }

    /// Number of keys held.
    #[cfg(any(test, feature = "unstable-bench-internals"))]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Key and value bytes held.
    #[cfg(any(test, feature = "unstable-bench-internals"))]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::key_range::RangeSpec;
    use proptest::prelude::*;

    fn kv(k: &str, v: &str, rev: i64) -> KeyValue {
        KeyValue::new(k.to_owned(), v.to_owned(), rev, rev, 1, 0)
    }

    #[test]
    fn apply_attaches_prev_kv() {
        let mut s = Store::default();
        let e = s.apply(EventType::Put, kv("a", "1", 2));
        assert!(e.prev_kv.is_none());
        let e = s.apply(EventType::Put, kv("a", "2", 3));
        assert_eq!(e.prev_kv.unwrap().value(), b"1");
        let e = s.apply(EventType::Delete, KeyValue::new("a", "", 0, 4, 0, 0));
        assert_eq!(e.prev_kv.unwrap().value(), b"2");
        assert_eq!(s.len(), 0);
        assert_eq!(s.bytes(), 0);
    }

    proptest! {
        /// A read at any revision in the window equals a replay of the ops up to it.
        #[test]
        fn range_at_equals_replay(ops in proptest::collection::vec((0u8..6, any::<bool>()), 1..80),
                                  cap in 1usize..100) {
            let mut store = Store::default();
            let mut hist = History::new(cap, usize::MAX);
            hist.reset(1);
            let mut states: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new()];
            let mut cur = BTreeMap::new();
            for (i, (k, put)) in ops.iter().enumerate() {
                let rev = i as i64 + 2;
                let key = vec![b'k', b'0' + k];
                let ev = if *put {
                    cur.insert(key.clone(), rev.to_string().into_bytes());
                    store.apply(EventType::Put, KeyValue::new(key, rev.to_string(), rev, rev, 1, 0))
                } else {
                    cur.remove(&key);
                    store.apply(EventType::Delete, KeyValue::new(key, "", 0, rev, 0, 0))
                };
                hist.push(Batch::new(rev, vec![ev]), false);
                states.push(cur.clone());
            }
            let head = ops.len() as i64 + 1;
            let snap = store.snapshot(head);
            let range = KeyRange::new(b"k", &RangeSpec::Prefix).unwrap();
            for rev in (hist.floor() - 1).max(1)..=head {
                let got: Vec<(Vec<u8>, Vec<u8>)> = snap.range_at(&range, hist.after(rev))
                    .into_iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect();
                let want: Vec<(Vec<u8>, Vec<u8>)> = states[(rev - 1) as usize].clone().into_iter().collect();
                prop_assert_eq!(got, want, "at revision {}", rev);
            }
        }
    }
}
