//! The proxy's certificate toward etcd lends nothing. etcd with `--client-cert-auth` takes
//! the CN of a connection's certificate as the user of every call on it that carries no
//! token; the proxy presents its certificate on the calls it forwards, so each of those
//! must reach etcd as a caller without a user, on every version, whatever the proxy knows
//! of etcd's auth state. Every call here is sent twice: through the proxy by a client
//! without credentials, and directly to etcd as a caller without a user (over a
//! certificate, with the metadata etcd's own gateway sends so that etcd ignores its CN).
//! The answers must be equal, refusals included.

mod raw;
mod support;

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use raw::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient,
    AuthUserListRequest, LeaseKeepAliveRequest, PutRequest, RangeRequest, StatusRequest,
};
use testkit::{EtcdVersion, TestPki};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use support::{start_etcd, start_proxy, EtcdOptions};

const WAIT: Duration = Duration::from_secs(15);

/// etcd with TLS and `--client-cert-auth`, its users (`root`, `cacher` with read on
/// /app/, `reader` with read on /app/a/), keys under /app/ and /other; auth on unless
/// `auth` is false.
async fn cert_etcd(version: EtcdVersion, pki: &TestPki, auth: bool) -> support::EtcdServer {
    cert_etcd_with(version, pki, auth, &[]).await
}

/// [`cert_etcd`] with `extra` flags for etcd.
async fn cert_etcd_with(
    version: EtcdVersion,
    pki: &TestPki,
    auth: bool,
    extra: &[String],
) -> support::EtcdServer {
    let mut opts = EtcdOptions::default()
        .version(version)
        .tls(pki.server_tls(true));
    for a in extra {
        opts = opts.arg(a.clone());
    }
    let etcd = start_etcd(opts).await;
    let mut admin = as_cn(&etcd.endpoint(), pki, "root").await;
    support::add_users(&mut admin).await;
    if auth {
        admin.auth_enable().await.unwrap();
    }
    etcd
}

/// An etcd-client over a certificate with CN `cn`.
async fn as_cn(endpoint: &str, pki: &TestPki, cn: &str) -> Client {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_tls(pki.client_tls(Some(&pki.client_identity(cn))));
    Client::connect([endpoint], Some(opts)).await.unwrap()
}

/// A raw channel to etcd over a certificate with CN `cn`.
async fn tls_channel(endpoint: &str, pki: &TestPki, cn: &str) -> Channel {
    let id = pki.client_identity(cn);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()))
        .identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
    Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

/// `msg` as etcd's gateway sends a call: etcd ignores the certificate's CN, so the call
/// is a caller's without a user.
fn anonymous<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("grpcgateway-accept", "1".parse().unwrap());
    req
}

/// The certificate files of CN `cn` in `dir`, as flags: `--cacert`, `--cert`, `--key`.
fn cert_flags(pki: &TestPki, dir: &std::path::Path, cn: &str) -> Vec<String> {
    let id = pki.client_identity(cn);
    let cert = dir.join(format!("{cn}.pem"));
    let key = dir.join(format!("{cn}-key.pem"));
    std::fs::write(&cert, &id.cert_pem).unwrap();
    std::fs::write(&key, &id.key_pem).unwrap();
    let ca = pki.dir().join("ca.pem");
    [
        "--cacert".to_string(),
        ca.display().to_string(),
        "--cert".to_string(),
        cert.display().to_string(),
        "--key".to_string(),
        key.display().to_string(),
    ]
    .to_vec()
}

/// The proxy's flags: `flags`, then the certificate of CN `cn` ([`cert_flags`]).
fn proxy_args(flags: &[&str], pki: &TestPki, dir: &std::path::Path, cn: &str) -> Vec<String> {
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    args.extend(cert_flags(pki, dir, cn));
    args
}

fn range(key: &str, serializable: bool) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec().into(),
        serializable,
        ..Default::default()
    }
}

/// `msg` as a request: over etcd's gateway form (`gateway`), or as it is.
fn req<T>(msg: T, gateway: bool) -> tonic::Request<T> {
    if gateway {
        anonymous(msg)
    } else {
        tonic::Request::new(msg)
    }
}

