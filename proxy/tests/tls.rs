//! TLS on both sides: proxy A serves TLS and requires client certificates; proxy B
//! reaches A over TLS with a client certificate (as it would reach a TLS etcd), and a
//! plain client uses B. Certificates are made with `openssl` for the test.

mod support;

use std::path::Path;
use std::process::Command;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions, WatchOptions};
use support::{client, start_etcd, start_proxy, EtcdOptions};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate.
fn make_certs(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    );
    for name in ["server", "client"] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_both_sides() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIP: openssl not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let p = |f: &str| dir.path().join(f).display().to_string();
    let etcd = start_etcd(EtcdOptions::default()).await;
    let a = start_proxy(
        etcd.endpoint(),
        vec![
            "--cert-file".into(),
            p("server.crt"),
            "--key-file".into(),
            p("server.key"),
            "--trusted-ca-file".into(),
            p("ca.crt"),
            // B's cache learns its upstream's members from MemberList: A itself.
            "--advertise-client-url".into(),
            "{self}".into(),
        ],
    )
    .await;
    let a_url = a.endpoint().replace("http://", "https://");
    let b = start_proxy(
        a_url.clone(),
        vec![
            "--cacert".into(),
            p("ca.crt"),
            "--cert".into(),
            p("client.crt"),
            "--key".into(),
            p("client.key"),
        ],
    )
    .await;
    // A TLS client with a certificate talks to A directly.
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read("ca.crt")))
        .identity(Identity::from_pem(read("client.crt"), read("client.key")));
    let mut on_a =
        etcd_client::Client::connect([a_url.clone()], Some(ConnectOptions::new().with_tls(tls)))
            .await
            .unwrap();
    on_a.put("/tls/a", "1", None).await.unwrap();
    // A client without a certificate is refused by A.
    let no_cert = TlsOptions::new().ca_certificate(Certificate::from_pem(read("ca.crt")));
    let refused = async {
        let mut c = etcd_client::Client::connect(
            [a_url.clone()],
            Some(ConnectOptions::new().with_tls(no_cert)),
        )
        .await?;
        c.get("/tls/a", None).await
    };
    assert!(
        refused.await.is_err(),
        "A accepted a client without a certificate"
    );
    // The plain client on B reads and watches through B -> TLS -> A -> etcd.
    let mut on_b = client(&b.endpoint()).await;
    let got = on_b.get("/tls/a", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");
    let mut w = on_b
        .watch("/tls/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(w.message().await.unwrap().unwrap().created());
    let rev = on_a
        .put("/tls/b", "2", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let r = w.message().await.unwrap().unwrap();
    assert_eq!(r.header().unwrap().revision(), rev);
    assert_eq!(r.events()[0].kv().unwrap().value(), b"2");
    assert!(
        b.log_text().contains("upstream_tls=true"),
        "{}",
        b.log_tail()
    );
    // The cache's own probe of each member's version reaches A over TLS too: its verdict
    // is logged once it has run, and no member was unreachable.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !b.log_text().contains("server versions") {
        assert!(
            std::time::Instant::now() < deadline,
            "no version verdict in 30 s:\n{}",
            b.log_tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        !b.log_text().contains("could not learn the etcd version")
            && !b.log_text().contains("unreachable:"),
        "{}",
        b.log_tail()
    );
}

/// TLS flags toward etcd with `http://` endpoints are a start-up error that names them
/// (etcd's Go client, and so grpc-proxy, ignores them: the proxy would then carry its
/// clients' tokens and passwords in clear while its operator asked for TLS); endpoints
/// that mix `http://` and `https://` are a start-up error too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_flags_with_http_endpoints_are_a_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let etcd = start_etcd(EtcdOptions::default()).await;
    let ca = dir.path().join("ca.pem").display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
        .args(["--endpoints", &etcd.endpoint(), "--cacert", &ca])
        .args(["--listen-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cacert given") && err.contains("every endpoint is http://"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
        .args([
            "--endpoints",
            &format!("{},https://127.0.0.1:1", etcd.endpoint()),
        ])
        .args(["--listen-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mixes http:// and https://"), "{err}");
}

/// etcd's `--auto-tls` makes ECDSA P-521 certificates; the proxy dials etcd with every
/// key type etcd makes or users deploy. Here etcd serves a P-521 certificate from a P-521
/// CA, and the proxy reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_with_a_p521_certificate_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-521",
        "-nodes",
    ];
    openssl(
        d,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=p521 test CA",
                "-sha512",
            ],
        ]
        .concat(),
    );
    openssl(
        d,
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server-key.pem",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-sha512",
        ],
    );
    let tls = testkit::ServerTls::from_files(d.join("server.pem"), d.join("server-key.pem"));
    let etcd = start_etcd(EtcdOptions::default().tls(tls)).await;
    let ca = d.join("ca.pem").display().to_string();
    let proxy = start_proxy(
        etcd.endpoint(),
        vec!["--cacert".into(), ca, "--prefix".into(), "/p/".into()],
    )
    .await;
    let mut c = client(&proxy.endpoint()).await;
    c.put("/p/k", "v", None).await.unwrap();
    assert_eq!(c.get("/p/k", None).await.unwrap().kvs().len(), 1);
    assert_eq!(
        c.get(
            "/p/k",
            Some(etcd_client::GetOptions::new().with_serializable())
        )
        .await
        .unwrap()
        .kvs()
        .len(),
        1
    );
}

