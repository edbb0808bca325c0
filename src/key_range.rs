//! Key ranges as etcd defines them (`client/v3/op.go`), their validation and matching.
//!
//! - empty `end`: one key;
//! - `end == "\0"`: every key `>= start` ("from key"; with `start == "\0"` every key);
//! - otherwise the half-open interval `[start, end)`;
//! - a prefix's end is the prefix with its last byte below `0xff` incremented and the
//!   trailing `0xff` bytes dropped (all `0xff`, or empty: `"\0"`).

use bytes::Bytes;

use crate::error::{Error, InvalidReason, Result};

/// The end that means "to the end of the keyspace".
pub(crate) const END_OF_KEYSPACE: &[u8] = b"\0";

/// Returns the end of the range that holds every key starting with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("non-empty") += 1;
            return end;
        }
        end.pop();
    }
    END_OF_KEYSPACE.to_vec()
}

/// How the user described a range; it decides how the end is derived from the key.
///
/// Public only for the hidden benchmark module (`internals`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "unstable-bench-internals"), allow(unreachable_pub))]
pub enum RangeSpec {
    /// Just the key.
    #[default]
    Single,
    /// Every key with the key as prefix.
    Prefix,
    /// Every key >= the key.
    FromKey,
    /// `[key, end)`.
    Range(Vec<u8>),
    /// Every key.
    AllKeys,
}

/// A validated key range. Cloning is cheap for a single key (the start is shared); a
/// range's end is copied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KeyRange {
    pub(crate) start: Bytes,
    /// `None` for a single key; `"\0"` for "to the end". A boxed slice, not `Bytes`: every
    /// subscriber's filter holds a range, and this keeps it at 48 bytes instead of 64
    /// (most subscribers watch one key and have no end at all).
    end: Option<Box<[u8]>>,
}

impl KeyRange {
    /// Builds and validates a range from a key and a spec. Errors name the problem.
    pub(crate) fn new(key: &[u8], spec: &RangeSpec) -> Result<Self> {
        let (start, end): (Vec<u8>, Vec<u8>) = match spec {
            RangeSpec::Single => {
                if key.is_empty() {
                    return Err(Error::invalid(InvalidReason::EmptyKey));
                }
                (key.to_vec(), Vec::new())
            }
            RangeSpec::AllKeys => (vec![0], END_OF_KEYSPACE.to_vec()),
            RangeSpec::Prefix => {
                if key.is_empty() {
                    (vec![0], END_OF_KEYSPACE.to_vec())
                } else {
                    (key.to_vec(), prefix_end(key))
                }
            }
            RangeSpec::FromKey => {
                let start = if key.is_empty() {
                    vec![0]
                } else {
                    key.to_vec()
                };
                (start, END_OF_KEYSPACE.to_vec())
            }
            RangeSpec::Range(end) => {
                if key.is_empty() {
                    return Err(Error::invalid(InvalidReason::EmptyKeyWithRangeEnd));
                }
                if end.is_empty() {
                    return Err(Error::invalid(InvalidReason::EmptyRangeEnd));
                }
                if end.as_slice() != END_OF_KEYSPACE && end.as_slice() <= key {
                    return Err(Error::invalid(InvalidReason::EndNotAfterKey {
                        key: key.to_vec(),
                        end: end.clone(),
                    }));
                }
                (key.to_vec(), end.clone())
            }
        };
        Ok(KeyRange::from_parts(Bytes::from(start), &end))
    }

    /// The range `[start, end)` as etcd reads a request's two fields (an empty `end`: the
    /// key `start` alone; `"\0"`: every key from `start`), not validated.
    pub(crate) fn from_parts(start: Bytes, end: &[u8]) -> Self {
        KeyRange {
            start,
            end: (!end.is_empty()).then(|| end.into()),
        }
    }

    /// The range's end as etcd's request field: empty for a single key, `"\0"` for "to
    /// the end".
    #[inline]
    pub(crate) fn end(&self) -> &[u8] {
        self.end.as_deref().unwrap_or_default()
    }

    /// The range that holds every key with `prefix` (the whole keyspace for "").
    pub(crate) fn for_prefix(prefix: &[u8]) -> Self {
        KeyRange::new(prefix, &RangeSpec::Prefix).expect("a prefix range is always valid")
    }

    /// True if the range is one key.
    pub(crate) fn is_single(&self) -> bool {
        self.end.is_none()
    }

    /// True if the range extends to the end of the keyspace.
    pub(crate) fn is_unbounded(&self) -> bool {
        self.end() == END_OF_KEYSPACE
    }

    /// If this range is exactly "every key starting with P" for a non-empty P, returns P.
    pub(crate) fn as_prefix(&self) -> Option<&Bytes> {
        if self.is_single() || self.start.is_empty() {
            return None;
        }
        (prefix_end(&self.start) == self.end()).then_some(&self.start)
    }

