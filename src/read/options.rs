//! [`GetOptions`] and [`GetResponse`], as `etcd_client`'s.

use crate::error::{Error, InvalidReason, Result};
use crate::key_range::{KeyRange, RangeSpec};
use crate::kv::KeyValue;
use crate::range_request::{RangeRequest, RangeResult, SortOrder, SortTarget};
use etcd_client::ResponseHeader;

/// Options for [`Cache::get`](crate::Cache::get), as `etcd_client::GetOptions`: every
/// builder method of it, with the same meaning.
///
/// ```
/// use etcd_cache::{GetOptions, SortOrder, SortTarget};
///
/// let newest_five = GetOptions::new()
///     .with_prefix()
///     .with_sort(SortTarget::Mod, SortOrder::Descend)
///     .with_limit(5)
///     .with_keys_only();
/// let at_42 = GetOptions::new().with_range("/app/z").with_revision(42).with_serializable();
/// let how_many = GetOptions::new().with_from_key().with_count_only();
/// # let _ = (newest_five, at_42, how_many);
/// ```
#[derive(Debug, Clone)]
pub struct GetOptions {
    spec: RangeSpec,
    revision: i64,
    serializable: bool,
    limit: i64,
    keys_only: bool,
    count_only: bool,
    sort_target: SortTarget,
    sort_order: SortOrder,
    min_mod_revision: i64,
    max_mod_revision: i64,
    min_create_revision: i64,
    max_create_revision: i64,
}

impl GetOptions {
    /// Read one key, at the latest revision, linearizably.
    pub const fn new() -> Self {
        GetOptions {
            spec: RangeSpec::Single,
            revision: 0,
            serializable: false,
            limit: 0,
            keys_only: false,
            count_only: false,
            sort_target: SortTarget::Key,
            sort_order: SortOrder::None,
            min_mod_revision: 0,
            max_mod_revision: 0,
            min_create_revision: 0,
            max_create_revision: 0,
        }
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
    pub const fn with_limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
    /// Read at `revision` (0: latest). Older than the window: `Compacted`; newer than
    /// the cluster: `FutureRevision`.
    pub const fn with_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }
    /// Sort the result.
    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.sort_target = target;
        self.sort_order = order;
        self
    }
    /// Answer from the cache without the consistency round trip (may be stale, as a
    /// serializable etcd read from a lagging member).
    pub const fn with_serializable(mut self) -> Self {
        self.serializable = true;
        self
    }
    /// Return keys without values.
    pub const fn with_keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
    /// Return only the count.
    pub const fn with_count_only(mut self) -> Self {
        self.count_only = true;
        self
    }
    /// Only keys with `mod_revision >= revision`.
    pub const fn with_min_mod_revision(mut self, revision: i64) -> Self {
        self.min_mod_revision = revision;
        self
    }
    /// Only keys with `mod_revision <= revision`.
    pub const fn with_max_mod_revision(mut self, revision: i64) -> Self {
        self.max_mod_revision = revision;
        self
    }
    /// Only keys with `create_revision >= revision`.
    pub const fn with_min_create_revision(mut self, revision: i64) -> Self {
        self.min_create_revision = revision;
        self
    }
    /// Only keys with `create_revision <= revision`.
    pub const fn with_max_create_revision(mut self, revision: i64) -> Self {
        self.max_create_revision = revision;
        self
    }

    /// Validates the options for `key` and makes the request they describe.
    ///
    /// # Errors
    /// [`Error::InvalidRange`] naming the problem.
    pub(crate) fn request(&self, key: &[u8]) -> Result<RangeRequest> {
        let range = KeyRange::new(key, &self.spec)?;
        Ok(RangeRequest {
            range,
            ..self.shaping()?
        })
    }

    /// The options without a key range (an empty one), validated: what shapes an
    /// answer. Allocates nothing.
    pub(crate) fn shaping(&self) -> Result<RangeRequest> {
        if self.revision < 0 {
            return Err(Error::invalid(InvalidReason::NegativeRevision(
                self.revision,
            )));
        }
        if self.limit < 0 {
            return Err(Error::invalid(InvalidReason::NegativeLimit(self.limit)));
        }
        Ok(RangeRequest {
            range: KeyRange::from_parts(bytes::Bytes::new(), b""),
            revision: self.revision,
            limit: self.limit,
            sort_target: self.sort_target,
            sort_order: self.sort_order,
            serializable: self.serializable,
            keys_only: self.keys_only,
            count_only: self.count_only,
            min_mod_revision: self.min_mod_revision,
            max_mod_revision: self.max_mod_revision,
            min_create_revision: self.min_create_revision,
            max_create_revision: self.max_create_revision,
        })
    }

    /// True for a serializable read of one non-empty key at the latest revision: the
    /// read path answers it with one map lookup.
    pub(crate) fn is_plain_serializable_get(&self, key: &[u8]) -> bool {
        self.serializable
            && self.spec == RangeSpec::Single
            && self.revision == 0
            && self.limit >= 0
            && !key.is_empty()
    }

    pub(crate) fn serializable(&self) -> bool {
        self.serializable
    }
}

impl Default for GetOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// The answer to [`Cache::get`](crate::Cache::get), as `etcd_client::GetResponse`.
///
/// ```no_run
/// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
/// use etcd_cache::GetOptions;
///
/// let resp = cache.get("/app/", Some(GetOptions::new().with_prefix().with_limit(10))).await?;
/// for kv in resp.kvs() {
///     println!("{} = {}", kv.key_str()?, kv.value_str()?);
/// }
/// println!("{} keys, more: {}, at {}", resp.count(), resp.more(), resp.header().unwrap().revision());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct GetResponse {
    revision: i64,
    header: Option<ResponseHeader>,
    /// Answered by etcd (a fallback), not from memory.
    from_etcd: bool,
    kvs: Vec<KeyValue>,
    count: i64,
    more: bool,
}

impl GetResponse {
    pub(crate) fn new(revision: i64, header: ResponseHeader, result: RangeResult) -> Self {
        GetResponse {
            revision,
            header: Some(header),
            from_etcd: false,
            kvs: result.kvs,
            count: result.count,
            more: result.more,
        }
    }

    /// Marks the response as answered by etcd.
    pub(crate) fn answered_by_etcd(mut self) -> Self {
        self.from_etcd = true;
        self
    }

    /// True if etcd answered this read (the cache could not prove it was current in
    /// time, or was not ready), false if the cache answered from memory.
    pub fn from_etcd(&self) -> bool {
        self.from_etcd
    }

    /// The revision the data reflects: the one asked for with `with_revision`, else
    /// the revision the read was answered at.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The response header, as etcd gives it: the newest revision the cache has
    /// applied (for a consistent read, at least the cluster's revision when the read
    /// started) — also for a read at an older revision, whose data is as of
    /// [`revision`](Self::revision) — and the upstream's cluster id, member id and
    /// raft term. Always `Some`.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// Takes the header out, as etcd-client's.
    pub fn take_header(&mut self) -> Option<ResponseHeader> {
        self.header.take()
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
}
