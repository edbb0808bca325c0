//! [`WatchResponse`], as `etcd_client::WatchResponse`.

use crate::events::SharedEvents;
use crate::kv::Event;

/// The header of a response: etcd-client's type, with the cache's revision and the
/// upstream's cluster id, member id and raft term (0 until the cache has heard them).
pub use etcd_client::ResponseHeader;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Created,
    Events,
    Progress,
    Canceled,
}

/// One response of a [`WatchStream`](crate::WatchStream), as
/// `etcd_client::WatchResponse`: the same accessors, the same meaning.
///
/// ```no_run
/// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
/// let mut stream = cache.watch("/app/", Some(etcd_cache::WatchOptions::new().with_prefix())).await?;
/// while let Some(resp) = stream.message().await? {
///     if resp.canceled() && resp.compact_revision() > 0 {
///         // Fell behind the cache's window: re-list, then watch again.
///         break;
///     }
///     for ev in resp.events() {
///         println!("{:?} at {}", ev.kv().map(|kv| kv.key()), resp.header().unwrap().revision());
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct WatchResponse {
    /// The header, or its revision once [`take_header`](Self::take_header) took it.
    header: Result<ResponseHeader, i64>,
    watch_id: i64,
    kind: Kind,
    events: Option<SharedEvents>,
    compact_revision: i64,
}

/// etcd's reason for a watch canceled behind compaction (`mvcc.ErrCompacted`): the
/// reason of every response with a compact revision (the cache cancels a watch for no
/// other reason of its own).
pub(super) const COMPACTED_REASON: &str = "mvcc: required revision has been compacted";

impl WatchResponse {
    fn new(header: ResponseHeader, watch_id: i64, kind: Kind) -> Self {
        WatchResponse {
            header: Ok(header),
            watch_id,
            kind,
            events: None,
            compact_revision: 0,
        }
    }

    pub(super) fn new_created(header: ResponseHeader, watch_id: i64) -> Self {
        Self::new(header, watch_id, Kind::Created)
    }

    pub(super) fn new_events(header: ResponseHeader, watch_id: i64, events: SharedEvents) -> Self {
        WatchResponse {
            events: Some(events),
            ..Self::new(header, watch_id, Kind::Events)
        }
    }

    pub(super) fn new_progress(header: ResponseHeader, watch_id: i64) -> Self {
        Self::new(header, watch_id, Kind::Progress)
    }

    /// A canceled response: by a cancel (`compact_revision` 0) or behind the window
    /// (then its reason is [`COMPACTED_REASON`]).
    pub(super) fn new_canceled(
        header: ResponseHeader,
        watch_id: i64,
        compact_revision: i64,
    ) -> Self {
        WatchResponse {
            compact_revision,
            ..Self::new(header, watch_id, Kind::Canceled)
        }
    }

