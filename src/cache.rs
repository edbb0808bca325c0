//! The [`Cache`] handle: building the cache, and the public calls, each a short
//! delegation to the flow that does the work (the follower task, the read path, the
//! watch registration).
//!
//! ## Shutdown
//! [`Cache::close`], or dropping the last `Cache` handle, stops the follower task.
//! Every open [`WatchStream`] then yields what was already delivered to it (including a
//! lagging stream's catch-up from the history) and ends with `None`.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{CacheBuilder, Config};
use crate::error::{Error, Result};
use crate::read::{GetOptions, GetResponse};
use crate::shared::Shared;
use crate::stats::CacheStats;
use crate::status::{CacheStatus, StatusStream};
use crate::upstream::etcd::EtcdUpstream;
use crate::upstream::Upstream;
use crate::watch::{WatchOptions, WatchScope, WatchStream};

/// Stops the follower task when the last `Cache` handle goes away.
struct Handle {
    shutdown: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// One upstream watch on a key prefix, a revision-ordered history, and any number of
/// local subscribers and readers. Cheap to clone; all clones share one cache.
///
/// See the [crate docs](crate) for a quick start.
#[derive(Clone)]
pub struct Cache {
    shared: Arc<Shared>,
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field(
                "prefix",
                &String::from_utf8_lossy(&self.shared.config().prefix),
            )
            .field("stats", &self.stats())
            .finish()
    }
}

