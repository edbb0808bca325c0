//! The paged list: the prefix read at one revision, page by page, the next page
//! requested while the current one is inserted.

use std::sync::Arc;

use imbl::OrdSet;
use tokio::time::Instant;
use tracing::info;

use crate::error::{Error, Result};
use crate::key_range::KeyRange;
use crate::shared::Shared;
use crate::store::{Entry, KvMap};
use crate::upstream::{bounded, RangeResponse};

/// A spawned page request that is cancelled if the list is abandoned.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Lists the cache's range at `at` (0: the latest revision): the key-values and the
/// revision they are at.
///
/// # Errors
/// What etcd said (e.g. `at` was compacted), or [`Error::Transport`] when a page does
/// not come within `upstream_idle_timeout`.
pub(super) async fn list(shared: &Arc<Shared>, at: i64) -> Result<(KvMap, i64)> {
    let page_size = shared.config().page_size;
    let started = Instant::now();
    let mut map: KvMap = OrdSet::new();
    // The next page is requested before the current one is inserted, so etcd and the
    // insertion work at the same time.
    let fetch = |range: KeyRange, revision: i64| {
        let up = shared.upstream().clone();
        AbortOnDrop(tokio::spawn(async move {
            up.list_page(range, revision, page_size).await
        }))
    };
    let mut pending = Some(fetch(shared.range().clone(), at));
    let mut revision = at;
    let mut pages = 0;
    while let Some(mut task) = pending.take() {
        let page: RangeResponse = bounded(
            shared.config().upstream_idle_timeout,
            "a page of the list",
            async {
                (&mut task.0)
                    .await
                    .map_err(|e| Error::transport(format!("the list task failed: {e}")))?
            },
        )
        .await?;
        pages += 1;
        if revision == 0 {
            revision = page.revision;
        }
        shared.counters().set_identity(page.header);
        let kvs = page.result.kvs;
        if page.result.more {
            if let Some(last) = kvs.last() {
                let mut next = last.key().to_vec();
                next.push(0);
                let range = KeyRange::from_parts(next.into(), shared.range().end());
                pending = Some(fetch(range, revision));
            }
        }
        for kv in kvs {
            map.insert(Entry(kv));
        }
    }
    shared
        .metrics()
        .listed(pages, !shared.view().status().loaded);
    shared.counters().listed();
    info!(revision, keys = map.len(), elapsed = ?started.elapsed(), "listed prefix");
    Ok((map, revision))
}