/// The calls of the finding, as a caller without credentials: reads of a secret
/// (linearizable and serializable, in and outside the cached prefix), a write, an admin
/// call, Status. Returns each call's outcome.
async fn anonymous_calls(ch: Channel, gateway: bool) -> Vec<(String, String)> {
    let mut kv = KvClient::new(ch.clone());
    let mut auth = raw::etcdserverpb::auth_client::AuthClient::new(ch.clone());
    let mut maintenance = MaintenanceClient::new(ch);
    let mut out = Vec::new();
    for key in ["/app/b/secret", "/other"] {
        for serializable in [false, true] {
            let r = kv.range(req(range(key, serializable), gateway)).await;
            out.push((format!("range {key} ser={serializable}"), raw::outcome(&r)));
        }
    }
    let put = PutRequest {
        key: b"/x".to_vec().into(),
        value: b"x".to_vec().into(),
        ..Default::default()
    };
    out.push((
        "put /x".into(),
        raw::outcome(&kv.put(req(put, gateway)).await),
    ));
    let r = auth.user_list(req(AuthUserListRequest {}, gateway)).await;
    out.push(("user list".into(), raw::outcome(&r)));
    let r = maintenance.status(req(StatusRequest {}, gateway)).await;
    out.push(("status".into(), raw::outcome(&r)));
    out
}

/// Runs the proxy in front of `etcd` with `args`, expects it to exit with an error within
/// 30 s (it is killed then, and the test fails), and returns what it printed.
fn refused_start(etcd: &str, args: &[String]) -> String {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
        .args(["--endpoints", etcd, "--listen-addr", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the proxy started ({status:?}): {err}"
    );
    err
}

/// etcd 3.4.23 and 3.7: a proxy presenting a certificate whose CN has the root role
/// (started with `--allow-root-upstream`) serves a client without credentials exactly
/// what etcd gives a caller without a user. On 3.4 (no `AuthStatus`) the proxy once took
/// its own CN's allowed probe for "auth is off" and served everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_certificate_serves_no_caller_on_any_version() {
    for version in [EtcdVersion::V3_4, EtcdVersion::V3_7] {
        let pki = TestPki::new();
        let etcd = cert_etcd(version, &pki, true).await;
        let dir = tempfile::tempdir().unwrap();
        let args = proxy_args(
            &["--prefix", "/app/", "--allow-root-upstream"],
            &pki,
            dir.path(),
            "root",
        );
        let proxy = start_proxy(etcd.endpoint(), args).await;
        let direct =
            anonymous_calls(tls_channel(&etcd.endpoint(), &pki, "cacher").await, true).await;
        let proxied = anonymous_calls(raw::channel(&proxy.endpoint()).await, false).await;
        assert_eq!(
            proxied, direct,
            "etcd {version}: through the proxy vs. directly"
        );
        // Refused directly: the comparison is not between two successes.
        let secret = &direct[0].1;
        assert!(secret.contains("user name is empty"), "{version}: {secret}");
        assert!(
            direct[4].1 != "ok" && direct[5].1 != "ok",
            "{version}: {direct:?}"
        );
    }
}

/// `--user` and the certificate's CN are two identities: a CN with the root role is
/// refused at start whatever `--user` may look up, on 3.4 and 3.7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_certificate_beside_a_user_is_refused_at_start() {
    for version in [EtcdVersion::V3_4, EtcdVersion::V3_7] {
        let pki = TestPki::new();
        let etcd = cert_etcd(version, &pki, true).await;
        let dir = tempfile::tempdir().unwrap();
        let args = proxy_args(
            &["--prefix", "/app/", "--user", "cacher:pw"],
            &pki,
            dir.path(),
            "root",
        );
        let endpoint = etcd.endpoint();
        let err = tokio::task::spawn_blocking(move || refused_start(&endpoint, &args))
            .await
            .unwrap();
        assert!(
            err.contains("the CN of --cert") && err.contains("root role"),
            "etcd {version}: {err}"
        );
    }
}

