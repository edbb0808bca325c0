//! Registration under `--resolver-prefix`, as etcd's grpc-proxy registers itself
//! (`server/proxy/grpcproxy/register.go`): the proxy puts its advertised client URL
//! under `<prefix>/<url>`, in the format etcd's naming resolver and endpoints manager
//! read (`client/v3/naming/endpoints`: a JSON `{"Op":0,"Addr":url,"Metadata":meta}`,
//! `meta` the JSON `{"name":hostname}`), on a lease of `--resolver-ttl` seconds that it
//! keeps alive. A proxy that stops (SIGTERM) deletes its key and revokes its lease; one
//! that dies disappears when its lease expires; one that loses etcd for longer than the
//! TTL registers again when etcd is back. Clients find the live proxies with etcd's
//! resolver, and `Cluster.MemberList` through any of them lists them ([`members`]).
//!
//! This is the proxy's own work, done with its own identity (`Upstream::own_call`), as
//! the cache's list and watch are.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::pb::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, Member, PutRequest, RangeRequest,
};
use crate::upstream::Upstream;

/// A pause between registration attempts after a failure (grpc-proxy: one a second).
const RETRY: Duration = Duration::from_secs(1);
/// How long a stopping proxy waits for etcd to take its deregistration.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// The key a proxy advertising `url` registers under `prefix` (grpc-proxy's).
pub(crate) fn key(prefix: &str, url: &str) -> String {
    format!("{prefix}/{url}")
}

/// The value of a registration: etcd's endpoints-manager update (`Op` 0 is "add"), with
/// grpc-proxy's metadata, the host's name.
pub(crate) fn value(url: &str, name: &str) -> String {
    let meta = serde_json::json!({ "name": name }).to_string();
    serde_json::json!({ "Op": 0, "Addr": url, "Metadata": meta }).to_string()
}

/// The member a registration stands for in `Cluster.MemberList`: its name (from the
/// metadata, as grpc-proxy decodes it) and its URL; `None` for a value that is not a
/// registration (or a deletion update).
pub(crate) fn member(value: &[u8], id: impl Fn(&str) -> u64) -> Option<Member> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    if v.get("Op").and_then(serde_json::Value::as_u64).unwrap_or(0) != 0 {
        return None;
    }
    let addr = v.get("Addr")?.as_str()?.to_string();
    let name = v
        .get("Metadata")
        .and_then(|m| m.as_str())
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|m| m.get("name")?.as_str().map(str::to_string))
        .unwrap_or_default();
    Some(Member {
        id: id(&addr),
        name,
        peer_ur_ls: Vec::new(),
        client_ur_ls: vec![addr],
        is_learner: false,
    })
}

/// The registered proxies under `prefix` (one serializable read of etcd, with the
/// caller's token, as `metadata` carries it: a caller sees only registrations etcd lets
/// it read), in key order.
///
/// # Errors
/// etcd's answer to the read.
pub(crate) async fn members(
    upstream: &Upstream,
    metadata: &tonic::metadata::MetadataMap,
    prefix: &str,
    id: impl Fn(&str) -> u64,
) -> Result<Vec<Member>, Status> {
    let key = format!("{prefix}/").into_bytes();
    let range_end = crate::namespace::prefix_end(&key);
    let req = RangeRequest {
        key: key.into(),
        range_end,
        serializable: true,
        ..Default::default()
    };
    let resp = upstream
        .call(metadata, req, |q| {
            let mut c = upstream.kv();
            async move { c.range(q).await }
        })
        .await?
        .into_inner();
    Ok(resp
        .kvs
        .iter()
        .filter_map(|kv| member(&kv.value, &id))
        .collect())
}

/// The host's name, as grpc-proxy puts it in its metadata.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "etcd-cache-proxy".into())
}

/// The running registration: [`stop`](Self::stop) deregisters.
pub(crate) struct Registration {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Registration {
    /// Registers `url` under `prefix` with a lease of `ttl`, and keeps it registered
    /// (renewing the lease, registering again after it expired) until stopped.
    pub(crate) fn start(upstream: Arc<Upstream>, prefix: String, url: String, ttl: u64) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(upstream, prefix, url, ttl.max(1), stopped));
        Registration {
            stop: Some(stop),
            task,
        }
    }

    /// Deletes the registration (its key, and its lease), waiting for etcd at most
    /// [`STOP_TIMEOUT`].
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(STOP_TIMEOUT, &mut self.task).await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a registered session ended.
enum Ended {
    Stopped,
    /// The lease expired or could not be renewed: register again.
    Lost(String),
}

async fn run(
    upstream: Arc<Upstream>,
    prefix: String,
    url: String,
    ttl: u64,
    mut stopped: oneshot::Receiver<()>,
) {
    let metrics = crate::metrics::get();
    let key = key(&prefix, &url);
    let value = value(&url, &hostname());
    loop {
        let lease = tokio::select! {
            _ = &mut stopped => return,
            r = register(&upstream, &key, &value, ttl) => r,
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(e) => {
                metrics.registration_failed();
                tracing::warn!(key, error = %e, "registration under --resolver-prefix failed; retrying");
                tokio::select! {
                    _ = &mut stopped => return,
                    _ = tokio::time::sleep(RETRY) => continue,
                }
            }
        };
        metrics.registered(true);
        tracing::info!(key, lease, ttl, "registered under --resolver-prefix");
        let ended = keep_alive(&upstream, lease, ttl, &mut stopped).await;
        metrics.registered(false);
        match ended {
            Ended::Stopped => {
                deregister(&upstream, &key, lease).await;
                return;
            }
            Ended::Lost(why) => {
                metrics.registration_failed();
                tracing::warn!(key, lease, why, "registration lost; registering again");
            }
        }
    }
}

