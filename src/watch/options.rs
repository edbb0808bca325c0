//! [`WatchOptions`] (etcd-client's builder, the same meaning for every method) and
//! their validation against the cache's range into the [`Request`] a stream registers.

use etcd_client::WatchFilterType;

use crate::error::{Error, InvalidReason, Result};
use crate::key_range::{KeyRange, RangeSpec};
use crate::shared::Shared;
use crate::subscribers::filter::Filter;

/// Options for [`Cache::watch`](crate::Cache::watch) and
/// [`WatchStream::watch`](crate::WatchStream::watch), as `etcd_client::WatchOptions`:
/// every builder method of it, with the same meaning.
///
/// ```
/// use etcd_cache::{WatchFilterType, WatchOptions};
///
/// let opts = WatchOptions::new()
///     .with_prefix()
///     .with_start_revision(42)
///     .with_prev_key()
///     .with_progress_notify()
///     .with_filters([WatchFilterType::NoDelete]);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone)]
pub struct WatchOptions {
    key: Option<Vec<u8>>,
    spec: RangeSpec,
    start_revision: i64,
    prev_kv: bool,
    progress_notify: bool,
    filters: Vec<WatchFilterType>,
    watch_id: i64,
    fragment: bool,
}

impl WatchOptions {
    /// Watch one key, from the next revision.
    pub const fn new() -> Self {
        WatchOptions {
            key: None,
            spec: RangeSpec::Single,
            start_revision: 0,
            prev_kv: false,
            progress_notify: false,
            filters: Vec::new(),
            watch_id: 0,
            fragment: false,
        }
    }

    /// Sets the key (the key argument of `watch` wins over it, as in etcd-client).
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Watch every key with the key as prefix (the empty key: every key).
    pub fn with_prefix(mut self) -> Self {
        self.spec = RangeSpec::Prefix;
        self
    }

    /// Watch `[key, end)`. `end = "\0"` means every key >= key.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.spec = RangeSpec::Range(end.into());
        self
    }

    /// Watch every key >= key.
    pub fn with_from_key(mut self) -> Self {
        self.spec = RangeSpec::FromKey;
        self
    }

    /// Watch every key (the cache's prefix must be empty).
    pub fn with_all_keys(mut self) -> Self {
        self.spec = RangeSpec::AllKeys;
        self
    }

    /// Start at `revision` (0: from the next revision). A revision inside the cache's
    /// window replays from the history, then continues live; below it, the watch gets
    /// a canceled response with `compact_revision`, as etcd sends for a compacted
    /// revision; a future revision waits for it.
    pub const fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }

    /// Attach each event's previous key-value (the cache knows it; etcd is not asked).
    pub const fn with_prev_key(mut self) -> Self {
        self.prev_kv = true;
        self
    }

    /// Receive periodic progress responses (no events; every matching event up to the
    /// revision was delivered). Interval: `CacheBuilder::progress_notify_interval`.
    pub const fn with_progress_notify(mut self) -> Self {
        self.progress_notify = true;
        self
    }

    /// Drop events of these types.
    pub fn with_filters(mut self, filters: impl Into<Vec<WatchFilterType>>) -> Self {
        self.filters = filters.into();
        self
    }

    /// Use this watch id on the stream (0, the default, picks the lowest free id, as
    /// etcd does). An id already in use on the stream is refused with
    /// [`Error::WatchIdInUse`].
    pub const fn with_watch_id(mut self, watch_id: i64) -> Self {
        self.watch_id = watch_id;
        self
    }

    /// Allow a revision's events to be split over several responses. Accepted for
    /// etcd-client compatibility; the cache never needs to split (there is no message
    /// size limit in memory), so every response is whole and `fragment()` is false.
    pub const fn with_fragment(mut self) -> Self {
        self.fragment = true;
        self
    }

    pub(crate) fn watch_id(&self) -> i64 {
        self.watch_id
    }
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl WatchOptions {
    /// The key, the argument or else the one set with `with_key`.
    fn key<'a>(&'a self, key: &'a [u8]) -> &'a [u8] {
        match &self.key {
            Some(k) if key.is_empty() => k,
            _ => key,
        }
    }
}

/// A watch request, validated: what the stream registers.
pub(crate) struct Request {
    pub(super) filter: Filter,
    pub(crate) start_revision: i64,
    pub(super) progress_notify: bool,
}

impl Request {
    /// Validates `options` for `key` against the cache's range.
    ///
    /// # Errors
    /// [`Error::InvalidRange`] (empty key, end not after the start, negative start
    /// revision, negative watch id), [`Error::OutOfRange`].
    pub(crate) fn new(shared: &Shared, key: &[u8], options: &WatchOptions) -> Result<Request> {
        let range = KeyRange::new(options.key(key), &options.spec)?;
        range.check_within(shared.range())?;
        if options.start_revision < 0 {
            return Err(Error::invalid(InvalidReason::NegativeStartRevision(
                options.start_revision,
            )));
        }
        if options.watch_id < 0 {
            return Err(Error::invalid(InvalidReason::NegativeWatchId(
                options.watch_id,
            )));
        }
        Ok(Request {
            filter: Filter {
                range,
                prev_kv: options.prev_kv,
                no_put: options.filters.contains(&WatchFilterType::NoPut),
                no_delete: options.filters.contains(&WatchFilterType::NoDelete),
            },
            start_revision: options.start_revision,
            progress_notify: options.progress_notify,
        })
    }
}
