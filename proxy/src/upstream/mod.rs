//! The seam to etcd for forwarded calls: one balanced tonic channel over every endpoint
//! (the set `--endpoints-auto-sync-interval` keeps to etcd's members: `auto_sync.rs`),
//! the raw generated clients on it, the token that goes with a call, and the identity
//! (cluster id, member id, raft term) put in the headers of answers served from memory.
//! How each endpoint is dialed is `dial.rs`; the endpoint set, its reachability and the
//! hedged calls `endpoints.rs`.

mod dial;
mod endpoints;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::error::{read, Error, Result};
use crate::pb::etcdserverpb::{
    auth_client::AuthClient, cluster_client::ClusterClient, kv_client::KvClient,
    lease_client::LeaseClient, maintenance_client::MaintenanceClient, watch_client::WatchClient,
    AuthenticateRequest, ResponseHeader, StatusRequest, StatusResponse,
};
use crate::pb::v3electionpb::election_client::ElectionClient;
use crate::pb::v3lockpb::lock_client::LockClient;

use dial::Dial;
pub(crate) use dial::{client_tls, versions, CacheChannel, StartRetry};
use endpoints::{Endpoints, REACHABILITY_INTERVAL};

/// Metadata key of etcd's auth token.
pub(crate) const TOKEN: &str = "token";
/// Metadata with which etcd ignores the CN of the connection's client certificate
/// (`AuthInfoFromTLS` in etcd's server/auth/store.go, since 3.3.23 / 3.4.10: etcd's own
/// gRPC gateway sends it, as the proxy does for every call of a caller without a token).
const NOT_THE_CERTIFICATE: &str = "grpcgateway-accept";
/// Metadata keys passed through from a client to etcd as they are.
const PASSED: &[&str] = &[TOKEN, "hasleader"];
/// How often the identity used in served headers is refreshed.
const IDENTITY_REFRESH: Duration = Duration::from_secs(30);

/// etcd, as the forwarding services reach it.
pub(crate) struct Upstream {
    channel: Channel,
    /// The endpoints `channel` balances over, and how to change them.
    endpoints: Endpoints,
    credentials: Option<(String, String)>,
    /// The proxy's own token (with --user); refreshed when etcd says it is invalid.
    token: RwLock<Option<AsciiMetadataValue>>,
    /// Serializes re-authentication.
    auth_lock: tokio::sync::Mutex<()>,
    /// cluster_id, member_id and raft_term from etcd's last Status answer.
    identity: Mutex<ResponseHeader>,
    /// Whether the proxy presents a client certificate to etcd (`--cert` with https://).
    presents_certificate: bool,
    /// The CN of that certificate: etcd (with `--client-cert-auth`) takes it as the user
    /// of a call that carries neither a token nor [`NOT_THE_CERTIFICATE`].
    cert_identity: Option<String>,
    /// Until when RangeStream is answered with a Range: a member answered it
    /// `Unimplemented` (etcd < 3.7), and is asked again after [`RANGE_STREAM_RETRY`]
    /// (members are upgraded one by one).
    no_range_stream_until: Mutex<Option<tokio::time::Instant>>,
}

/// How long RangeStream is answered with a Range after etcd said it has none.
const RANGE_STREAM_RETRY: Duration = Duration::from_secs(60);

/// The metadata of a client's call that is passed on to etcd (its token and
/// `hasleader`), nothing else.
pub(crate) fn passed(from: &MetadataMap) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    for key in PASSED {
        if let Some(v) = from.get(*key) {
            metadata.insert(*key, v.clone());
        }
    }
    metadata
}

