//! Hidden entry points for the micro-benchmarks (feature `bench-internals`). Not API.
//!
//! Thin wrappers over crate-private types, so `benches/` can time the pieces one by one:
//! the subscriber index and mailboxes ([`BenchIndex`], [`BenchMailbox`]), the history ring
//! ([`BenchHistory`]), the store and its snapshots ([`BenchStore`], [`BenchSnapshot`]), and
//! a whole [`Cache`] over an in-memory upstream ([`mem_cache`]) for what needs the real
//! `watch` / `get` paths without an etcd process. Nothing here changes the wrapped types.
#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::cache::Cache;
use crate::config::Config;
use crate::dispatch::{catch_up, Index, Mailbox, Shape};
use crate::error::{Error, Result};
use crate::get::GetResponse;
use crate::history::{Batch, History};
use crate::key_range::{KeyRange, RangeSpec};
use crate::kv::{Event, EventType, KeyValue};
use crate::store::{Snapshot, Store};
use crate::upstream::{Page, Upstream, UpstreamWatch, WatchMsg};

/// How a subscriber or a read selects keys (mirrors the `with_*` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    Single,
    Prefix,
    FromKey,
    Range(Vec<u8>),
    AllKeys,
}

impl Spec {
    fn to_range(&self, key: &[u8]) -> KeyRange {
        let spec = match self {
            Spec::Single => RangeSpec::Single,
            Spec::Prefix => RangeSpec::Prefix,
            Spec::FromKey => RangeSpec::FromKey,
            Spec::Range(end) => RangeSpec::Range(end.clone()),
            Spec::AllKeys => RangeSpec::AllKeys,
        };
        KeyRange::new(key, &spec).expect("valid benchmark range")
    }

    fn shape(&self, key: &[u8], prev_kv: bool) -> Shape {
        Shape {
            range: self.to_range(key),
            prev_kv,
            no_put: false,
            no_delete: false,
        }
    }
}

/// A key-value as the upstream would deliver it (create = mod = `revision`, version 1).
pub fn kv(key: impl Into<Bytes>, value: impl Into<Bytes>, revision: i64) -> KeyValue {
    KeyValue::new(key.into(), value.into(), revision, revision, 1, 0)
}

/// One revision's events, stored once and shared (`Arc<Batch>`).
#[derive(Clone)]
pub struct BenchBatch(Arc<Batch>);

impl BenchBatch {
    /// One put of `key` at `revision`.
    pub fn put(revision: i64, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Self::puts(revision, [(key.into(), value.into())])
    }

    /// Several puts in one revision (a transaction).
    pub fn puts(revision: i64, kvs: impl IntoIterator<Item = (Bytes, Bytes)>) -> Self {
        let events = kvs
            .into_iter()
            .map(|(k, v)| Event::new(EventType::Put, kv(k, v, revision), None))
            .collect();
        BenchBatch(Batch::new(revision, events))
    }

    pub fn revision(&self) -> i64 {
        self.0.revision
    }
}

/// The subscriber index with its mailboxes (what the upstream task dispatches into).
#[derive(Default)]
pub struct BenchIndex {
    index: Index,
    lagging: AtomicUsize,
    next_id: u64,
}

/// A subscriber's bounded queue, seen from the consumer.
#[derive(Clone)]
pub struct BenchMailbox {
    pub id: u64,
    mailbox: Arc<Mailbox>,
}

impl BenchMailbox {
    /// Pops everything queued; returns the number of deliveries popped.
    pub fn drain(&self) -> usize {
        let mut s = self.mailbox.state.lock();
        let n = s.queue.len();
        s.queue.clear();
        n
    }

    /// Pops everything queued and returns (revision, events) of each delivery.
    pub fn take(&self) -> Vec<(i64, usize)> {
        let mut s = self.mailbox.state.lock();
        s.queue
            .drain(..)
            .map(|d| (d.revision, d.events.len()))
            .collect()
    }

    pub fn is_lagging(&self) -> bool {
        self.mailbox.state.lock().lagging
    }
}

