//! [`WatchScope`]: a watch budget for one tenant or connection.

use std::sync::Arc;

use super::options::WatchOptions;
use super::stream::WatchStream;
use crate::error::Result;
use crate::shared::Shared;
use crate::subscribers::Scope;

/// A watch budget for one tenant or connection, made by
/// [`Cache::scope`](crate::Cache::scope). A handle: it keeps the cache running.
///
/// At most its limit of watches are open through it at once (one more fails with
/// [`Error::WatchLimit`](crate::Error::WatchLimit) naming this limit), and they also
/// count against the cache's own limit. Dropping the scope ends every watch opened
/// through it: their streams end with `None` after what was already delivered. A
/// service that re-issues watches in a reconnect loop drops the old scope and makes a
/// new one, and leaks nothing.
///
/// ```no_run
/// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
/// let tenant = cache.scope(100);
/// let mut stream = tenant.watch("/app/tenant-a/", Some(etcd_cache::WatchOptions::new().with_prefix())).await?;
/// assert_eq!(tenant.open(), 1);
/// drop(tenant); // ends the stream's watches
/// assert!(stream.message().await?.unwrap().created());
/// # Ok(()) }
/// ```
pub struct WatchScope {
    shared: Arc<Shared>,
    scope: Arc<Scope>,
    /// Keeps the cache running while the scope exists (the cache's handle).
    _cache: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for WatchScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchScope")
            .field("limit", &self.scope.limit())
            .field("open", &self.open())
            .finish()
    }
}

impl WatchScope {
    pub(crate) fn new(
        shared: Arc<Shared>,
        cache: Arc<dyn std::any::Any + Send + Sync>,
        max_watchers: usize,
    ) -> Self {
        WatchScope {
            scope: shared.subscribers().scope(max_watchers),
            shared,
            _cache: cache,
        }
    }

    /// Like [`Cache::watch`](crate::Cache::watch), counted against this scope. Watches
    /// added later to the returned stream count against it too.
    ///
    /// # Errors
    /// As [`Cache::watch`](crate::Cache::watch).
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream> {
        let mut stream = self.watch_stream();
        stream.watch_open(key, options).await?;
        Ok(stream)
    }

    /// Like [`Cache::watch_stream`](crate::Cache::watch_stream): an empty stream whose
    /// watches count against this scope.
    pub fn watch_stream(&self) -> WatchStream {
        WatchStream::empty(self.shared.clone(), Some(self.scope.clone()))
    }

    /// Watches open through this scope.
    pub fn open(&self) -> usize {
        self.scope.open()
    }

    /// This scope's limit.
    pub fn limit(&self) -> usize {
        self.scope.limit()
    }
}

impl Drop for WatchScope {
    fn drop(&mut self) {
        self.scope.cancel_all(self.shared.subscribers());
    }
}
