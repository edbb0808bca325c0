//! grpc-proxy's flags that etcd's e2e suites pass it (issue 42), with a real etcd and the
//! proxy binary: `--endpoints-auto-sync-interval`, `--tls-min-version`/`--tls-max-version`,
//! HTTP/1.1 `/proxy/health` and `/metrics` on the gRPC port, `--insecure-skip-tls-verify`.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::scrape::http_get;
use support::{client, start_etcd, start_fails, EtcdOptions, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a call may keep failing after a member is killed before the test fails.
const FAILOVER: Duration = Duration::from_secs(20);

/// A put and a linearizable get through `endpoint`, retried until both answer or
/// `within` has passed; true when they answered.
async fn answers_within(endpoint: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    let mut c = etcd_client::Client::connect([endpoint], Some(options))
        .await
        .unwrap();
    while Instant::now() < deadline {
        let put = c.put("/sync/k", "v", None).await;
        let get = c.get("/sync/k", None).await;
        if put.is_ok() && get.is_ok_and(|g| g.kvs().len() == 1) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// `--endpoints-auto-sync-interval`: a proxy given one member of three learns the other
/// two from MemberList (its log names them) and, once that member is killed, still
/// answers; a proxy without the flag, given the same member, does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sync_keeps_serving_after_the_given_member_dies() {
    let mut cluster = tokio::task::spawn_blocking(testkit::EtcdCluster::start)
        .await
        .unwrap();
    let first = cluster.member(0).endpoint();
    let others: Vec<String> = cluster.endpoints()[1..].to_vec();
    let (synced, plain) = tokio::task::spawn_blocking({
        let first = first.clone();
        let others = others.clone();
        move || {
            let mut synced = Proxy::start(&first, &["--endpoints-auto-sync-interval", "200ms"]);
            // The event: the sync set every member's URL.
            for url in &others {
                synced.wait_for_log(&[&format!("endpoint added endpoint={url}")]);
            }
            let plain = Proxy::start(&first, &[]);
            (synced, plain)
        }
    })
    .await
    .unwrap();
    assert!(answers_within(&synced.endpoint(), FAILOVER).await);
    cluster.kill(0);
    assert!(
        answers_within(&synced.endpoint(), FAILOVER).await,
        "the synced proxy stopped answering:\n{}",
        synced.log_tail()
    );
    // The cache's own client follows the synced endpoints too: the proxy says it is
    // healthy (its cache follows etcd again). (Before, the cache stayed on the dead
    // member: unhealthy.)
    let addr = synced.addr();
    let healthy = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + FAILOVER;
        loop {
            let (code, _, body) = http_get(addr, "/proxy/health");
            if code == 200 && body.contains(r#""health":"true""#) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    assert!(
        healthy,
        "the synced proxy's cache did not follow etcd again:\n{}",
        synced.log_tail()
    );
    // A write through another member reaches a watch created through the proxy.
    let mut watcher = client(&synced.endpoint()).await;
    let mut events = watcher.watch("/sync/after", None).await.unwrap();
    // etcd-client's `watch` returns once the stream is open, before the watch is: a write
    // made before `created` may come before the watch's start (as on etcd).
    let created = events.message().await.unwrap().expect("created");
    assert!(created.created(), "{created:?}");
    let mut direct = client(&others[0]).await;
    let put = direct.put("/sync/after", "v", None).await.unwrap();
    let written = put.header().unwrap().revision();
    let got = tokio::time::timeout(FAILOVER, async {
        loop {
            let resp = events.message().await.unwrap().expect("the watch goes on");
            if let Some(e) = resp.events().first() {
                return e.kv().unwrap().key().to_vec();
            }
        }
    })
    .await;
    let Ok(got) = got else {
        let (_, _, metrics) = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
            .await
            .unwrap();
        let revisions: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("etcd_cache_") && l.contains("revision"))
            .collect();
        let members: Vec<(String, Vec<String>)> = match direct.member_list().await {
            Ok(list) => list
                .members()
                .iter()
                .map(|m| (format!("{:x}", m.id()), m.client_urls().to_vec()))
                .collect(),
            Err(_) => Vec::new(),
        };
        panic!(
            "the watch through the proxy did not see the write at {written} in time \
             (members {members:?}, the proxy's {revisions:?}):\n{}",
            synced.log_tail()
        );
    };
    assert_eq!(got, b"/sync/after");
    // Without the flag the proxy knows only the dead member.
    assert!(!answers_within(&plain.endpoint(), Duration::from_secs(3)).await);
}

/// A rustls client config trusting `ca_pem`, offering only `versions` and ALPN `alpn`.
fn client_config(
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[u8],
) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// `GET path` over TLS with `config`: the status line and body, or the handshake error.
async fn https_get(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> std::io::Result<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

/// The proxy serving TLS with the flags of etcd's TestGrpcProxyTLSVersions.
/// `dir`: a `TestPki`'s.
fn tls_proxy(etcd: &str, dir: &str, flags: &[&str]) -> Proxy {
    let (cert, key) = (format!("{dir}/server.pem"), format!("{dir}/server-key.pem"));
    let mut args = vec!["--cert-file", &cert, "--key-file", &key];
    args.extend_from_slice(flags);
    Proxy::start(etcd, &args)
}

/// `--tls-min-version TLS1.3`: a client offering only TLS 1.2 is refused at the handshake,
/// one offering TLS 1.3 is served; by default both are. A bad value and a minimum above
/// the maximum are start-up errors that name the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_versions_bound_what_clients_may_offer() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let pki = testkit::TestPki::new();
    let tls12 = client_config(pki.ca_pem(), &[&rustls::version::TLS12], b"http/1.1");
    let tls13 = client_config(pki.ca_pem(), &[&rustls::version::TLS13], b"http/1.1");
    let (only13, default) = tokio::task::spawn_blocking({
        let (endpoint, pki) = (etcd.endpoint(), pki.dir().display().to_string());
        move || {
            (
                tls_proxy(&endpoint, &pki, &["--tls-min-version", "TLS1.3"]),
                tls_proxy(&endpoint, &pki, &[]),
            )
        }
    })
    .await
    .unwrap();
    let refused = https_get(only13.addr(), tls12.clone(), "/proxy/health").await;
    assert!(refused.is_err(), "TLS 1.2 served: {refused:?}");
    let served = https_get(only13.addr(), tls13.clone(), "/proxy/health").await;
    assert!(served.unwrap().starts_with("HTTP/1.1 200"));
    for config in [tls12, tls13] {
        let served = https_get(default.addr(), config, "/proxy/health").await;
        assert!(served.unwrap().starts_with("HTTP/1.1 200"));
    }
    let endpoint = etcd.endpoint();
    let errors = tokio::task::spawn_blocking(move || {
        [
            start_fails(&endpoint, &["--tls-min-version", "TLS1.1"]),
            start_fails(&endpoint, &["--tls-max-version", "TLS1.0"]),
            start_fails(
                &endpoint,
                &["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"],
            ),
        ]
    })
    .await
    .unwrap();
    assert!(errors[0].contains("--tls-min-version"), "{}", errors[0]);
    assert!(errors[1].contains("--tls-max-version"), "{}", errors[1]);
    assert!(
        errors[2].contains("--tls-min-version TLS1.3 is greater than --tls-max-version TLS1.2"),
        "{}",
        errors[2]
    );
}

/// HTTP/1.1 on the gRPC port, as grpc-proxy serves it: `GET /proxy/health` answers etcd's
/// health JSON and `GET /metrics` the proxy's metrics, plain and over TLS (ALPN
/// `http/1.1`), while gRPC calls on the same port go on being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_over_http1_on_the_grpc_port() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let pki = testkit::TestPki::new();
    let (plain, tls) = tokio::task::spawn_blocking({
        let (endpoint, pki) = (etcd.endpoint(), pki.dir().display().to_string());
        move || {
            (
                Proxy::start(&endpoint, &[]),
                tls_proxy(&endpoint, &pki, &[]),
            )
        }
    })
    .await
    .unwrap();
    let addr = plain.addr();
    let (health, metrics, other) = tokio::task::spawn_blocking(move || {
        (
            http_get(addr, "/proxy/health"),
            http_get(addr, "/metrics"),
            http_get(addr, "/nothing"),
        )
    })
    .await
    .unwrap();
    assert_eq!(health.0, 200, "{health:?}");
    assert!(health.2.contains(r#""health":"true""#), "{health:?}");
    assert_eq!(metrics.0, 200);
    assert!(
        metrics.2.contains("etcd_cache_proxy_connections"),
        "{}",
        metrics.2
    );
    assert_eq!(other.0, 404);
    let mut c = client(&plain.endpoint()).await;
    c.put("/http1/k", "v", None).await.unwrap();
    assert_eq!(c.get("/http1/k", None).await.unwrap().kvs().len(), 1);

    let config = client_config(pki.ca_pem(), &[&rustls::version::TLS13], b"http/1.1");
    let health = https_get(tls.addr(), config.clone(), "/proxy/health")
        .await
        .unwrap();
    assert!(
        health.starts_with("HTTP/1.1 200") && health.contains(r#""health":"true""#),
        "{health}"
    );
    let metrics = https_get(tls.addr(), config, "/metrics").await.unwrap();
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
}

/// `--insecure-skip-tls-verify`: an etcd whose certificate the proxy has no CA for is
/// refused without the flag and served with it; the proxy warns at start and
/// `etcd_cache_proxy_upstream_tls_unverified` is 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_tls_verification_reaches_an_etcd_without_its_ca() {
    let theirs = testkit::TestPki::new();
    let etcd = start_etcd(EtcdOptions::default().tls(theirs.server_tls(false))).await;
    let endpoint = etcd.endpoint();
    let ours = testkit::TestPki::new();
    let ours_ca = ours.dir().join("ca.pem").display().to_string();
    let (refused, proxy) = tokio::task::spawn_blocking(move || {
        let refused = start_fails(&endpoint, &["--cacert", &ours_ca]);
        // As etcd's e2e framework passes it (Go's `--flag=true`).
        let proxy = Proxy::start(&endpoint, &["--insecure-skip-tls-verify=true"]);
        (refused, proxy)
    })
    .await
    .unwrap();
    assert!(
        refused.contains("etcd's TLS certificate is refused"),
        "{refused}"
    );
    assert!(proxy
        .log_text()
        .contains("--insecure-skip-tls-verify was given: etcd's TLS certificate is not verified"));
    let mut c = client(&proxy.endpoint()).await;
    c.put("/insecure/k", "v", None).await.unwrap();
    assert_eq!(c.get("/insecure/k", None).await.unwrap().kvs().len(), 1);
    let addr = proxy.addr();
    let (_, _, body) = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
        .await
        .unwrap();
    assert!(
        body.contains("etcd_cache_proxy_upstream_tls_unverified 1"),
        "{body}"
    );
}