    /// The response header: the revision (see [`revision`](Self::revision)) and the
    /// upstream's cluster id, member id and raft term. Always `Some` (an `Option` as in
    /// etcd-client).
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref().ok()
    }

    /// Takes the header out, as etcd-client's ([`revision`](Self::revision) still
    /// gives its revision).
    pub fn take_header(&mut self) -> Option<ResponseHeader> {
        let revision = self.revision();
        std::mem::replace(&mut self.header, Err(revision)).ok()
    }

    /// The header revision. For events: at least their revision (equal unless the
    /// stream already reported a later one, as etcd reports its current revision on
    /// a replay); for progress: every matching event up to it was delivered; for
    /// `created`: the revision the watch is current at. Never below an earlier
    /// response's on the same stream.
    pub fn revision(&self) -> i64 {
        match &self.header {
            Ok(header) => header.revision(),
            Err(revision) => *revision,
        }
    }

    /// The events, all of one revision. Shared with other subscribers, never copied.
    pub fn events(&self) -> &[Event] {
        self.events.as_deref().unwrap_or(&[])
    }

    /// A value derived from [`events`](Self::events) once and shared by every response
    /// that carries the same events: the subscribers of one key range with the same
    /// options get the same events of a revision, so the first of them to call this
    /// runs `derive` and the others get its value (a reference count, no copy). This is
    /// how etcd-cache-proxy encodes an event once for all of its remote watchers; a
    /// service can use it to decode a value once for many subscribers.
    ///
    /// One value per set of events: `None` when the response has no events, or when the
    /// value derived first is of another type than `T`. It lives as long as the events
    /// (the cache's history keeps the events of its window).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use etcd_cache::WatchOptions;
    ///
    /// let mut stream = cache.watch("/app/", Some(WatchOptions::new().with_prefix())).await?;
    /// while let Some(resp) = stream.message().await? {
    ///     // Counted once per revision, however many subscribers ask.
    ///     let bytes: Option<&usize> = resp.events_memo(|events| {
    ///         events.iter().filter_map(|e| e.kv()).map(|kv| kv.value().len()).sum()
    ///     });
    ///     println!("{bytes:?} bytes of values");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn events_memo<T: std::any::Any + Send + Sync>(
        &self,
        derive: impl FnOnce(&[Event]) -> T,
    ) -> Option<&T> {
        self.events.as_ref()?.memo(derive)
    }

    /// True for a progress response: no events, and every matching event with a
    /// revision <= [`revision`](Self::revision) was delivered. Its `watch_id` is the
    /// watch's for a periodic notification, -1 for the answer to
    /// [`request_progress`](crate::WatchStream::request_progress), as etcd sends them.
    pub fn is_progress_notify(&self) -> bool {
        self.kind == Kind::Progress
    }

    /// True for the first response of a watch; it carries the watch's id.
    pub fn created(&self) -> bool {
        self.kind == Kind::Created
    }

    /// True for the last response of a watch: cancelled by
    /// [`cancel`](crate::WatchStream::cancel), or behind the cache's window (then
    /// [`compact_revision`](Self::compact_revision) is set). Nothing more comes for it.
    pub fn canceled(&self) -> bool {
        self.kind == Kind::Canceled
    }

    /// Set (> 0) when the watch was canceled because its position is older than the
    /// cache can replay: the oldest revision a watch can start from now. Re-list, and
    /// watch again from the read's revision + 1.
    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }

    /// Why the watch was canceled (etcd's text for compaction), empty otherwise.
    pub fn cancel_reason(&self) -> &str {
        if self.compact_revision > 0 {
            COMPACTED_REASON
        } else {
            ""
        }
    }

    /// Always false: the cache never splits a revision over several responses.
    pub fn fragment(&self) -> bool {
        false
    }

    /// The id of the watch on its stream (-1 for the answer to a stream-wide
    /// progress request).
    pub fn watch_id(&self) -> i64 {
        self.watch_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(revision: i64) -> ResponseHeader {
        crate::upstream::Header::default().at(revision)
    }

    /// Every delivery moves one through the stream's layers: 72 bytes (the header's
    /// revision is not kept twice, the cancel reason is derived from the compact
    /// revision).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_response_takes_72_bytes() {
        assert_eq!(std::mem::size_of::<WatchResponse>(), 72);
    }

    #[test]
    fn the_revision_outlives_a_taken_header_and_the_reason_follows_the_compaction() {
        let mut r = WatchResponse::new_progress(header(7), 3);
        assert_eq!((r.revision(), r.watch_id()), (7, 3));
        assert_eq!(r.take_header().map(|h| h.revision()), Some(7));
        assert!(r.header().is_none() && r.take_header().is_none());
        assert_eq!(r.revision(), 7, "as etcd-client's: the revision stays");
        let canceled = WatchResponse::new_canceled(header(9), 1, 0);
        assert!(canceled.canceled() && canceled.cancel_reason().is_empty());
        let compacted = WatchResponse::new_canceled(header(9), 1, 5);
        assert_eq!(
            (compacted.compact_revision(), compacted.cancel_reason()),
            (5, COMPACTED_REASON)
        );
    }
}
