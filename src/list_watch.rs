//! List then watch, as one stream: [`ListWatch`]. The state at one revision, then every
//! change after it; after a gap the cache cannot replay (a compaction, a watch that fell
//! out of the window), the full state again behind a marker, so that a consumer
//! replaces its state instead of guessing. kube-runtime's `watcher` is the model.
//!
//! The stream is the same for the cache's key-values ([`Cache::list_watch`]) and for a
//! typed view's objects ([`TypedView::list_watch`](crate::TypedView::list_watch)): it is
//! generic over its item, made from each key-value by a function the maker gives.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;

use crate::backoff::Backoff;
use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::kv::{EventType, KeyValue};
use crate::read::GetOptions;
use crate::watch::{WatchOptions, WatchStream};

/// An item of a [`ListWatch`]: a [`KeyValue`] ([`Cache::list_watch`]) or a typed view's
/// [`TypedKv`](crate::TypedKv) ([`TypedView::list_watch`](crate::TypedView::list_watch)).
/// Sealed: the crate makes the items.
///
/// A consumer written once for both kinds of list-watch:
///
/// ```
/// use std::collections::BTreeMap;
/// use etcd_cache::{ListItem, ListWatchEvent};
///
/// /// Applies one event to a map of key to mod revision.
/// fn apply<I: ListItem>(state: &mut BTreeMap<Vec<u8>, i64>, event: &ListWatchEvent<I>) {
///     match event {
///         ListWatchEvent::Init { .. } => state.clear(),
///         ListWatchEvent::InitApply(item) | ListWatchEvent::Apply(item) => {
///             let kv = item.key_value();
///             state.insert(kv.key().to_vec(), kv.mod_revision());
///         }
///         ListWatchEvent::Delete { key, .. } => {
///             state.remove(&key[..]);
///         }
///         ListWatchEvent::InitDone { .. } => {}
///     }
/// }
/// let mut state = BTreeMap::new();
/// apply::<etcd_cache::KeyValue>(&mut state, &ListWatchEvent::Init { restarted: false });
/// assert!(state.is_empty());
/// ```
pub trait ListItem: Send + Sync + 'static + private::Sealed {
    /// The key-value of the item: the item itself for a [`KeyValue`], the key-value the
    /// object was decoded from for a [`TypedKv`](crate::TypedKv).
    fn key_value(&self) -> &KeyValue;
}

impl ListItem for KeyValue {
    fn key_value(&self) -> &KeyValue {
        self
    }
}

pub(crate) mod private {
    /// Keeps [`ListItem`](super::ListItem) to the crate's own item types.
    pub trait Sealed {}
    impl Sealed for crate::kv::KeyValue {}
}

/// Makes a list-watch's item from a key-value.
pub(crate) type MakeItem<I> = Arc<dyn Fn(KeyValue) -> I + Send + Sync>;

/// One item of a [`ListWatch`]. A state is `Init`, then `InitApply` for each item,
/// then `InitDone`; after it, `Apply` and `Delete` for each change, in revision order.
/// Another `Init` (with `restarted: true`) starts a whole new state: drop the old one
/// when its `InitDone` arrives. `I` is a [`KeyValue`] for [`Cache::list_watch`], a
/// [`TypedKv`](crate::TypedKv) for a typed view's.
pub enum ListWatchEvent<I> {
    /// A new state starts. `restarted` is false for the first, true after a gap.
    Init {
        /// Whether an earlier state was given before (and is now replaced).
        restarted: bool,
    },
    /// One key of the new state.
    InitApply(I),
    /// The new state is complete: it is what the prefix held at `revision`.
    InitDone {
        /// The revision of the state.
        revision: i64,
    },
    /// A key was created or changed.
    Apply(I),
    /// A key was deleted.
    Delete {
        /// The key.
        key: Bytes,
        /// The revision of the delete.
        revision: i64,
        /// What the key held before.
        last: Option<I>,
    },
}

impl<I: ListItem> fmt::Debug for ListWatchEvent<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListWatchEvent::Init { restarted } => write!(f, "Init {{ restarted: {restarted} }}"),
            ListWatchEvent::InitApply(o) => write!(
                f,
                "InitApply({:?}@{})",
                String::from_utf8_lossy(o.key_value().key()),
                o.key_value().mod_revision()
            ),
            ListWatchEvent::InitDone { revision } => {
                write!(f, "InitDone {{ revision: {revision} }}")
            }
            ListWatchEvent::Apply(o) => write!(
                f,
                "Apply({:?}@{})",
                String::from_utf8_lossy(o.key_value().key()),
                o.key_value().mod_revision()
            ),
            ListWatchEvent::Delete { key, revision, .. } => {
                write!(f, "Delete({:?}@{revision})", String::from_utf8_lossy(key))
            }
        }
    }
}

