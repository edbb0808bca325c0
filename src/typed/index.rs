//! The indexes of a typed view: a task follows the view with a [`ListWatch`] and
//! publishes, after each revision, the objects and one map per index (persistent maps:
//! a publication is a clone of a few pointers), so that a lookup reads one revision's
//! state in O(matches).
//!
//! A published state is the view's content at exactly the revision it carries, and a
//! lookup answers at that revision, never at another one it learned elsewhere.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use imbl::{HashMap, OrdMap, OrdSet};
use tokio::sync::{watch, Notify};

use crate::error::{Error, Result};
use crate::list_watch::{ListWatch, ListWatchEvent, Step};
use crate::typed::source::{Source, TypedKv, TypedList};

/// Index keys of an object.
type KeysOf<T> = Box<dyn Fn(&T) -> Vec<String> + Send + Sync>;

/// One declared index.
pub(crate) struct IndexSpec<T> {
    name: String,
    keys: KeysOf<T>,
}

impl<T> IndexSpec<T> {
    pub(crate) fn new(
        name: String,
        keys: impl Fn(&T) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        IndexSpec {
            name,
            keys: Box::new(keys),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// The view's objects and indexes at one revision.
pub(crate) struct State<T> {
    /// `None` until the first state is complete.
    revision: Option<i64>,
    objects: OrdMap<Bytes, TypedKv<T>>,
    /// Per index (in declaration order): index key -> the keys of its objects.
    by: Vec<HashMap<String, OrdSet<Bytes>>>,
}

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        State {
            revision: self.revision,
            objects: self.objects.clone(),
            by: self.by.clone(),
        }
    }
}

impl<T> State<T> {
    fn empty(indexes: usize) -> Self {
        State {
            revision: None,
            objects: OrdMap::new(),
            by: vec![HashMap::new(); indexes],
        }
    }

    fn insert(&mut self, specs: &[IndexSpec<T>], object: TypedKv<T>) {
        let key = object.kv().key_bytes().clone();
        self.remove(specs, &key);
        if let Some(value) = object.object() {
            for (spec, map) in specs.iter().zip(self.by.iter_mut()) {
                for ix in (spec.keys)(value) {
                    map.entry(ix).or_default().insert(key.clone());
                }
            }
        }
        self.objects.insert(key, object);
    }

    fn remove(&mut self, specs: &[IndexSpec<T>], key: &Bytes) {
        let Some(old) = self.objects.remove(key) else {
            return;
        };
        let Some(value) = old.object() else { return };
        for (spec, map) in specs.iter().zip(self.by.iter_mut()) {
            for ix in (spec.keys)(value) {
                if let Some(keys) = map.get_mut(&ix) {
                    keys.remove(key);
                    if keys.is_empty() {
                        map.remove(&ix);
                    }
                }
            }
        }
    }

    /// The objects index `at` holds under `key`, at the state's revision.
    pub(crate) fn lookup(&self, at: usize, key: &str) -> TypedList<T> {
        let items = self.by[at]
            .get(key)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| self.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default();
        TypedList {
            revision: self.revision.unwrap_or(0),
            items,
        }
    }
}

/// The handle of a view's indexes: the published state, the declared indexes (for a
/// lookup in a list read elsewhere), and a way to ask the task to catch up with a
/// revision the cache has applied (so the state reaches it with no change in the view).
pub(crate) struct Indexes<T> {
    names: Vec<String>,
    specs: Arc<[IndexSpec<T>]>,
    state: watch::Receiver<Arc<State<T>>>,
    nudge: Arc<Nudge>,
    task: tokio::task::JoinHandle<()>,
}

/// A lookup's request to the index task: catch up with the cache, at least to
/// `wanted`.
#[derive(Default)]
struct Nudge {
    notify: Notify,
    /// The newest revision a lookup asked for. Only revisions the cache has published
    /// are asked for: every event up to it has been handed to the task's watch.
    wanted: AtomicI64,
}

impl<T> Drop for Indexes<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<T: Send + Sync + 'static> Indexes<T> {
    /// Starts the task that keeps the indexes of the view of `source` (the task holds
    /// no `Indexes`: it ends when the last view handle drops this).
    pub(crate) fn start(
        rt: &tokio::runtime::Handle,
        source: Arc<Source<T>>,
        specs: Vec<IndexSpec<T>>,
    ) -> Self {
        let names = specs.iter().map(|s| s.name.clone()).collect();
        let specs: Arc<[IndexSpec<T>]> = specs.into();
        let (tx, state) = watch::channel(Arc::new(State::empty(specs.len())));
        let nudge = Arc::new(Nudge::default());
        let task = rt.spawn(follow(
            crate::typed::source::list_watch(&source),
            specs.clone(),
            tx,
            nudge.clone(),
        ));
        Indexes {
            names,
            specs,
            state,
            nudge,
            task,
        }
    }

    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    pub(crate) fn unknown(&self, name: &str) -> Error {
        Error::UnknownIndex {
            name: name.to_string(),
            known: self.names.join(", "),
        }
    }

