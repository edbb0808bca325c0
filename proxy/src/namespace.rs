//! `--namespace`: every client key is prefixed on the way to etcd and stripped on the way
//! back, as etcd's `client/v3/namespace` does for its grpc-proxy. The rewrite works on
//! typed messages (a range end, a compare, a nested txn), so it is a value every service
//! applies rather than an HTTP-level tower layer. With an empty namespace every method
//! is the identity.

use bytes::{Bytes, BytesMut};

use crate::pb::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, ResponseOp, TxnRequest, TxnResponse,
};
use crate::pb::mvccpb::KeyValue;

/// The key prefix of one proxy's clients.
#[derive(Debug, Clone, Default)]
pub(crate) struct Namespace {
    prefix: Bytes,
}

/// The end of the range of every key that starts with `prefix` (`"\0"`: no end).
pub(crate) fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end.into();
        }
        end.pop();
    }
    Bytes::from_static(b"\0")
}

impl Namespace {
    pub(crate) fn new(prefix: impl Into<Bytes>) -> Self {
        Namespace {
            prefix: prefix.into(),
        }
    }

    fn join(&self, key: &[u8]) -> Bytes {
        if self.prefix.is_empty() {
            return Bytes::copy_from_slice(key);
        }
        let mut b = BytesMut::with_capacity(self.prefix.len() + key.len());
        b.extend_from_slice(&self.prefix);
        b.extend_from_slice(key);
        b.freeze()
    }

    /// A client key as etcd stores it.
    pub(crate) fn key(&self, key: &Bytes) -> Bytes {
        if self.prefix.is_empty() {
            key.clone()
        } else {
            self.join(key)
        }
    }

    /// A client range `[key, end)` as etcd's (`prefixInterval` in etcd's namespace
    /// package): an empty end stays empty (one key), `"\0"` (every key from `key`)
    /// becomes the namespace's end.
    pub(crate) fn range(&self, key: &Bytes, end: &Bytes) -> (Bytes, Bytes) {
        if self.prefix.is_empty() {
            return (key.clone(), end.clone());
        }
        let k = self.join(key);
        let e = if end.as_ref() == b"\0" {
            prefix_end(&self.prefix)
        } else if end.is_empty() {
            Bytes::new()
        } else {
            self.join(end)
        };
        (k, e)
    }

    /// An etcd key as the client sees it.
    pub(crate) fn strip(&self, key: Bytes) -> Bytes {
        if !self.prefix.is_empty() && key.starts_with(&self.prefix) {
            key.slice(self.prefix.len()..)
        } else {
            key
        }
    }

    /// True if an etcd key is inside the namespace.
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix)
    }

    /// A key-value served from the cache, as the client sees it (keys and values are
    /// shared, not copied).
    pub(crate) fn kv_from_cache(&self, kv: &etcd_cache::KeyValue) -> KeyValue {
        KeyValue {
            key: self.strip(kv.key_bytes().clone()),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            value: kv.value_bytes().clone(),
            lease: kv.lease(),
        }
    }

    pub(crate) fn kv_out(&self, kv: &mut KeyValue) {
        if !self.prefix.is_empty() {
            kv.key = self.strip(std::mem::take(&mut kv.key));
        }
    }

    pub(crate) fn range_in(&self, r: &mut RangeRequest) {
        (r.key, r.range_end) = self.range(&r.key, &r.range_end);
    }

    pub(crate) fn range_out(&self, r: &mut RangeResponse) {
        r.kvs.iter_mut().for_each(|kv| self.kv_out(kv));
    }

    pub(crate) fn put_in(&self, r: &mut PutRequest) {
        r.key = self.key(&r.key);
    }

    pub(crate) fn delete_in(&self, r: &mut DeleteRangeRequest) {
        (r.key, r.range_end) = self.range(&r.key, &r.range_end);
    }

    fn compare_in(&self, c: &mut Compare) {
        (c.key, c.range_end) = self.range(&c.key, &c.range_end);
    }

    fn op_in(&self, op: &mut RequestOp) {
        match op.request.as_mut() {
            Some(request_op::Request::RequestRange(r)) => self.range_in(r),
            Some(request_op::Request::RequestPut(r)) => self.put_in(r),
            Some(request_op::Request::RequestDeleteRange(r)) => self.delete_in(r),
            Some(request_op::Request::RequestTxn(t)) => self.txn_in(t),
            None => {}
        }
    }

    pub(crate) fn txn_in(&self, t: &mut TxnRequest) {
        if self.prefix.is_empty() {
            return;
        }
        t.compare.iter_mut().for_each(|c| self.compare_in(c));
        t.success.iter_mut().for_each(|op| self.op_in(op));
        t.failure.iter_mut().for_each(|op| self.op_in(op));
    }

    fn op_out(&self, op: &mut ResponseOp) {
        match op.response.as_mut() {
            Some(response_op::Response::ResponseRange(r)) => self.range_out(r),
            Some(response_op::Response::ResponsePut(r)) => {
                if let Some(kv) = r.prev_kv.as_mut() {
                    self.kv_out(kv);
                }
            }
            Some(response_op::Response::ResponseDeleteRange(r)) => {
                r.prev_kvs.iter_mut().for_each(|kv| self.kv_out(kv));
            }
            Some(response_op::Response::ResponseTxn(t)) => self.txn_out(t),
            None => {}
        }
    }

    pub(crate) fn txn_out(&self, t: &mut TxnResponse) {
        if self.prefix.is_empty() {
            return;
        }
        t.responses.iter_mut().for_each(|op| self.op_out(op));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b(b"/a0"));
        assert_eq!(prefix_end(b"a\xff"), b(b"b"));
        assert_eq!(prefix_end(b"\xff\xff"), b(b"\0"));
        assert_eq!(prefix_end(b""), b(b"\0"));
    }

    #[test]
    fn ranges_map_as_etcds_namespace() {
        let namespace = Namespace::new(b(b"/t/"));
        assert_eq!(namespace.range(&b(b"k"), &b(b"")), (b(b"/t/k"), b(b"")));
        assert_eq!(
            namespace.range(&b(b"a"), &b(b"c")),
            (b(b"/t/a"), b(b"/t/c"))
        );
        // From a key to the end of the keyspace: to the end of the namespace.
        assert_eq!(
            namespace.range(&b(b"a"), &b(b"\0")),
            (b(b"/t/a"), b(b"/t0"))
        );
        // All keys ("\0", "\0"): the whole namespace.
        assert_eq!(
            namespace.range(&b(b"\0"), &b(b"\0")),
            (b(b"/t/\0"), b(b"/t0"))
        );
        assert_eq!(namespace.strip(b(b"/t/k")), b(b"k"));
        let none = Namespace::default();
        assert_eq!(none.range(&b(b"a"), &b(b"\0")), (b(b"a"), b(b"\0")));
    }
}
