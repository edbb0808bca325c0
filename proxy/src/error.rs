//! Why the proxy could not start or keep serving. Runtime errors of calls are gRPC
//! statuses (see `etcd_errors.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;

/// A start-up or serving failure; `main` prints it with its causes and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bad endpoint {url:?}")]
    Endpoint {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("no --endpoints given")]
    NoEndpoints,
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("the metrics recorder")]
    Metrics(#[source] std::io::Error),
    #[error("etcd's TLS certificate is refused: {reason} ({hint})")]
    UpstreamCertificate {
        /// What the TLS handshake said.
        reason: String,
        /// What to change.
        hint: &'static str,
    },
    #[error("TLS configuration")]
    Tls(#[source] tonic::transport::Error),
    #[error("the TLS served to clients: {0}")]
    ServerTls(String),
    #[error("starting the cache")]
    Cache(#[source] etcd_cache::Error),
    #[error("cannot read the certificate's subject: {0}")]
    Certificate(String),
    #[error("authenticating --user {user:?} toward etcd failed: {}", status.message())]
    Authenticate { user: String, status: tonic::Status },
    #[error("{0} has etcd's root role: every client would get root through the proxy's own calls. Give the proxy a user with read on the cached prefix only, or pass --allow-root-upstream if you know what you are doing")]
    RootUpstream(String),
    #[error("checking the proxy's own etcd user {user:?} failed: {}", status.message())]
    IdentityCheck { user: String, status: tonic::Status },
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving gRPC")]
    Serve(#[source] tonic::transport::Error),
}

/// `Result` with [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads a PEM file named by a flag.
pub(crate) fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}