impl BenchIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a subscriber on `key` / `spec` with a queue of `capacity` deliveries,
    /// positioned at `last_rev` (it receives revisions after it).
    pub fn subscribe(
        &mut self,
        key: &[u8],
        spec: &Spec,
        capacity: usize,
        last_rev: i64,
    ) -> BenchMailbox {
        self.subscribe_with(key, spec, false, capacity, last_rev)
    }

    /// As [`subscribe`](Self::subscribe), choosing `prev_kv`.
    pub fn subscribe_with(
        &mut self,
        key: &[u8],
        spec: &Spec,
        prev_kv: bool,
        capacity: usize,
        last_rev: i64,
    ) -> BenchMailbox {
        self.next_id += 1;
        let id = self.next_id;
        let mailbox = Mailbox::new(capacity, last_rev, false);
        self.index
            .insert(id, spec.shape(key, prev_kv), mailbox.clone());
        BenchMailbox { id, mailbox }
    }

    /// Removes a subscriber.
    pub fn unsubscribe(&mut self, id: u64) -> bool {
        self.index.remove(id).is_some()
    }

    /// Pushes `batch` to every matching subscriber: (delivered, became lagging).
    pub fn dispatch(&mut self, batch: &BenchBatch) -> (usize, usize) {
        let stats = self.index.dispatch(&batch.0, &self.lagging);
        (stats.delivered, stats.lagged)
    }

    /// Subscribers that became lagging so far.
    pub fn lagged(&self) -> usize {
        self.lagging.load(Ordering::Relaxed)
    }
}

/// The revision-ordered ring of batches.
pub struct BenchHistory {
    history: History,
}

impl BenchHistory {
    /// An empty ring of `capacity` revisions covering revisions after `revision`.
    pub fn new(capacity: usize, revision: i64) -> Self {
        let mut history = History::new(capacity);
        history.reset(revision);
        BenchHistory { history }
    }

    pub fn push(&mut self, batch: &BenchBatch) {
        self.history.push(batch.0.clone());
    }

    pub fn floor(&self) -> i64 {
        self.history.floor()
    }

    pub fn head(&self) -> i64 {
        self.history.head()
    }

    pub fn len(&self) -> usize {
        self.history.len()
    }

    pub fn is_empty(&self) -> bool {
        self.history.len() == 0
    }

    /// Key and value bytes referenced by the ring.
    pub fn bytes(&self) -> usize {
        self.history.bytes()
    }

    /// Replays what a lagging subscriber on `key` / `spec` positioned at `after` gets:
    /// the crate's own catch-up into a queue of `capacity`. Returns deliveries queued.
    pub fn replay(&self, key: &[u8], spec: &Spec, after: i64, capacity: usize) -> usize {
        let shape = spec.shape(key, false);
        let mailbox = Mailbox::new(capacity, after, true);
        // As a stream does: call again while it lags and its queue has room (one call
        // scans a bounded number of batches).
        while !catch_up(&self.history, &mailbox, &shape) {
            let st = mailbox.state.lock();
            if !st.lagging || st.queue.len() >= capacity {
                break;
            }
        }
        let n = mailbox.state.lock().queue.len();
        n
    }
}

/// The writer's side of the store.
#[derive(Default)]
pub struct BenchStore {
    store: Store,
    revision: i64,
}

impl BenchStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a put at `revision` (must not go backwards).
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>, revision: i64) {
        self.store.apply(EventType::Put, kv(key, value, revision));
        self.revision = self.revision.max(revision);
    }

    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    /// Key and value bytes held.
    pub fn bytes(&self) -> usize {
        self.store.bytes()
    }

    /// An O(1) snapshot at the newest revision.
    pub fn snapshot(&self) -> BenchSnapshot {
        BenchSnapshot(self.store.snapshot(self.revision))
    }
}

/// An immutable view of the store (what a serializable read uses).
#[derive(Clone)]
pub struct BenchSnapshot(Snapshot);

impl BenchSnapshot {
    /// One key, cloned out (as a get response holds it).
    pub fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.0.range(&Spec::Single.to_range(key)).next().cloned()
    }

    /// Every key-value of `key` / `spec`, cloned out in key order.
    pub fn range(&self, key: &[u8], spec: &Spec) -> Vec<KeyValue> {
        self.0.range(&spec.to_range(key)).cloned().collect()
    }
}

/// Feeds events to a [`mem_cache`] as if etcd had sent them.
pub struct MemFeed {
    tx: mpsc::UnboundedSender<WatchMsg>,
    revision: i64,
}

impl MemFeed {
    /// The newest revision sent.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Sends one put in its own revision; returns the revision.
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> i64 {
        self.revision += 1;
        let msg = WatchMsg::Events(vec![(EventType::Put, kv(key, value, self.revision))]);
        let _ = self.tx.send(msg);
        self.revision
    }

