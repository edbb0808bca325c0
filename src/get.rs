//! Reads from memory: [`GetOptions`], [`GetResponse`], and the read path.
//!
//! - **Serializable** (`with_serializable`): answered from the newest snapshot, or from
//!   the snapshot and the history for an older revision inside the window.
//! - **Consistent** (the default, as in etcd): one cheap round trip learns the cluster's
//!   current revision (a count-only, limit-1 range of the cache's prefix); the read
//!   waits until the cache has applied it, then answers from memory. See
//!   `docs/GUARANTEES.md` for why this is linearizable on every etcd version.

use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cache::{Cache, Shared, Status};
use crate::config::ReadFallback;
use crate::error::{Error, Result};
use crate::key_range::{KeyRange, RangeSpec};
use crate::kv::KeyValue;

/// The order of a sorted read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SortOrder {
    /// No sorting (key order).
    #[default]
    None,
    /// Ascending.
    Ascend,
    /// Descending.
    Descend,
}

/// The field a read is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SortTarget {
    /// The key.
    #[default]
    Key,
    /// The version.
    Version,
    /// The create revision.
    Create,
    /// The mod revision.
    Mod,
    /// The value.
    Value,
}

/// Options for [`Cache::get`], as `etcd_client::GetOptions`.
#[derive(Debug, Clone, Default)]
pub struct GetOptions {
    spec: RangeSpec,
    revision: i64,
    serializable: bool,
    limit: i64,
    keys_only: bool,
    count_only: bool,
    sort: (SortTarget, SortOrder),
    min_mod_revision: i64,
    max_mod_revision: i64,
    min_create_revision: i64,
    max_create_revision: i64,
}

impl GetOptions {
    /// Read one key, at the latest revision, linearizably.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every key with the key as prefix (the empty key: every key).
    pub fn with_prefix(mut self) -> Self {
        self.spec = RangeSpec::Prefix;
        self
    }
    /// `[key, end)`; `end = "\0"` means every key >= key.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.spec = RangeSpec::Range(end.into());
        self
    }
    /// Every key >= key.
    pub fn with_from_key(mut self) -> Self {
        self.spec = RangeSpec::FromKey;
        self
    }
    /// Every key (the cache's prefix must be empty).
    pub fn with_all_keys(mut self) -> Self {
        self.spec = RangeSpec::AllKeys;
        self
    }
    /// At most `limit` key-values (0: no limit); `more()` tells if some were left out.
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
    /// Read at `revision` (0: latest). Older than the window: `Compacted`; newer than
    /// the cluster: `FutureRevision`.
    pub fn with_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }
    /// Sort the result.
    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.sort = (target, order);
        self
    }
    /// Answer from the cache without the consistency round trip (may be stale, as a
    /// serializable etcd read from a lagging member).
    pub fn with_serializable(mut self) -> Self {
        self.serializable = true;
        self
    }
    /// Return keys without values.
    pub fn with_keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
    /// Return only the count.
    pub fn with_count_only(mut self) -> Self {
        self.count_only = true;
        self
    }
    /// Only keys with `mod_revision >= revision`.
    pub fn with_min_mod_revision(mut self, revision: i64) -> Self {
        self.min_mod_revision = revision;
        self
    }
    /// Only keys with `mod_revision <= revision`.
    pub fn with_max_mod_revision(mut self, revision: i64) -> Self {
        self.max_mod_revision = revision;
        self
    }
    /// Only keys with `create_revision >= revision`.
    pub fn with_min_create_revision(mut self, revision: i64) -> Self {
        self.min_create_revision = revision;
        self
    }
    /// Only keys with `create_revision <= revision`.
    pub fn with_max_create_revision(mut self, revision: i64) -> Self {
        self.max_create_revision = revision;
        self
    }

    fn has_revision_filters(&self) -> bool {
        self.min_mod_revision != 0
            || self.max_mod_revision != 0
            || self.min_create_revision != 0
            || self.max_create_revision != 0
    }

    /// The same request for etcd (the fallback path).
    fn to_etcd(&self, range: &KeyRange) -> etcd_client::GetOptions {
        let mut o = etcd_client::GetOptions::new();
        if !range.end.is_empty() {
            o = o.with_range(range.end.to_vec());
        }
        o = o.with_limit(self.limit).with_revision(self.revision);
        if self.serializable {
            o = o.with_serializable();
        }
        if self.keys_only {
            o = o.with_keys_only();
        }
        if self.count_only {
            o = o.with_count_only();
        }
        let target = match self.sort.0 {
            SortTarget::Key => etcd_client::SortTarget::Key,
            SortTarget::Version => etcd_client::SortTarget::Version,
            SortTarget::Create => etcd_client::SortTarget::Create,
            SortTarget::Mod => etcd_client::SortTarget::Mod,
            SortTarget::Value => etcd_client::SortTarget::Value,
        };
        let order = match self.sort.1 {
            SortOrder::None => etcd_client::SortOrder::None,
            SortOrder::Ascend => etcd_client::SortOrder::Ascend,
            SortOrder::Descend => etcd_client::SortOrder::Descend,
        };
        o.with_sort(target, order)
            .with_min_mod_revision(self.min_mod_revision)
            .with_max_mod_revision(self.max_mod_revision)
            .with_min_create_revision(self.min_create_revision)
            .with_max_create_revision(self.max_create_revision)
    }
}