    /// The published state once it is at `revision` or later. `revision` must be one
    /// the cache has published (the revision of a snapshot it answered from, or at most
    /// [`Cache::revision`](crate::Cache::revision)): the task is asked to reach it, and
    /// the cache has handed it every event up to it.
    pub(crate) async fn at_least(&self, revision: i64) -> Result<Arc<State<T>>> {
        let mut rx = self.state.clone();
        loop {
            {
                let state = rx.borrow_and_update();
                if state.revision.is_some_and(|r| r >= revision) {
                    return Ok(state.clone());
                }
            }
            self.nudge.wanted.fetch_max(revision, Ordering::AcqRel);
            self.nudge.notify.notify_one();
            rx.changed().await.map_err(|_| Error::Closed)?;
        }
    }

    /// The objects of `list` (the view's objects at one revision, read elsewhere) that
    /// index `at` holds under `key`, as a lookup in the state at that revision gives
    /// them: in key order, at the list's revision.
    pub(crate) fn lookup_in(&self, at: usize, key: &str, list: TypedList<T>) -> TypedList<T> {
        let spec = &self.specs[at];
        let items = list
            .items
            .into_iter()
            .filter(|item| {
                item.object()
                    .is_some_and(|object| (spec.keys)(object).iter().any(|k| k == key))
            })
            .collect();
        TypedList {
            revision: list.revision,
            items,
        }
    }
}

/// The task: applies the list-watch to the state, publishes it after each revision.
/// Asked (by a lookup) to catch up with the cache, it takes the cache's revision (or the
/// revision the lookup asked for, if that is newer: the cache's revision is stored just
/// after its snapshot is published, so a reader of that snapshot can be ahead of it),
/// then every response already queued for its watch: the cache hands a revision's
/// events to its watches before it publishes the revision, so once the queue is empty
/// the state holds every change up to the revision it took, whether or not any was in
/// the view.
async fn follow<T: Send + Sync + 'static>(
    mut lw: ListWatch<TypedKv<T>>,
    specs: Arc<[IndexSpec<T>]>,
    tx: watch::Sender<Arc<State<T>>>,
    nudge: Arc<Nudge>,
) {
    let mut follower = Follower {
        current: State::empty(specs.len()),
        next: None,
        specs,
        tx,
    };
    loop {
        let step = tokio::select! {
            step = lw.step() => step,
            () = nudge.notify.notified() => {
                let target = lw
                    .cache_revision()
                    .max(nudge.wanted.load(Ordering::Acquire));
                while let Some(step) = lw.step().now_or_never() {
                    if !follower.apply(step, lw.revision()) {
                        return;
                    }
                }
                if lw.is_watching() {
                    follower.publish(target);
                }
                continue;
            }
        };
        if !follower.apply(step, lw.revision()) {
            return;
        }
    }
}

/// The index task's state: the published one and the one being listed.
struct Follower<T> {
    current: State<T>,
    next: Option<State<T>>,
    specs: Arc<[IndexSpec<T>]>,
    tx: watch::Sender<Arc<State<T>>>,
}

impl<T> Follower<T> {
    /// Applies one step; false when the list-watch has ended (the cache is closed).
    /// `revision` is the list-watch's once every queued event is out.
    fn apply(&mut self, step: Option<Result<Step<TypedKv<T>>>>, revision: Option<i64>) -> bool {
        match step {
            None => return false,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "typed view index: list-watch error, retrying");
            }
            Some(Ok(Step::Event(event))) => match event {
                ListWatchEvent::Init { .. } => self.next = Some(State::empty(self.specs.len())),
                ListWatchEvent::InitApply(object) => {
                    if let Some(state) = self.next.as_mut() {
                        state.insert(&self.specs, object);
                    }
                }
                ListWatchEvent::InitDone { .. } => {
                    if let Some(state) = self.next.take() {
                        self.current = state;
                    }
                }
                ListWatchEvent::Apply(object) => self.current.insert(&self.specs, object),
                ListWatchEvent::Delete { key, .. } => self.current.remove(&self.specs, &key),
            },
            Some(Ok(Step::Progress)) => {}
        }
        // Publish whole revisions only: when everything queued has been applied.
        if let Some(revision) = revision {
            self.publish(revision);
        }
        true
    }

    /// Publishes the state as being at `revision` (if that is newer), unless a new
    /// state is being listed.
    fn publish(&mut self, revision: i64) {
        if self.next.is_some() || self.current.revision.is_some_and(|r| r >= revision) {
            return;
        }
        self.current.revision = Some(revision);
        self.tx.send_replace(Arc::new(self.current.clone()));
    }
}
