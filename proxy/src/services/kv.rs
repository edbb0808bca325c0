//! The KV service: Range inside the cached prefix from memory (serializable and
//! linearizable, through `Cache::get`), everything else forwarded to etcd.

use std::sync::Arc;

use etcd_cache::{GetOptions, SortOrder, SortTarget};
use futures::{Stream, StreamExt};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::etcd_errors;
use crate::forward_macros::call_upstream;
use crate::metrics::Served;
use crate::pb::etcdserverpb::{
    kv_server::Kv, request_op, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, RangeStreamResponse,
    RequestOp, TxnRequest, TxnResponse,
};
use crate::state::State;

/// etcd's KV service.
pub(crate) struct KvService {
    state: Arc<State>,
}

impl KvService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        KvService { state }
    }

    /// Answers an etcd-space range from `cache`; `Err(None)`: forward it.
    ///
    /// `checked_at`: etcd's revision when it said `r.revision` is not compacted (0: not
    /// asked); a read at a past revision then answers with it as its header revision, so
    /// that the check and the answer are one decision (a later header could be a state
    /// after a compaction that covers `r.revision`, where etcd refuses the read).
    async fn cached_range(
        &self,
        cache: &etcd_cache::Cache,
        r: &RangeRequest,
        checked_at: i64,
    ) -> Result<RangeResponse, Option<Status>> {
        let mut o = GetOptions::new()
            .with_revision(r.revision)
            .with_limit(r.limit)
            .with_min_mod_revision(r.min_mod_revision)
            .with_max_mod_revision(r.max_mod_revision)
            .with_min_create_revision(r.min_create_revision)
            .with_max_create_revision(r.max_create_revision)
            .with_sort(sort_target(r.sort_target), sort_order(r.sort_order));
        if !r.range_end.is_empty() {
            o = o.with_range(r.range_end.to_vec());
        }
        if r.serializable {
            o = o.with_serializable();
        }
        if r.keys_only {
            o = o.with_keys_only();
        }
        if r.count_only {
            o = o.with_count_only();
        }
        let resp = cache.get(r.key.to_vec(), Some(o)).await.map_err(|e| {
            tracing::debug!(error = %e, "range not served from the cache; forwarding");
            etcd_errors::from_cache_read(&e)
        })?;
        // The header is the revision the answer is a state of: at a past revision,
        // etcd's revision at the compaction check (a later one could be a state after a
        // compaction that covers `r.revision`: robustness finding R2); otherwise the
        // cache's header (for a consistent read at least the cluster's revision at the
        // call), never a newer revision than the data's.
        let revision = if r.revision > 0 && checked_at >= r.revision {
            checked_at
        } else {
            match resp.header().map_or(0, |h| h.revision()) {
                0 => resp.revision().max(cache.revision()),
                h => h,
            }
        };
        let header = self
            .state
            .upstream
            .header_from_cache(resp.header(), revision);
        Ok(RangeResponse {
            header: Some(header),
            kvs: resp
                .kvs()
                .iter()
                .map(|kv| self.state.namespace.kv_from_cache(kv))
                .collect(),
            more: resp.more(),
            count: resp.count(),
        })
    }

    /// A client range, checked as etcd checks it and moved into the namespace; `Ok(Some)`
    /// when the cache answered it. The cache answers only a caller etcd allows that
    /// range (`authz/`); a refusal is etcd's own.
    async fn range_inner(
        &self,
        metadata: &MetadataMap,
        r: &mut RangeRequest,
    ) -> Result<Option<RangeResponse>, Status> {
        check_range(r)?;
        self.state.namespace.range_in(r);
        let mut cache = self
            .state
            .cache()
            .filter(|_| self.state.in_cache(&r.key, &r.range_end));
        if cache.is_some() {
            // The caller first, as etcd checks it before it reads: a caller etcd refuses
            // costs the proxy no read of its own.
            self.state
                .authz
                .check(metadata, &r.key, &r.range_end)
                .await?;
        }
        // etcd answers a read at a revision it compacted, not the cache's window. The
        // cache answers a past revision only with etcd's revision at a check that found
        // it readable as the header: the check and the answer are one decision. Without
        // that revision (the check failed, or the revision is beyond etcd's), etcd
        // answers.
        let mut checked_at = 0;
        if cache.is_some() && r.revision > 0 {
            match self.state.compaction_check(r.revision).await {
                Some(etcd_cache::CompactionCheck::Readable { etcd_revision })
                    if etcd_revision >= r.revision =>
                {
                    checked_at = etcd_revision;
                }
                _ => cache = None,
            }
        }
        if let Some(cache) = cache {
            match self.cached_range(&cache, r, checked_at).await {
                Ok(resp) => {
                    crate::metrics::get().range(Served::Cache);
                    return Ok(Some(resp));
                }
                Err(Some(status)) => return Err(status),
                Err(None) => {}
            }
        }
        crate::metrics::get().range(Served::Etcd);
        Ok(None)
    }
}

