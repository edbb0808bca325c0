//! The production [`Upstream`]: an `etcd_client::Client`. Every conversion between the
//! crate's types and `etcd_client`'s lives in this file.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::proto::PbKeyValue;
use futures_util::future::BoxFuture;

use super::{Header, RangeResponse, Upstream, UpstreamWatch, WatchMsg};
use crate::error::{
    token_refused, Error, Result, AUTH_OLD_REVISION, COMPACTED_REVISION, FUTURE_REVISION,
    INVALID_AUTH_TOKEN, PERMISSION_DENIED,
};
use crate::key_range::KeyRange;
use crate::kv::{Event, EventType, KeyValue};
use crate::range_request::{RangeRequest, RangeResult};

/// The largest message the cache takes from etcd: what etcd's own Go client takes by
/// default (`MaxCallRecvMsgSize`, `math.MaxInt32`). etcd-client keeps tonic's 4 MiB,
/// which refuses a page of 1,000 keys of 4 KiB (Kubernetes' Pods are that size), or a
/// watch's catch-up (etcd sends up to 1,000 revisions in one response), at every try:
/// the cache would never load or never resume.
const MAX_RECEIVE_BYTES: usize = i32::MAX as usize;

/// A KV client of `client` that takes etcd's answers whatever their size.
fn kv_client(client: &etcd_client::Client) -> etcd_client::KvClient {
    client
        .kv_client()
        .max_decoding_message_size(MAX_RECEIVE_BYTES)
}

/// A Watch client of `client` that takes etcd's responses whatever their size.
fn watch_client(client: &etcd_client::Client) -> etcd_client::WatchClient {
    client
        .watch_client()
        .max_decoding_message_size(MAX_RECEIVE_BYTES)
}

/// The production upstream.
pub(crate) struct EtcdUpstream {
    client: etcd_client::Client,
    /// How the per-member probe connects (the user's TLS and credentials).
    connect_options: etcd_client::ConnectOptions,
    /// Set when etcd refused a watch for its token: the next watch authenticates first.
    refresh_before_watch: Arc<AtomicBool>,
}

impl EtcdUpstream {
    /// One Range to etcd, with a fresh token when etcd refused the old one, and asked
    /// again when its connection failed if `retry` (see [`read_retry`]).
    async fn range_call(&self, request: RangeRequest, retry: bool) -> Result<RangeResponse> {
        // The range's start, not the user's key: etcd-client rewrites an empty key only
        // for its own prefix/from-key/all-keys flags, which are not used here.
        let client = &self.client;
        let call = || {
            let mut kv = kv_client(client);
            let (key, opts) = (request.range.start.to_vec(), get_options(&request));
            async move { kv.get(key, Some(opts)).await }
        };
        let resp = if retry {
            read_retry(client, call).await?
        } else {
            with_fresh_token(client, call).await?
        };
        Ok(range_response(resp))
    }