/// A lease of `ttl` seconds and the key on it; the lease's id.
async fn register(upstream: &Upstream, key: &str, value: &str, ttl: u64) -> Result<i64, Status> {
    let grant = LeaseGrantRequest {
        ttl: ttl as i64,
        id: 0,
    };
    let lease = upstream
        .own_call(grant, |q| {
            let mut c = upstream.lease();
            async move { c.lease_grant(q).await }
        })
        .await?
        .into_inner();
    if !lease.error.is_empty() {
        return Err(Status::unavailable(lease.error));
    }
    let put = PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.as_bytes().to_vec().into(),
        lease: lease.id,
        ..Default::default()
    };
    upstream
        .own_call(put, |q| {
            let mut c = upstream.kv();
            async move { c.put(q).await }
        })
        .await?;
    crate::metrics::get().registration();
    Ok(lease.id)
}

/// Renews `lease` every third of its TTL until stopped, or until it cannot be renewed
/// before it expires (a broken keep-alive stream is opened again meanwhile).
async fn keep_alive(
    upstream: &Upstream,
    lease: i64,
    ttl: u64,
    stopped: &mut oneshot::Receiver<()>,
) -> Ended {
    let every = Duration::from_millis(ttl * 1000 / 3).max(Duration::from_millis(100));
    let expiry = Duration::from_secs(ttl);
    let mut renewed = tokio::time::Instant::now();
    loop {
        if renewed.elapsed() >= expiry {
            return Ended::Lost(format!("not renewed for {ttl} s"));
        }
        let (tx, mut rx) = match open_keep_alive(upstream, lease).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(lease, error = %e, "lease keep-alive stream failed; retrying");
                tokio::select! {
                    _ = &mut *stopped => return Ended::Stopped,
                    _ = tokio::time::sleep(RETRY.min(every)) => continue,
                }
            }
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            if renewed.elapsed() >= expiry {
                return Ended::Lost(format!("not renewed for {ttl} s"));
            }
            tokio::select! {
                _ = &mut *stopped => return Ended::Stopped,
                _ = tick.tick() => {
                    if tx.send(LeaseKeepAliveRequest { id: lease }).await.is_err() {
                        break;
                    }
                }
                answer = rx.message() => match answer {
                    Ok(Some(a)) if a.ttl > 0 => {
                        renewed = tokio::time::Instant::now();
                        crate::metrics::get().registration_renewed();
                    }
                    Ok(Some(_)) => return Ended::Lost("the lease expired".into()),
                    // Broken: opened again (the lease lives on until it expires).
                    Ok(None) | Err(_) => break,
                },
            }
        }
    }
}

type KeepAliveStream = (
    mpsc::Sender<LeaseKeepAliveRequest>,
    tonic::Streaming<crate::pb::etcdserverpb::LeaseKeepAliveResponse>,
);

/// A keep-alive stream for `lease`, opened with its first renewal queued: etcd sends the
/// stream's response headers with its first answer, so the call returns only then.
async fn open_keep_alive(upstream: &Upstream, lease: i64) -> Result<KeepAliveStream, Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.try_send(LeaseKeepAliveRequest { id: lease })
        .expect("an empty queue has room");
    let req = upstream.own_request(ReceiverStream::new(rx));
    let stream = upstream.lease().lease_keep_alive(req).await?.into_inner();
    Ok((tx, stream))
}

/// Deletes the registration: its lease revoked (which deletes its key), bounded by
/// [`STOP_TIMEOUT`].
async fn deregister(upstream: &Upstream, key: &str, lease: i64) {
    let revoke = upstream.own_call(LeaseRevokeRequest { id: lease }, |q| {
        let mut c = upstream.lease();
        async move { c.lease_revoke(q).await }
    });
    match tokio::time::timeout(STOP_TIMEOUT, revoke).await {
        Ok(Ok(_)) => tracing::info!(key, lease, "deregistered from --resolver-prefix"),
        Ok(Err(e)) => tracing::warn!(key, error = %e, "deregistration failed; the lease expires"),
        Err(_) => tracing::warn!(key, "deregistration timed out; the lease expires"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value is what etcd's endpoints manager writes (`internal.Update` as JSON, the
    /// metadata a JSON string, as grpc-proxy's `getMeta`), and reads back as a member.
    #[test]
    fn a_registration_is_the_endpoints_managers_update() {
        let v = value("http://127.0.0.1:23790", "host-a");
        let parsed: serde_json::Value = serde_json::from_str(&v).unwrap();
        assert_eq!(parsed["Op"], 0);
        assert_eq!(parsed["Addr"], "http://127.0.0.1:23790");
        assert_eq!(parsed["Metadata"], r#"{"name":"host-a"}"#);
        assert_eq!(
            key("/p", "http://127.0.0.1:23790"),
            "/p/http://127.0.0.1:23790"
        );
        let m = member(v.as_bytes(), |_| 7).unwrap();
        assert_eq!((m.id, m.name.as_str()), (7, "host-a"));
        assert_eq!(m.client_ur_ls, ["http://127.0.0.1:23790"]);
        // grpc-proxy's own, and a plain resolver entry without metadata.
        let go = br#"{"Op":0,"Addr":"http://10.0.0.1:2379","Metadata":"{\"name\":\"g\"}"}"#;
        assert_eq!(member(go, |_| 1).unwrap().name, "g");
        let bare = br#"{"Addr":"10.0.0.2:2379"}"#;
        assert_eq!(member(bare, |_| 1).unwrap().client_ur_ls, ["10.0.0.2:2379"]);
        assert!(member(b"not json", |_| 1).is_none());
        assert!(
            member(br#"{"Op":1,"Addr":"x"}"#, |_| 1).is_none(),
            "a deletion"
        );
    }
}
