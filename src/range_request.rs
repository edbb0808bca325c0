//! A read as etcd's `Range` RPC describes it, and etcd's range semantics
//! (`server/etcdserver/apply.go`, `Range`): the validated request that the read path
//! answers from memory and the upstream sends to etcd when it falls back.

use std::cmp::Ordering;

use crate::key_range::KeyRange;
use crate::kv::KeyValue;

pub use etcd_client::{SortOrder, SortTarget};

/// Everything a range read asks for, validated: the key range and every option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangeRequest {
    pub(crate) range: KeyRange,
    /// 0: the latest revision.
    pub(crate) revision: i64,
    /// 0: no limit.
    pub(crate) limit: i64,
    pub(crate) sort_target: SortTarget,
    pub(crate) sort_order: SortOrder,
    pub(crate) serializable: bool,
    pub(crate) keys_only: bool,
    pub(crate) count_only: bool,
    pub(crate) min_mod_revision: i64,
    pub(crate) max_mod_revision: i64,
    pub(crate) min_create_revision: i64,
    pub(crate) max_create_revision: i64,
}

impl RangeRequest {
    /// A plain read of `range` at the latest revision.
    pub(crate) fn new(range: KeyRange) -> Self {
        RangeRequest {
            range,
            revision: 0,
            limit: 0,
            sort_target: SortTarget::Key,
            sort_order: SortOrder::None,
            serializable: false,
            keys_only: false,
            count_only: false,
            min_mod_revision: 0,
            max_mod_revision: 0,
            min_create_revision: 0,
            max_create_revision: 0,
        }
    }

    fn has_revision_filters(&self) -> bool {
        self.min_mod_revision != 0
            || self.max_mod_revision != 0
            || self.min_create_revision != 0
            || self.max_create_revision != 0
    }

    fn passes_filters(&self, kv: &KeyValue) -> bool {
        (self.min_mod_revision == 0 || kv.mod_revision() >= self.min_mod_revision)
            && (self.max_mod_revision == 0 || kv.mod_revision() <= self.max_mod_revision)
            && (self.min_create_revision == 0 || kv.create_revision() >= self.min_create_revision)
            && (self.max_create_revision == 0 || kv.create_revision() <= self.max_create_revision)
    }

    /// Answers the request from the key-values of its range at its revision, given in
    /// key order, as etcd does: count before the limit, `more` when the limit cut,
    /// etcd's sort rules and keys-only/count-only shaping (keys-only answers keep their
    /// leases, as etcd 3.4 to 3.6 answers; see [`RangeRequest::answer_as`]).
    pub(crate) fn answer<'a>(&self, kvs: impl Iterator<Item = &'a KeyValue>) -> RangeResult {
        self.answer_as(kvs, false)
    }

    /// [`RangeRequest::answer`], with keys-only answers also without their leases when
    /// `keys_only_drops_lease` (etcd >= 3.7).
    pub(crate) fn answer_as<'a>(
        &self,
        kvs: impl Iterator<Item = &'a KeyValue>,
        keys_only_drops_lease: bool,
    ) -> RangeResult {
        let target = self.sort_target;
        let mut order = self.sort_order;
        if target != SortTarget::Key && order == SortOrder::None {
            order = SortOrder::Ascend;
        }
        let sorted =
            order != SortOrder::None && !(target == SortTarget::Key && order == SortOrder::Ascend);
        let limit = usize::try_from(self.limit).unwrap_or(0);
        // As etcd: with an explicit sort order or revision filters everything is fetched,
        // sorted and truncated; otherwise only `limit + 1` keys in key order are fetched
        // (and then sorted, when the target is not the key: etcd sorts that page only).
        let fetch_all = self.sort_order != SortOrder::None || self.has_revision_filters();
        let take = if !fetch_all && limit > 0 {
            limit + 1
        } else {
            usize::MAX
        };
        let mut count = 0i64;
        let mut out: Vec<KeyValue> = Vec::new();
        if self.count_only {
            count = kvs.count() as i64;
        } else {
            for kv in kvs {
                count += 1;
                if out.len() < take && self.passes_filters(kv) {
                    out.push(kv.clone());
                }
            }
            if sorted {
                out.sort_by(|a, b| {
                    let c = compare(target, a, b);
                    if order == SortOrder::Descend {
                        c.reverse()
                    } else {
                        c
                    }
                });
            }
        }
        let mut more = false;
        if limit > 0 && out.len() > limit {
            out.truncate(limit);
            more = true;
        }
        if self.keys_only {
            for kv in &mut out {
                *kv = kv.keys_only(keys_only_drops_lease);
            }
        }
        RangeResult {
            kvs: out,
            count,
            more,
        }
    }
}