/// The answer to [`Cache::get`], as `etcd_client::GetResponse`.
#[derive(Debug, Clone, Default)]
pub struct GetResponse {
    revision: i64,
    kvs: Vec<KeyValue>,
    count: i64,
    more: bool,
}

impl GetResponse {
    /// The revision the answer reflects.
    pub fn revision(&self) -> i64 {
        self.revision
    }
    /// The key-values.
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
    /// Takes the key-values out.
    pub fn take_kvs(&mut self) -> Vec<KeyValue> {
        std::mem::take(&mut self.kvs)
    }
    /// The number of keys in the range (before `limit`).
    pub fn count(&self) -> i64 {
        self.count
    }
    /// True if `limit` left keys out.
    pub fn more(&self) -> bool {
        self.more
    }

    pub(crate) fn from_etcd(resp: etcd_client::GetResponse) -> Self {
        let pb = resp.0;
        GetResponse {
            revision: pb.header.as_ref().map_or(0, |h| h.revision),
            count: pb.count,
            more: pb.more,
            kvs: pb.kvs.into_iter().map(KeyValue::from).collect(),
        }
    }
}

fn sort_key_cmp(target: SortTarget, a: &KeyValue, b: &KeyValue) -> CmpOrdering {
    match target {
        SortTarget::Key => a.0.key.cmp(&b.0.key),
        SortTarget::Version => a.0.version.cmp(&b.0.version),
        SortTarget::Create => a.0.create_revision.cmp(&b.0.create_revision),
        SortTarget::Mod => a.0.mod_revision.cmp(&b.0.mod_revision),
        SortTarget::Value => a.0.value.cmp(&b.0.value),
    }
}

