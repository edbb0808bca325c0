//! Key-values and events. Keys and values are [`Bytes`], so a clone is a reference-count
//! increment and a delivery never copies them.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::error::{Error, Result};

pub use etcd_client::EventType;

/// A key and its value at one revision, as etcd stores it, with etcd-client's
/// accessors; converts to and from `etcd_client::KeyValue`.
///
/// ```
/// use etcd_cache::KeyValue;
///
/// let kv = KeyValue::new("/app/a", "1", 5, 7, 2, 0);
/// assert_eq!((kv.key_str().unwrap(), kv.value()), ("/app/a", &b"1"[..]));
/// assert_eq!((kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()), (5, 7, 2, 0));
/// let theirs: etcd_client::KeyValue = (&kv).into();
/// assert_eq!(theirs.key(), kv.key());
/// let (key, value) = kv.into_key_value();
/// assert_eq!((key, value), (b"/app/a".to_vec(), b"1".to_vec()));
/// ```
///
/// One shared allocation: a clone is one reference-count increment, whichever of the
/// store, the history, a delivery or a read holds it.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct KeyValue(pub(crate) Arc<KvInner>);

/// The fields of a [`KeyValue`].
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct KvInner {
    pub(crate) key: Bytes,
    pub(crate) value: Bytes,
    pub(crate) create_revision: i64,
    pub(crate) mod_revision: i64,
    pub(crate) version: i64,
    pub(crate) lease: i64,
    /// What one typed view ([`crate::TypedView`]) decoded of the value: decoded once,
    /// by whoever asks first, and shared by the store, the history, every delivery and
    /// every read that holds this key-value. Not part of equality or hashing.
    pub(crate) memo: Memo,
}

/// The decoded form of one key-value, for the view that owns it (16 bytes when empty).
#[derive(Default)]
pub(crate) struct Memo(OnceLock<Box<Owned>>);

/// A decoded value and the view that decoded it.
struct Owned {
    owner: u64,
    value: Box<dyn Any + Send + Sync>,
}

impl Clone for Memo {
    /// A copy of a key-value starts without a memo (it may not hold the same value).
    fn clone(&self) -> Self {
        Memo::default()
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Memo {}

impl std::hash::Hash for Memo {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl std::fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &String::from_utf8_lossy(&self.0.key))
            .field("value_len", &self.0.value.len())
            .field("create_revision", &self.0.create_revision)
            .field("mod_revision", &self.0.mod_revision)
            .field("version", &self.0.version)
            .field("lease", &self.0.lease)
            .finish()
    }
}

impl KeyValue {
    /// Builds a key-value (useful in tests and adapters).
    pub fn new(
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        create_revision: i64,
        mod_revision: i64,
        version: i64,
        lease: i64,
    ) -> Self {
        KeyValue(Arc::new(KvInner {
            key: key.into(),
            value: value.into(),
            create_revision,
            mod_revision,
            version,
            lease,
            memo: Memo::default(),
        }))
    }

    /// The value `derive` makes of this key-value for view `owner`: made by the first
    /// caller and kept, then handed to every later caller of that view (a clone; the
    /// values kept are `Arc`s). A key-value holds one view's memo: another view's
    /// caller derives its own value each time.
    pub(crate) fn memo<V: Any + Send + Sync + Clone>(
        &self,
        owner: u64,
        derive: impl Fn(&KeyValue) -> V,
    ) -> V {
        let kept = self.0.memo.0.get_or_init(|| {
            Box::new(Owned {
                owner,
                value: Box::new(derive(self)),
            })
        });
        match kept.value.downcast_ref::<V>() {
            Some(v) if kept.owner == owner => v.clone(),
            _ => derive(self),
        }
    }

    /// The key.
    #[inline]
    pub fn key(&self) -> &[u8] {
        &self.0.key
    }

    /// The key as `&str`.
    ///
    /// # Errors
    /// [`Error::Utf8`] if the key is not UTF-8.
    pub fn key_str(&self) -> Result<&str> {
        std::str::from_utf8(&self.0.key).map_err(Error::Utf8)
    }

    /// The value (empty for a delete event's key-value and for keys-only reads).
    #[inline]
    pub fn value(&self) -> &[u8] {
        &self.0.value
    }

    /// The value as `&str`.
    ///
    /// # Errors
    /// [`Error::Utf8`] if the value is not UTF-8.
    pub fn value_str(&self) -> Result<&str> {
        std::str::from_utf8(&self.0.value).map_err(Error::Utf8)
    }

    /// The key as shared [`Bytes`] (a clone costs a reference count).
    #[inline]
    pub fn key_bytes(&self) -> &Bytes {
        &self.0.key
    }

    /// The value as shared [`Bytes`].
    #[inline]
    pub fn value_bytes(&self) -> &Bytes {
        &self.0.value
    }

    /// The revision of the key's last creation.
    #[inline]
    pub fn create_revision(&self) -> i64 {
        self.0.create_revision
    }

    /// The revision of the key's last modification.
    #[inline]
    pub fn mod_revision(&self) -> i64 {
        self.0.mod_revision
    }

    /// The number of modifications since creation (a delete resets it to 0).
    #[inline]
    pub fn version(&self) -> i64 {
        self.0.version
    }