/// The key-values, the count and `more` of an answered range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangeResult {
    pub(crate) kvs: Vec<KeyValue>,
    pub(crate) count: i64,
    pub(crate) more: bool,
}

fn compare(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key().cmp(b.key()),
        SortTarget::Version => a.version().cmp(&b.version()),
        SortTarget::Create => a.create_revision().cmp(&b.create_revision()),
        SortTarget::Mod => a.mod_revision().cmp(&b.mod_revision()),
        SortTarget::Value => a.value().cmp(b.value()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_range::RangeSpec;

    fn kvs() -> Vec<KeyValue> {
        (0..5)
            .map(|i| {
                KeyValue::new(
                    format!("k{i}"),
                    format!("v{}", 4 - i),
                    10 + i,
                    20 - i,
                    i + 1,
                    0,
                )
            })
            .collect()
    }

    fn req() -> RangeRequest {
        RangeRequest::new(KeyRange::new(b"k", &RangeSpec::Prefix).unwrap())
    }

    fn keys(r: &RangeResult) -> Vec<&[u8]> {
        r.kvs.iter().map(|kv| kv.key()).collect()
    }

    #[test]
    fn limit_sets_more_and_keeps_count() {
        let kvs = kvs();
        let r = RangeRequest { limit: 2, ..req() }.answer(kvs.iter());
        assert_eq!((r.kvs.len(), r.count, r.more), (2, 5, true));
        let r = RangeRequest { limit: 5, ..req() }.answer(kvs.iter());
        assert_eq!((r.kvs.len(), r.count, r.more), (5, 5, false));
    }

    #[test]
    fn sort_and_keys_only_and_count_only() {
        let kvs = kvs();
        let r = RangeRequest {
            sort_target: SortTarget::Mod,
            keys_only: true,
            ..req()
        }
        .answer(kvs.iter());
        assert_eq!(keys(&r), [&b"k4"[..], b"k3", b"k2", b"k1", b"k0"]);
        assert!(r.kvs.iter().all(|kv| kv.value().is_empty()));
        let r = RangeRequest {
            sort_order: SortOrder::Descend,
            limit: 1,
            ..req()
        }
        .answer(kvs.iter());
        assert_eq!(r.kvs[0].key(), b"k4");
        assert!(r.more);
        let r = RangeRequest {
            count_only: true,
            ..req()
        }
        .answer(kvs.iter());
        assert_eq!((r.kvs.len(), r.count, r.more), (0, 5, false));
    }

    /// Keys-only answers keep the lease as etcd 3.4-3.6 answer them, and lose it as 3.7.
    #[test]
    fn keys_only_keeps_or_drops_the_lease() {
        let leased = [KeyValue::new("k", "v", 3, 3, 1, 77)];
        let keys_only = RangeRequest {
            keys_only: true,
            ..req()
        };
        let kept = keys_only.answer(leased.iter());
        assert_eq!((kept.kvs[0].lease(), kept.kvs[0].value()), (77, &b""[..]));
        let dropped = keys_only.answer_as(leased.iter(), true);
        assert_eq!(
            (dropped.kvs[0].lease(), dropped.kvs[0].value()),
            (0, &b""[..])
        );
        // Not keys-only: the lease stays whatever the version.
        assert_eq!(req().answer_as(leased.iter(), true).kvs[0].lease(), 77);
    }

    #[test]
    fn unordered_sort_with_limit_sorts_only_the_first_page_as_etcd() {
        // etcd 3.4 apply.go: with SortOrder NONE the range is fetched with limit + 1 in
        // key order, then sorted ascending by the target, then truncated.
        let kvs = kvs();
        let r = RangeRequest {
            sort_target: SortTarget::Mod,
            limit: 2,
            ..req()
        }
        .answer(kvs.iter());
        assert_eq!(keys(&r), [&b"k2"[..], b"k1"]);
        assert!(r.more);
        // With an explicit order everything is sorted first.
        let r = RangeRequest {
            sort_target: SortTarget::Mod,
            sort_order: SortOrder::Ascend,
            limit: 2,
            ..req()
        }
        .answer(kvs.iter());
        assert_eq!(keys(&r), [&b"k4"[..], b"k3"]);
    }

    #[test]
    fn revision_filters_do_not_change_count() {
        let kvs = kvs();
        let r = RangeRequest {
            min_create_revision: 12,
            ..req()
        }
        .answer(kvs.iter());
        assert_eq!((r.kvs.len(), r.count), (3, 5));
    }
}
