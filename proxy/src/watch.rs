//! The seam between the Watch service and the cache: [`Watches`] holds the watches of one
//! gRPC Watch stream and turns the cache's responses into [`Reply`]s, in etcd's terms.
//! Nothing else in the proxy calls the cache's watch API.
//!
//! Today's cache API has one watch per `WatchStream`, so each remote watch is one cache
//! stream, tagged with its per-stream watch id and merged with `SelectAll`; the
//! per-connection cap is counted here. The id rules are etcd's (`mvcc/watcher.go`):
//! 0 asks for the next free id, a client-chosen id must not be in use on the stream.
//!
//! ## Progress
//! A stream-level `WatchProgressRequest` asks every watch of the stream for a progress
//! response; once each has answered (each answer comes after everything it had to
//! deliver), one response with watch id -1 and the lowest of their revisions follows: every
//! event up to that revision, on every watch of the stream, has been sent before it.

use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use etcd_cache::{Cache, WatchFilterType, WatchOptions, WatchResponse, WatchStream};
use futures::stream::SelectAll;
use futures::{FutureExt, Stream, StreamExt};

/// etcd's `mvcc.ErrEmptyWatcherRange`.
pub(crate) const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's `mvcc.ErrWatcherDuplicateID`.
pub(crate) const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// The watch budget of one client connection, shared by its Watch streams.
#[derive(Debug, Default)]
pub(crate) struct ConnBudget {
    open: AtomicUsize,
}

