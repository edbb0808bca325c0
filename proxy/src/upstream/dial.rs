//! How each endpoint toward etcd is dialed: the TLS settings (shared by the forwarding
//! channel and the cache's client), the cache's own balanced channel, and the verifier of
//! `--insecure-skip-tls-verify`.
//!
//! ## TLS without verification
//! With `--insecure-skip-tls-verify` each endpoint gets tonic's
//! `Endpoint::tls_config_with_verifier` (tonic 0.14.9 takes a rustls
//! `ServerCertVerifier` there; no connector of our own is needed) with [`Unverified`]:
//! etcd's certificate chain and name are not checked, its handshake signature still is
//! (as Go's `InsecureSkipVerify`).

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::sync::mpsc;
use tonic::transport::channel::Change;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::Config;
use crate::error::{read, Error, Result};
use crate::pb::etcdserverpb::{maintenance_client::MaintenanceClient, StatusRequest};

/// Time limit of one connection attempt to an endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The first pause before trying to reach etcd again while the proxy starts.
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest such pause.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// Pauses between attempts to reach etcd while the proxy (or a cache of it) starts: the
/// first short, as etcd is often starting beside the proxy (a member restarted with its
/// proxy) and serves a moment later; then doubling up to a second.
pub(crate) struct StartRetry(Duration);

impl StartRetry {
    pub(crate) fn new() -> Self {
        StartRetry(FIRST_RETRY)
    }

    /// Sleeps the pause, and makes the next one longer.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(MAX_RETRY);
    }
}

