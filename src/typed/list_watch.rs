//! List then watch, as one stream: [`ListWatch`]. The state at one revision, then every
//! change after it; after a gap the cache cannot replay (a compaction, a watch that fell
//! out of the window), the full state again behind a marker, so that a consumer
//! replaces its state instead of guessing. kube-runtime's `watcher` is the model.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::kv::EventType;
use crate::read::GetOptions;
use crate::typed::decoder::{Source, TypedKv};
use crate::watch::{WatchOptions, WatchStream};

/// One item of a [`ListWatch`]. A state is `Init`, then `InitApply` for each object,
/// then `InitDone`; after it, `Apply` and `Delete` for each change, in revision order.
/// Another `Init` (with `restarted: true`) starts a whole new state: drop the old one
/// when its `InitDone` arrives.
pub enum ListWatchEvent<T> {
    /// A new state starts. `restarted` is false for the first, true after a gap.
    Init {
        /// Whether an earlier state was given before (and is now replaced).
        restarted: bool,
    },
    /// One object of the new state.
    InitApply(TypedKv<T>),
    /// The new state is complete: it is the view's content at `revision`.
    InitDone {
        /// The revision of the state.
        revision: i64,
    },
    /// An object was created or changed.
    Apply(TypedKv<T>),
    /// A key was deleted.
    Delete {
        /// The key.
        key: Bytes,
        /// The revision of the delete.
        revision: i64,
        /// The object the key held before.
        last: Option<TypedKv<T>>,
    },
}

impl<T> fmt::Debug for ListWatchEvent<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListWatchEvent::Init { restarted } => write!(f, "Init {{ restarted: {restarted} }}"),
            ListWatchEvent::InitApply(o) => write!(
                f,
                "InitApply({:?}@{})",
                String::from_utf8_lossy(o.key()),
                o.mod_revision()
            ),
            ListWatchEvent::InitDone { revision } => {
                write!(f, "InitDone {{ revision: {revision} }}")
            }
            ListWatchEvent::Apply(o) => write!(
                f,
                "Apply({:?}@{})",
                String::from_utf8_lossy(o.key()),
                o.mod_revision()
            ),
            ListWatchEvent::Delete { key, revision, .. } => {
                write!(f, "Delete({:?}@{revision})", String::from_utf8_lossy(key))
            }
        }
    }
}

/// What [`ListWatch::step`] gives: an event, or the news that the stream has handed out
/// every change up to a revision (a progress response).
pub(crate) enum Step<T> {
    Event(ListWatchEvent<T>),
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

/// The list-then-watch stream of a [`TypedView`](crate::TypedView)
/// ([`TypedView::list_watch`](crate::TypedView::list_watch)): the
/// view's objects at one revision (`Init`, `InitApply`..., `InitDone`), then every
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
pub struct ListWatch<T> {
    view: Arc<Source<T>>,
    phase: Phase,
    pending: VecDeque<ListWatchEvent<T>>,
    /// The revision of everything handed out once `pending` is empty.
    revision: i64,
    started: bool,
    backoff: Backoff,
}

impl<T> fmt::Debug for ListWatch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListWatch")
            .field("revision", &self.revision)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<T: Send + Sync + 'static> ListWatch<T> {
    pub(crate) fn new(view: Arc<Source<T>>) -> Self {
        ListWatch {
            view,
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
    pub async fn next(&mut self) -> Option<Result<ListWatchEvent<T>>> {
        loop {
            match self.step().await? {
                Ok(Step::Event(event)) => return Some(Ok(event)),
                Ok(Step::Progress) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// This stream as a [`Stream`].
    pub fn into_stream(self) -> impl Stream<Item = Result<ListWatchEvent<T>>> + Send {
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
        self.view.cache.revision()
    }

    pub(crate) async fn step(&mut self) -> Option<Result<Step<T>>> {
        loop {
            // The watch opens as soon as the state is read, before the state is
            // handed out, so that a slow consumer of a big state is not left behind.
            if let Phase::Open { revision } = self.phase {
                let options = WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_start_revision(revision + 1);
                let prefix = self.view.prefix.clone();
                match self.view.cache.watch(prefix, Some(options)).await {
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
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            self.pending.push_back(match ev.event_type() {
                                EventType::Put => {
                                    ListWatchEvent::Apply(self.view.typed_kv(kv.clone()))
                                }
                                EventType::Delete => ListWatchEvent::Delete {
                                    key: kv.key_bytes().clone(),
                                    revision: kv.mod_revision(),
                                    last: ev.prev_kv().map(|p| self.view.typed_kv(p.clone())),
                                },
                            });
                        }
                        self.revision = self.revision.max(resp.revision());
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
        let cache = &self.view.cache;
        if !cache.is_ready() {
            cache.wait_ready().await?;
        }
        let list = self
            .view
            .range(
                self.view.prefix.clone(),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        let revision = list.revision();
        self.pending.push_back(ListWatchEvent::Init {
            restarted: std::mem::replace(&mut self.started, true),
        });
        self.pending
            .extend(list.into_items().into_iter().map(ListWatchEvent::InitApply));
        self.pending
            .push_back(ListWatchEvent::InitDone { revision });
        self.revision = revision;
        Ok(revision)
    }

    /// Hands out `e`, and lists again after a backoff; ends on a closed cache.
    fn failed(&mut self, e: Error) -> Option<Result<Step<T>>> {
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