    pub(crate) fn new(
        client: etcd_client::Client,
        connect_options: Option<etcd_client::ConnectOptions>,
    ) -> Self {
        EtcdUpstream {
            client,
            connect_options: connect_options.unwrap_or_default(),
            refresh_before_watch: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl From<PbKeyValue> for KeyValue {
    /// Moves the protobuf buffers into `Bytes` without copying them.
    fn from(kv: PbKeyValue) -> Self {
        KeyValue::new(
            Bytes::from(kv.key),
            Bytes::from(kv.value),
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.lease,
        )
    }
}

impl From<etcd_client::KeyValue> for KeyValue {
    /// Moves etcd-client's buffers in (no copy).
    fn from(kv: etcd_client::KeyValue) -> Self {
        KeyValue::from(kv.0)
    }
}

impl From<&KeyValue> for etcd_client::KeyValue {
    /// A copy as etcd-client's type, for helpers that take `&etcd_client::KeyValue`.
    fn from(kv: &KeyValue) -> Self {
        etcd_client::KeyValue(PbKeyValue {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: kv.lease(),
        })
    }
}

impl From<KeyValue> for etcd_client::KeyValue {
    fn from(kv: KeyValue) -> Self {
        etcd_client::KeyValue::from(&kv)
    }
}

impl From<&Event> for etcd_client::Event {
    /// A copy as etcd-client's type.
    fn from(ev: &Event) -> Self {
        etcd_client::Event(etcd_client::proto::PbEvent {
            r#type: ev.event_type() as i32,
            kv: ev.kv().map(|kv| etcd_client::KeyValue::from(kv).0),
            prev_kv: ev.prev_kv().map(|kv| etcd_client::KeyValue::from(kv).0),
        })
    }
}

impl From<Event> for etcd_client::Event {
    fn from(ev: Event) -> Self {
        etcd_client::Event::from(&ev)
    }
}

impl TryFrom<etcd_client::Event> for Event {
    type Error = Error;

    /// etcd-client's event as the cache's (no copy of the buffers).
    ///
    /// # Errors
    /// [`Error::Protocol`] for an unknown event type or an event without a key-value.
    fn try_from(ev: etcd_client::Event) -> Result<Self> {
        let pb = ev.0;
        let event_type = event_type(pb.r#type)?;
        let kv = pb
            .kv
            .ok_or_else(|| Error::protocol("an event without a key-value"))?;
        Ok(Event::new(
            event_type,
            KeyValue::from(kv),
            pb.prev_kv.map(KeyValue::from),
        ))
    }
}

/// `etcd_client`'s request options for `request`, keyed at the range's start.
fn get_options(request: &RangeRequest) -> etcd_client::GetOptions {
    let range = &request.range;
    let mut o = etcd_client::GetOptions::new();
    if !range.end().is_empty() {
        o = o.with_range(range.end().to_vec());
    }
    o = o.with_limit(request.limit).with_revision(request.revision);
    if request.serializable {
        o = o.with_serializable();
    }
    if request.keys_only {
        o = o.with_keys_only();
    }
    if request.count_only {
        o = o.with_count_only();
    }
    o.with_sort(request.sort_target, request.sort_order)
        .with_min_mod_revision(request.min_mod_revision)
        .with_max_mod_revision(request.max_mod_revision)
        .with_min_create_revision(request.min_create_revision)
        .with_max_create_revision(request.max_create_revision)
}

fn header(h: Option<&etcd_client::proto::PbResponseHeader>) -> Header {
    h.map_or(Header::default(), |h| Header {
        cluster_id: h.cluster_id,
        member_id: h.member_id,
        raft_term: h.raft_term,
        revision: h.revision,
    })
}

fn range_response(resp: etcd_client::GetResponse) -> RangeResponse {
    let pb = resp.0;
    RangeResponse {
        revision: pb.header.as_ref().map_or(0, |h| h.revision),
        header: header(pb.header.as_ref()),
        result: RangeResult {
            count: pb.count,
            more: pb.more,
            kvs: pb.kvs.into_iter().map(KeyValue::from).collect(),
        },
    }
}

fn event_type(code: i32) -> Result<EventType> {
    EventType::try_from(code).map_err(|_| Error::protocol(format!("unknown event type {code}")))
}

struct EtcdWatch {
    stream: etcd_client::WatchStream,
    last_header: Header,
    /// Set when etcd refuses this watch for its token (see `EtcdUpstream::watch`).
    refresh_before_watch: Arc<AtomicBool>,
}

/// Runs `call`; if etcd refused its token, authenticates `client` again (with the
/// credentials it was connected with; a client without any has nothing to refresh) and
/// runs it once more. A failed authentication is returned (a changed password:
/// permanent).
async fn with_fresh_token<T, F, Fut>(client: &etcd_client::Client, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    match call().await {
        Err(e) if token_refused(&e) => {
            tracing::debug!(error = %e, "etcd refused the token; authenticating again");
            client.refresh_token().await?;
            Ok(call().await?)
        }
        other => Ok(other?),
    }
}

/// Retries of a read whose connection failed (see [`read_retry`]), and the delay before
/// each: a channel that was reconnecting answers its first call with the failure of its
/// last connect, which says nothing about the next one.
const READ_RETRY_DELAYS: [std::time::Duration; 3] = [
    std::time::Duration::from_millis(10),
    std::time::Duration::from_millis(50),
    std::time::Duration::from_millis(200),
];

/// Runs the read `call` (through [`with_fresh_token`]); if its connection failed (a
/// read that was never answered, see [`crate::error::connection_failed`]), runs it
/// again after each of [`READ_RETRY_DELAYS`], logging each retry. The last failure is
/// returned. Only for reads: a write whose connection broke may have been applied.
async fn read_retry<T, F, Fut>(client: &etcd_client::Client, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let mut delays = READ_RETRY_DELAYS.iter();
    loop {
        match with_fresh_token(client, &mut call).await {
            Err(Error::Upstream(e)) if crate::error::connection_failed(&e) => {
                let Some(delay) = delays.next() else {
                    return Err(Error::Upstream(e));
                };
                tracing::debug!(error = %e, ?delay, "a read's connection failed; asking again");
                tokio::time::sleep(*delay).await;
            }
            other => return other,
        }
    }
}

impl EtcdUpstream {
    /// etcd's compact revision, known to be above `revision`: a watch from `revision`
    /// is canceled with it at once (etcd does not replay a compacted start). Bounded:
    /// if etcd does not say, `revision + 1`, the least it can be.
    async fn compact_revision_from(&self, range: &KeyRange, revision: i64) -> Result<i64> {
        let client = &self.client;
        let opts = etcd_client::WatchOptions::new().with_start_revision(revision);
        let mut stream = with_fresh_token(client, || {
            let mut w = watch_client(client);
            let (key, opts) = (range.start.to_vec(), opts.clone());
            async move { w.watch(key, Some(opts)).await }
        })
        .await?;
        let answer = tokio::time::timeout(COMPACT_WATCH_LIMIT, async {
            while let Some(resp) = stream.message().await? {
                if resp.compact_revision() > 0 {
                    return Ok(resp.compact_revision());
                }
                if resp.canceled() {
                    break;
                }
            }
            Ok::<_, etcd_client::Error>(revision + 1)
        })
        .await;
        Ok(match answer {
            Ok(answer) => answer?,
            Err(_) => {
                tracing::debug!(revision, "etcd did not tell its compact revision in time");
                revision + 1
            }
        })
    }
}

/// How long a watch from a compacted revision may take to be told etcd's compact
/// revision (etcd answers at once; this only bounds a connection that hangs).
const COMPACT_WATCH_LIMIT: Duration = Duration::from_secs(5);

impl UpstreamWatch for EtcdWatch {
    fn message(&mut self) -> BoxFuture<'_, Result<Option<WatchMsg>>> {
        Box::pin(async move {
            // A stream that broke under the cache (HTTP/2 error, connection reset) is a
            // transport failure, not an answer of etcd's.
            let member = self.last_header.member_id;
            let next = self.stream.message().await;
            let Some(resp) = next.map_err(|e| Error::watch_stream(e, member))? else {
                return Ok(None);
            };
            let mut pb = resp.0;
            let revision = pb.header.as_ref().map_or(0, |h| h.revision);
            if pb.header.is_some() {
                self.last_header = header(pb.header.as_ref());
            }
            // `canceled` first: etcd refuses a watch with `created` and `canceled` both set.
            if pb.canceled && pb.compact_revision == 0 {
                if pb.cancel_reason.contains(PERMISSION_DENIED) {
                    // As a refused call: permanent, so the cache stops with it instead of
                    // asking again forever.
                    return Err(Error::Upstream(etcd_client::Error::GRpcStatus(
                        tonic::Status::permission_denied(std::mem::take(&mut pb.cancel_reason)),
                    )));
                }
                if pb.cancel_reason.contains(INVALID_AUTH_TOKEN)
                    || pb.cancel_reason.contains(AUTH_OLD_REVISION)
                {
                    // The next watch authenticates first (here it would not be cancel
                    // safe).
                    self.refresh_before_watch.store(true, Ordering::Relaxed);
                }
            }
            Ok(Some(if pb.canceled {
                WatchMsg::Canceled {
                    compact_revision: pb.compact_revision,
                    reason: std::mem::take(&mut pb.cancel_reason),
                }
            } else if pb.created {
                WatchMsg::Created
            } else if pb.compact_revision != 0 {
                WatchMsg::Canceled {
                    compact_revision: pb.compact_revision,
                    reason: "compacted".into(),
                }
            } else if pb.events.is_empty() {
                WatchMsg::Progress {
                    revision,
                    requested: pb.watch_id == -1,
                }
            } else {
                let mut out = Vec::with_capacity(pb.events.len());
                for ev in std::mem::take(&mut pb.events) {
                    let t = event_type(ev.r#type)?;
                    let Some(kv) = ev.kv else {
                        return Err(Error::protocol("an event without a key-value"));
                    };
                    out.push((t, KeyValue::from(kv)));
                }
                WatchMsg::Events(out)
            }))
        })
    }

    fn request_progress(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { Ok(self.stream.request_progress().await?) })
    }

    fn header(&self) -> Header {
        self.last_header
    }
}

impl Upstream for EtcdUpstream {
    fn versions(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move {
            let client = &self.client;
            let status = with_fresh_token(client, || {
                let mut c = client.clone();
                async move { c.status().await }
            })
            .await?;
            let mut versions = vec![status.version().to_owned()];
            // Status on every member: the client may be balanced over several.
            let members = with_fresh_token(client, || {
                let mut c = client.clone();
                async move { c.member_list().await }
            })
            .await?;
            let urls: Vec<String> = members
                .members()
                .iter()
                .flat_map(|m| m.client_urls().iter().cloned())
                .collect();
            let probes = urls.into_iter().map(|url| async move {
                let probe = async {
                    let opts = self
                        .connect_options
                        .clone()
                        .with_connect_timeout(Duration::from_secs(2))
                        .with_timeout(Duration::from_secs(2));
                    let mut c = etcd_client::Client::connect([url.as_str()], Some(opts)).await?;
                    Ok::<_, etcd_client::Error>(c.status().await?.version().to_owned())
                };
                match tokio::time::timeout(Duration::from_secs(3), probe).await {
                    Ok(Ok(v)) => v,
                    // Unknown (unreachable, or TLS or auth without the options it
                    // needs): counts as a version that cannot be trusted, which is
                    // only slower.
                    Ok(Err(e)) => {
                        tracing::debug!(%url, error = %e, "version probe of a member failed");
                        format!("unreachable:{url}")
                    }
                    Err(_) => format!("unreachable:{url}"),
                }
            });
            versions.extend(futures_util::future::join_all(probes).await);
            Ok(versions)
        })
    }

    fn list_page(
        &self,
        range: KeyRange,
        revision: i64,
        limit: i64,
    ) -> BoxFuture<'_, Result<RangeResponse>> {
        // Not retried here: a list that fails ends the session, and the follower counts
        // and backs off its failures itself (see `CLOSED_AT_CONNECT_LIMIT`).
        let request = RangeRequest {
            revision,
            limit,
            ..RangeRequest::new(range)
        };
        Box::pin(self.range_call(request, false))
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: i64,
    ) -> BoxFuture<'_, Result<Box<dyn UpstreamWatch>>> {
        Box::pin(async move {
            let mut opts = etcd_client::WatchOptions::new()
                .with_start_revision(start_revision)
                .with_progress_notify();
            if !range.end().is_empty() {
                opts = opts.with_range(range.end().to_vec());
            }
            let client = &self.client;
            if self.refresh_before_watch.swap(false, Ordering::Relaxed) {
                // etcd refused the last watch for its token (in a watch response, which
                // etcd-client's refresh does not see). If authenticating fails (the
                // password changed), that error is permanent and stops the cache.
                tracing::debug!("etcd refused the watch's token; authenticating again");
                client.refresh_token().await?;
            }
            let stream = with_fresh_token(client, || {
                let mut w = watch_client(client);
                let (key, opts) = (range.start.to_vec(), opts.clone());
                async move { w.watch(key, Some(opts)).await }
            })
            .await?;
            Ok(Box::new(EtcdWatch {
                stream,
                last_header: Header::default(),
                refresh_before_watch: self.refresh_before_watch.clone(),
            }) as Box<dyn UpstreamWatch>)
        })
    }

