//! The cache creates of a stream that wait for their `created`, and which of them (with
//! the open cached watches) a revocation re-check asks about.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::pb::etcdserverpb::WatchCreateRequest;
use crate::watch::id_map::IdMap;

/// A cache create waiting for its `created`: the id it was given, its `fragment` flag and
/// key range.
pub(super) struct PendingCreate {
    pub(super) id: i64,
    /// The client canceled it before its `created` came: its id is free (as etcd frees
    /// it when it reads the cancel), and it is not counted as open.
    pub(super) canceled: bool,
    pub(super) fragment: bool,
    pub(super) key: Bytes,
    pub(super) end: Bytes,
    /// The create as etcd would take it (etcd's keyspace, its id): how the watch is
    /// resumed from etcd if it falls behind the cache's window.
    pub(super) resume: WatchCreateRequest,
    /// A watch caught up from etcd returning to the cache (`rejoin`): the client has had
    /// its `created` long ago, and did not ask for this one.
    pub(super) rejoin: bool,
}

/// The key ranges a revocation re-check asks about, each with the watch ids it decides:
/// the stream's open cached watches and its cached creates whose `created` has not gone
/// out yet (neither canceled by the client nor a resume after a move), so that a create
/// in flight at the revocation is not let through by its late reply.
pub(super) fn to_recheck(
    cached: &IdMap<(Bytes, Bytes)>,
    pending: &VecDeque<PendingCreate>,
) -> HashMap<(Bytes, Bytes), Vec<i64>> {
    let mut by_range: HashMap<(Bytes, Bytes), Vec<i64>> = HashMap::new();
    for (id, range) in cached {
        by_range.entry(range.clone()).or_default().push(*id);
    }
    for p in pending.iter().filter(|p| !p.canceled && !p.rejoin) {
        by_range
            .entry((p.key.clone(), p.end.clone()))
            .or_default()
            .push(p.id);
    }
    by_range
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(id: i64, key: &'static str, canceled: bool, rejoin: bool) -> PendingCreate {
        PendingCreate {
            id,
            canceled,
            fragment: false,
            key: Bytes::from_static(key.as_bytes()),
            end: Bytes::new(),
            resume: WatchCreateRequest::default(),
            rejoin,
        }
    }

    /// A revocation re-checks the open cached watches and the cached creates still waiting
    /// for their `created` (issue 40: a create in flight at the revocation was let
    /// through), not those the client canceled nor resumes after a move.
    #[test]
    fn a_recheck_covers_creates_not_answered_yet() {
        let mut cached = IdMap::default();
        cached.insert(1, (Bytes::from_static(b"/a"), Bytes::new()));
        let queue: VecDeque<PendingCreate> = [
            pending(2, "/a", false, false),
            pending(3, "/b", false, false),
            pending(4, "/c", true, false),
            pending(5, "/d", false, true),
        ]
        .into();
        let mut got: Vec<(Bytes, Vec<i64>)> = to_recheck(&cached, &queue)
            .into_iter()
            .map(|((k, _), mut ids)| {
                ids.sort();
                (k, ids)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (Bytes::from_static(b"/a"), vec![1, 2]),
                (Bytes::from_static(b"/b"), vec![3]),
            ]
        );
        assert!(to_recheck(&IdMap::default(), &VecDeque::new()).is_empty());
    }
}
