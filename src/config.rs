//! [`CacheBuilder`]: every knob, its default as a named constant, and validation.

use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};

/// Default number of revisions (event batches) kept for replay.
pub const DEFAULT_HISTORY_WINDOW: usize = 2048;
/// Default [`CacheBuilder::history_bytes`]: the key and value bytes (values and previous
/// values) the history holds at most, 128 MiB.
pub const DEFAULT_HISTORY_BYTES: usize = 128 * 1024 * 1024;
/// Default number of responses buffered per subscriber before it is marked lagging.
pub const DEFAULT_SUBSCRIBER_BUFFER: usize = 128;
/// Default limit on open watches per cache.
pub const DEFAULT_MAX_WATCHERS: usize = 1_000_000;
/// Default number of keys per page of the initial list.
pub const DEFAULT_PAGE_SIZE: i64 = 1000;
/// Default first reconnect delay.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Default longest reconnect delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Default interval of local progress responses to subscribers that asked for them.
pub const DEFAULT_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(5);
/// Default interval of `RequestProgress` on the upstream watch while a read waits.
pub const DEFAULT_PROGRESS_REQUEST_INTERVAL: Duration = Duration::from_millis(100);
/// Default silence on the upstream watch after which the connection is probed.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a consistent read waits for the cache before [`ReadFallback`] applies.
pub const DEFAULT_CONSISTENT_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest interval or timeout accepted (a year): longer values would overflow
/// timer arithmetic. Use it to mean "practically never".
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a consistent read does when the cache cannot answer it correctly in time
/// (or at all, while the cache is not ready).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReadFallback {
    /// Read from etcd instead (the default: a consistent read never fails merely
    /// because the cache is slow).
    #[default]
    Etcd,
    /// Fail with [`Error::Timeout`] (or [`Error::NotReady`]).
    Error,
}

/// Whether etcd's answers to `RequestProgress` may be trusted to advance the cache.
///
/// etcd before 3.4.31 / 3.5.13 can answer a progress request with a revision ahead of
/// events it has not sent yet (etcd#15220, etcd#17507). `Auto` asks every member for
/// its version (Status RPC, with [`CacheBuilder::connect_options`]) in the background:
/// after each reconnect (answers are untrusted until then) and every 30 s, so a rolling
/// upgrade reaches the fast path without a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProgressTrust {
    /// Detect from the server versions (the default).
    #[default]
    Auto,
    /// Never trust stream-level progress answers (always correct, slower reads).
    Never,
    /// Trust them whatever the version says (only for servers known to be fixed).
    Always,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) prefix: Bytes,
    pub(crate) history_window: usize,
    pub(crate) history_bytes: usize,
    pub(crate) keep_history_while_lagging: bool,
    pub(crate) subscriber_buffer: usize,
    pub(crate) max_watchers: usize,
    pub(crate) page_size: i64,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) progress_notify_interval: Duration,
    pub(crate) progress_request_interval: Duration,
    pub(crate) consistent_read_timeout: Duration,
    pub(crate) upstream_idle_timeout: Duration,
    pub(crate) linearizable_watch_start: bool,
    pub(crate) read_fallback: ReadFallback,
    pub(crate) progress_trust: ProgressTrust,
    /// How the per-member version probe connects (the user's TLS and credentials).
    pub(crate) connect_options: Option<etcd_client::ConnectOptions>,
    /// The period of the consistency check, if enabled.
    pub(crate) consistency_check: Option<Duration>,
    /// Reads and watches at a revision etcd compacted are refused, as etcd refuses them.
    pub(crate) follow_etcd_compaction: bool,
    /// The client was connected by [`CacheBuilder::connect`], with
    /// [`EtcdChannel`](crate::EtcdChannel)'s HTTP/2 windows (else it is the user's).
    pub(crate) own_channel: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            prefix: Bytes::new(),
            history_window: DEFAULT_HISTORY_WINDOW,
            history_bytes: DEFAULT_HISTORY_BYTES,
            keep_history_while_lagging: false,
            subscriber_buffer: DEFAULT_SUBSCRIBER_BUFFER,
            max_watchers: DEFAULT_MAX_WATCHERS,
            page_size: DEFAULT_PAGE_SIZE,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
            progress_notify_interval: DEFAULT_PROGRESS_NOTIFY_INTERVAL,
            progress_request_interval: DEFAULT_PROGRESS_REQUEST_INTERVAL,
            consistent_read_timeout: DEFAULT_CONSISTENT_READ_TIMEOUT,
            upstream_idle_timeout: DEFAULT_UPSTREAM_IDLE_TIMEOUT,
            linearizable_watch_start: true,
            read_fallback: ReadFallback::Etcd,
            progress_trust: ProgressTrust::Auto,
            connect_options: None,
            follow_etcd_compaction: true,
            consistency_check: None,
            own_channel: false,
        }
    }
}