impl Cache {
    /// Starts configuring a cache over `client`. A client connected with TLS or
    /// credentials needs the same options on [`CacheBuilder::connect_options`] too; or
    /// use [`CacheBuilder::connect`], which connects the client and passes them once.
    ///
    /// Connect `client` with `Client::connect_with_balanced_channel(.., `
    /// [`EtcdChannel::new()`](crate::EtcdChannel)`)`: with `Client::connect`'s HTTP/2
    /// windows a stall of a few seconds while etcd sends many small events makes the
    /// client's own h2 close the connection (`too_many_data_frames`), failing every call
    /// on it. The cache reconnects, warns once and counts
    /// `etcd_cache_upstream_disconnects_total{cause="too_many_data_frames"}`.
    ///
    /// ```no_run
    /// # async fn f() -> etcd_cache::Result<()> {
    /// let client = etcd_client::Client::connect(["127.0.0.1:2379"], None).await?;
    /// let cache = etcd_cache::Cache::builder(client).prefix("/app/").build().await?;
    /// cache.wait_ready().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: etcd_client::Client) -> CacheBuilder {
        CacheBuilder::new(client)
    }

    /// Starts the cache on any upstream (the etcd client, or the fake one in tests).
    pub(crate) fn start(config: Config, upstream: Arc<dyn Upstream>) -> Result<Cache> {
        config.validate()?;
        let (shared, publisher, history) = Shared::new(config, upstream);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let follower = crate::follower::run(shared.clone(), publisher, history, shutdown_rx);
        let task = tokio::spawn(follower);
        Ok(Cache {
            handle: Arc::new(Handle {
                shutdown,
                task: Mutex::new(Some(task)),
            }),
            shared,
        })
    }

    /// Waits until the first snapshot is loaded and the upstream watch is confirmed.
    /// Transient failures are retried meanwhile (see [`status`](Self::status) for the
    /// last one).
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache is closed first; [`Error::Failed`] if etcd
    /// refused the cache for good (permission denied, authentication failed).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// cache.wait_ready().await?;
    /// assert!(cache.is_ready());
    /// # Ok(()) }
    /// ```
    pub async fn wait_ready(&self) -> Result<()> {
        self.shared.view().wait_ready().await
    }

    /// [`wait_ready`](Self::wait_ready) with a time limit.
    ///
    /// # Errors
    /// After `limit`: [`Error::Unavailable`] with the last upstream error if etcd kept
    /// failing (the cache keeps retrying), else [`Error::Timeout`] (still loading, e.g.
    /// a large prefix). [`Error::Closed`]; [`Error::Failed`] if etcd refused the cache
    /// for good (permission denied, bad credentials).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use std::time::Duration;
    /// match cache.wait_ready_timeout(Duration::from_secs(5)).await {
    ///     Ok(()) => println!("ready at {}", cache.revision()),
    ///     Err(etcd_cache::Error::Unavailable { source, .. }) => println!("etcd is down: {source}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait_ready_timeout(&self, limit: Duration) -> Result<()> {
        match tokio::time::timeout(limit, self.wait_ready()).await {
            Ok(result) => result,
            Err(_) => match self.status() {
                CacheStatus::Reconnecting { error, .. } => Err(Error::Unavailable {
                    waited: limit,
                    source: error,
                }),
                _ => Err(Error::timeout("the cache to become ready", limit)),
            },
        }
    }

    /// Where the cache is: loading, ready, reconnecting (with the error), re-listing,
    /// closed or failed. See [`status_stream`](Self::status_stream) to follow changes.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) {
    /// use etcd_cache::CacheStatus;
    /// match cache.status() {
    ///     CacheStatus::Ready => println!("serving"),
    ///     CacheStatus::Reconnecting { error, attempts } => {
    ///         println!("etcd unreachable ({attempts} attempts): {error}")
    ///     }
    ///     other => println!("{other:?}"),
    /// }
    /// # }
    /// ```
    pub fn status(&self) -> CacheStatus {
        self.shared.view().status().state
    }

    /// The status now, then every change of it (see [`StatusStream`]): a health
    /// endpoint or an alert can follow outages instead of polling
    /// [`is_ready`](Self::is_ready). During an outage the cache's own
    /// [`WatchStream`]s stay open and resume by themselves when etcd is back; this is
    /// the difference from a direct etcd watch, whose stream breaks.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) {
    /// let mut statuses = cache.status_stream();
    /// while let Some(status) = statuses.next().await {
    ///     println!("cache status: {status:?}");
    /// }
    /// # }
    /// ```
    pub fn status_stream(&self) -> StatusStream {
        self.shared.view().status_stream()
    }

    /// The etcd server version of each member, as last probed (`unreachable:<url>`
    /// for a member whose version could not be learned).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// for v in cache.server_versions() {
    ///     println!("member version: {v}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn server_versions(&self) -> Vec<String> {
        self.shared.counters().versions()
    }

    /// True while the cache can vouch for its data: loaded and following etcd.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// if !cache.is_ready() {
    ///     println!("serving possibly stale data: {:?}", cache.status());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_ready(&self) -> bool {
        self.shared.view().is_ready()
    }

    /// Newest revision applied (0 before the first snapshot).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// println!("the cache is at revision {}", cache.revision());
    /// # Ok(()) }
    /// ```
    pub fn revision(&self) -> i64 {
        self.shared.view().revision()
    }

    /// Whether etcd has compacted `revision`: `Some(etcd's compact revision)` when etcd
    /// would refuse a read or a watch at it, `None` when it would answer (0 and
    /// revisions etcd has not reached are never compacted). One count-only read of etcd
    /// at `revision`, sent after this call and shared with the calls made meanwhile;
    /// below a compaction the cache already knows of, no round trip. It works whatever
    /// [`CacheBuilder::follow_etcd_compaction`](crate::CacheBuilder::follow_etcd_compaction)
    /// says (with it on, `get` and `watch` at a past revision ask this themselves).
    ///
    /// # Errors
    /// [`Error::Timeout`] after `consistent_read_timeout`; [`Error::Transport`] with
    /// etcd's error when etcd could not answer; [`Error::Closed`].
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// if let Some(compact_revision) = cache.compacted(40).await? {
    ///     println!("etcd compacted revision 40; the oldest it serves is {compact_revision}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn compacted(&self, revision: i64) -> Result<Option<i64>> {
        Ok(self.check_compaction(revision).await?.compacted())
    }

    /// [`compacted`](Self::compacted), with etcd's revision when etcd serves `revision`
    /// ([`CompactionCheck::Readable`](crate::CompactionCheck::Readable)). A front that
    /// answers a read at `revision` from the cache after this check reports that
    /// revision in the answer's header: the check and the header are then one decision,
    /// which a compaction finishing after the check cannot contradict (a header above a
    /// compaction that covers the read revision would be a state in which etcd refuses
    /// the read).
    ///
    /// # Errors
    /// As [`compacted`](Self::compacted).
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use etcd_cache::CompactionCheck;
    /// match cache.check_compaction(40).await? {
    ///     CompactionCheck::Compacted(oldest) => println!("compacted; etcd serves {oldest} on"),
    ///     CompactionCheck::Readable { etcd_revision } => {
    ///         println!("readable; etcd was at {etcd_revision} when it said so")
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check_compaction(&self, revision: i64) -> Result<crate::CompactionCheck> {
        let status = self.shared.view().status();
        if status.closed() {
            return Err(status.closed_error());
        }
        self.shared.etcd_compaction_check(revision).await
    }

    /// Resolves once [`revision`](Self::revision) `>= rev`. While it waits, the cache
    /// asks etcd for progress (on servers where that answer can be trusted).
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closes first. Wrap it in `tokio::time::timeout` to
    /// bound the wait.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use std::time::Duration;
    /// let written = 42; // e.g. the header revision of a put
    /// tokio::time::timeout(Duration::from_secs(1), cache.wait_for_revision(written))
    ///     .await
    ///     .map_err(|_| etcd_cache::Error::Timeout)??;
    /// # Ok(()) }
    /// ```
    pub async fn wait_for_revision(&self, rev: i64) -> Result<()> {
        self.shared.wait_for_revision(rev).await
    }

    /// Watches `key` (and, with the options, a range) from the cache. Mirrors
    /// `etcd_client::Client::watch`; see [`WatchOptions`] for the forms. More watches
    /// can be added to the stream with [`WatchStream::watch`].
    ///
    /// The first response has `created() == true` and the watch's id. A start revision
    /// below the window gets a canceled response with `compact_revision` set (as etcd
    /// sends for a compacted revision), and then the watch ends.
    ///
    /// It returns an open watch, as `etcd_client::Client::watch` returns once etcd has
    /// created it: a watch from now has learned the cluster's revision (one round trip,
    /// shared with every watch and read waiting), and a write made after this returns is
    /// delivered. To add many watches without a round trip each, add them to one stream
    /// ([`watch_stream`](Self::watch_stream)): [`WatchStream::watch`] returns at once.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use etcd_cache::WatchOptions;
    ///
    /// let mut stream = cache.watch("/app/", Some(WatchOptions::new().with_prefix())).await?;
    /// while let Some(resp) = stream.message().await? {
    ///     for ev in resp.events() {
    ///         println!("{:?} {:?}", ev.event_type(), ev.kv().map(|kv| kv.key()));
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::WatchLimit`],
    /// [`Error::NotReady`] before the first snapshot is loaded (await
    /// [`wait_ready`](Self::wait_ready) first), [`Error::Closed`], [`Error::Failed`].
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream> {
        let mut stream = self.watch_stream();
        stream.watch_open(key, options).await?;
        Ok(stream)
    }

    /// An empty [`WatchStream`]: add watches with [`WatchStream::watch`]. Split it
    /// ([`WatchStream::split`]) to add watches from one task while another reads.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// let mut stream = cache.watch_stream();
    /// for key in ["/app/a", "/app/b"] {
    ///     stream.watch(key, None).await?;
    /// }
    /// while let Some(resp) = stream.message().await? {
    ///     println!("watch {}: {} events", resp.watch_id(), resp.events().len());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn watch_stream(&self) -> WatchStream {
        WatchStream::empty(self.shared.clone(), None)
    }

    /// Reads from the cache. Mirrors `etcd_client::Client::get`; see [`GetOptions`].
    ///
    /// Without `with_serializable()` the read is linearizable, like etcd's default: it
    /// reflects every write that completed before the call.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::Compacted`],
    /// [`Error::FutureRevision`], [`Error::Timeout`] / [`Error::NotReady`] (with
    /// [`ReadFallback::Error`](crate::ReadFallback::Error)), [`Error::Upstream`],
    /// [`Error::Closed`].
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use etcd_cache::{GetOptions, SortOrder, SortTarget};
    /// let one = cache.get("/app/config", None).await?;
    /// let fast = cache.get("/app/config", Some(GetOptions::new().with_serializable())).await?;
    /// let newest = cache
    ///     .get("/app/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Mod, SortOrder::Descend).with_limit(5)))
    ///     .await?;
    /// println!("{} {} {}", one.count(), fast.count(), newest.kvs().len());
    /// # Ok(()) }
    /// ```
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        let key = key.into();
        crate::read::get(&self.shared, &key, options.unwrap_or_default()).await
    }

    /// A handle with its own watch budget: at most `max_watchers` open watches through
    /// it, all cancelled when it is dropped. Give one to each tenant or connection.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// let tenant = cache.scope(10);
    /// let _stream = tenant.watch("/app/tenant-1/", Some(etcd_cache::WatchOptions::new().with_prefix())).await?;
    /// assert_eq!(tenant.open(), 1);
    /// # Ok(()) }
    /// ```
    pub fn scope(&self, max_watchers: usize) -> WatchScope {
        WatchScope::new(self.shared.clone(), self.handle.clone(), max_watchers)
    }

    /// Counters: revision, watchers, lagging, history span, store size, connections.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// let s = cache.stats();
    /// println!(
    ///     "revision {} ({} behind), {} watchers ({} lagging), {} keys, last heard {:?} ago",
    ///     s.revision, s.behind, s.watchers, s.lagging, s.keys, s.since_last_heard
    /// );
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> CacheStats {
        self.shared.stats()
    }

    /// Whether etcd's answers to a stream-level `RequestProgress` are trusted: every
    /// member runs a release without etcd#15220 and etcd#17507 (3.4.31+, 3.5.13+, 3.6+).
    /// The same as [`CacheStats::progress_trusted`], without gathering the rest.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// println!("progress answers trusted: {}", cache.progress_trusted());
    /// # Ok(()) }
    /// ```
    pub fn progress_trusted(&self) -> bool {
        self.shared.counters().progress_trusted()
    }

    /// Open watches.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// println!("{} watches open", cache.watcher_count());
    /// # Ok(()) }
    /// ```
    pub fn watcher_count(&self) -> usize {
        self.shared.subscribers().watchers()
    }

    /// Watches currently lagging.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// println!("{} watches catching up", cache.lagging_count());
    /// # Ok(()) }
    /// ```
    pub fn lagging_count(&self) -> usize {
        self.shared.subscribers().lagging()
    }

    /// `(oldest replayable start revision, newest revision covered)`.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// let (floor, head) = cache.history_span();
    /// println!("a watch can start anywhere in {floor}..={}", head + 1);
    /// # Ok(()) }
    /// ```
    pub fn history_span(&self) -> (i64, i64) {
        let h = self.shared.history().read();
        (h.floor(), h.head())
    }

    /// How long a consistent read may wait (`CacheBuilder::consistent_read_timeout`).
    pub(crate) fn consistent_read_timeout(&self) -> Duration {
        self.shared.config().consistent_read_timeout
    }

    /// The key prefix the cache holds.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// assert!(cache.prefix().starts_with(b"/"));
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self) -> &[u8] {
        &self.shared.config().prefix
    }

    /// Checks that the keys under `prefix` are inside the cache's range, as a read or a
    /// watch of them is checked ([`Error::OutOfRange`] otherwise).
    pub(crate) fn check_prefix(&self, prefix: &[u8]) -> Result<()> {
        crate::key_range::KeyRange::new(prefix, &crate::key_range::RangeSpec::Prefix)?
            .check_within(self.shared.range())
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Test hook (feature `unstable-test-hooks`): writes `kv` into the cache's store behind
    /// etcd's back, as a bug would, so that a test can see the consistency check find
    /// and repair it. Not for production use.
    #[cfg(feature = "unstable-test-hooks")]
    #[doc(hidden)]
    pub fn corrupt_store_for_test(&self, kv: crate::KeyValue) {
        self.shared.hooks().corrupt(kv);
    }

    /// Stops the follower task and ends every stream after what it was already
    /// delivered. Idempotent; other handles see [`Error::Closed`] afterwards.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// cache.close().await;
    /// assert!(matches!(cache.get("/app/a", None).await, Err(etcd_cache::Error::Closed)));
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) {
        let _ = self.handle.shutdown.send(true);
        let task = self.handle.task.lock().take();
        match task {
            Some(task) => {
                let _ = task.await;
            }
            None => self.shared.view().wait_closed().await,
        }
    }
}