impl Cache {
    /// The key-values under `prefix` at one revision, then every change after it, as
    /// one stream: the loop of "list, watch from the list's revision + 1, list again
    /// after a compaction" written once (see [`ListWatch`]). A typed view has the same
    /// stream of objects, [`TypedView::list_watch`](crate::TypedView::list_watch).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `prefix` is outside the cache's prefix (the stream
    /// could never list it).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use std::collections::BTreeMap;
    /// use etcd_cache::ListWatchEvent;
    ///
    /// let mut state = BTreeMap::new();
    /// let mut next = BTreeMap::new();
    /// let mut stream = cache.list_watch("/config/")?;
    /// while let Some(event) = stream.next().await {
    ///     match event? {
    ///         ListWatchEvent::Init { .. } => next.clear(),
    ///         ListWatchEvent::InitApply(kv) => { next.insert(kv.key().to_vec(), kv); }
    ///         ListWatchEvent::InitDone { revision } => {
    ///             state = std::mem::take(&mut next);
    ///             println!("{} keys at revision {revision}", state.len());
    ///         }
    ///         ListWatchEvent::Apply(kv) => { state.insert(kv.key().to_vec(), kv); }
    ///         ListWatchEvent::Delete { key, .. } => { state.remove(&key[..]); }
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list_watch(&self, prefix: impl Into<Vec<u8>>) -> Result<ListWatch<KeyValue>> {
        let prefix = prefix.into();
        self.check_prefix(&prefix)?;
        Ok(ListWatch::new(self.clone(), prefix, Arc::new(|kv| kv)))
    }
}

/// What [`ListWatch::step`] gives: an event, or the news that the stream has handed out
/// every change up to a revision (a progress response).
pub(crate) enum Step<I> {
    Event(ListWatchEvent<I>),
    Progress,
}

enum Phase {
    /// Read the state (after `delay`, when the last attempt failed).
    List {
        delay: Option<Duration>,
    },
    /// The state at `revision` is queued: open the watch after it.
    Open {
        revision: i64,
    },
    Watch(Box<WatchStream>),
    Ended,
}

/// The list-then-watch stream of the keys under a prefix, as key-values
/// ([`Cache::list_watch`]) or as a typed view's objects
/// ([`TypedView::list_watch`](crate::TypedView::list_watch)): the
/// keys at one revision (`Init`, `InitApply`..., `InitDone`), then every
/// change after it (`Apply`, `Delete`), with no gap and nothing twice. When the cache
/// cannot replay the changes since the last one handed out (the watch fell out of the
/// window: a slow consumer, a compaction), it starts over with `Init { restarted: true }`
/// and the full state at a newer revision. Outages of etcd do not restart it: the cache
/// resumes its watches by itself.
///
/// A transient error (the cache not ready yet, a failed read) is handed out as an
/// `Err` item and retried with a backoff; the stream ends (`None`) when the cache is
/// closed.
///
/// ```no_run
/// # async fn f(view: etcd_cache::TypedView<String>) -> etcd_cache::Result<()> {
/// use std::collections::BTreeMap;
/// use etcd_cache::ListWatchEvent;
///
/// let mut state = BTreeMap::new();
/// let mut next = BTreeMap::new();
/// let mut stream = view.list_watch();
/// while let Some(event) = stream.next().await {
///     match event? {
///         ListWatchEvent::Init { .. } => next.clear(),
///         ListWatchEvent::InitApply(o) => { next.insert(o.key().to_vec(), o); }
///         ListWatchEvent::InitDone { .. } => state = std::mem::take(&mut next),
///         ListWatchEvent::Apply(o) => { state.insert(o.key().to_vec(), o); }
///         ListWatchEvent::Delete { key, .. } => { state.remove(&key[..]); }
///     }
/// }
/// # Ok(()) }
/// ```
pub struct ListWatch<I> {
    cache: Cache,
    prefix: Vec<u8>,
    make: MakeItem<I>,
    phase: Phase,
    pending: VecDeque<ListWatchEvent<I>>,
    /// The revision of everything handed out once `pending` is empty.
    revision: i64,
    started: bool,
    backoff: Backoff,
}

