//! The model's side: ranges, etcd's truth and the mirror of what the cache applied,
//! and what a watch matches.

use super::*;

impl Range {
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        match self {
            Range::Single(k) => key == k.as_bytes(),
            Range::Prefix(p) => key.starts_with(p.as_bytes()),
            Range::Between(s, e) if e == "\0" => key >= s.as_bytes(),
            Range::Between(s, e) => key >= s.as_bytes() && key < e.as_bytes(),
            Range::FromKey(s) => key >= s.as_bytes(),
            Range::All => true,
        }
    }

    pub(super) fn watch_options(&self) -> (String, WatchOptions) {
        let o = WatchOptions::new();
        match self {
            Range::Single(k) => (k.clone(), o),
            Range::Prefix(p) => (p.clone(), o.with_prefix()),
            Range::Between(s, e) => (s.clone(), o.with_range(e.as_str())),
            Range::FromKey(s) => (s.clone(), o.with_from_key()),
            Range::All => (String::new(), o.with_all_keys()),
        }
    }

    pub(super) fn get_options(&self) -> (String, GetOptions) {
        let o = GetOptions::new();
        match self {
            Range::Single(k) => (k.clone(), o),
            Range::Prefix(p) => (p.clone(), o.with_prefix()),
            Range::Between(s, e) => (s.clone(), o.with_range(e.as_str())),
            Range::FromKey(s) => (s.clone(), o.with_from_key()),
            Range::All => (String::new(), o.with_all_keys()),
        }
    }
}

impl Truth {
    pub(super) fn in_cache(&self, key: &[u8]) -> bool {
        key.starts_with(self.prefix.as_bytes())
    }

    pub(super) fn state_at(&self, revision: i64) -> &Map {
        self.states
            .range(..=revision)
            .next_back()
            .map(|(_, m)| m)
            .expect("a state at the first list")
    }

    /// The events the cache's upstream watch delivers for `revision`.
    pub(super) fn cache_events(&self, revision: i64) -> Vec<(EventType, KeyValue)> {
        self.events.get(&revision).map_or_else(Vec::new, |evs| {
            evs.iter()
                .filter(|e| self.in_cache(e.key()))
                .map(|e| (e.event_type(), e.kv.clone()))
                .collect()
        })
    }

    /// Revisions in `(after, upto]` with events for the cache.
    pub(super) fn cache_revisions(&self, after: i64, upto: i64) -> Vec<i64> {
        if upto <= after {
            return Vec::new();
        }
        self.events
            .range(after + 1..=upto)
            .filter(|(_, evs)| evs.iter().any(|e| self.in_cache(e.key())))
            .map(|(r, _)| *r)
            .collect()
    }

    /// The mirror of `Writer::apply` for one revision the cache receives.
    pub(super) fn cache_applies(&mut self, revision: i64) {
        if revision <= self.applied {
            return;
        }
        self.hist.push_back(revision);
        if self.hist.len() > self.window {
            let old = self.hist.pop_front().expect("non-empty");
            self.floor = old + 1;
        }
        self.applied = revision;
    }

    /// The mirror of `Writer::progress`.
    pub(super) fn cache_progress(&mut self, revision: i64) {
        self.applied = self.applied.max(revision);
    }

    /// The mirror of `Writer::install` after a re-list at `revision`.
    pub(super) fn cache_relists(&mut self, revision: i64) {
        if revision > self.applied {
            self.gaps.push((self.applied, revision));
        }
        self.hist.clear();
        self.applied = self.applied.max(revision);
        self.floor = self.applied + 1;
    }

    /// The matching events of `revision` as `w` must get them.
    pub(super) fn expected(&self, w: &Watch, revision: i64) -> Vec<Event> {
        self.events.get(&revision).map_or_else(Vec::new, |evs| {
            evs.iter()
                .filter(|e| w.wants(e))
                .map(|e| {
                    if w.prev_kv {
                        e.clone()
                    } else {
                        e.without_prev()
                    }
                })
                .collect()
        })
    }

    /// The first revision after `after` with an event `w` matches.
    pub(super) fn next_match(&self, w: &Watch, after: i64) -> Option<i64> {
        self.events
            .range(after + 1..)
            .find(|(_, evs)| evs.iter().any(|e| w.wants(e)))
            .map(|(r, _)| *r)
    }
}

impl Watch {
    pub(super) fn wants(&self, e: &Event) -> bool {
        match e.event_type() {
            EventType::Put if self.no_put => false,
            EventType::Delete if self.no_delete => false,
            _ => self.range.contains(e.key()),
        }
    }
}