    fn compacted_at(
        &self,
        range: KeyRange,
        revision: i64,
    ) -> BoxFuture<'_, Result<crate::CompactionCheck>> {
        use crate::CompactionCheck;
        Box::pin(async move {
            let opts = etcd_client::GetOptions::new()
                .with_revision(revision)
                .with_count_only()
                .with_limit(1);
            let client = &self.client;
            let read = read_retry(client, || {
                let mut kv = kv_client(client);
                let (key, opts) = (range.start.to_vec(), opts.clone());
                async move { kv.get(key, Some(opts)).await }
            })
            .await;
            match read {
                Ok(resp) => Ok(CompactionCheck::Readable {
                    etcd_revision: resp.header().map_or(0, |h| h.revision()),
                }),
                // Beyond etcd's revision: not compacted, and etcd's revision is unknown.
                Err(Error::Upstream(etcd_client::Error::GRpcStatus(s)))
                    if s.message().contains(FUTURE_REVISION) =>
                {
                    Ok(CompactionCheck::Readable { etcd_revision: 0 })
                }
                Err(Error::Upstream(etcd_client::Error::GRpcStatus(s)))
                    if s.message().contains(COMPACTED_REVISION) =>
                {
                    self.compact_revision_from(&range, revision)
                        .await
                        .map(CompactionCheck::Compacted)
                }
                Err(e) => Err(e),
            }
        })
    }

    fn current_revision(&self, range: KeyRange) -> BoxFuture<'_, Result<i64>> {
        Box::pin(async move {
            // The header revision is the cluster's, whatever the key: a count-only read
            // of one key costs O(log n) where a count over the prefix walks it (3.4).
            let opts = etcd_client::GetOptions::new()
                .with_count_only()
                .with_limit(1);
            let client = &self.client;
            let resp = read_retry(client, || {
                let mut kv = kv_client(client);
                let (key, opts) = (range.start.to_vec(), opts.clone());
                async move { kv.get(key, Some(opts)).await }
            })
            .await?;
            Ok(resp.header().map_or(0, |h| h.revision()))
        })
    }

    fn range(&self, request: RangeRequest) -> BoxFuture<'_, Result<RangeResponse>> {
        Box::pin(self.range_call(request, true))
    }
}