impl<I> fmt::Debug for ListWatch<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListWatch")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("revision", &self.revision)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<I: ListItem> ListWatch<I> {
    /// The list-watch of the keys under `prefix` (inside the cache's prefix), each
    /// key-value made an item by `make`.
    pub(crate) fn new(cache: Cache, prefix: Vec<u8>, make: MakeItem<I>) -> Self {
        ListWatch {
            cache,
            prefix,
            make,
            phase: Phase::List { delay: None },
            pending: VecDeque::new(),
            revision: 0,
            started: false,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
        }
    }

    /// The next event; `None` once the cache is closed.
    ///
    /// # Errors
    /// Transient errors, as items (the stream goes on): [`Error::NotReady`]-like
    /// failures of the read, errors of the watch.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is handed out once, by the call that returns it.
    pub async fn next(&mut self) -> Option<Result<ListWatchEvent<I>>> {
        loop {
            match self.step().await? {
                Ok(Step::Event(event)) => return Some(Ok(event)),
                Ok(Step::Progress) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// This stream as a [`Stream`].
    pub fn into_stream(self) -> impl Stream<Item = Result<ListWatchEvent<I>>> + Send {
        futures_util::stream::unfold(self, |mut lw| async move {
            lw.next().await.map(|item| (item, lw))
        })
    }

    /// The revision of the state handed out so far, once every event queued is out
    /// (0 before the first `InitDone`).
    pub(crate) fn revision(&self) -> Option<i64> {
        self.pending.is_empty().then_some(self.revision)
    }

    /// Whether the watch is open and every event it gave is out.
    pub(crate) fn is_watching(&self) -> bool {
        self.pending.is_empty() && matches!(self.phase, Phase::Watch(_))
    }

    /// The cache's revision now.
    pub(crate) fn cache_revision(&self) -> i64 {
        self.cache.revision()
    }

    pub(crate) async fn step(&mut self) -> Option<Result<Step<I>>> {
        loop {
            // The watch opens as soon as the state is read, before the state is
            // handed out, so that a slow consumer of a big state is not left behind.
            if let Phase::Open { revision } = self.phase {
                let options = WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_start_revision(revision + 1);
                let prefix = self.prefix.clone();
                match self.cache.watch(prefix, Some(options)).await {
                    Ok(stream) => self.phase = Phase::Watch(Box::new(stream)),
                    Err(e) => return self.failed(e),
                }
            }
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(Step::Event(event)));
            }
            match &mut self.phase {
                Phase::Ended => return None,
                // Opened above.
                Phase::Open { .. } => {}
                Phase::List { delay } => {
                    if let Some(delay) = *delay {
                        tokio::time::sleep(delay).await;
                        self.phase = Phase::List { delay: None };
                    }
                    match self.list().await {
                        Ok(revision) => self.phase = Phase::Open { revision },
                        Err(e) => return self.failed(e),
                    }
                }
                Phase::Watch(stream) => match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => {
                        // A gap (compaction, fell out of the window): a new state; at
                        // once when etcd said so, after a backoff otherwise.
                        let delay =
                            (resp.compact_revision() == 0).then(|| self.backoff.next_delay());
                        tracing::debug!(
                            compact_revision = resp.compact_revision(),
                            reason = resp.cancel_reason(),
                            "list-watch: watch canceled, listing again"
                        );
                        self.phase = Phase::List { delay };
                    }
                    Ok(Some(resp)) if resp.created() => {}
                    Ok(Some(resp)) if resp.events().is_empty() => {
                        self.revision = self.revision.max(resp.revision());
                        return Some(Ok(Step::Progress));
                    }
                    Ok(Some(resp)) => {
                        self.backoff.reset();
                        // The events' own revision (one per response), not the header's:
                        // a watch from a start revision reports the cache's revision in
                        // its `created` header, and every header after it is at least
                        // that, while the revisions between its start and it are still
                        // being replayed.
                        let revision = resp.events().iter().filter_map(|ev| ev.kv());
                        let revision = revision.map(KeyValue::mod_revision).max();
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            self.pending.push_back(match ev.event_type() {
                                EventType::Put => ListWatchEvent::Apply((self.make)(kv.clone())),
                                EventType::Delete => ListWatchEvent::Delete {
                                    key: kv.key_bytes().clone(),
                                    revision: kv.mod_revision(),
                                    last: ev.prev_kv().map(|p| (self.make)(p.clone())),
                                },
                            });
                        }
                        self.revision = self.revision.max(revision.unwrap_or(0));
                    }
                    Ok(None) => {
                        self.phase = Phase::Ended;
                        return None;
                    }
                    Err(e) => return self.failed(e),
                },
            }
        }
    }

    /// Reads the state and queues it; returns its revision.
    async fn list(&mut self) -> Result<i64> {
        let cache = &self.cache;
        if !cache.is_ready() {
            cache.wait_ready().await?;
        }
        let mut list = cache
            .get(self.prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        let revision = list.revision();
        self.pending.push_back(ListWatchEvent::Init {
            restarted: std::mem::replace(&mut self.started, true),
        });
        let make = &self.make;
        self.pending.extend(
            list.take_kvs()
                .into_iter()
                .map(|kv| ListWatchEvent::InitApply(make(kv))),
        );
        self.pending
            .push_back(ListWatchEvent::InitDone { revision });
        self.revision = revision;
        Ok(revision)
    }

    /// Hands out `e`, and lists again after a backoff; ends on a closed cache.
    fn failed(&mut self, e: Error) -> Option<Result<Step<I>>> {
        if matches!(e, Error::Closed) {
            self.phase = Phase::Ended;
            return None;
        }
        self.phase = Phase::List {
            delay: Some(self.backoff.next_delay()),
        };
        Some(Err(e))
    }
}