impl Upstream {
    /// A lazily connecting channel over every endpoint (calls fail over between them).
    pub(crate) fn new(config: &Config) -> Result<Arc<Upstream>> {
        let dial = Dial::new(config)?;
        let urls = config.endpoint_urls();
        if urls.is_empty() {
            return Err(Error::NoEndpoints);
        }
        crate::metrics::get().endpoints_synced(urls.len());
        let (channel, endpoints) = Endpoints::new(dial, urls)?;
        let presents_certificate = config.cert.is_some() && config.upstream_tls();
        let cert_identity = match &config.cert {
            Some(path) if presents_certificate => certificate_cn(&read(path)?)?,
            _ => None,
        };
        Ok(Arc::new(Upstream {
            channel,
            endpoints,
            credentials: config.credentials(),
            token: RwLock::new(None),
            auth_lock: tokio::sync::Mutex::new(()),
            identity: Mutex::new(ResponseHeader::default()),
            presents_certificate,
            cert_identity,
            no_range_stream_until: Mutex::new(None),
        }))
    }

    /// Every [`REACHABILITY_INTERVAL`], tries a TCP connection to each endpoint: one that
    /// refuses it (a member stopped, killed, or its machine gone) is taken out of the
    /// balance that forwarded calls use, and put back once it accepts again. tonic's
    /// balance keeps picking an endpoint whose connection fails (grpc-go's balancers skip
    /// one in TRANSIENT_FAILURE), so without it a third of the calls over three endpoints
    /// failed `Unavailable` for as long as one member was down. When every endpoint
    /// refuses, all stay in (calls fail as etcd's unreachability, not hang). Ends when
    /// the upstream is dropped.
    pub(crate) fn spawn_reachability(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REACHABILITY_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(upstream) = weak.upgrade() else {
                    return;
                };
                upstream.endpoints.check_reachability().await;
            }
        })
    }

    /// Whether etcd said lately that it has no RangeStream (etcd < 3.7).
    pub(crate) fn lacks_range_stream(&self) -> bool {
        self.no_range_stream_until
            .lock()
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// Records that etcd answered RangeStream `Unimplemented`.
    pub(crate) fn set_lacks_range_stream(&self) {
        tracing::debug!("etcd has no RangeStream: it is answered with a Range");
        *self.no_range_stream_until.lock() = Some(tokio::time::Instant::now() + RANGE_STREAM_RETRY);
    }

    pub(crate) fn kv(&self) -> KvClient<Channel> {
        Upstream::kv_on(self.channel.clone())
    }
    pub(crate) fn watch(&self) -> WatchClient<Channel> {
        WatchClient::new(self.channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
    pub(crate) fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel.clone())
    }
    pub(crate) fn maintenance(&self) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(self.channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
    pub(crate) fn auth(&self) -> AuthClient<Channel> {
        AuthClient::new(self.channel.clone())
    }
    pub(crate) fn cluster(&self) -> ClusterClient<Channel> {
        ClusterClient::new(self.channel.clone())
    }
    pub(crate) fn election(&self) -> ElectionClient<Channel> {
        ElectionClient::new(self.channel.clone())
    }
    pub(crate) fn lock(&self) -> LockClient<Channel> {
        LockClient::new(self.channel.clone())
    }

    /// `msg` as a request to etcd on a client's behalf: the client's token and
    /// `hasleader` pass through, nothing else. A call without a token reaches etcd
    /// without one, and over the proxy's certificate with [`NOT_THE_CERTIFICATE`], so
    /// that etcd answers it as a caller without a user, never as the certificate's CN:
    /// the proxy never lends its own authority, whatever it knows of etcd's auth state.
    pub(crate) fn request<T>(&self, from: &MetadataMap, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        let metadata = req.metadata_mut();
        for key in PASSED {
            if let Some(v) = from.get(*key) {
                metadata.insert(*key, v.clone());
            }
        }
        if self.presents_certificate && metadata.get(TOKEN).is_none() {
            metadata.insert(NOT_THE_CERTIFICATE, AsciiMetadataValue::from_static("1"));
        }
        req
    }

    /// `msg` as a request of the certificate's CN itself: no token, and nothing that
    /// makes etcd ignore the certificate (only for learning what that CN may do).
    pub(crate) fn certificate_request<T>(&self, msg: T) -> Request<T> {
        Request::new(msg)
    }

    /// `msg` as a request of the proxy's own (Status for headers, the keep-alive
    /// coalescer's stream): with the proxy's token (with --user).
    pub(crate) fn own_request<T>(&self, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        if let Some(token) = self.token.read().clone() {
            req.metadata_mut().insert(TOKEN, token);
        }
        req
    }

    /// Calls etcd's `method` with `msg` on a client's behalf (see
    /// [`request`](Self::request)).
    ///
    /// # Errors
    /// etcd's answer; a connection that broke under the call as grpc-go reports it
    /// (`status::as_etcd_client_sees`).
    pub(crate) async fn call<T, R, F, Fut>(
        &self,
        from: &MetadataMap,
        msg: T,
        mut f: F,
    ) -> Result<Response<R>, Status>
    where
        F: FnMut(Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        f(self.request(from, msg))
            .await
            .map_err(crate::etcd_errors::as_etcd_client_sees)
    }

    /// Calls etcd for the proxy's own work with its token; when etcd says the token is
    /// no longer valid, authenticates again and retries once.
    pub(crate) async fn own_call<T, R, F, Fut>(
        &self,
        msg: T,
        mut f: F,
    ) -> Result<Response<R>, Status>
    where
        T: Clone,
        F: FnMut(Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        match f(self.own_request(msg.clone())).await {
            Err(s) if self.credentials.is_some() && token_rejected(&s) => {
                self.authenticate().await?;
                f(self.own_request(msg)).await
            }
            other => other,
        }
    }

    /// The endpoints forwarded calls balance over.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.endpoints.current()
    }

    /// Makes `urls` the endpoints forwarded calls balance over: those not among them are
    /// dropped (their connections close once idle), new ones are dialed lazily. Returns
    /// the added and the removed. A URL that is not an endpoint (bad syntax) is left out,
    /// logged.
    pub(crate) async fn set_endpoints(&self, urls: &[String]) -> (Vec<String>, Vec<String>) {
        self.endpoints.set(urls).await
    }

    /// The endpoints as [`set_endpoints`](Upstream::set_endpoints) leaves them, less those
    /// that refuse connections ([`spawn_reachability`](Upstream::spawn_reachability)), from
    /// now on: the cache's own client follows them (`cache_slot.rs`), so it keeps a connection
    /// to etcd when the members of `--endpoints` are gone.
    pub(crate) fn endpoint_changes(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.endpoints.subscribe()
    }

    /// Runs `one` on the balanced channel and, when it has not answered within
    /// [`HEDGE_AFTER`](endpoints::HEDGE_AFTER) or failed in a way another member may not
    /// (`endpoints.rs: settled`), also on a channel to each endpoint that is not down;
    /// returns the first settled answer and drops the others. When none settles, the
    /// first answer.
    ///
    /// Only for calls that etcd answers linearizably (a Range without `serializable`, a
    /// raft request): any member's answer is then at least as new as the call, so the
    /// first is as good as the others, and a member that lags (it answers only after a
    /// round trip to the leader, and after applying up to it) does not decide how long
    /// the caller waits. Auth decisions and the auth state take this path: a revocation
    /// is seen as soon as the fastest member can say so.
    pub(crate) async fn hedged<R, Fut>(&self, one: impl Fn(Channel) -> Fut) -> Result<R, Status>
    where
        Fut: Future<Output = Result<R, Status>>,
    {
        self.endpoints.hedged(&self.channel, one).await
    }

    /// A KV client on `channel` (one of [`Upstream::hedged`]'s), with the limits of
    /// [`Upstream::kv`].
    pub(crate) fn kv_on(channel: Channel) -> KvClient<Channel> {
        KvClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    /// The --user name, if any.
    pub(crate) fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(n, _)| n.as_str())
    }

    /// The CN of the proxy's client certificate toward etcd, if any.
    pub(crate) fn cert_identity(&self) -> Option<&str> {
        self.cert_identity.as_deref()
    }

    /// Gets a fresh token for --user (no-op without credentials).
    pub(crate) async fn authenticate(&self) -> Result<(), Status> {
        let Some((name, password)) = self.credentials.clone() else {
            return Ok(());
        };
        let _guard = self.auth_lock.lock().await;
        let resp = self
            .auth()
            .authenticate(AuthenticateRequest { name, password })
            .await?
            .into_inner();
        let token = AsciiMetadataValue::try_from(resp.token.as_str())
            .map_err(|_| Status::internal("etcd returned a token that is not ASCII"))?;
        *self.token.write() = Some(token);
        Ok(())
    }

    /// A header for an answer served from memory at `revision`.
    pub(crate) fn header(&self, revision: i64) -> ResponseHeader {
        let id = self.identity.lock();
        ResponseHeader {
            cluster_id: id.cluster_id,
            member_id: id.member_id,
            raft_term: id.raft_term,
            revision,
        }
    }

    /// The header of an answer the cache gave, at `revision` (the caller's: the state the
    /// answer is of), with the identity of the cache's header (etcd's), or the proxy's
    /// while the cache knows none.
    pub(crate) fn header_from_cache(
        &self,
        h: Option<&etcd_cache::ResponseHeader>,
        revision: i64,
    ) -> ResponseHeader {
        match h {
            Some(h) if h.cluster_id() != 0 => ResponseHeader {
                cluster_id: h.cluster_id(),
                member_id: h.member_id(),
                revision,
                raft_term: h.raft_term(),
            },
            _ => self.header(revision),
        }
    }

    /// Remembers the identity of the member behind a forwarded answer.
    pub(crate) fn observe(&self, header: Option<&ResponseHeader>) {
        if let Some(h) = header {
            if h.cluster_id != 0 {
                let mut id = self.identity.lock();
                id.cluster_id = h.cluster_id;
                id.member_id = h.member_id;
                id.raft_term = id.raft_term.max(h.raft_term);
            }
        }
    }

    /// Maintenance.Status through the channel (and the identity it carries).
    pub(crate) async fn status(&self) -> Result<StatusResponse, Status> {
        let resp = self
            .own_call(StatusRequest {}, |r| {
                let mut c = self.maintenance();
                async move { c.status(r).await }
            })
            .await?
            .into_inner();
        self.observe(resp.header.as_ref());
        Ok(resp)
    }

    /// Refreshes the served identity from etcd every [`IDENTITY_REFRESH`], until dropped.
    pub(crate) fn spawn_identity_refresh(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(IDENTITY_REFRESH).await;
                let Some(upstream) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = upstream.status().await {
                    tracing::debug!(error = %e, "identity refresh failed");
                }
            }
        })
    }
}

/// etcd's answer without etcd's response metadata (its HTTP/2 headers are not ours to
/// send: passing them on breaks the client's stream).
pub(crate) fn fresh<R>(resp: Response<R>) -> Response<R> {
    Response::new(resp.into_inner())
}

/// etcd's answer to an expired or unknown token (`ErrGRPCInvalidAuthToken`).
pub(crate) fn token_rejected(s: &Status) -> bool {
    s.code() == tonic::Code::Unauthenticated && s.message().contains("invalid auth token")
}

/// The CN of the first certificate in a PEM file, if it has one: the last CN of its
/// subject, as Go's x509 (and so etcd) reads it.
/// (The identity etcd takes as the caller of a call without a token: see `authz/`.)
fn certificate_cn(pem: &[u8]) -> Result<Option<String>> {
    use x509_parser::prelude::*;
    let bad = |why: String| Error::Certificate(why);
    let (_, pem) = parse_x509_pem(pem).map_err(|e| bad(e.to_string()))?;
    let cert = pem.parse_x509().map_err(|e| bad(e.to_string()))?;
    let cn = cert
        .subject()
        .iter_common_name()
        .last()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
        .filter(|cn| !cn.is_empty());
    Ok(cn)
}
