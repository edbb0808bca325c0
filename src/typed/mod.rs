//! Typed views: each value under a prefix decoded once into an `Arc<T>`, shared by every
//! read, every watch and every index of the view.
//!
//! The decoded object is kept beside the [`KeyValue`] it came from (a memo in the
//! key-value's one shared allocation), so the store, the history, every delivery and
//! every read that hold that key-value share one decode: a value is decoded once, by
//! whichever reader or watcher meets it first, whatever the number of subscribers.
//!
//! - `codec.rs`: the [`Codec`] trait, JSON and protobuf codecs, [`DecodeError`].
//! - `source.rs`: what every part of a view shares (the cache, the prefix, the codec
//!   and the decode through the key-value's memo), [`TypedKv`], [`TypedList`].
//! - `watch.rs`: [`TypedWatchStream`], a cache watch whose events carry objects.
//! - `index.rs`: the indexes a view keeps (a task that follows the view with a
//!   [`ListWatch`] and publishes persistent maps).
//!
//! This file holds the builder and the view; the files above never import it.

pub(crate) mod codec;
pub(crate) mod index;
pub(crate) mod source;
pub(crate) mod watch;

use std::fmt;
use std::sync::Arc;

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::kv::KeyValue;
use crate::list_watch::ListWatch;
use crate::read::GetOptions;
use crate::watch::WatchOptions;
use source::Source;

#[cfg(feature = "json")]
pub use codec::JsonCodec;
#[cfg(feature = "prost")]
pub use codec::ProstCodec;
pub use codec::{decode_with, BoxError, Codec, DecodeError, FnCodec};
pub use source::{Decoded, TypedKv, TypedList};
pub use watch::{TypedEvent, TypedWatchResponse, TypedWatchStream};

impl Cache {
    /// A typed view of the cache (or of a prefix inside it): each value decoded once
    /// by `codec` into an `Arc` shared by every read, watch, list-watch stream and
    /// index of the view. See [`TypedView`] and docs/TYPED.md.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// let numbers = cache
    ///     .typed(etcd_cache::decode_with(|kv: &etcd_cache::KeyValue| Ok(kv.value_str()?.parse::<i64>()?)))
    ///     .prefix("/app/counters/")
    ///     .build()?;
    /// for item in numbers.list().await?.items() {
    ///     println!("{:?} = {:?}", item.key(), item.value());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn typed<C: Codec>(&self, codec: C) -> TypedViewBuilder<C> {
        TypedViewBuilder::new(self.clone(), codec)
    }
}

/// Builds a [`TypedView`]: made by [`Cache::typed`].
pub struct TypedViewBuilder<C: Codec> {
    cache: Cache,
    codec: C,
    prefix: Vec<u8>,
    indexes: Vec<index::IndexSpec<C::Value>>,
}

impl<C: Codec> fmt::Debug for TypedViewBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedViewBuilder")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("indexes", &self.indexes.len())
            .finish()
    }
}

impl<C: Codec> TypedViewBuilder<C> {
    pub(crate) fn new(cache: Cache, codec: C) -> Self {
        let prefix = cache.prefix().to_vec();
        TypedViewBuilder {
            cache,
            codec,
            prefix,
            indexes: Vec::new(),
        }
    }

    /// Narrows the view to the keys under `prefix` (inside the cache's prefix; the
    /// default is the cache's prefix).
    pub fn prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Declares an index: `keys` gives each object's index keys (zero or more), and
    /// [`TypedView::by_index`] finds the objects by one of them. Objects whose value
    /// does not decode are in no index.
    pub fn index<F>(mut self, name: impl Into<String>, keys: F) -> Self
    where
        F: Fn(&C::Value) -> Vec<String> + Send + Sync + 'static,
    {
        self.indexes.push(index::IndexSpec::new(name.into(), keys));
        self
    }