impl CacheBuilder {
    /// Connects an `etcd_client::Client` to `endpoints` with `options` and starts
    /// configuring a cache over it that uses the same options for its own connections
    /// (the per-member version probe): TLS and credentials are given once. The client's
    /// HTTP/2 windows are [`EtcdChannel`](crate::EtcdChannel)'s, sized so that a
    /// process that stalls for seconds while etcd sends many small events keeps its
    /// connection (see docs/RELIABILITY.md). The same as
    /// `Cache::builder(Client::connect_with_balanced_channel(endpoints, options.clone(),
    /// EtcdChannel::new()).await?).connect_options(options)`; a later
    /// [`connect_options`](Self::connect_options) replaces the probe's options.
    ///
    /// # Errors
    /// [`Error::Upstream`] with etcd-client's error: an invalid endpoint, or (with
    /// credentials) etcd refused them or could not be reached to authenticate.
    ///
    /// ```no_run
    /// # async fn f() -> etcd_cache::Result<()> {
    /// use etcd_cache::etcd_client::ConnectOptions;
    ///
    /// let options = ConnectOptions::new().with_user("app", "secret").with_auto_token_refresh(true);
    /// let cache = etcd_cache::CacheBuilder::connect(["127.0.0.1:2379"], Some(options))
    ///     .await?
    ///     .prefix("/app/")
    ///     .build()
    ///     .await?;
    /// cache.wait_ready().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: Option<etcd_client::ConnectOptions>,
    ) -> Result<CacheBuilder> {
        let client = etcd_client::Client::connect_with_balanced_channel(
            endpoints,
            options.clone(),
            crate::EtcdChannel::new(),
        )
        .await?;
        let mut builder = CacheBuilder::new(client);
        builder.config.connect_options = options;
        builder.config.own_channel = true;
        Ok(builder)
    }

    /// Validates the configuration and spawns the follower task. It does not wait for
    /// the first snapshot: use [`Cache::wait_ready`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad value.
    ///
    /// # Panics
    /// If called outside a tokio runtime.
    pub async fn build(mut self) -> Result<Cache> {
        let client = self.client.take().ok_or_else(|| Error::InvalidConfig {
            reason: "builder used twice".into(),
        })?;
        let connect_options = self.config.connect_options.clone();
        Cache::start(
            self.config,
            Arc::new(EtcdUpstream::new(client, connect_options)),
        )
    }
}
