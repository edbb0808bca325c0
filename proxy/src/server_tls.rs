//! The TLS the proxy serves to its clients, from `--cert-file`, `--key-file`,
//! `--trusted-ca-file`, `--client-crl-file`, `--tls-min-version` and `--tls-max-version`: a rustls server configuration built once
//! at start (a bad file is a start-up error that names it), used by `conn::incoming` for
//! each handshake. As etcd: with a trusted CA, clients must present a certificate it
//! signed; with revocation lists, a certificate one of them revokes is refused. Only the
//! client's own certificate is checked against the lists (etcd compares its serial), and a
//! certificate no list speaks of is accepted.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};

use crate::config::{Config, TlsVersion};
use crate::error::{read, Error, Result};

/// The server configuration when the proxy serves TLS (`--cert-file` and `--key-file`).
pub(crate) fn server_config(config: &Config) -> Result<Option<Arc<rustls::ServerConfig>>> {
    if config.client_crl_file.is_some() && config.trusted_ca_file.is_none() {
        tracing::warn!(
            "--client-crl-file is ignored: without --trusted-ca-file no client certificate is asked for"
        );
    }
    let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) else {
        return Ok(None);
    };
    let certs = certificates(cert_file, "--cert-file")?;
    let key = PrivateKeyDer::from_pem_slice(&read(key_file)?).map_err(|e| {
        bad(
            "--key-file",
            key_file,
            format!("no private key in it ({e})"),
        )
    })?;
    // --tls-min-version..=--tls-max-version (checked in order by `Config::check`).
    let versions: Vec<_> = [TlsVersion::Tls12, TlsVersion::Tls13]
        .into_iter()
        .filter(|v| (config.tls_min_version..=config.tls_max_version).contains(v))
        .map(TlsVersion::rustls)
        .collect();
    let builder = rustls::ServerConfig::builder_with_protocol_versions(&versions);
    let builder = match &config.trusted_ca_file {
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in certificates(ca_file, "--trusted-ca-file")? {
                roots
                    .add(ca)
                    .map_err(|e| bad("--trusted-ca-file", ca_file, e.to_string()))?;
            }
            let mut verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            if let Some(crl_file) = &config.client_crl_file {
                let crls = revocation_lists(crl_file)?;
                verifier = verifier
                    .with_crls(crls)
                    .only_check_end_entity_revocation()
                    .allow_unknown_revocation_status();
            }
            let verifier = verifier
                .build()
                .map_err(|e| match (e, &config.client_crl_file) {
                    (VerifierBuilderError::InvalidCrl(e), Some(crl_file)) => bad(
                        "--client-crl-file",
                        crl_file,
                        format!("not a certificate revocation list (PEM or DER): {e:?}"),
                    ),
                    (e, _) => bad("--trusted-ca-file", ca_file, e.to_string()),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder
        .with_single_cert(certs, key)
        .map_err(|e| bad("--cert-file", cert_file, format!("with --key-file: {e}")))?;
    // gRPC is HTTP/2; HTTP/1.1 carries `/proxy/health` and `/metrics` (`http_front.rs`).
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(Arc::new(tls)))
}

/// Every certificate in the PEM file `path`, at least one.
fn certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(flag, path, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(
            flag,
            path,
            "no certificate (BEGIN CERTIFICATE) in it".into(),
        ));
    }
    Ok(certs)
}

/// The revocation lists in `path`: PEM (`BEGIN X509 CRL`, one or more) or else one DER
/// list, as etcd's `x509.ParseCRL` takes them (the verifier's build parses them, so one that
/// does not parse is a start-up error, not a failure at the first handshake).
fn revocation_lists(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>> {
    let data = read(path)?;
    let pem = CertificateRevocationListDer::pem_slice_iter(&data)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("--client-crl-file", path, e.to_string()))?;
    Ok(if pem.is_empty() {
        vec![CertificateRevocationListDer::from(data)]
    } else {
        pem
    })
}

fn bad(flag: &str, path: &Path, why: String) -> Error {
    Error::ServerTls(format!("{flag} {}: {why}", path.display()))
}