/// etcd's certificate refused (signed by another CA): a start-up error that says so, not
/// an endless retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_etcd_certificate_is_a_start_up_error() {
    let theirs = testkit::TestPki::new();
    let etcd = start_etcd(EtcdOptions::default().tls(theirs.server_tls(false))).await;
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let ours = dir.path().join("ca.crt").display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
            .args([
                "--endpoints",
                &etcd.endpoint(),
                "--listen-addr",
                "127.0.0.1:0",
            ])
            .args(["--cacert", &ours])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("etcd's TLS certificate is refused"), "{err}");
}

/// `--client-crl-file` as etcd has it: the same revocation list given to etcd and to the
/// proxy; a client whose certificate it revokes is refused by both, another client of the
/// same CA is served by both. A list that is not a CRL is a start-up error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused_as_etcd_refuses_it() {
    let pki = testkit::TestPki::new();
    let good = pki.client_identity("good");
    let revoked = pki.client_identity("revoked");
    let proxy_id = pki.client_identity("proxy");
    let crl = pki.crl_file(&[&revoked]);
    let etcd = start_etcd(
        EtcdOptions::default().tls(pki.server_tls(true).with_client_crl_file(crl.clone())),
    )
    .await;
    let file = |name: &str, text: &str| {
        let path = pki.dir().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (cert, key) = (
        file("proxy.pem", &proxy_id.cert_pem),
        file("proxy-key.pem", &proxy_id.key_pem),
    );
    let dir = pki.dir().display().to_string();
    let proxy = start_proxy(
        etcd.endpoint(),
        vec![
            "--cacert".into(),
            format!("{dir}/ca.pem"),
            "--cert".into(),
            cert,
            "--key".into(),
            key,
            "--cert-file".into(),
            format!("{dir}/server.pem"),
            "--key-file".into(),
            format!("{dir}/server-key.pem"),
            "--trusted-ca-file".into(),
            format!("{dir}/ca.pem"),
            "--client-crl-file".into(),
            crl.display().to_string(),
            "--prefix".into(),
            "/crl/".into(),
        ],
    )
    .await;
    let proxy_url = proxy.endpoint().replace("http://", "https://");
    for (who, id, served) in [("good", &good, true), ("revoked", &revoked, false)] {
        let mut answers = Vec::new();
        for endpoint in [etcd.endpoint(), proxy_url.clone()] {
            let options = ConnectOptions::new()
                .with_tls(pki.client_tls(Some(id)))
                .with_connect_timeout(std::time::Duration::from_secs(5))
                .with_timeout(std::time::Duration::from_secs(5));
            let got = async {
                let mut c = etcd_client::Client::connect([endpoint.clone()], Some(options)).await?;
                c.get("/crl/k", None).await
            }
            .await;
            answers.push(got.is_ok());
            if served {
                got.unwrap_or_else(|e| panic!("{who} refused by {endpoint}: {e}"));
            }
        }
        assert_eq!(
            answers,
            [served, served],
            "{who}: answered by [etcd, the proxy]"
        );
    }
    let not_a_crl = file("not-a-crl.pem", &good.cert_pem);
    let why = support::start_fails(
        &etcd.endpoint(),
        &[
            "--cert-file",
            &format!("{dir}/server.pem"),
            "--key-file",
            &format!("{dir}/server-key.pem"),
            "--trusted-ca-file",
            &format!("{dir}/ca.pem"),
            "--client-crl-file",
            &not_a_crl,
        ],
    );
    assert!(
        why.contains("--client-crl-file") && why.contains("not-a-crl.pem"),
        "{why}"
    );
}
