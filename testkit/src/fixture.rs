//! The usual start of a cache test: one etcd, a client for the test's own writes, and a ready
//! cache on that client.

use std::time::Duration;

use etcd_cache::{Cache, CacheBuilder};
use etcd_client::Client;

use crate::{blocking, client, EtcdOptions, EtcdServer};

/// How long [`ready_cache`] waits for the first snapshot and the watch.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// One etcd, a plain etcd-client for writes and direct reads, and a ready [`Cache`] built on
/// a clone of that client.
///
/// Destructure it with a named binding for the server, `etcd: _etcd`: the pattern `etcd: _`
/// binds nothing, so the server would be dropped (killed) at the end of the statement.
///
/// ```no_run
/// # async fn example() {
/// use testkit::CacheOnEtcd;
/// let CacheOnEtcd { etcd: _etcd, mut client, cache } =
///     CacheOnEtcd::start(|builder| builder.prefix("/app/").history_window(64)).await;
/// let rev = client.put("/app/k", "v", None).await.unwrap().header().unwrap().revision();
/// cache.wait_for_revision(rev).await.unwrap();
/// # }
/// ```
pub struct CacheOnEtcd {
    /// The server, killed when dropped.
    pub etcd: EtcdServer,
    /// A client of its own for the test (the cache holds a clone, so they share a channel).
    pub client: Client,
    /// The cache, ready.
    pub cache: Cache,
}

impl CacheOnEtcd {
    /// Starts an etcd with default options, connects, and builds a cache configured by
    /// `configure`, waiting until it is ready.
    ///
    /// # Panics
    /// When etcd does not start, the client cannot connect, or the cache fails to build or
    /// to become ready within [`READY_TIMEOUT`].
    pub async fn start(configure: impl FnOnce(CacheBuilder) -> CacheBuilder) -> CacheOnEtcd {
        Self::start_with(EtcdOptions::default(), configure).await
    }

    /// [`start`](Self::start) with an etcd started with `options`.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub async fn start_with(
        options: EtcdOptions,
        configure: impl FnOnce(CacheBuilder) -> CacheBuilder,
    ) -> CacheOnEtcd {
        let (etcd, client) = etcd_with_client(options).await;
        let cache = ready_cache(client.clone(), configure).await;
        CacheOnEtcd {
            etcd,
            client,
            cache,
        }
    }
}

impl std::fmt::Debug for CacheOnEtcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheOnEtcd")
            .field("etcd", &self.etcd)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

/// An etcd started with `options` (off the runtime's threads) and a client connected to it,
/// for a test that writes before its cache exists or puts something between the two.
///
/// # Panics
/// When etcd does not start or the client cannot connect.
pub async fn etcd_with_client(options: EtcdOptions) -> (EtcdServer, Client) {
    let etcd = blocking(move || EtcdServer::start_with(options)).await;
    let client = client(&[etcd.endpoint()]).await;
    (etcd, client)
}

/// A cache on `client`, configured by `configure`, once it is ready.
///
/// # Panics
/// When the cache fails to build or to become ready within [`READY_TIMEOUT`].
pub async fn ready_cache(
    client: Client,
    configure: impl FnOnce(CacheBuilder) -> CacheBuilder,
) -> Cache {
    let cache = configure(Cache::builder(client))
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot build the cache: {e}"));
    cache
        .wait_ready_timeout(READY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("the cache did not become ready: {e}"));
    cache
}