/// A keep-alive stream opened without a token while etcd's auth was off goes on after
/// auth is turned on: its renewals get etcd's answer for a caller without a user, never
/// the proxy's CN's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_stream_across_auth_on_renews_as_no_user() {
    for version in [EtcdVersion::V3_4, EtcdVersion::V3_7] {
        let pki = TestPki::new();
        let etcd = cert_etcd(version, &pki, false).await;
        let dir = tempfile::tempdir().unwrap();
        let args = proxy_args(
            &["--prefix", "/app/", "--allow-root-upstream"],
            &pki,
            dir.path(),
            "root",
        );
        let proxy = start_proxy(etcd.endpoint(), args).await;
        let mut admin = as_cn(&etcd.endpoint(), &pki, "root").await;
        let lease = admin.lease_grant(120, None).await.unwrap().id();

        let direct = LeaseClient::new(tls_channel(&etcd.endpoint(), &pki, "cacher").await);
        let proxied = LeaseClient::new(raw::channel(&proxy.endpoint()).await);
        let mut streams = Vec::new();
        for (mut client, gateway) in [(direct, true), (proxied, false)] {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(LeaseKeepAliveRequest { id: lease }).await.unwrap();
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            let mut answers = client
                .lease_keep_alive(req(stream, gateway))
                .await
                .unwrap()
                .into_inner();
            let first = tokio::time::timeout(WAIT, answers.message()).await.unwrap();
            assert!(
                first
                    .as_ref()
                    .is_ok_and(|a| a.as_ref().is_some_and(|a| a.ttl > 0)),
                "etcd {version}: a renewal with auth off: {first:?}"
            );
            streams.push((tx, answers));
        }
        admin.auth_enable().await.unwrap();
        let mut outcomes = Vec::new();
        for (tx, answers) in &mut streams {
            let _ = tx.send(LeaseKeepAliveRequest { id: lease }).await;
            let next = tokio::time::timeout(WAIT, answers.message()).await.unwrap();
            outcomes.push(match next {
                Ok(Some(a)) => format!("renewed ttl>0: {}", a.ttl > 0),
                Ok(None) => "ended".to_string(),
                Err(s) => format!("{:?}: {}", s.code(), s.message()),
            });
        }
        assert_eq!(
            outcomes[1], outcomes[0],
            "etcd {version}: a renewal after auth on, through the proxy vs. directly"
        );
    }
}

