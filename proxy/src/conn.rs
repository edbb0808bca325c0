//! Client connections: each accepted TCP connection (after its TLS handshake, when the
//! proxy serves TLS: see `server_tls`) gets a [`ConnInfo`] that tonic puts in the
//! extensions of every request on it, so per-connection limits (the watch cap) are shared
//! by all of a connection's streams.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use crate::watch::cached::ConnScope;

/// How long to pause accepting after an accept error (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a client has to finish its TLS handshake (etcd's Go server: none by default;
/// a bound keeps half-open connections from holding a task forever).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections handshaken and not yet taken by the server.
const READY_QUEUE: usize = 64;

/// What the proxy knows of one client connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// Unique per accepted connection (in logs).
    pub(crate) id: u64,
    pub(crate) remote: Option<SocketAddr>,
    /// The connection's watch budget (`--max-watches-per-connection`).
    pub(crate) watches: ConnScope,
}

/// The connection of a request, if it came through [`incoming`].
pub(crate) fn info(ext: &http::Extensions) -> Option<&ConnInfo> {
    ext.get::<ConnInfo>()
}

/// A client's byte stream: plain TCP, or TLS over it.
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An accepted connection with its [`ConnInfo`].
pub(crate) struct Conn {
    io: Io,
    info: ConnInfo,
    /// Counts it in `etcd_cache_proxy_connections` until it is closed.
    _open: crate::metrics::GaugeGuard,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(io) => Pin::new(io).poll_flush(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }
}

/// Every connection accepted on `listener`, forever, after its TLS handshake when `tls`
/// is set. Handshakes run in tasks of their own, so a slow or silent client holds up no
/// other; one that fails or takes over [`HANDSHAKE_TIMEOUT`] is dropped (logged at
/// debug: a refused certificate is the client's to see). Accept errors are logged and
/// followed by a short pause instead of ending the stream.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
) -> impl Stream<Item = io::Result<Conn>> {
    let (ready, taken) = mpsc::channel(READY_QUEUE);
    tokio::spawn(accept(listener, tls.map(TlsAcceptor::from), ready));
    tokio_stream::wrappers::ReceiverStream::new(taken)
}

/// The accept loop of [`incoming`]; ends when the server stops taking connections.
async fn accept(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    ready: mpsc::Sender<io::Result<Conn>>,
) {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = ready.closed() => return,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let info = ConnInfo {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            remote: Some(remote),
            watches: ConnScope::default(),
        };
        let open = crate::metrics::get().connection();
        let Some(acceptor) = tls.clone() else {
            let conn = Conn {
                io: Io::Plain(tcp),
                info,
                _open: open,
            };
            if ready.send(Ok(conn)).await.is_err() {
                return;
            }
            continue;
        };
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let conn = Conn {
                        io: Io::Tls(Box::new(stream)),
                        info,
                        _open: open,
                    };
                    let _ = ready.send(Ok(conn)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    tracing::debug!(%remote, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
                }
            }
        });
    }
}