    /// The lease attached to the key (0 for none).
    #[inline]
    pub fn lease(&self) -> i64 {
        self.0.lease
    }

    /// Takes the key and value apart, as etcd-client's (copies: the bytes are shared
    /// with other subscribers; [`into_key_value_bytes`](Self::into_key_value_bytes)
    /// does not copy).
    pub fn into_key_value(self) -> (Vec<u8>, Vec<u8>) {
        (self.0.key.to_vec(), self.0.value.to_vec())
    }

    /// Takes the key and value apart as shared [`Bytes`] (no copy).
    pub fn into_key_value_bytes(self) -> (Bytes, Bytes) {
        (self.0.key.clone(), self.0.value.clone())
    }

    /// The key as `&str`, as etcd-client's `key_str_unchecked` — but checked: this
    /// crate has no unsafe code, so invalid UTF-8 gives the longest valid prefix
    /// instead of undefined behaviour. Calling it in an `unsafe` block, as ported code
    /// does, compiles (with an `unused_unsafe` warning).
    pub fn key_str_unchecked(&self) -> &str {
        valid_prefix(&self.0.key)
    }

    /// The value as `&str`; checked as [`key_str_unchecked`](Self::key_str_unchecked).
    pub fn value_str_unchecked(&self) -> &str {
        valid_prefix(&self.0.value)
    }

    /// The approximate number of bytes this key-value holds (key + value).
    pub(crate) fn payload_len(&self) -> usize {
        self.0.key.len() + self.0.value.len()
    }

    /// This key-value as a keys-only read answers it: without its value, and without its
    /// lease too when `drop_lease` (etcd >= 3.7).
    pub(crate) fn keys_only(&self, drop_lease: bool) -> Self {
        KeyValue(Arc::new(KvInner {
            value: Bytes::new(),
            lease: if drop_lease { 0 } else { self.0.lease },
            ..(*self.0).clone()
        }))
    }
}

/// The longest valid UTF-8 prefix of `b`.
fn valid_prefix(b: &[u8]) -> &str {
    match std::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// One change to one key, with etcd-client's accessors; converts to and from
/// `etcd_client::Event`.
///
/// ```
/// use etcd_cache::{Event, EventType, KeyValue};
///
/// let ev = Event::new(EventType::Put, KeyValue::new("/k", "2", 3, 4, 2, 0), Some(KeyValue::new("/k", "1", 3, 3, 1, 0)));
/// assert_eq!(ev.event_type(), EventType::Put);
/// assert_eq!(ev.kv().unwrap().value(), b"2");
/// assert_eq!(ev.prev_kv().unwrap().value(), b"1");
/// let theirs: etcd_client::Event = (&ev).into();
/// assert_eq!(theirs.kv().unwrap().value(), b"2");
/// ```
///
/// A `Put` carries the new key-value; a `Delete` carries the key with its `mod_revision`
/// set to the deleting revision and everything else zero, exactly as etcd sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub(crate) event_type: EventType,
    pub(crate) kv: KeyValue,
    pub(crate) prev_kv: Option<KeyValue>,
}

impl Event {
    /// Builds an event.
    pub fn new(event_type: EventType, kv: KeyValue, prev_kv: Option<KeyValue>) -> Self {
        Event {
            event_type,
            kv,
            prev_kv,
        }
    }

    /// Put or Delete.
    #[inline]
    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    /// The key-value of the event. Always `Some`; an `Option` as in `etcd-client`.
    #[inline]
    pub fn kv(&self) -> Option<&KeyValue> {
        Some(&self.kv)
    }

    /// The key-value before the event, if the watch asked for it (`with_prev_key`) and the
    /// key existed.
    #[inline]
    pub fn prev_kv(&self) -> Option<&KeyValue> {
        self.prev_kv.as_ref()
    }

    /// The revision of the event.
    #[inline]
    pub fn revision(&self) -> i64 {
        self.kv.0.mod_revision
    }

    /// The key of the event.
    #[inline]
    pub(crate) fn key(&self) -> &[u8] {
        &self.kv.0.key
    }

    /// This event without its previous key-value.
    pub(crate) fn without_prev(&self) -> Self {
        Event {
            event_type: self.event_type,
            kv: self.kv.clone(),
            prev_kv: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_memo_is_made_once_for_its_owner_and_never_handed_to_another() {
        let kv = KeyValue::new("/k", "v", 1, 1, 1, 0);
        let calls = Cell::new(0);
        let derive = |kv: &KeyValue| {
            calls.set(calls.get() + 1);
            Arc::new(kv.value().len())
        };
        let first = kv.memo(1, derive);
        let clone = kv.clone();
        let again = clone.memo(1, derive);
        assert!(Arc::ptr_eq(&first, &again), "the same Arc for every holder");
        assert_eq!(calls.get(), 1);
        // Another view (owner) or another type: derived each time, never the first's.
        let other = kv.memo(2, derive);
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(kv.memo(1, |_| "a str"), "a str");
        assert_eq!(calls.get(), 2);
        // A copy (not a clone of the handle) starts empty; equality ignores the memo.
        let copy = KeyValue(Arc::new((*kv.0).clone()));
        assert_eq!(copy, kv);
        copy.memo(1, derive);
        assert_eq!(calls.get(), 3);
    }
}