/// Applies etcd's range semantics (`server/etcdserver/apply.go` Range) to the key-values
/// of a range, in key order.
fn shape_response<'a>(
    revision: i64,
    opts: &GetOptions,
    kvs: impl Iterator<Item = &'a KeyValue>,
) -> GetResponse {
    let (target, mut order) = opts.sort;
    if target != SortTarget::Key && order == SortOrder::None {
        order = SortOrder::Ascend;
    }
    let sorted =
        order != SortOrder::None && !(target == SortTarget::Key && order == SortOrder::Ascend);
    let filter = |kv: &KeyValue| {
        (opts.min_mod_revision == 0 || kv.0.mod_revision >= opts.min_mod_revision)
            && (opts.max_mod_revision == 0 || kv.0.mod_revision <= opts.max_mod_revision)
            && (opts.min_create_revision == 0 || kv.0.create_revision >= opts.min_create_revision)
            && (opts.max_create_revision == 0 || kv.0.create_revision <= opts.max_create_revision)
    };
    let limit = usize::try_from(opts.limit).unwrap_or(0);
    // As etcd: with an explicit sort order or revision filters everything is fetched,
    // sorted and truncated; otherwise only `limit + 1` keys in key order are fetched
    // (and then sorted, when the target is not the key: etcd sorts that page only).
    let fetch_all = opts.sort.1 != SortOrder::None || opts.has_revision_filters();
    let take = if !fetch_all && limit > 0 {
        limit + 1
    } else {
        usize::MAX
    };
    let mut count = 0i64;
    let mut out: Vec<KeyValue> = Vec::new();
    if opts.count_only {
        count = kvs.count() as i64;
    } else {
        for kv in kvs {
            count += 1;
            if out.len() < take && filter(kv) {
                out.push(kv.clone());
            }
        }
        if sorted {
            out.sort_by(|a, b| {
                let c = sort_key_cmp(target, a, b);
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
    if opts.keys_only {
        for kv in &mut out {
            *kv = kv.without_value();
        }
    }
    GetResponse {
        revision,
        kvs: out,
        count,
        more,
    }
}

impl Shared {
    /// Answers from memory at `revision` (0: the newest snapshot).
    pub(crate) fn read_local(
        &self,
        range: &KeyRange,
        opts: &GetOptions,
        revision: i64,
    ) -> Result<GetResponse> {
        let snap = self.snapshot.load_full();
        if revision == 0 || revision == snap.revision {
            return Ok(shape_response(snap.revision, opts, snap.range(range)));
        }
        if revision > snap.revision {
            return Err(Error::FutureRevision {
                requested: revision,
                current: snap.revision,
            });
        }
        let history = self.history.read();
        // Events in (revision, snap.revision] must all be held.
        if revision + 1 < history.floor() {
            return Err(Error::Compacted {
                compact_revision: (history.floor() - 1).max(1),
            });
        }
        // Take the few batches needed and let the writer go before merging.
        let later: Vec<Arc<crate::history::Batch>> = history
            .after(revision)
            .take_while(|b| b.revision <= snap.revision)
            .cloned()
            .collect();
        drop(history);
        let kvs = snap.range_at(range, later.iter());
        Ok(shape_response(revision, opts, kvs.iter()))
    }

    async fn read_from_etcd(&self, range: &KeyRange, opts: &GetOptions) -> Result<GetResponse> {
        self.fallback_reads.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            revision = self.revision(),
            "consistent read answered by etcd"
        );
        // The range's start, not the user's key: etcd-client rewrites an empty key only
        // for its own prefix/from-key/all-keys flags, which are not used here.
        let mut resp = self
            .upstream
            .get(range.start.to_vec(), opts.to_etcd(range))
            .await?;
        if opts.revision > 0 {
            // As from memory: the revision the answer reflects.
            resp.revision = opts.revision;
        }
        Ok(resp)
    }

    /// What a consistent read does when the cache cannot answer in time.
    async fn fallback(
        &self,
        range: &KeyRange,
        opts: &GetOptions,
        err: Error,
    ) -> Result<GetResponse> {
        match self.config.read_fallback {
            ReadFallback::Etcd => self.read_from_etcd(range, opts).await,
            _ => Err(err),
        }
    }

    pub(crate) async fn get(self: &Arc<Self>, key: &[u8], opts: GetOptions) -> Result<GetResponse> {
        // Fast path: a serializable read of one key at the latest revision is one map
        // lookup in the current snapshot, without building a range.
        if opts.serializable
            && opts.spec == RangeSpec::Single
            && opts.revision == 0
            && opts.limit >= 0
            && !key.is_empty()
            && self.range.contains(key)
            && matches!(
                self.status(),
                Status {
                    loaded: true,
                    closed: false,
                    ..
                }
            )
        {
            let snap = self.snapshot.load();
            return Ok(shape_response(
                snap.revision,
                &opts,
                snap.map.get(key).map(|e| &e.0).into_iter(),
            ));
        }
        let range = KeyRange::new(key, &opts.spec)?;
        range.check_within(&self.range)?;
        if opts.revision < 0 {
            return Err(Error::invalid(format!(
                "negative revision {}",
                opts.revision
            )));
        }
        if opts.limit < 0 {
            return Err(Error::invalid(format!("negative limit {}", opts.limit)));
        }
        let status = self.status();
        if status.closed {
            return Err(Error::Closed);
        }
        let timeout = self.config.consistent_read_timeout;
        if opts.serializable {
            if !status.loaded {
                self.wait_loaded(timeout).await?;
            }
            if opts.revision > self.revision() {
                // Wait for it if the cluster has it; refuse it if the cluster does not.
                let current = self.cluster_revision(timeout).await?;
                if opts.revision > current {
                    return Err(Error::FutureRevision {
                        requested: opts.revision,
                        current,
                    });
                }
                self.wait_applied(opts.revision, timeout).await?;
            }
            return self.read_local(&range, &opts, opts.revision);
        }
        // Consistent read. Data at a revision the cache has applied never changes, so a
        // read at such a revision needs no round trip.
        if opts.revision > 0 && opts.revision <= self.revision() {
            return self.read_local(&range, &opts, opts.revision);
        }
        if !status.ready {
            return self.fallback(&range, &opts, Error::NotReady).await;
        }
        let current = self.cluster_revision(timeout).await?;
        if opts.revision > current {
            return Err(Error::FutureRevision {
                requested: opts.revision,
                current,
            });
        }
        let need = if opts.revision > 0 {
            opts.revision
        } else {
            current
        };
        if self.revision() < need {
            let can_wait = self.trust_progress.load(Ordering::Acquire)
                || self.config.read_fallback == ReadFallback::Error;
            if !can_wait {
                // etcd#15220: without trustworthy progress answers the cache cannot prove
                // it is current, so etcd answers.
                return self.read_from_etcd(&range, &opts).await;
            }
            if let Err(e) = self.wait_applied(need, timeout).await {
                return self.fallback(&range, &opts, e).await;
            }
        }
        self.read_local(&range, &opts, opts.revision)
    }

    /// The cluster's current revision (one linearizable round trip), bounded by `limit`
    /// so that a stalled connection cannot hang a read.
    async fn cluster_revision(&self, limit: std::time::Duration) -> Result<i64> {
        tokio::time::timeout(limit, self.probe.current(&self.upstream, &self.range))
            .await
            .map_err(|_| Error::timeout("etcd to report its current revision", limit))?
    }

    async fn wait_applied(&self, rev: i64, limit: std::time::Duration) -> Result<()> {
        tokio::time::timeout(limit, self.wait_for_revision(rev))
            .await
            .map_err(|_| Error::timeout("the cache to reach the read's revision", limit))?
    }
}

impl Cache {
    /// Reads from the cache. Mirrors `etcd_client::Client::get`; see [`GetOptions`].
    ///
    /// Without `with_serializable()` the read is linearizable, like etcd's default: it
    /// reflects every write that completed before the call.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::Compacted`],
    /// [`Error::FutureRevision`], [`Error::Timeout`] / [`Error::NotReady`] (with
    /// [`ReadFallback::Error`]), [`Error::Upstream`], [`Error::Closed`].
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        let key = key.into();
        self.shared().get(&key, options.unwrap_or_default()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn limit_sets_more_and_keeps_count() {
        let kvs = kvs();
        let r = shape_response(7, &GetOptions::new().with_limit(2), kvs.iter());
        assert_eq!((r.kvs().len(), r.count(), r.more()), (2, 5, true));
        let r = shape_response(7, &GetOptions::new().with_limit(5), kvs.iter());
        assert_eq!((r.kvs().len(), r.count(), r.more()), (5, 5, false));
    }

    #[test]
    fn sort_and_keys_only_and_count_only() {
        let kvs = kvs();
        let r = shape_response(
            7,
            &GetOptions::new()
                .with_sort(SortTarget::Mod, SortOrder::None)
                .with_keys_only(),
            kvs.iter(),
        );
        let keys: Vec<&[u8]> = r.kvs().iter().map(|kv| kv.key()).collect();
        assert_eq!(keys, [&b"k4"[..], b"k3", b"k2", b"k1", b"k0"]);
        assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));
        let r = shape_response(
            7,
            &GetOptions::new()
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(1),
            kvs.iter(),
        );
        assert_eq!(r.kvs()[0].key(), b"k4");
        assert!(r.more());
        let r = shape_response(7, &GetOptions::new().with_count_only(), kvs.iter());
        assert_eq!((r.kvs().len(), r.count(), r.more()), (0, 5, false));
    }

    #[test]
    fn unordered_sort_with_limit_sorts_only_the_first_page_as_etcd() {
        // etcd 3.4 apply.go: with SortOrder NONE the range is fetched with limit + 1 in
        // key order, then sorted ascending by the target, then truncated.
        let kvs = kvs();
        let r = shape_response(
            7,
            &GetOptions::new()
                .with_sort(SortTarget::Mod, SortOrder::None)
                .with_limit(2),
            kvs.iter(),
        );
        let keys: Vec<&[u8]> = r.kvs().iter().map(|kv| kv.key()).collect();
        assert_eq!(keys, [&b"k2"[..], b"k1"]);
        assert!(r.more());
        // With an explicit order everything is sorted first.
        let r = shape_response(
            7,
            &GetOptions::new()
                .with_sort(SortTarget::Mod, SortOrder::Ascend)
                .with_limit(2),
            kvs.iter(),
        );
        let keys: Vec<&[u8]> = r.kvs().iter().map(|kv| kv.key()).collect();
        assert_eq!(keys, [&b"k4"[..], b"k3"]);
    }

    #[test]
    fn revision_filters_do_not_change_count() {
        let kvs = kvs();
        let r = shape_response(
            7,
            &GetOptions::new().with_min_create_revision(12),
            kvs.iter(),
        );
        assert_eq!((r.kvs().len(), r.count()), (3, 5));
    }
}
