//! How a typed view turns a value into an object: the [`Codec`] trait, the codecs the
//! crate ships (JSON with the `json` feature, protobuf with the `prost` feature, a user
//! closure) and the per-key [`DecodeError`].

use std::fmt;
#[cfg(any(feature = "json", feature = "prost"))]
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;

use crate::kv::KeyValue;

/// The error a codec returns: any error type (its `Display` text is kept).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Decodes the value of a key-value into an object of a typed view
/// ([`Cache::typed`](crate::Cache::typed)). Called once per value the view sees
/// (never for a delete), on whichever task first needs it.
///
/// ```
/// use etcd_cache::{Codec, KeyValue};
///
/// /// A value that is a decimal number.
/// struct Number;
///
/// impl Codec for Number {
///     type Value = u64;
///     fn decode(&self, kv: &KeyValue) -> Result<u64, etcd_cache::BoxError> {
///         Ok(kv.value_str()?.trim().parse()?)
///     }
/// }
///
/// assert_eq!(Number.decode(&KeyValue::new("/n", "42", 1, 1, 1, 0)).unwrap(), 42);
/// assert!(Number.decode(&KeyValue::new("/n", "x", 1, 1, 1, 0)).is_err());
/// ```
pub trait Codec: Send + Sync + 'static {
    /// The object a value decodes to.
    type Value: Send + Sync + 'static;

    /// Decodes `kv`'s value (the key and revisions are there too, for codecs that need
    /// them).
    ///
    /// # Errors
    /// Any error: the view reports it for this key ([`DecodeError`]) and goes on.
    fn decode(&self, kv: &KeyValue) -> Result<Self::Value, BoxError>;
}

/// A codec from a closure: `decode_with(|kv| ...)`.
///
/// ```
/// use etcd_cache::{decode_with, Codec, KeyValue};
///
/// let upper = decode_with(|kv: &KeyValue| Ok(kv.value_str()?.to_uppercase()));
/// assert_eq!(upper.decode(&KeyValue::new("/k", "abc", 1, 1, 1, 0)).unwrap(), "ABC");
/// ```
pub fn decode_with<T, F>(decode: F) -> FnCodec<F>
where
    F: Fn(&KeyValue) -> Result<T, BoxError> + Send + Sync + 'static,
    T: Send + Sync + 'static,
{
    FnCodec(decode)
}

/// The codec [`decode_with`] makes.
#[derive(Clone)]
pub struct FnCodec<F>(F);

impl<F> fmt::Debug for FnCodec<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnCodec")
    }
}

impl<T, F> Codec for FnCodec<F>
where
    F: Fn(&KeyValue) -> Result<T, BoxError> + Send + Sync + 'static,
    T: Send + Sync + 'static,
{
    type Value = T;

    fn decode(&self, kv: &KeyValue) -> Result<T, BoxError> {
        (self.0)(kv)
    }
}

/// JSON values through serde (feature `json`).
///
/// ```
/// # #[cfg(feature = "json")] {
/// use etcd_cache::{Codec, JsonCodec, KeyValue};
///
/// #[derive(serde::Deserialize)]
/// struct Service { port: u16 }
///
/// let codec = JsonCodec::<Service>::new();
/// assert_eq!(codec.decode(&KeyValue::new("/svc/a", r#"{"port": 80}"#, 1, 1, 1, 0)).unwrap().port, 80);
/// assert!(codec.decode(&KeyValue::new("/svc/b", "{", 1, 1, 1, 0)).is_err());
/// # }
/// ```
#[cfg(feature = "json")]
pub struct JsonCodec<T>(PhantomData<fn() -> T>);

#[cfg(feature = "json")]
impl<T> JsonCodec<T> {
    /// The codec.
    pub fn new() -> Self {
        JsonCodec(PhantomData)
    }
}

#[cfg(feature = "json")]
impl<T> Default for JsonCodec<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "json")]
impl<T> fmt::Debug for JsonCodec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonCodec<{}>", std::any::type_name::<T>())
    }
}

#[cfg(feature = "json")]
impl<T> Codec for JsonCodec<T>
where
    T: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    type Value = T;

    fn decode(&self, kv: &KeyValue) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(kv.value())?)
    }
}

/// Protobuf values through prost (feature `prost`). An empty value is refused: it would
/// decode to a message with every field at its default, which is almost never what was
/// written.
///
/// ```
/// # #[cfg(feature = "prost")] {
/// use etcd_cache::{Codec, KeyValue, ProstCodec};
///
/// #[derive(Clone, PartialEq, prost::Message)]
/// struct Lease { #[prost(int64, tag = "1")] ttl: i64 }
///
/// let value = prost::Message::encode_to_vec(&Lease { ttl: 30 });
/// let codec = ProstCodec::<Lease>::new();
/// assert_eq!(codec.decode(&KeyValue::new("/l/1", value, 1, 1, 1, 0)).unwrap().ttl, 30);
/// assert!(codec.decode(&KeyValue::new("/l/2", "", 1, 1, 1, 0)).is_err());
/// # }
/// ```
#[cfg(feature = "prost")]
pub struct ProstCodec<T>(PhantomData<fn() -> T>);

#[cfg(feature = "prost")]
impl<T> ProstCodec<T> {
    /// The codec.
    pub fn new() -> Self {
        ProstCodec(PhantomData)
    }
}

#[cfg(feature = "prost")]
impl<T> Default for ProstCodec<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "prost")]
impl<T> fmt::Debug for ProstCodec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProstCodec<{}>", std::any::type_name::<T>())
    }
}

#[cfg(feature = "prost")]
impl<T> Codec for ProstCodec<T>
where
    T: prost::Message + Default + Send + Sync + 'static,
{
    type Value = T;

    fn decode(&self, kv: &KeyValue) -> Result<T, BoxError> {
        if kv.value().is_empty() {
            return Err("empty value".into());
        }
        Ok(T::decode(kv.value())?)
    }
}

/// A value that did not decode: the key, the revision of that value and the codec's
/// error. It stands for that key's object until its next good value; other keys are not
/// affected.
#[derive(Clone, PartialEq, Eq)]
pub struct DecodeError {
    key: Bytes,
    mod_revision: i64,
    message: Arc<str>,
}

impl DecodeError {
    pub(crate) fn new(kv: &KeyValue, error: &BoxError) -> Self {
        DecodeError {
            key: kv.key_bytes().clone(),
            mod_revision: kv.mod_revision(),
            message: error.to_string().into(),
        }
    }

    /// The key whose value did not decode.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The revision of the value that did not decode.
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    /// The codec's error text.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the value of {:?} at revision {} does not decode: {}",
            String::from_utf8_lossy(&self.key),
            self.mod_revision,
            self.message
        )
    }
}

impl fmt::Debug for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for DecodeError {}