    /// True if `key` is in the range.
    #[inline]
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        if self.is_single() {
            key == self.start.as_ref()
        } else if self.is_unbounded() {
            key >= self.start.as_ref()
        } else {
            key >= self.start.as_ref() && key < self.end()
        }
    }

    /// True if every key of `self` is also in `outer`.
    pub(crate) fn is_within(&self, outer: &KeyRange) -> bool {
        if outer.is_single() {
            return self.is_single() && self.start == outer.start;
        }
        if self.start.as_ref() < outer.start.as_ref() {
            return false;
        }
        if outer.is_unbounded() {
            return true;
        }
        if self.is_single() {
            return self.start.as_ref() < outer.end();
        }
        !self.is_unbounded() && self.end() <= outer.end()
    }

    /// The error for a range that is not inside `outer`.
    pub(crate) fn out_of(&self, outer: &KeyRange) -> Error {
        Error::OutOfRange {
            start: self.start.to_vec(),
            end: self.end().to_vec(),
            prefix_start: outer.start.to_vec(),
            prefix_end: outer.end().to_vec(),
        }
    }

    /// Checks that the range is inside `outer`.
    pub(crate) fn check_within(&self, outer: &KeyRange) -> Result<()> {
        if self.is_within(outer) {
            Ok(())
        } else {
            Err(self.out_of(outer))
        }
    }

    /// `(start, end)` bounds over byte slices, for the store's range queries.
    pub(crate) fn slice_bounds(&self) -> (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>) {
        use std::ops::Bound::*;
        if self.is_single() {
            (Included(&self.start[..]), Included(&self.start[..]))
        } else if self.is_unbounded() {
            (Included(&self.start[..]), Unbounded)
        } else {
            (Included(&self.start[..]), Excluded(self.end()))
        }
    }

    /// `(start, end)` bounds for a `BTreeMap`/`OrdMap` range query.
    #[cfg(any(test, feature = "unstable-bench-internals"))]
    pub(crate) fn bounds(&self) -> (std::ops::Bound<Bytes>, std::ops::Bound<Bytes>) {
        use std::ops::Bound::*;
        if self.is_single() {
            (Included(self.start.clone()), Included(self.start.clone()))
        } else if self.is_unbounded() {
            (Included(self.start.clone()), Unbounded)
        } else {
            (
                Included(self.start.clone()),
                Excluded(Bytes::copy_from_slice(self.end())),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(key: &[u8], spec: RangeSpec) -> KeyRange {
        KeyRange::new(key, &spec).unwrap()
    }

    #[test]
    fn prefix_end_matches_etcd() {
        assert_eq!(prefix_end(b"/app/"), b"/app0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn validation_names_the_problem() {
        let e = KeyRange::new(b"", &RangeSpec::Single).unwrap_err();
        assert!(e.to_string().contains("empty key"), "{e}");
        let e = KeyRange::new(b"b", &RangeSpec::Range(b"a".to_vec())).unwrap_err();
        assert!(e.to_string().contains("not after the key"), "{e}");
        let e = KeyRange::new(b"b", &RangeSpec::Range(b"b".to_vec())).unwrap_err();
        assert!(matches!(e, Error::InvalidRange { .. }));
        assert!(KeyRange::new(b"a", &RangeSpec::Range(b"\0".to_vec())).is_ok());
    }

    #[test]
    fn containment_in_prefix() {
        let app = KeyRange::for_prefix(b"/app/");
        assert!(r(b"/app/x", RangeSpec::Single).is_within(&app));
        assert!(!r(b"/ap", RangeSpec::Single).is_within(&app));
        assert!(r(b"/app/a", RangeSpec::Prefix).is_within(&app));
        assert!(r(b"/app/", RangeSpec::Range(b"/app0".to_vec())).is_within(&app));
        assert!(!r(b"/app/", RangeSpec::Range(b"/app1".to_vec())).is_within(&app));
        assert!(!r(b"/app/", RangeSpec::FromKey).is_within(&app));
        assert!(!r(b"", RangeSpec::AllKeys).is_within(&app));
        let all = KeyRange::for_prefix(b"");
        assert!(r(b"", RangeSpec::AllKeys).is_within(&all));
        assert!(r(b"x", RangeSpec::FromKey).is_within(&all));
        assert_eq!(
            r(b"/app/a", RangeSpec::Prefix)
                .as_prefix()
                .unwrap()
                .as_ref(),
            b"/app/a"
        );
        assert!(r(b"", RangeSpec::AllKeys).as_prefix().is_none());
    }

    proptest! {
        #[test]
        fn contains_agrees_with_within(key in proptest::collection::vec(0u8..4, 0..4),
                                       start in proptest::collection::vec(0u8..4, 1..4),
                                       spec in 0u8..4, end in proptest::collection::vec(0u8..4, 1..4)) {
            let spec = match spec { 0 => RangeSpec::Single, 1 => RangeSpec::Prefix, 2 => RangeSpec::FromKey, _ => RangeSpec::Range(end) };
            if let Ok(range) = KeyRange::new(&start, &spec) {
                if !key.is_empty() {
                    let single = r(&key, RangeSpec::Single);
                    prop_assert_eq!(range.contains(&key), single.is_within(&range));
                }
                if let Some(p) = range.as_prefix() {
                    prop_assert_eq!(range.contains(&key), key.starts_with(p));
                }
            }
        }
    }
}
