//! The core of a typed view, shared by its reads, watches, list-watch streams and
//! indexes: the [`Source`] (the cache, the view's prefix and its codec, decoding each
//! key-value once through the key-value's memo) and what it hands out ([`TypedKv`],
//! [`TypedList`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cache::Cache;
use crate::error::Result;
use crate::kv::KeyValue;
use crate::list_watch::{ListItem, ListWatch};
use crate::metrics::ViewMetrics;
use crate::read::GetOptions;
use crate::typed::codec::{Codec, DecodeError};

/// Distinguishes the memos of different views on one key-value.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A decoded value: the shared object, or why the value did not decode.
pub type Decoded<T> = std::result::Result<Arc<T>, DecodeError>;

/// A key-value and its decoded object.
pub struct TypedKv<T> {
    pub(crate) kv: KeyValue,
    pub(crate) value: Decoded<T>,
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

impl<T: Send + Sync + 'static> ListItem for TypedKv<T> {
    fn key_value(&self) -> &KeyValue {
        &self.kv
    }
}

impl<T> crate::list_watch::private::Sealed for TypedKv<T> {}

/// The list-watch of the view of `source`: its key-values as objects.
pub(crate) fn list_watch<T: Send + Sync + 'static>(
    source: &Arc<Source<T>>,
) -> ListWatch<TypedKv<T>> {
    list_watch_under(source, source.prefix.clone())
}

/// The list-watch of the view's keys under `prefix` (inside the view's prefix).
pub(crate) fn list_watch_under<T: Send + Sync + 'static>(
    source: &Arc<Source<T>>,
    prefix: Vec<u8>,
) -> ListWatch<TypedKv<T>> {
    let view = source.clone();
    ListWatch::new(
        source.cache.clone(),
        prefix,
        Arc::new(move |kv| view.typed_kv(kv)),
    )
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
    pub(crate) revision: i64,
    pub(crate) items: Vec<TypedKv<T>>,
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

/// What every part of one view shares.
pub(crate) struct Source<T> {
    pub(crate) cache: Cache,
    codec: Box<dyn Codec<Value = T>>,
    owner: u64,
    pub(crate) prefix: Vec<u8>,
    metrics: ViewMetrics,
    decodes: AtomicU64,
    failures: AtomicU64,
}

impl<T: Send + Sync + 'static> Source<T> {
    pub(crate) fn new(cache: Cache, codec: Box<dyn Codec<Value = T>>, prefix: Vec<u8>) -> Self {
        Source {
            metrics: ViewMetrics::new(cache.prefix(), &prefix),
            cache,
            codec,
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            prefix,
            decodes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// This view's tag on the memos it keeps.
    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    /// Values decoded, and of those, refused.
    pub(crate) fn decodes(&self) -> (u64, u64) {
        (
            self.decodes.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }

    /// The object of `kv`: decoded on the first call for this key-value, then shared.
    pub(crate) fn decode(&self, kv: &KeyValue) -> Decoded<T> {
        kv.memo(self.owner, |kv| self.decode_now(kv))
    }

    pub(crate) fn typed_kv(&self, kv: KeyValue) -> TypedKv<T> {
        TypedKv {
            value: self.decode(&kv),
            kv,
        }
    }

    /// A consistent read of the cache, typed (keys outside the view left out).
    pub(crate) async fn range(
        &self,
        key: Vec<u8>,
        options: Option<GetOptions>,
    ) -> Result<TypedList<T>> {
        let mut resp = self.cache.get(key, options).await?;
        Ok(TypedList {
            revision: resp.revision(),
            items: resp
                .take_kvs()
                .into_iter()
                .filter(|kv| kv.key().starts_with(&self.prefix))
                .map(|kv| self.typed_kv(kv))
                .collect(),
        })
    }

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
