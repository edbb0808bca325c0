//! Typed views: each value under a prefix decoded once into an `Arc<T>`, shared by every
//! read, every watch and every index of the view.
//!
//! The decoded object is kept beside the [`KeyValue`] it came from (a memo in the
//! key-value's one shared allocation), so the store, the history, every delivery and
//! every read that hold that key-value share one decode: a value is decoded once, by
//! whichever reader or watcher meets it first, whatever the number of subscribers.
//!
//! - [`codec`]: the [`Codec`] trait, JSON and protobuf codecs, [`DecodeError`].
//! - [`watch`]: [`TypedWatchStream`], a cache watch whose events carry objects.
//! - [`list_watch`]: [`ListWatch`], the list-then-watch stream with its re-list.
//! - [`index`]: the indexes a view keeps (a task that follows the view with a
//!   [`ListWatch`] and publishes persistent maps).

pub(crate) mod codec;
pub(crate) mod index;
pub(crate) mod list_watch;
pub(crate) mod watch;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::kv::KeyValue;
use crate::metrics::ViewMetrics;
use crate::read::GetOptions;
use crate::watch::WatchOptions;

#[cfg(feature = "json")]
pub use codec::JsonCodec;
#[cfg(feature = "prost")]
pub use codec::ProstCodec;
pub use codec::{decode_with, BoxError, Codec, DecodeError, FnCodec};
pub use list_watch::{ListWatch, ListWatchEvent};
pub use watch::{TypedEvent, TypedWatchResponse, TypedWatchStream};

/// Distinguishes the memos of different views on one key-value.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A decoded value: the shared object, or why the value did not decode.
pub type Decoded<T> = std::result::Result<Arc<T>, DecodeError>;

/// A key-value and its decoded object.
pub struct TypedKv<T> {
    kv: KeyValue,
    value: Decoded<T>,
}

impl<T> Clone for TypedKv<T> {
    fn clone(&self) -> Self {
        TypedKv {
            kv: self.kv.clone(),
            value: self.value.clone(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for TypedKv<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedKv")
            .field("key", &String::from_utf8_lossy(self.kv.key()))
            .field("mod_revision", &self.kv.mod_revision())
            .field("value", &self.value)
            .finish()
    }
}

impl<T> TypedKv<T> {
    /// The key.
    pub fn key(&self) -> &[u8] {
        self.kv.key()
    }

    /// The key-value the object was decoded from (its bytes, revisions and lease).
    pub fn kv(&self) -> &KeyValue {
        &self.kv
    }

    /// The revision of this value.
    pub fn mod_revision(&self) -> i64 {
        self.kv.mod_revision()
    }

    /// The object, or why this value did not decode.
    ///
    /// # Errors
    /// The [`DecodeError`] of this key's value.
    pub fn value(&self) -> std::result::Result<&Arc<T>, &DecodeError> {
        self.value.as_ref()
    }

    /// The object, if the value decoded.
    pub fn object(&self) -> Option<&Arc<T>> {
        self.value.as_ref().ok()
    }
}

/// Objects read at one revision.
pub struct TypedList<T> {
    revision: i64,
    items: Vec<TypedKv<T>>,
}

impl<T> fmt::Debug for TypedList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedList")
            .field("revision", &self.revision)
            .field("items", &self.items.len())
            .finish()
    }
}

impl<T> TypedList<T> {
    /// The revision the objects were read at.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The objects, in key order (those that did not decode included, as errors).
    pub fn items(&self) -> &[TypedKv<T>] {
        &self.items
    }

    /// Takes the objects.
    pub fn into_items(self) -> Vec<TypedKv<T>> {
        self.items
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
        let view = TypedView {
            inner: Arc::new(Inner {
                metrics: ViewMetrics::new(cache_prefix, &self.prefix),
                cache: self.cache,
                codec: Box::new(self.codec),
                owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
                prefix: self.prefix,
                decodes: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            }),
            indexes: None,
        };
        Ok(match runtime {
            None => view,
            Some(rt) => {
                let indexes = index::Indexes::start(&rt, view.clone(), self.indexes);
                TypedView {
                    indexes: Some(Arc::new(indexes)),
                    ..view
                }
            }
        })
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
    inner: Arc<Inner<T>>,
    indexes: Option<Arc<index::Indexes<T>>>,
}

impl<T> Clone for TypedView<T> {
    fn clone(&self) -> Self {
        TypedView {
            inner: self.inner.clone(),
            indexes: self.indexes.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> fmt::Debug for TypedView<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedView")
            .field("prefix", &String::from_utf8_lossy(&self.inner.prefix))
            .field("type", &std::any::type_name::<T>())
            .field("decodes", &self.decodes())
            .finish()
    }
}

struct Inner<T> {
    cache: Cache,
    codec: Box<dyn Codec<Value = T>>,
    owner: u64,
    prefix: Vec<u8>,
    metrics: ViewMetrics,
    decodes: AtomicU64,
    failures: AtomicU64,
}

impl<T: Send + Sync + 'static> TypedView<T> {
    /// The view's prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.inner.prefix
    }