    /// The view. With indexes, a task follows the view to keep them (it needs a tokio
    /// runtime, and ends with the last handle of the view).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the prefix is outside the cache's prefix;
    /// [`Error::InvalidConfig`] for two indexes with one name, or indexes without a
    /// tokio runtime to run on.
    pub fn build(self) -> Result<TypedView<C::Value>> {
        let cache_prefix = self.cache.prefix();
        if !self.prefix.starts_with(cache_prefix) {
            return Err(out_of_range(&self.prefix, cache_prefix));
        }
        let mut names: Vec<&str> = self.indexes.iter().map(|i| i.name()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::InvalidConfig {
                reason: format!("a typed view has two indexes named {:?}", w[0]),
            });
        }
        let runtime = if self.indexes.is_empty() {
            None
        } else {
            Some(tokio::runtime::Handle::try_current().map_err(|_| Error::InvalidConfig {
                reason: "a typed view with indexes must be built inside a tokio runtime (its index task runs there)".into(),
            })?)
        };
        let source = Arc::new(Source::new(self.cache, Box::new(self.codec), self.prefix));
        let indexes =
            runtime.map(|rt| Arc::new(index::Indexes::start(&rt, source.clone(), self.indexes)));
        Ok(TypedView { source, indexes })
    }
}

/// A typed view of a cache's keys (under a prefix): every value decoded once into an
/// `Arc<T>`, shared by the view's reads, watches, list-watch streams and indexes. Made
/// by [`Cache::typed`]; a clone is another handle to the same view.
///
/// Build one view per codec and share it: two views are two memos, and a key-value
/// keeps the first view's (the second view decodes that value on each use).
///
/// ```no_run
/// # #[cfg(feature = "json")]
/// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
/// use etcd_cache::{JsonCodec, ListWatchEvent};
///
/// #[derive(serde::Deserialize)]
/// struct Service { owner: String, port: u16 }
///
/// let services = cache
///     .typed(JsonCodec::<Service>::new())
///     .prefix("/app/services/")
///     .index("owner", |s: &Service| vec![s.owner.clone()])
///     .build()?;
/// // Reads: decoded once, shared by every caller.
/// if let Some(svc) = services.get("/app/services/web").await? {
///     println!("web listens on {}", svc.object().map_or(0, |s| s.port));
/// }
/// // An index lookup, at one revision.
/// let mine = services.by_index("owner", "team-a").await?;
/// println!("{} services of team-a at {}", mine.items().len(), mine.revision());
/// // The list-then-watch loop.
/// let mut stream = services.list_watch();
/// while let Some(event) = stream.next().await {
///     match event? {
///         ListWatchEvent::Init { .. } => { /* start a new state */ }
///         ListWatchEvent::InitApply(svc) | ListWatchEvent::Apply(svc) => { let _ = svc.object(); }
///         ListWatchEvent::InitDone { revision } => println!("state complete at {revision}"),
///         ListWatchEvent::Delete { key, .. } => { let _ = key; }
///     }
/// }
/// # Ok(()) }
/// ```
pub struct TypedView<T> {
    source: Arc<Source<T>>,
    indexes: Option<Arc<index::Indexes<T>>>,
}