impl Config {
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidConfig { reason });
        if self.history_window == 0 {
            return bad("history_window must be at least 1 revision".into());
        }
        if self.history_bytes == 0 {
            return bad("history_bytes must be at least 1 byte".into());
        }
        if self.subscriber_buffer == 0 {
            return bad("subscriber_buffer must be at least 1 response".into());
        }
        if self.max_watchers == 0 {
            return bad("max_watchers must be at least 1".into());
        }
        if self.page_size <= 0 {
            return bad(format!(
                "page_size must be at least 1 key, got {}",
                self.page_size
            ));
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return bad(format!(
                "backoff must satisfy 0 < initial ({:?}) <= max ({:?})",
                self.backoff_initial, self.backoff_max
            ));
        }
        if self.backoff_max > MAX_DURATION {
            return bad(format!("backoff max must be at most {MAX_DURATION:?}"));
        }
        if let Some(d) = self.consistency_check {
            if d.is_zero() || d > MAX_DURATION {
                return bad(format!(
                    "consistency_check must be greater than zero and at most {MAX_DURATION:?}, got {d:?}"
                ));
            }
        }
        for (name, d) in [
            ("progress_notify_interval", self.progress_notify_interval),
            ("progress_request_interval", self.progress_request_interval),
            ("consistent_read_timeout", self.consistent_read_timeout),
            ("upstream_idle_timeout", self.upstream_idle_timeout),
        ] {
            if d.is_zero() || d > MAX_DURATION {
                return bad(format!(
                    "{name} must be greater than zero and at most {MAX_DURATION:?}, got {d:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Configures and starts a [`Cache`](crate::Cache). Made by [`Cache::builder`](crate::Cache::builder).
///
/// ```no_run
/// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
/// let cache = etcd_cache::Cache::builder(client)
///     .prefix("/app/")
///     .history_window(4096)
///     .subscriber_buffer(64)
///     .build()
///     .await?;
/// cache.wait_ready().await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until build() is awaited"]
pub struct CacheBuilder {
    pub(crate) client: Option<etcd_client::Client>,
    pub(crate) config: Config,
}

impl std::fmt::Debug for CacheBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("config", &self.config)
            .finish()
    }
}

impl CacheBuilder {
    pub(crate) fn new(client: etcd_client::Client) -> Self {
        CacheBuilder {
            client: Some(client),
            config: Config::default(),
        }
    }

    /// The key prefix the cache holds. Default `""`: the whole keyspace.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).prefix("/app/").build().await?;
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.config.prefix = Bytes::from(prefix.into());
        self
    }

    /// Revisions (event batches) kept for replay and historical reads. Default
    /// [`DEFAULT_HISTORY_WINDOW`]. Must be at least 1.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).history_window(4096).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn history_window(mut self, revisions: usize) -> Self {
        self.config.history_window = revisions;
        self
    }

    /// Key and value bytes (events' values and previous values) the history holds at most,
    /// beside the [`history_window`](Self::history_window) in revisions: the oldest
    /// revisions go first when either is reached, and the newest revision always stays.
    /// Default [`DEFAULT_HISTORY_BYTES`] (128 MiB). Must be at least 1. Without it a
    /// writer of large values could make the window cost `history_window` times the
    /// largest transaction; the worst case is now this budget plus about 200 bytes per
    /// event of bookkeeping. Watched in `CacheStats::history_bytes` and the metric
    /// `etcd_cache_history_bytes`.
    ///
    /// ```no_run
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client)
    ///     .history_bytes(64 * 1024 * 1024)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn history_bytes(mut self, bytes: usize) -> Self {
        self.config.history_bytes = bytes;
        self
    }

    /// While a subscriber lags (its queue filled and it catches up from the history),
    /// the history keeps revisions beyond [`history_window`](Self::history_window), up
    /// to [`history_bytes`](Self::history_bytes), and trims back to the window once no
    /// subscriber lags. A burst longer than the window then costs memory (within the
    /// byte budget) instead of the compaction signal for every subscriber it outran:
    /// they catch up from memory, and only one that falls behind the byte budget gets
    /// the signal. Default `false`: the window is `history_window` revisions whatever
    /// the subscribers do. etcd-cache-proxy turns it on.
    ///
    /// ```no_run
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client)
    ///     .history_window(2048)
    ///     .history_bytes(256 * 1024 * 1024)
    ///     .keep_history_while_lagging(true)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn keep_history_while_lagging(mut self, keep: bool) -> Self {
        self.config.keep_history_while_lagging = keep;
        self
    }

    /// Responses buffered per subscriber before it becomes lagging. Default
    /// [`DEFAULT_SUBSCRIBER_BUFFER`]. Must be at least 1.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).subscriber_buffer(64).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn subscriber_buffer(mut self, responses: usize) -> Self {
        self.config.subscriber_buffer = responses;
        self
    }

    /// Open watches allowed on the cache; one more fails with [`Error::WatchLimit`].
    /// Default [`DEFAULT_MAX_WATCHERS`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).max_watchers(10_000).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn max_watchers(mut self, n: usize) -> Self {
        self.config.max_watchers = n;
        self
    }

    /// Keys per page of the initial (and any re-) list. Default [`DEFAULT_PAGE_SIZE`].
    ///
    /// A page is one message from etcd and is held whole while it is inserted: with
    /// values of up to etcd's 1.5 MiB, a page of 1,000 keys can be 1.5 GiB. The cache takes
    /// messages of any size up to 2 GiB (as etcd's Go client does), so a smaller page
    /// only bounds that peak; it does not make a list possible.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).page_size(500).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn page_size(mut self, keys: i64) -> Self {
        self.config.page_size = keys;
        self
    }

    /// Reconnect backoff: exponential from `initial` to `max`, with full jitter.
    /// Defaults [`DEFAULT_BACKOFF_INITIAL`], [`DEFAULT_BACKOFF_MAX`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).backoff(Duration::from_millis(100), Duration::from_secs(10)).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn backoff(mut self, initial: std::time::Duration, max: std::time::Duration) -> Self {
        self.config.backoff_initial = initial;
        self.config.backoff_max = max;
        self
    }

    /// Interval of the progress responses sent to watches made `with_progress_notify`.
    /// Default [`DEFAULT_PROGRESS_NOTIFY_INTERVAL`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).progress_notify_interval(Duration::from_secs(1)).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn progress_notify_interval(mut self, every: std::time::Duration) -> Self {
        self.config.progress_notify_interval = every;
        self
    }

    /// Interval of `RequestProgress` on the upstream watch while at least one read
    /// waits. Default [`DEFAULT_PROGRESS_REQUEST_INTERVAL`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).progress_request_interval(Duration::from_millis(50)).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn progress_request_interval(mut self, every: std::time::Duration) -> Self {
        self.config.progress_request_interval = every;
        self
    }

    /// How long a consistent read waits for the cache before [`ReadFallback`] applies.
    /// Default [`DEFAULT_CONSISTENT_READ_TIMEOUT`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).consistent_read_timeout(Duration::from_secs(1)).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn consistent_read_timeout(mut self, wait: std::time::Duration) -> Self {
        self.config.consistent_read_timeout = wait;
        self
    }

    /// After this much silence on the upstream watch, the cache checks the connection
    /// with one cheap unary call (a count-only read) and reconnects if it fails within
    /// 5 s. This catches connections that died without a reset when the client has no
    /// keep-alive configured. Default [`DEFAULT_UPSTREAM_IDLE_TIMEOUT`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).upstream_idle_timeout(Duration::from_secs(10)).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn upstream_idle_timeout(mut self, silence: std::time::Duration) -> Self {
        self.config.upstream_idle_timeout = silence;
        self
    }

    /// Whether a watch without a start revision starts after the *cluster's* current
    /// revision (one count-only round trip, shared by every watch and consistent read
    /// waiting at the time, as etcd itself starts it: no write that completed before
    /// `watch()` was called is delivered), or after the cache's own
    /// revision (no round trip; a write the cache had not applied yet when `watch()` was
    /// called is delivered too). Default `true`. While the cache is not ready, or if the
    /// round trip fails, the cache's revision is used.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).linearizable_watch_start(false).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn linearizable_watch_start(mut self, enabled: bool) -> Self {
        self.config.linearizable_watch_start = enabled;
        self
    }

    /// What a consistent read does when the cache cannot serve it in time.
    /// Default [`ReadFallback::Etcd`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).read_fallback(etcd_cache::ReadFallback::Error).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn read_fallback(mut self, fallback: ReadFallback) -> Self {
        self.config.read_fallback = fallback;
        self
    }

    /// Whether etcd's `RequestProgress` answers are trusted. Default
    /// [`ProgressTrust::Auto`] (by server version).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client).progress_trust(etcd_cache::ProgressTrust::Never).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn progress_trust(mut self, trust: ProgressTrust) -> Self {
        self.config.progress_trust = trust;
        self
    }

    /// The options the cache's own connections use: the per-member version probe
    /// connects to each member's client URL on its own, and needs the same TLS
    /// settings and credentials as the client given to [`Cache::builder`]. Pass the
    /// options that client was connected with. Without them, members behind TLS or
    /// auth read as of unknown version: the cache is then correct but slower (progress
    /// answers untrusted), and `CacheStats::unknown_versions` and a warning say so.
    /// The probe's connect and request timeouts are its own (2 s).
    /// [`CacheBuilder::connect`] connects the client and sets these options in one call.
    ///
    /// ```no_run
    /// # async fn f() -> etcd_cache::Result<()> {
    /// let opts = etcd_client::ConnectOptions::new()
    ///     .with_user("app", "secret")
    ///     .with_auto_token_refresh(true);
    /// let client = etcd_client::Client::connect(["https://etcd:2379"], Some(opts.clone())).await?;
    /// let cache = etcd_cache::Cache::builder(client)
    ///     .prefix("/app/")
    ///     .connect_options(opts)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Cache::builder`]: crate::Cache::builder
    pub fn connect_options(mut self, options: etcd_client::ConnectOptions) -> Self {
        self.config.connect_options = Some(options);
        self
    }

    /// Checks the cache against etcd every `period` (off by default): reads etcd at a
    /// revision the cache holds (its newest), page by page (`page_size` keys, at most
    /// 50 pages a second), compares the keys and mod revisions with the cache's, and on
    /// a mismatch logs the differing keys, counts it (`CacheStats::
    /// consistency_mismatches`) and repairs the store by listing again at the same
    /// revision (every subscriber continues; if etcd compacted that revision the cache
    /// re-lists at the latest, and subscribers behind get the compaction signal).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client)
    ///     .consistency_check(Duration::from_secs(600))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn consistency_check(mut self, period: std::time::Duration) -> Self {
        self.config.consistency_check = Some(period);
        self
    }

    /// Whether reads and watches at a past revision follow etcd's compaction (on by
    /// default). On, the cache answers as etcd would: a read at a revision etcd has
    /// compacted gets [`Error::Compacted`](crate::Error::Compacted) with etcd's compact
    /// revision, and a watch from one gets the canceled response with
    /// `compact_revision`, even where the cache's own window still holds it. A
    /// consistent read or a watch at a past revision asks etcd (one count-only read at
    /// that revision, sent after the call and shared with the calls waiting with it,
    /// beside the read's own revision probe); a serializable read uses what the cache
    /// knows, which a check every 5 s keeps current. Off, the cache's only floor is its
    /// window, and past revisions cost etcd nothing (what etcd-cache-proxy does: it asks
    /// [`Cache::compacted`](crate::Cache::compacted) itself and lets etcd answer).
    ///
    /// ```no_run
    /// # async fn f(client: etcd_client::Client) -> etcd_cache::Result<()> {
    /// let cache = etcd_cache::Cache::builder(client)
    ///     .follow_etcd_compaction(false)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn follow_etcd_compaction(mut self, follow: bool) -> Self {
        self.config.follow_etcd_compaction = follow;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_values_are_rejected_with_their_name() {
        let mut c = Config::default();
        assert!(c.validate().is_ok());
        c.history_window = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("history_window"));
        let c = Config {
            subscriber_buffer: 0,
            ..Config::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("subscriber_buffer"));
        let c = Config {
            backoff_max: Duration::from_millis(1),
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("backoff"));
    }
}