    /// The cache the view reads.
    pub fn cache(&self) -> &Cache {
        &self.inner.cache
    }

    /// The number of values decoded so far (one per value the view met, whatever the
    /// number of readers and watchers), and of those that did not decode.
    pub fn decodes(&self) -> (u64, u64) {
        (
            self.inner.decodes.load(Ordering::Relaxed),
            self.inner.failures.load(Ordering::Relaxed),
        )
    }

    /// The object of `kv`: decoded on the first call for this key-value, then shared.
    pub fn decode(&self, kv: &KeyValue) -> Decoded<T> {
        let inner = &*self.inner;
        kv.memo(inner.owner, |kv| inner.decode_now(kv))
    }

    pub(crate) fn typed_kv(&self, kv: KeyValue) -> TypedKv<T> {
        TypedKv {
            value: self.decode(&kv),
            kv,
        }
    }

    /// The object at `key` (a consistent read, as [`Cache::get`]), or `None`.
    ///
    /// # Errors
    /// As [`Cache::get`]; [`Error::OutOfRange`] for a key outside the view.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<TypedKv<T>>> {
        let key = key.into();
        self.check_key(&key)?;
        let mut resp = self.inner.cache.get(key, None).await?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| self.typed_kv(kv)))
    }

    /// Every object of the view at one revision (a consistent read).
    ///
    /// # Errors
    /// As [`Cache::get`].
    pub async fn list(&self) -> Result<TypedList<T>> {
        self.range(
            self.inner.prefix.clone(),
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
        let mut resp = self.inner.cache.get(key, options).await?;
        Ok(TypedList {
            revision: resp.revision(),
            items: resp
                .take_kvs()
                .into_iter()
                .filter(|kv| kv.key().starts_with(&self.inner.prefix))
                .map(|kv| self.typed_kv(kv))
                .collect(),
        })
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
        let stream = self.inner.cache.watch(key, options).await?;
        Ok(TypedWatchStream::new(self.clone(), stream))
    }

    /// The view's objects at one revision, then every change after it, as one stream
    /// (see [`ListWatch`]).
    pub fn list_watch(&self) -> ListWatch<T> {
        ListWatch::new(self.clone())
    }

    /// The objects whose index `name` holds `key`, at one revision, consistent as a
    /// [`get`](Self::get): at least every revision committed before the call.
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
        // snapshot proven equal to it for the view's keys.
        let barrier = self
            .inner
            .cache
            .get(
                self.inner.prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?
            .revision();
        // The snapshot that answered is at most the cache's revision now: the index
        // state at that revision (or later) is the view's content at the barrier.
        let applied = self.inner.cache.revision();
        let limit = self.inner.cache.consistent_read_timeout();
        let state = tokio::time::timeout(limit, indexes.at_least(applied))
            .await
            .map_err(|_| Error::Timeout)??;
        let mut list = state.lookup(at, key);
        list.revision = list.revision.max(barrier);
        Ok(list)
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.starts_with(&self.inner.prefix) {
            Ok(())
        } else {
            Err(out_of_range(key, &self.inner.prefix))
        }
    }
}

impl<T: Send + Sync + 'static> Inner<T> {
    fn decode_now(&self, kv: &KeyValue) -> Decoded<T> {
        self.decodes.fetch_add(1, Ordering::Relaxed);
        let decoded = self.codec.decode(kv);
        self.metrics.decoded(decoded.is_ok());
        decoded.map(Arc::new).map_err(|e| {
            self.failures.fetch_add(1, Ordering::Relaxed);
            let e = DecodeError::new(kv, &e);
            tracing::warn!(error = %e, "typed view: a value does not decode");
            e
        })
    }
}

/// The error for `key` (or a view's prefix) outside `prefix`.
fn out_of_range(key: &[u8], prefix: &[u8]) -> Error {
    Error::OutOfRange {
        start: String::from_utf8_lossy(key).into_owned(),
        end: String::new(),
        prefix_start: String::from_utf8_lossy(prefix).into_owned(),
        prefix_end: String::from_utf8_lossy(&crate::key_range::prefix_end(prefix)).into_owned(),
    }
}
