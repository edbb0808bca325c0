//! Client connections: each accepted TCP connection gets a [`ConnInfo`] that tonic puts
//! in the extensions of every request on it (plain or TLS), so per-connection limits
//! (the watch cap) are shared by all of a connection's streams.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TlsConnectInfo};

use crate::watch::ConnScope;

/// How long to pause accepting after an accept error (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

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
        .or_else(|| ext.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
}

/// An accepted TCP connection with its [`ConnInfo`].
pub(crate) struct Conn {
    io: TcpStream,
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
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Every connection accepted on `listener`, forever. Accept errors are logged and
/// followed by a short pause instead of ending the stream.
pub(crate) fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<Conn>> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    futures::stream::unfold(listener, |listener| async move {
        loop {
            match listener.accept().await {
                Ok((io, remote)) => {
                    let _ = io.set_nodelay(true);
                    let info = ConnInfo {
                        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                        remote: Some(remote),
                        watches: ConnScope::default(),
                    };
                    let conn = Conn {
                        io,
                        info,
                        _open: crate::metrics::get().connection(),
                    };
                    return Some((Ok(conn), listener));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    })
}