/// A decision for a JWT ends with the token: reads served from memory stop when etcd
/// stops accepting the token (its `exp`), not `--auth-token-ttl` later. The proxy
/// follows etcd as its certificate's CN (a cache that lives on), the caller has a JWT
/// of etcd's (`--auth-token jwt,...,ttl=3s`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_for_a_jwt_ends_with_the_token() {
    let pki = TestPki::new();
    let jwt = pki.jwt_auth_token_arg(3);
    let etcd = cert_etcd_with(EtcdVersion::V3_4, &pki, true, &[jwt]).await;
    let dir = tempfile::tempdir().unwrap();
    let args = proxy_args(&["--prefix", "/app/"], &pki, dir.path(), "cacher");
    let proxy = start_proxy(etcd.endpoint(), args).await;
    let direct_ch = tls_channel(&etcd.endpoint(), &pki, "nobody").await;
    let mut auth = raw::etcdserverpb::auth_client::AuthClient::new(direct_ch.clone());
    let token = auth
        .authenticate(raw::etcdserverpb::AuthenticateRequest {
            name: "reader".into(),
            password: "pw".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let issued = Instant::now();
    let mut direct = KvClient::new(direct_ch);
    let mut proxied = KvClient::new(raw::channel(&proxy.endpoint()).await);
    let read = || raw::with_tokens(range("/app/a/x", true), &[&token]);
    assert_eq!(raw::outcome(&proxied.range(read()).await), "ok");
    // Until etcd refuses the token directly, then through the proxy at once.
    let refused = loop {
        // Used through the proxy meanwhile (cached reads).
        let _ = proxied.range(read()).await;
        let d = raw::outcome(&direct.range(read()).await);
        if d != "ok" {
            break d;
        }
        assert!(
            issued.elapsed() < Duration::from_secs(20),
            "the JWT never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let p = raw::outcome(&proxied.range(read()).await);
    assert_eq!(
        p, refused,
        "through the proxy right after etcd refused the JWT"
    );
}

/// In front of a learner (which refuses linearizable reads, watches and
/// `Authenticate`), the proxy either forwards every call, which etcd answers as a
/// caller's without a user, or does not serve at all; it never serves a caller as its
/// own certificate (it once let token-less calls go out over its root certificate before
/// it knew etcd's auth state). Once the learner is promoted, a client without
/// credentials still gets what etcd gives a caller without a user; on 3.4 and 3.7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_front_of_a_learner_the_proxy_lends_nothing_before_or_after_the_promotion() {
    const SERVING: &str = "serving etcd's v3 gRPC API";
    const WAITING: &str = "cannot learn etcd's auth state yet";
    for version in [EtcdVersion::V3_4, EtcdVersion::V3_7] {
        let pki = TestPki::new();
        let etcd = cert_etcd(version, &pki, false).await;
        let mut admin = as_cn(&etcd.endpoint(), &pki, "root").await;
        let (client_port, peer_port) = (support::free_port(), support::free_port());
        let added = admin
            .member_add(
                [format!("http://127.0.0.1:{peer_port}")],
                Some(etcd_client::MemberAddOptions::new().with_is_learner()),
            )
            .await
            .unwrap();
        let learner_id = added.member().unwrap().id();
        // The learner's start blocks; the test's runtime has two threads.
        let learner = tokio::task::block_in_place(|| {
            support::EtcdServer::join(&etcd, "learner", client_port, peer_port)
        });
        admin.auth_enable().await.unwrap();

        let dir = tempfile::tempdir().unwrap();
        let args = proxy_args(
            &["--prefix", "/app/", "--allow-root-upstream"],
            &pki,
            dir.path(),
            "root",
        );
        let learner_url = learner.endpoint();
        let (mut proxy, said) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut p = support::Proxy::starting(&learner_url, &args);
            let said = p.wait_for_log(&[SERVING, WAITING]);
            (p, said)
        })
        .await
        .unwrap();
        let direct =
            anonymous_calls(tls_channel(&learner.endpoint(), &pki, "cacher").await, true).await;
        // A learner answers serializable reads only: as a caller's without a user.
        assert!(
            direct[1].1.contains("user name is empty"),
            "{version}: {direct:?}"
        );
        if said == SERVING {
            let proxied = anonymous_calls(raw::channel(&proxy.endpoint()).await, false).await;
            assert_eq!(
                proxied, direct,
                "etcd {version}: through the proxy vs. directly, in front of a learner"
            );
        } else {
            assert!(
                std::net::TcpStream::connect_timeout(&proxy.addr(), Duration::from_secs(1))
                    .is_err(),
                "etcd {version}: the proxy serves before it knows etcd's auth state:\n{}",
                proxy.log_tail()
            );
        }
        println!("etcd {version}, in front of a learner, the proxy said: {said}");

        admin.member_promote(learner_id).await.unwrap();
        // The member applies its promotion on its own time: until it has, it still
        // refuses linearizable reads as a learner. The reference answers are taken once
        // it says it is a voter.
        let mut status =
            MaintenanceClient::new(tls_channel(&learner.endpoint(), &pki, "cacher").await);
        tokio::time::timeout(Duration::from_secs(30), async {
            while status
                .status(StatusRequest {})
                .await
                .map_or(true, |s| s.into_inner().is_learner)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!("etcd {version}: the member still a learner 30 s after its promotion")
        });
        let proxy = tokio::task::spawn_blocking(move || {
            proxy.wait_serving();
            proxy
        })
        .await
        .unwrap();
        // Promoted: the proxy builds its cache; whether it answers from it or forwards,
        // the answers are etcd's.
        let direct =
            anonymous_calls(tls_channel(&learner.endpoint(), &pki, "cacher").await, true).await;
        let proxied = anonymous_calls(raw::channel(&proxy.endpoint()).await, false).await;
        assert_eq!(
            proxied, direct,
            "etcd {version}: through the proxy vs. directly, after the promotion"
        );
    }
}