/// The TLS settings toward etcd (shared by the forwarding channel and the cache's client).
/// With `--insecure-skip-tls-verify` no CA is set: [`Dial::endpoint`] puts [`Unverified`] in
/// place of the verifier (tonic refuses a CA beside a verifier of our own).
pub(crate) fn client_tls(config: &Config) -> Result<Option<ClientTlsConfig>> {
    if !config.upstream_tls() {
        return Ok(None);
    }
    let mut tls = ClientTlsConfig::new();
    if let Some(ca) = config
        .cacert
        .as_ref()
        .filter(|_| !config.insecure_skip_tls_verify)
    {
        tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let (Some(cert), Some(key)) = (&config.cert, &config.key) {
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(name) = &config.upstream_server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(Some(tls))
}

/// How each endpoint toward etcd is dialed: its TLS, and whether etcd's certificate goes
/// unverified.
#[derive(Clone)]
pub(crate) struct Dial {
    tls: Option<ClientTlsConfig>,
    unverified: bool,
}

impl Dial {
    /// The proxy's settings.
    pub(crate) fn new(config: &Config) -> Result<Dial> {
        Ok(Dial {
            tls: client_tls(config)?,
            unverified: config.insecure_skip_tls_verify,
        })
    }

    /// One endpoint with the proxy's connection settings (TLS only for `https://`).
    pub(crate) fn endpoint(&self, url: &str) -> Result<Endpoint> {
        let mut ep = Endpoint::from_shared(url.to_string())
            .map_err(|source| Error::Endpoint {
                url: url.to_string(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        // The cache's HTTP/2 windows toward etcd (etcd_cache::EtcdChannel): forwarded
        // streams whose clients stall do not make h2 close the connection
        // (too_many_data_frames).
        ep = etcd_cache::EtcdChannel::endpoint(ep);
        match &self.tls {
            Some(tls) if url.starts_with("https://") && self.unverified => ep
                .tls_config_with_verifier(tls.clone(), Unverified::verifier())
                .map_err(Error::Tls),
            Some(tls) if url.starts_with("https://") => {
                ep.tls_config(tls.clone()).map_err(Error::Tls)
            }
            _ => Ok(ep),
        }
    }
}

/// The balanced channel of the cache's own etcd client (give it to
/// `etcd_client::Client::connect_with_balanced_channel` in place of
/// `etcd_cache::EtcdChannel::new()`): `EtcdChannel`'s HTTP/2 windows, and with
/// `--insecure-skip-tls-verify` each endpoint's TLS with [`Unverified`] (etcd-client sets
/// an endpoint's TLS from `ConnectOptions`, whose `ClientTlsConfig` cannot carry a verifier
/// of our own, so it is set again here, over it).
pub(crate) struct CacheChannel {
    dial: Dial,
}

impl CacheChannel {
    /// The proxy's settings.
    pub(crate) fn new(config: &Config) -> Result<CacheChannel> {
        Ok(CacheChannel {
            dial: Dial::new(config)?,
        })
    }
}

impl etcd_client::BalancedChannelBuilder for CacheChannel {
    type Error = tonic::transport::Error;

    /// tonic's balanced channel behind a task that gives every endpoint the client
    /// inserts these settings; it ends with the client's last handle.
    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> std::result::Result<
        (
            etcd_client::Channel,
            mpsc::Sender<Change<http::Uri, Endpoint>>,
        ),
        Self::Error,
    > {
        let (channel, to_tonic) = Channel::balance_channel(buffer_size);
        let (updater, mut changes) =
            mpsc::channel::<Change<http::Uri, Endpoint>>(buffer_size.max(1));
        let dial = self.dial;
        tokio::spawn(async move {
            while let Some(change) = changes.recv().await {
                let change = match change {
                    Change::Insert(uri, ep) => {
                        let ep = etcd_cache::EtcdChannel::endpoint(ep);
                        let ep = match &dial.tls {
                            Some(tls) if dial.unverified && uri.scheme_str() == Some("https") => {
                                match ep
                                    .clone()
                                    .tls_config_with_verifier(tls.clone(), Unverified::verifier())
                                {
                                    Ok(ep) => ep,
                                    Err(e) => {
                                        tracing::warn!(endpoint = %uri, error = %e, "the cache's endpoint keeps its verified TLS");
                                        ep
                                    }
                                }
                            }
                            _ => ep,
                        };
                        Change::Insert(uri, ep)
                    }
                    other => other,
                };
                if to_tonic.send(change).await.is_err() {
                    return;
                }
            }
        });
        Ok((etcd_client::Channel::Tonic(channel), updater))
    }
}

/// A verifier that takes any certificate etcd presents (`--insecure-skip-tls-verify`);
/// the handshake's signature is still checked against that certificate's key.
#[derive(Debug)]
pub(crate) struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl Unverified {
    fn verifier() -> Arc<dyn ServerCertVerifier> {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        Arc::new(Unverified(provider))
    }
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The version each endpoint reports (for the start-up log line), each on its own channel.
pub(crate) async fn versions(config: &Config) -> Vec<(String, Result<String, String>)> {
    let dial = Dial::new(config);
    let mut out = Vec::new();
    for url in config.endpoint_urls() {
        let v = async {
            let dial = dial.as_ref().map_err(|e| e.to_string())?;
            let ep = dial.endpoint(&url).map_err(|e| e.to_string())?;
            let ch = ep.connect().await.map_err(|e| e.to_string())?;
            let resp = MaintenanceClient::new(ch)
                .status(StatusRequest {})
                .await
                .map_err(|e| e.message().to_string())?;
            Ok::<_, String>(resp.into_inner().version)
        };
        let v = tokio::time::timeout(CONNECT_TIMEOUT, v)
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        out.push((url, v));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first retry comes after 50 ms (etcd is often starting beside the proxy), each
    /// next one after twice the last, up to a second.
    #[tokio::test(start_paused = true)]
    async fn start_retries_begin_short_and_double_up_to_a_second() {
        let mut retry = StartRetry::new();
        let mut pauses = Vec::new();
        for _ in 0..8 {
            let before = tokio::time::Instant::now();
            retry.wait().await;
            pauses.push(before.elapsed().as_millis());
        }
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
    }
}
