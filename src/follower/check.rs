//! The opt-in consistency check (`CacheBuilder::consistency_check`): every period it
//! reads etcd at a revision the cache holds (the newest snapshot's), page by page and
//! paced, and compares the keys and their mod revisions with the snapshot's. On a
//! mismatch it logs the differing keys, counts it, and asks the follower to repair:
//! re-list at the cache's own revision, so that every subscriber continues (nothing was
//! missed at that revision; only the store was wrong), or at the latest revision if
//! etcd compacted that one (then subscribers behind get the compaction signal).
//!
//! Beside it, [`keep_compaction_current`] keeps what the cache knows of etcd's own
//! compaction fresh (see [`compaction`](crate::compaction)).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::error::Result;
use crate::key_range::KeyRange;
use crate::range_request::RangeRequest;
use crate::shared::Shared;
use crate::store::Snapshot;

/// The pause between two pages of a check, so that a check does not load etcd: at
/// most 50 pages (of `page_size` keys) a second.
const PAGE_PAUSE: Duration = Duration::from_millis(20);

/// Keys named in the log of a mismatch, at most.
const LOGGED_KEYS: usize = 10;

/// What one check found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The cache's keys and mod revisions equal etcd's at the revision.
    Match { keys: usize },
    /// They differ; the first differing keys (lossy UTF-8).
    Mismatch {
        differing: Vec<String>,
        total: usize,
    },
}

/// Runs a check every `period` while the cache is ready; asks for a repair through
/// `repair` on a mismatch. Ends with the follower (it is aborted then).
pub(super) async fn run(shared: Arc<Shared>, period: Duration, repair: Arc<Notify>) {
    loop {
        tokio::time::sleep(period).await;
        if !shared.view().is_ready() {
            continue;
        }
        let snapshot = shared.view().snapshot();
        match check(&shared, &snapshot).await {
            Ok(Outcome::Match { keys }) => {
                shared.counters().consistency_checked(false);
                shared.metrics().consistency_checked(false);
                debug!(
                    revision = snapshot.revision,
                    keys, "consistency check: the cache equals etcd"
                );
            }
            Ok(Outcome::Mismatch { differing, total }) => {
                shared.counters().consistency_checked(true);
                shared.metrics().consistency_checked(true);
                warn!(
                    revision = snapshot.revision,
                    differing_keys = total,
                    keys = ?differing,
                    "consistency check: the cache differs from etcd; re-listing"
                );
                repair.notify_one();
            }
            // etcd compacted the revision meanwhile, or did not answer: try next time.
            Err(e) => debug!(error = %e, "consistency check skipped"),
        }
    }
}

/// Compares `snapshot` with etcd at the snapshot's revision.
///
/// # Errors
/// What etcd said (e.g. the revision was compacted): the check is inconclusive.
pub(super) async fn check(shared: &Shared, snapshot: &Snapshot) -> Result<Outcome> {
    let mut ours = snapshot.range(shared.range()).peekable();
    let mut differing = Vec::new();
    let mut total = 0;
    let mut keys = 0;
    let mut start = shared.range().start.clone();
    let mut note = |key: &[u8], differing: &mut Vec<String>| {
        total += 1;
        if differing.len() < LOGGED_KEYS {
            differing.push(String::from_utf8_lossy(key).into_owned());
        }
    };
    loop {
        let request = RangeRequest {
            revision: snapshot.revision,
            limit: shared.config().page_size,
            keys_only: true,
            ..RangeRequest::new(KeyRange::from_parts(start.clone(), shared.range().end()))
        };
        let page = shared.upstream().range(request).await?.result;
        for theirs in &page.kvs {
            keys += 1;
            // Ours below their key are keys etcd does not have.
            while let Some(mine) = ours.next_if(|m| m.key() < theirs.key()) {
                note(mine.key(), &mut differing);
            }
            match ours.next_if(|m| m.key() == theirs.key()) {
                Some(mine) if mine.mod_revision() == theirs.mod_revision() => {}
                _ => note(theirs.key(), &mut differing),
            }
        }
        match page.kvs.last() {
            Some(last) if page.more => {
                let mut next = last.key().to_vec();
                next.push(0);
                start = next.into();
                tokio::time::sleep(PAGE_PAUSE).await;
            }
            _ => break,
        }
    }
    for mine in ours {
        note(mine.key(), &mut differing);
    }
    Ok(if total == 0 {
        Outcome::Match { keys }
    } else {
        Outcome::Mismatch { differing, total }
    })
}

/// Brings the known compaction floor up to date every
/// [`CHECK_INTERVAL`](crate::compaction::CHECK_INTERVAL) while the cache serves:
/// checks the lowest revision that is not known compacted and that the cache could
/// still answer from its window. Runs until dropped (the follower's background task).
pub(super) async fn keep_compaction_current(shared: Arc<Shared>) {
    let limit = shared.config().consistent_read_timeout;
    loop {
        tokio::time::sleep(crate::compaction::CHECK_INTERVAL).await;
        if !shared.view().is_ready() {
            continue;
        }
        let at = shared
            .history()
            .read()
            .floor()
            .max(shared.compaction().known())
            .max(1);
        if let Err(e) = shared
            .compaction()
            .check(shared.upstream(), shared.range(), at, limit)
            .await
        {
            tracing::debug!(error = %e, "compaction check failed");
        }
    }
}