impl<T> Clone for TypedView<T> {
    fn clone(&self) -> Self {
        TypedView {
            source: self.source.clone(),
            indexes: self.indexes.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> fmt::Debug for TypedView<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedView")
            .field("prefix", &String::from_utf8_lossy(&self.source.prefix))
            .field("type", &std::any::type_name::<T>())
            .field("decodes", &self.decodes())
            .finish()
    }
}

impl<T: Send + Sync + 'static> TypedView<T> {
    /// The view's prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.source.prefix
    }

    /// The cache the view reads.
    pub fn cache(&self) -> &Cache {
        &self.source.cache
    }

    /// The number of values decoded so far (one per value the view met, whatever the
    /// number of readers and watchers), and of those that did not decode.
    pub fn decodes(&self) -> (u64, u64) {
        self.source.decodes()
    }

    /// The object of `kv`: decoded on the first call for this key-value, then shared.
    pub fn decode(&self, kv: &KeyValue) -> Decoded<T> {
        self.source.decode(kv)
    }

    /// The object at `key` (a consistent read, as [`Cache::get`]), or `None`.
    ///
    /// # Errors
    /// As [`Cache::get`]; [`Error::OutOfRange`] for a key outside the view.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<TypedKv<T>>> {
        let key = key.into();
        self.check_key(&key)?;
        let mut resp = self.source.cache.get(key, None).await?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| self.source.typed_kv(kv)))
    }

    /// Every object of the view at one revision (a consistent read).
    ///
    /// # Errors
    /// As [`Cache::get`].
    pub async fn list(&self) -> Result<TypedList<T>> {
        self.range(
            self.source.prefix.clone(),
            Some(GetOptions::new().with_prefix()),
        )
        .await
    }

    /// The objects a [`Cache::get`] with these options reads (inside the view).
    ///
    /// # Errors
    /// As [`Cache::get`]; [`Error::OutOfRange`] for a key outside the view.
    pub async fn range(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<TypedList<T>> {
        let key = key.into();
        self.check_key(&key)?;
        self.source.range(key, options).await
    }

    /// A watch of the cache ([`Cache::watch`], the same options and guarantees) whose
    /// events carry the objects.
    ///
    /// # Errors
    /// As [`Cache::watch`]; [`Error::OutOfRange`] for a key outside the view.
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<TypedWatchStream<T>> {
        let key = key.into();
        self.check_key(&key)?;
        let stream = self.source.cache.watch(key, options).await?;
        Ok(TypedWatchStream::new(self.source.clone(), stream))
    }

    /// The view's objects at one revision, then every change after it, as one stream
    /// (see [`ListWatch`]).
    pub fn list_watch(&self) -> ListWatch<TypedKv<T>> {
        source::list_watch(&self.source)
    }

    /// The list-watch of the view's objects under `prefix` only (a part of the view):
    /// as [`list_watch`](Self::list_watch), for a sub-range.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `prefix` is outside the view's prefix.
    ///
    /// ```no_run
    /// # fn f(view: etcd_cache::TypedView<String>) -> etcd_cache::Result<()> {
    /// // The services of one team, in a view of every service.
    /// let team_a = view.list_watch_prefix("/services/team-a/")?;
    /// # let _ = team_a; Ok(()) }
    /// ```
    pub fn list_watch_prefix(&self, prefix: impl Into<Vec<u8>>) -> Result<ListWatch<TypedKv<T>>> {
        let prefix = prefix.into();
        self.check_key(&prefix)?;
        Ok(source::list_watch_under(&self.source, prefix))
    }

    /// The objects whose index `name` holds `key`, at one revision, consistent as a
    /// [`get`](Self::get): at least every revision committed before the call. The
    /// objects are exactly the view's at the revision the answer reports.
    ///
    /// The index answers when the cache has applied the consistent read's revision; when
    /// the cache cannot show that it has (etcd answered the read's barrier: progress
    /// answers not trusted, or not in time), the view is read at that revision instead
    /// (from the cache's history if it has caught up meanwhile, else from etcd) and
    /// looked up as the index would.
    ///
    /// # Errors
    /// [`Error::UnknownIndex`] if the view has no such index; as [`Cache::get`] for the
    /// consistent read's barrier; [`Error::Timeout`] if the index does not reach the
    /// barrier's revision within the cache's `consistent_read_timeout`;
    /// [`Error::Closed`].
    pub async fn by_index(&self, name: &str, key: &str) -> Result<TypedList<T>> {
        let (indexes, at) = match &self.indexes {
            Some(ix) => match ix.position(name) {
                Some(at) => (ix, at),
                None => return Err(ix.unknown(name)),
            },
            None => {
                return Err(Error::UnknownIndex {
                    name: name.to_string(),
                    known: "none".into(),
                })
            }
        };
        // The consistent-read barrier: etcd's revision when asked, and the cache's
        // snapshot proven to have reached it for the view's keys.
        let barrier = self
            .source
            .cache
            .get(
                self.source.prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?;
        let revision = barrier.revision();
        // Answered from memory, the barrier's revision is that of a snapshot the cache
        // has published: the index can be brought to it. The answer is at the state's
        // own revision (at least the barrier's), never at one the state does not hold.
        if !barrier.from_etcd() || self.source.cache.revision() >= revision {
            let limit = self.source.cache.consistent_read_timeout();
            let state = tokio::time::timeout(limit, indexes.at_least(revision))
                .await
                .map_err(|_| Error::Timeout)??;
            return Ok(state.lookup(at, key));
        }
        // etcd answered at a revision the cache has not applied (yet): the view at that
        // revision, looked up as the index would.
        let options = GetOptions::new()
            .with_prefix()
            .with_revision(revision)
            .with_serializable();
        let list = self
            .source
            .range(self.source.prefix.clone(), Some(options))
            .await?;
        Ok(indexes.lookup_in(at, key, list))
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.starts_with(&self.source.prefix) {
            Ok(())
        } else {
            Err(out_of_range(key, &self.source.prefix))
        }
    }
}

/// The error for `key` (or a view's prefix) outside `prefix`.
fn out_of_range(key: &[u8], prefix: &[u8]) -> Error {
    Error::OutOfRange {
        start: key.to_vec(),
        end: Vec::new(),
        prefix_start: prefix.to_vec(),
        prefix_end: crate::key_range::prefix_end(prefix),
    }
}