    /// Sends several revisions (one put each) in one upstream message.
    pub fn put_many(&mut self, kvs: impl IntoIterator<Item = (Bytes, Bytes)>) -> i64 {
        let events: Vec<_> = kvs
            .into_iter()
            .map(|(k, v)| {
                self.revision += 1;
                (EventType::Put, kv(k, v, self.revision))
            })
            .collect();
        let _ = self.tx.send(WatchMsg::Events(events));
        self.revision
    }
}

struct MemUpstream {
    revision: i64,
    kvs: Vec<KeyValue>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<WatchMsg>>>,
}

struct MemWatch {
    pending: VecDeque<WatchMsg>,
    rx: mpsc::UnboundedReceiver<WatchMsg>,
}

impl UpstreamWatch for MemWatch {
    fn message(&mut self) -> BoxFuture<'_, Result<Option<WatchMsg>>> {
        Box::pin(async move {
            if let Some(m) = self.pending.pop_front() {
                return Ok(Some(m));
            }
            match self.rx.recv().await {
                Some(m) => Ok(Some(m)),
                // The feed was dropped: stay quiet rather than end (no reconnect loop).
                None => std::future::pending().await,
            }
        })
    }

    fn request_progress(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

impl Upstream for MemUpstream {
    fn versions(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async { Ok(vec!["3.5.13".to_string()]) })
    }

    fn list_page(
        &self,
        range: KeyRange,
        _revision: i64,
        limit: i64,
    ) -> BoxFuture<'_, Result<Page>> {
        Box::pin(async move {
            let limit = if limit <= 0 {
                usize::MAX
            } else {
                limit as usize
            };
            let mut kvs: Vec<KeyValue> = self
                .kvs
                .iter()
                .filter(|kv| range.contains(kv.key()))
                .take(limit.saturating_add(1))
                .cloned()
                .collect();
            let more = kvs.len() > limit;
            kvs.truncate(limit);
            Ok(Page {
                revision: self.revision,
                kvs,
                more,
            })
        })
    }

    fn watch(
        &self,
        _range: KeyRange,
        _start: i64,
    ) -> BoxFuture<'_, Result<Box<dyn UpstreamWatch>>> {
        Box::pin(async move {
            let rx = self
                .rx
                .lock()
                .take()
                .ok_or_else(|| Error::invalid("in-memory upstream watched twice"))?;
            let mut pending = VecDeque::new();
            pending.push_back(WatchMsg::Created);
            Ok(Box::new(MemWatch { pending, rx }) as Box<dyn UpstreamWatch>)
        })
    }

    fn current_revision(&self, _range: KeyRange) -> BoxFuture<'_, Result<i64>> {
        Box::pin(async { Err(Error::invalid("in-memory upstream: no current revision")) })
    }

    fn get(
        &self,
        _key: Vec<u8>,
        _options: etcd_client::GetOptions,
    ) -> BoxFuture<'_, Result<GetResponse>> {
        Box::pin(async { Err(Error::invalid("in-memory upstream: no reads")) })
    }
}

/// Options of [`mem_cache`].
#[derive(Debug, Clone)]
pub struct MemCacheOptions {
    pub prefix: Vec<u8>,
    pub subscriber_buffer: usize,
    pub history_window: usize,
    pub max_watchers: usize,
}

impl Default for MemCacheOptions {
    fn default() -> Self {
        let c = Config::default();
        MemCacheOptions {
            prefix: Vec::new(),
            subscriber_buffer: c.subscriber_buffer,
            history_window: c.history_window,
            max_watchers: 1_000_000,
        }
    }
}

/// A real [`Cache`] whose upstream is in memory: it lists `kvs` (sorted by key here) at
/// `revision`, then receives what the returned [`MemFeed`] sends. Call inside a tokio
/// runtime; the cache is ready once `wait_ready` resolves.
pub fn mem_cache(
    opts: MemCacheOptions,
    mut kvs: Vec<KeyValue>,
    revision: i64,
) -> Result<(Cache, MemFeed)> {
    kvs.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    let (tx, rx) = mpsc::unbounded_channel();
    let upstream = MemUpstream {
        revision,
        kvs,
        rx: Mutex::new(Some(rx)),
    };
    let config = Config {
        prefix: Bytes::from(opts.prefix),
        subscriber_buffer: opts.subscriber_buffer,
        history_window: opts.history_window,
        max_watchers: opts.max_watchers,
        page_size: 10_000,
        ..Config::default()
    };
    let cache = Cache::start(config, Arc::new(upstream))?;
    Ok((cache, MemFeed { tx, revision }))
}