impl ConnBudget {
    fn acquire(&self, limit: usize) -> bool {
        if limit == 0 {
            self.open.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A WatchCreateRequest in the cache's keyspace (namespace already applied; an empty key
/// already replaced by `"\0"`, as etcd does).
#[derive(Debug, Clone, Default)]
pub(crate) struct Create {
    pub(crate) key: Bytes,
    /// Empty: one key; `"\0"`: every key from `key`.
    pub(crate) range_end: Bytes,
    pub(crate) start_revision: i64,
    pub(crate) progress_notify: bool,
    pub(crate) prev_kv: bool,
    pub(crate) no_put: bool,
    pub(crate) no_delete: bool,
    /// 0: the next free id.
    pub(crate) watch_id: i64,
}

/// What the Watch service sends, in etcd's terms.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The watch exists; its events follow.
    Created { watch_id: i64, revision: i64 },
    /// The events of one revision.
    Events {
        watch_id: i64,
        response: WatchResponse,
    },
    /// A progress notification of one watch.
    Progress { watch_id: i64, revision: i64 },
    /// The answer to a WatchProgressRequest (watch id -1).
    StreamProgress { revision: i64 },
    /// The watch has ended (compacted, or the cache closed).
    Canceled {
        watch_id: i64,
        compact_revision: i64,
        reason: String,
    },
}

/// The watches of one gRPC Watch stream.
pub(crate) struct Watches {
    cache: Cache,
    budget: Arc<ConnBudget>,
    limit: usize,
    streams: SelectAll<Tagged>,
    ids: HashSet<i64>,
    /// Watches whose `Created` reply has been returned.
    announced: HashSet<i64>,
    next_id: i64,
    ready: VecDeque<Reply>,
    /// Watches that still owe an answer to the pending progress requests.
    progress_owed: HashSet<i64>,
    progress_revision: i64,
    /// Progress requests waiting for `progress_owed` to empty.
    progress_requests: usize,
}

/// Why a create was refused: the cancel reason etcd's client reads.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

impl Watches {
    pub(crate) fn new(cache: Cache, budget: Arc<ConnBudget>, limit: usize) -> Self {
        Watches {
            cache,
            budget,
            limit,
            streams: SelectAll::new(),
            ids: HashSet::new(),
            announced: HashSet::new(),
            next_id: 0,
            ready: VecDeque::new(),
            progress_owed: HashSet::new(),
            progress_revision: i64::MAX,
            progress_requests: 0,
        }
    }

    /// The cache's newest revision (headers of control responses).
    pub(crate) fn revision(&self) -> i64 {
        self.cache.revision()
    }

    /// Adds a watch; its `Created` reply comes from [`next`](Self::next), before any of
    /// its events. Returns the watch id.
    ///
    /// # Errors
    /// The cancel reason etcd would give (empty range, duplicate id), the
    /// per-connection cap, or what the cache refused.
    pub(crate) async fn create(&mut self, c: Create) -> Result<i64, Refused> {
        let end = c.range_end.as_ref();
        if !end.is_empty() && end != b"\0" && c.key.as_ref() >= end {
            return Err(Refused(EMPTY_RANGE.into()));
        }
        if c.watch_id != 0 && self.ids.contains(&c.watch_id) {
            return Err(Refused(DUPLICATE_ID.into()));
        }
        if !self.budget.acquire(self.limit) {
            return Err(Refused(format!(
                "ETCD_WATCH_LIMIT: at most {} watches are allowed per connection",
                self.limit
            )));
        }
        let mut opts = WatchOptions::new().with_start_revision(c.start_revision);
        if !end.is_empty() {
            opts = opts.with_range(end.to_vec());
        }
        if c.prev_kv {
            opts = opts.with_prev_key();
        }
        if c.progress_notify {
            opts = opts.with_progress_notify();
        }
        let mut filters = Vec::new();
        if c.no_put {
            filters.push(WatchFilterType::NoPut);
        }
        if c.no_delete {
            filters.push(WatchFilterType::NoDelete);
        }
        opts = opts.with_filters(filters);
        let stream = match self.cache.watch(c.key.to_vec(), Some(opts)).await {
            Ok(s) => s,
            Err(e) => {
                self.budget.release();
                return Err(Refused(refusal(&e)));
            }
        };
        // Checked again: another create may have taken the id while this one waited.
        let id = if c.watch_id != 0 {
            if !self.ids.insert(c.watch_id) {
                self.budget.release();
                return Err(Refused(DUPLICATE_ID.into()));
            }
            c.watch_id
        } else {
            while self.ids.contains(&self.next_id) {
                self.next_id += 1;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.ids.insert(id);
            id
        };
        self.streams.push(Tagged {
            id,
            stream: Some(stream),
            waker: None,
            budget: Some(self.budget.clone()),
        });
        Ok(id)
    }

    /// Cancels a watch. False if the stream has no watch with that id (etcd then sends
    /// nothing).
    pub(crate) fn cancel(&mut self, watch_id: i64) -> bool {
        if !self.ids.remove(&watch_id) {
            return false;
        }
        if let Some(t) = self.streams.iter_mut().find(|t| t.id == watch_id) {
            t.close();
        }
        self.progress_settled(watch_id, None);
        true
    }

    /// Asks for one stream-level progress response (see the module docs).
    pub(crate) fn request_progress(&mut self) {
        self.progress_requests += 1;
        for t in self.streams.iter_mut() {
            if self.ids.contains(&t.id) && t.request_progress() {
                self.progress_owed.insert(t.id);
            }
        }
        if self.progress_owed.is_empty() {
            self.finish_progress(self.cache.revision());
        }
    }

    fn progress_settled(&mut self, watch_id: i64, revision: Option<i64>) -> bool {
        if !self.progress_owed.remove(&watch_id) {
            return false;
        }
        if let Some(rev) = revision {
            self.progress_revision = self.progress_revision.min(rev);
        }
        if self.progress_owed.is_empty() {
            let rev = match self.progress_revision {
                i64::MAX => self.cache.revision(),
                rev => rev,
            };
            self.finish_progress(rev);
        }
        true
    }

    fn finish_progress(&mut self, revision: i64) {
        for _ in 0..std::mem::take(&mut self.progress_requests) {
            self.ready.push_back(Reply::StreamProgress { revision });
        }
        self.progress_revision = i64::MAX;
    }

    /// The next reply. Never resolves while there is nothing to send.
    ///
    /// # Cancel safety
    /// Cancel safe: a reply is taken only when it is returned.
    pub(crate) async fn next(&mut self) -> Reply {
        loop {
            if let Some(r) = self.ready.pop_front() {
                return r;
            }
            let Some((id, item)) = self.streams.next().await else {
                // No watch left: wait for the service to add one (it drops this future).
                return futures::future::pending().await;
            };
            if !self.ids.contains(&id) {
                continue; // cancelled: nothing more is sent for it
            }
            let reply = self.reply(id, item);
            let Some(reply) = reply else { continue };
            if matches!(reply, Reply::Created { .. }) {
                self.announced.insert(id);
                return reply;
            }
            // As etcd: a watch is created before anything else is said of it (a watch
            // that starts below the window is created, then canceled as compacted).
            if self.announced.insert(id) {
                self.ready.push_back(reply);
                return Reply::Created {
                    watch_id: id,
                    revision: self.cache.revision(),
                };
            }
            if let Reply::Canceled { watch_id, .. } = &reply {
                self.announced.remove(watch_id);
            }
            return reply;
        }
    }

    fn reply(&mut self, id: i64, item: Item) -> Option<Reply> {
        let reply = match item {
            Some(Ok(resp)) => {
                if resp.created() {
                    Reply::Created {
                        watch_id: id,
                        revision: resp.revision(),
                    }
                } else if resp.is_progress_notify() {
                    if self.progress_settled(id, Some(resp.revision())) {
                        return None;
                    }
                    Reply::Progress {
                        watch_id: id,
                        revision: resp.revision(),
                    }
                } else {
                    Reply::Events {
                        watch_id: id,
                        response: resp,
                    }
                }
            }
            Some(Err(etcd_cache::Error::Compacted { compact_revision })) => {
                self.ids.remove(&id);
                self.progress_settled(id, None);
                Reply::Canceled {
                    watch_id: id,
                    compact_revision,
                    reason: String::new(),
                }
            }
            Some(Err(e)) => {
                self.ids.remove(&id);
                self.progress_settled(id, None);
                Reply::Canceled {
                    watch_id: id,
                    compact_revision: 0,
                    reason: e.to_string(),
                }
            }
            None => {
                self.ids.remove(&id);
                self.progress_settled(id, None);
                Reply::Canceled {
                    watch_id: id,
                    compact_revision: 0,
                    reason: "etcd-cache-proxy: the cache is closed".into(),
                }
            }
        };
        Some(reply)
    }
}

/// The cancel reason for a watch the cache refused.
fn refusal(e: &etcd_cache::Error) -> String {
    match e {
        etcd_cache::Error::InvalidRange { .. } => EMPTY_RANGE.into(),
        etcd_cache::Error::OutOfRange { .. } => format!(
            "etcd-cache-proxy: the key range is outside the cached prefix ({e}); \
             watches are served from the cache only"
        ),
        etcd_cache::Error::WatchLimit { limit } => {
            format!("ETCD_WATCH_LIMIT: at most {limit} watches are allowed on this proxy")
        }
        other => format!("etcd-cache-proxy: {other}"),
    }
}

/// One cache stream tagged with its watch id. Yields `(id, Some(item))`, then `(id, None)`
/// when the cache stream ends. [`close`](Self::close) drops the cache stream at once
/// (freeing its subscription) and wakes the merge so the entry leaves it.
struct Tagged {
    id: i64,
    stream: Option<WatchStream>,
    waker: Option<Waker>,
    budget: Option<Arc<ConnBudget>>,
}

impl Tagged {
    /// Asks the cache stream for a progress response and wakes the merge to poll it.
    fn request_progress(&mut self) -> bool {
        let Some(s) = self.stream.as_mut() else {
            return false;
        };
        let _ = s.request_progress().now_or_never();
        if let Some(w) = self.waker.take() {
            w.wake();
        }
        true
    }

    fn close(&mut self) {
        self.stream = None;
        if let Some(b) = self.budget.take() {
            b.release();
        }
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

impl Drop for Tagged {
    fn drop(&mut self) {
        if let Some(b) = self.budget.take() {
            b.release();
        }
    }
}

type Item = Option<etcd_cache::Result<WatchResponse>>;

impl Stream for Tagged {
    type Item = (i64, Item);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(stream).poll_next(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Some((this.id, Some(item)))),
            Poll::Ready(None) => {
                this.close();
                Poll::Ready(Some((this.id, None)))
            }
            Poll::Pending => {
                match &this.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => this.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_and_frees() {
        let b = ConnBudget::default();
        assert!(b.acquire(2));
        assert!(b.acquire(2));
        assert!(!b.acquire(2));
        b.release();
        assert!(b.acquire(2));
        assert!(b.acquire(0));
    }
}