/// etcd's `checkRangeRequest`.
fn check_range(r: &RangeRequest) -> Result<(), Status> {
    if r.key.is_empty() {
        return Err(etcd_errors::empty_key());
    }
    if !(0..=2).contains(&r.sort_order) || !(0..=4).contains(&r.sort_target) {
        return Err(etcd_errors::invalid_sort_option());
    }
    Ok(())
}

/// etcd's `checkRequestOp` (empty keys), before the namespace makes them non-empty.
fn check_txn(t: &TxnRequest) -> Result<(), Status> {
    let check = |op: &RequestOp| match op.request.as_ref() {
        Some(request_op::Request::RequestRange(r)) => check_range(r),
        Some(request_op::Request::RequestPut(r)) if r.key.is_empty() => {
            Err(etcd_errors::empty_key())
        }
        Some(request_op::Request::RequestDeleteRange(r)) if r.key.is_empty() => {
            Err(etcd_errors::empty_key())
        }
        Some(request_op::Request::RequestTxn(t)) => check_txn(t),
        _ => Ok(()),
    };
    t.success.iter().chain(t.failure.iter()).try_for_each(check)
}

fn sort_target(t: i32) -> SortTarget {
    match t {
        1 => SortTarget::Version,
        2 => SortTarget::Create,
        3 => SortTarget::Mod,
        4 => SortTarget::Value,
        _ => SortTarget::Key,
    }
}

fn sort_order(o: i32) -> SortOrder {
    match o {
        1 => SortOrder::Ascend,
        2 => SortOrder::Descend,
        _ => SortOrder::None,
    }
}

type RangeStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<RangeStreamResponse, Status>> + Send>>;

/// A RangeStream answered whole, in one chunk (as the cache answers it).
fn one_chunk(resp: RangeResponse) -> RangeStream {
    let one = RangeStreamResponse {
        range_response: Some(resp),
    };
    Box::pin(futures::stream::iter([Ok(one)]))
}

impl KvService {
    /// A Range etcd answers, with keys taken out of the namespace.
    async fn forward_range(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        r: RangeRequest,
    ) -> Result<RangeResponse, Status> {
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, metadata, r, kv.range)
            .await?
            .into_inner();
        upstream.observe(resp.header.as_ref());
        self.state.namespace.range_out(&mut resp);
        Ok(resp)
    }

    /// etcd's RangeStream chunks, with keys taken out of the namespace.
    fn range_stream_out(&self, stream: tonic::Streaming<RangeStreamResponse>) -> RangeStream {
        let namespace = self.state.namespace.clone();
        Box::pin(stream.map(move |chunk| {
            chunk.map(|mut c| {
                if let Some(r) = c.range_response.as_mut() {
                    namespace.range_out(r);
                }
                c
            })
        }))
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        if let Some(resp) = self.range_inner(&metadata, &mut r).await? {
            return Ok(Response::new(resp));
        }
        Ok(Response::new(self.forward_range(&metadata, r).await?))
    }

    type RangeStreamStream = RangeStream;

    async fn range_stream(
        &self,
        req: Request<RangeRequest>,
    ) -> Result<Response<RangeStream>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        if let Some(resp) = self.range_inner(&metadata, &mut r).await? {
            return Ok(Response::new(one_chunk(resp)));
        }
        let upstream = &self.state.upstream;
        if !upstream.lacks_range_stream() {
            match call_upstream!(upstream, &metadata, r.clone(), kv.range_stream).await {
                Ok(stream) => return Ok(Response::new(self.range_stream_out(stream.into_inner()))),
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    upstream.set_lacks_range_stream();
                }
                Err(s) => return Err(s),
            }
        }
        // etcd < 3.7 has no RangeStream: one Range answers it, as the cache answers one
        // (a client gets one API whatever the member behind the proxy).
        Ok(Response::new(one_chunk(
            self.forward_range(&metadata, r).await?,
        )))
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        if r.key.is_empty() {
            return Err(etcd_errors::empty_key());
        }
        self.state.namespace.put_in(&mut r);
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, &metadata, r, kv.put)
            .await?
            .into_inner();
        upstream.observe(resp.header.as_ref());
        if let Some(kv) = resp.prev_kv.as_mut() {
            self.state.namespace.kv_out(kv);
        }
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        if r.key.is_empty() {
            return Err(etcd_errors::empty_key());
        }
        self.state.namespace.delete_in(&mut r);
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, &metadata, r, kv.delete_range)
            .await?
            .into_inner();
        upstream.observe(resp.header.as_ref());
        resp.prev_kvs
            .iter_mut()
            .for_each(|kv| self.state.namespace.kv_out(kv));
        Ok(Response::new(resp))
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut t = req.into_inner();
        check_txn(&t)?;
        self.state.namespace.txn_in(&mut t);
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, &metadata, t, kv.txn)
            .await?
            .into_inner();
        upstream.observe(resp.header.as_ref());
        self.state.namespace.txn_out(&mut resp);
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let metadata = req.metadata().clone();
        let upstream = &self.state.upstream;
        let resp = call_upstream!(upstream, &metadata, req.into_inner(), kv.compact).await?;
        Ok(crate::upstream::fresh(resp))
    }
}
