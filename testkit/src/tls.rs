//! Certificates made at test time (`rcgen`): a CA, a server certificate for 127.0.0.1 and
//! localhost, and client certificates, written as PEM files into a temporary directory for
//! etcd's `--cert-file`, `--key-file` and `--trusted-ca-file`.
//!
//! ```no_run
//! # async fn example() {
//! use testkit::{EtcdOptions, EtcdServer, TestPki};
//! let pki = TestPki::new();
//! let etcd = EtcdServer::start_with(EtcdOptions::default().tls(pki.server_tls(true)));
//! let tls = pki.client_tls(Some(&pki.client_identity("root")));
//! let options = etcd_client::ConnectOptions::new().with_tls(tls);
//! let client = testkit::Connect::new().options(options).client(&[etcd.endpoint()]).await;
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use etcd_client::{Certificate, Identity, TlsOptions};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SerialNumber,
};

/// The TLS files of an etcd server (see [`EtcdOptions::tls`](crate::EtcdOptions::tls)).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// `--cert-file`: the server certificate (SANs 127.0.0.1 and localhost).
    pub cert_file: PathBuf,
    /// `--key-file`.
    pub key_file: PathBuf,
    /// `--trusted-ca-file`: the CA that client certificates must chain to. Only with
    /// client-certificate auth: etcd turns client-certificate auth on whenever this flag is
    /// given, whatever `--client-cert-auth` says.
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth`: clients must present a certificate signed by that CA.
    pub client_cert_auth: bool,
    /// `--client-crl-file`: client certificates revoked (see [`TestPki::crl_file`]).
    pub client_crl_file: Option<PathBuf>,
    /// Keeps the files until the last server using them is gone.
    _dir: Arc<tempfile::TempDir>,
}

impl ServerTls {
    /// TLS with certificate and key files made elsewhere (another key type, say), no
    /// client-certificate auth. The caller keeps the files.
    ///
    /// # Panics
    /// When a temporary directory cannot be made.
    pub fn from_files(cert_file: PathBuf, key_file: PathBuf) -> ServerTls {
        ServerTls {
            cert_file,
            key_file,
            trusted_ca_file: None,
            client_cert_auth: false,
            client_crl_file: None,
            _dir: Arc::new(tempfile::tempdir().expect("a temporary directory")),
        }
    }

    /// The same, with `--client-crl-file` set to `crl` (see [`TestPki::crl_file`]).
    pub fn with_client_crl_file(mut self, crl: PathBuf) -> ServerTls {
        self.client_crl_file = Some(crl);
        self
    }
}

/// A client certificate and its key, in PEM.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// The certificate (its common name is etcd's user name when auth is on).
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
    /// The certificate's serial number (big-endian), as a CRL names it.
    pub serial: Vec<u8>,
}

/// A test CA with a server certificate, issuing client certificates on demand.
pub struct TestPki {
    dir: Arc<tempfile::TempDir>,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

impl TestPki {
    /// A new CA (its own key, so two `TestPki`s do not trust each other) and a server
    /// certificate for `127.0.0.1` and `localhost`, written to a temporary directory.
    ///
    /// # Panics
    /// When a certificate cannot be made or written.
    pub fn new() -> TestPki {
        let dir = tempfile::Builder::new()
            .prefix("etcd-test-pki-")
            .tempdir()
            .expect("cannot create a temporary directory for certificates");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "etcd-cache test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-signed CA");
        let ca_pem = ca_cert.pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let mut server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])
            .expect("server params");
        server
            .distinguished_name
            .push(DnType::CommonName, "etcd-cache test server");
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            // etcd's gateway and health checks dial the server with its own certificate.
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_key = KeyPair::generate().expect("server key");
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .expect("server certificate");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text)
                .unwrap_or_else(|e| panic!("cannot write {name}: {e}"))
        };
        write("ca.pem", &ca_pem);
        write("server.pem", &server_cert.pem());
        write("server-key.pem", &server_key.serialize_pem());
        TestPki {
            dir: Arc::new(dir),
            ca_pem,
            issuer,
        }
    }

    /// The directory holding `ca.pem`, `server.pem` and `server-key.pem`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate, in PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server's TLS files; `client_cert_auth` adds `--client-cert-auth` and
    /// `--trusted-ca-file` (this CA), so that clients must present a certificate it signed.
    pub fn server_tls(&self, client_cert_auth: bool) -> ServerTls {
        ServerTls {
            cert_file: self.dir.path().join("server.pem"),
            key_file: self.dir.path().join("server-key.pem"),
            trusted_ca_file: client_cert_auth.then(|| self.dir.path().join("ca.pem")),
            client_cert_auth,
            client_crl_file: None,
            _dir: self.dir.clone(),
        }
    }

    /// A client certificate signed by this CA, with `common_name` as its subject (with
    /// etcd's auth on and `--client-cert-auth`, the common name is the user).
    ///
    /// # Panics
    /// When the certificate cannot be made.
    pub fn client_identity(&self, common_name: &str) -> ClientIdentity {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        // Unique in the process (a CRL revokes by serial); positive (first byte < 0x80).
        static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);
        let serial: Vec<u8> = [0x10]
            .into_iter()
            .chain(std::process::id().to_be_bytes())
            .chain(NEXT_SERIAL.fetch_add(1, Ordering::Relaxed).to_be_bytes())
            .collect();
        params.serial_number = Some(SerialNumber::from(serial.clone()));
        let key = KeyPair::generate().expect("client key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("client certificate");
        ClientIdentity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial,
        }
    }

    /// A certificate revocation list signed by this CA that revokes `revoked`, written
    /// in DER as `crl.der` beside the certificates (for `--client-crl-file`).
    ///
    /// # Panics
    /// When the list cannot be made or written.
    pub fn crl_file(&self, revoked: &[&ClientIdentity]) -> PathBuf {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2000, 1, 1),
            next_update: rcgen::date_time_ymd(4000, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|id| RevokedCertParams {
                    serial_number: SerialNumber::from(id.serial.clone()),
                    revocation_time: rcgen::date_time_ymd(2001, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer).expect("a CRL");
        // DER: etcd 3.6 and later read the file with Go's x509.ParseRevocationList, which
        // takes DER only (a PEM file fails every handshake: "x509: malformed crl"); etcd
        // 3.4's x509.ParseCRL and the proxy take either.
        let path = self.dir.path().join("crl.der");
        std::fs::write(&path, crl.der()).expect("write crl.der");
        path
    }

    /// An ECDSA P-256 key pair for etcd's JWT auth tokens, written next to the certificates,
    /// as the argument that turns them on:
    /// `--auth-token=jwt,pub-key=…,priv-key=…,sign-method=ES256,ttl=<ttl_secs>s`.
    ///
    /// # Panics
    /// When the key cannot be made or written.
    pub fn jwt_auth_token_arg(&self, ttl_secs: u64) -> String {
        let key = KeyPair::generate().expect("JWT key");
        let private = self.dir.path().join("jwt.key");
        let public = self.dir.path().join("jwt.pub");
        std::fs::write(&private, key.serialize_pem()).expect("write jwt.key");
        std::fs::write(&public, key.public_key_pem()).expect("write jwt.pub");
        format!(
            "--auth-token=jwt,pub-key={},priv-key={},sign-method=ES256,ttl={ttl_secs}s",
            public.display(),
            private.display()
        )
    }

    /// etcd-client's TLS options trusting this CA, presenting `identity` if given.
    pub fn client_tls(&self, identity: Option<&ClientIdentity>) -> TlsOptions {
        let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        match identity {
            Some(id) => tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem)),
            None => tls,
        }
    }
}
