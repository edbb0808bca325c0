//! The usual start of a cache test: one etcd, a client for the test's own writes, and a ready
//! cache on that client.

use std::time::Duration;

use etcd_cache::{Cache, CacheBuilder};
use etcd_client::Client;

use crate::{blocking, client, EtcdOptions, EtcdServer};

/// How long [`ready_cache`] waits for the first snapshot and the watch.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The start of most cache tests: an etcd with default options, a plain etcd-client for the
/// test's own writes and direct reads, and a [`Cache`] on a clone of that client, configured
/// by `configure` and ready.
///
/// Bind the server to a name, `_etcd`, not to `_`: the pattern `_` binds nothing, so the
/// server would be dropped (killed) at the end of the statement.
///
/// ```no_run
/// # async fn example() {
/// let (_etcd, mut client, cache) =
///     testkit::cache_on_etcd(|builder| builder.prefix("/app/").history_window(64)).await;
/// let rev = client.put("/app/k", "v", None).await.unwrap().header().unwrap().revision();
/// cache.wait_for_revision(rev).await.unwrap();
/// # }
/// ```
///
/// # Panics
/// When etcd does not start, the client cannot connect, or the cache fails to build or to
/// become ready within [`READY_TIMEOUT`].
pub async fn cache_on_etcd(
    configure: impl FnOnce(CacheBuilder) -> CacheBuilder,
) -> (EtcdServer, Client, Cache) {
    let (etcd, client) = etcd_with_client(EtcdOptions::default()).await;
    let cache = ready_cache(client.clone(), configure).await;
    (etcd, client, cache)
}

/// An etcd started with `options` (off the runtime's threads) and a client connected to it:
/// the first half of [`cache_on_etcd`], for a test that writes before its cache exists, puts
/// a [`TcpProxy`](crate::TcpProxy) in between, or needs other etcd options.
///
/// # Panics
/// When etcd does not start or the client cannot connect.
pub async fn etcd_with_client(options: EtcdOptions) -> (EtcdServer, Client) {
    let etcd = blocking(move || EtcdServer::start_with(options)).await;
    let client = client(&[etcd.endpoint()]).await;
    (etcd, client)
}

/// A cache on `client`, configured by `configure`, once it is ready: the second half of
/// [`cache_on_etcd`].
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
