//! Hidden entry points for the micro-benchmarks (feature `unstable-bench-internals`). Not API.
//!
//! Thin wrappers over crate-private types, so `benches/` can time the pieces one by one:
//! the subscriber index and mailboxes ([`BenchIndex`], [`BenchMailbox`]), the history ring
//! ([`BenchHistory`]), the store and its snapshots ([`BenchStore`], [`BenchSnapshot`]), and
//! a whole [`Cache`] over an in-memory upstream ([`mem_cache`]) for what needs the real
//! `watch` / `get` paths without an etcd process. Nothing here changes the wrapped types.
#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

use std::sync::Arc;

use bytes::Bytes;

use crate::cache::Cache;
use crate::config::Config;
use crate::error::Result;
use crate::history::{Batch, History, HistoryWriter, SharedHistory};
use crate::key_range::KeyRange;
pub use crate::key_range::RangeSpec as Spec;
use crate::kv::{Event, EventType, KeyValue};
use crate::store::{Snapshot, Store};
use crate::subscribers::filter::Filter;
use crate::subscribers::index::Index;
use crate::subscribers::mailbox::{LagCount, Mailbox};
use crate::upstream::fake::{FakeUpstream, OpenedWatch};

fn range(key: &[u8], spec: &Spec) -> KeyRange {
    KeyRange::new(key, spec).expect("valid benchmark range")
}

fn filter(key: &[u8], spec: &Spec, prev_kv: bool) -> Filter {
    Filter {
        prev_kv,
        ..Filter::range(range(key, spec))
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
    lag: LagCount,
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
        self.mailbox.clear_queued()
    }

    /// Pops everything queued and returns (revision, events) of each delivery.
    pub fn take(&self) -> Vec<(i64, usize)> {
        self.mailbox
            .take_queued()
            .into_iter()
            .map(|d| (d.revision, d.events.len()))
            .collect()
    }

    pub fn is_lagging(&self) -> bool {
        self.mailbox.is_lagging()
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
        let mailbox = Mailbox::new(
            filter(key, spec, prev_kv),
            capacity,
            last_rev,
            false,
            &self.lag,
        );
        self.index.insert(id, mailbox.clone());
        BenchMailbox { id, mailbox }
    }

    /// Removes a subscriber.
    pub fn unsubscribe(&mut self, sub: &BenchMailbox) -> bool {
        self.index.remove(sub.id, sub.mailbox.filter()).is_some()
    }

    /// Pushes `batch` to every matching subscriber: (delivered, became lagging).
    pub fn dispatch(&mut self, batch: &BenchBatch) -> (usize, usize) {
        let stats = self.index.dispatch(&batch.0, &self.lag);
        (stats.delivered, stats.lagged)
    }

    /// Subscribers that became lagging so far.
    pub fn lagged(&self) -> usize {
        self.lag.get()
    }
}

/// The revision-ordered ring of batches.
pub struct BenchHistory {
    history: Arc<SharedHistory>,
    writer: HistoryWriter,
}

impl BenchHistory {
    /// An empty ring of `capacity` revisions covering revisions after `revision`.
    pub fn new(capacity: usize, revision: i64) -> Self {
        let mut history = History::new(capacity, usize::MAX);
        history.reset(revision);
        let (history, writer) = SharedHistory::new(history);
        BenchHistory { history, writer }
    }

    pub fn push(&mut self, batch: &BenchBatch) {
        self.writer.write().push(batch.0.clone(), false);
    }

    pub fn floor(&self) -> i64 {
        self.history.read().floor()
    }

    pub fn head(&self) -> i64 {
        self.history.read().head()
    }

    pub fn len(&self) -> usize {
        self.history.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.history.read().len() == 0
    }

    /// Key and value bytes referenced by the ring.
    pub fn bytes(&self) -> usize {
        self.history.read().bytes()
    }

    /// Replays what a lagging subscriber on `key` / `spec` positioned at `after` gets:
    /// the crate's own catch-up into a queue of `capacity`. Returns the deliveries
    /// queued.
    pub fn replay(&self, key: &[u8], spec: &Spec, after: i64, capacity: usize) -> usize {
        let lag = LagCount::default();
        let mailbox = Mailbox::new(filter(key, spec, false), capacity, after, true, &lag);
        // The catch-up fills the queue (as a lagging consumer's first poll does); the
        // deliveries are then dropped in place, as the dispatch benchmark's drains are.
        mailbox.replay(&self.history, &lag);
        mailbox.clear_queued()
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
        self.0.range(&range(key, &Spec::Single)).next().cloned()
    }

    /// Every key-value of `key` / `spec`, cloned out in key order.
    pub fn range(&self, key: &[u8], spec: &Spec) -> Vec<KeyValue> {
        self.0.range(&range(key, spec)).cloned().collect()
    }
}

/// Feeds events to a [`mem_cache`] as if etcd had sent them.
pub struct MemFeed {
    watch: OpenedWatch,
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
        self.watch
            .events(vec![(EventType::Put, kv(key, value, self.revision))]);
        self.revision
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

/// A real [`Cache`] over the crate's fake upstream: it lists `kvs` at `revision`, then
/// receives what the returned [`MemFeed`] sends. Call inside a tokio runtime; the cache
/// is ready once `wait_ready` resolves.
pub fn mem_cache(
    opts: MemCacheOptions,
    kvs: Vec<KeyValue>,
    revision: i64,
) -> Result<(Cache, MemFeed)> {
    let (upstream, _watches) = FakeUpstream::new(&["3.5.13"], &[], revision);
    upstream.set_kvs(kvs, revision);
    let watch = upstream.preset_watch();
    watch.created();
    let config = Config {
        prefix: Bytes::from(opts.prefix),
        subscriber_buffer: opts.subscriber_buffer,
        history_window: opts.history_window,
        max_watchers: opts.max_watchers,
        page_size: 10_000,
        ..Config::default()
    };
    let cache = Cache::start(config, upstream)?;
    Ok((cache, MemFeed { watch, revision }))
}
