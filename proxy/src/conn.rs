//! Client connections: each accepted TCP connection (after its TLS handshake, when the
//! proxy serves TLS: see `server_tls`) gets a [`ConnInfo`] that tonic puts in the
//! extensions of every request on it, so per-connection limits (the watch cap, the
//! bytes of Watch requests read ahead) are shared by all of a connection's streams; and
//! the HTTP/2 windows every connection is served with ([`http2`]).
//!
//! ## HTTP/2 windows and the small-frame guard
//! h2 (0.4.16 and later) charges every received DATA frame under 256 bytes `256 - len`
//! bytes of a per-connection budget until the service reads it, and closes the whole
//! connection (GOAWAY `ENHANCE_YOUR_CALM`, `too_many_data_frames`) when it runs out. The
//! budget is half the connection window (at least 25,600 bytes); hyper and tonic do not
//! let it be set otherwise. grpc-go clients (etcdctl, clientv3, Kubernetes) send each
//! message in its own DATA frame, and a pipelined Watch stream is thousands of 7-byte
//! frames: h2 reads a whole stream window of them from the socket before the stream's
//! reader can run. So the connection window is sized for the worst a stream can cost
//! ([`FLOODED_STREAMS`] streams each with a full window of etcd's smallest request,
//! unread), the adaptive window stays off (it makes both windows one estimate, under
//! which a single stream exhausts the budget), and the Watch service reads its streams
//! eagerly into a queue bounded per connection (`--max-queued-watch-request-bytes`) and over
//! all of them (`--max-queued-watch-request-bytes-total`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;
use tonic::transport::Server;

use crate::authority_header::AuthorityFix;

/// How long to pause accepting after an accept error (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a client has to finish its TLS handshake (etcd's Go server: none by default;
/// a bound keeps half-open connections from holding a task forever).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections handshaken and not yet taken by the server.
const READY_QUEUE: usize = 64;

/// The receive window of each stream a client opens: etcd's (grpc-go's initial 64 KiB).
pub(crate) const STREAM_WINDOW: u32 = 65_535;
/// etcd's smallest request on a stream that stays open: a `WatchProgressRequest`, the
/// 5-byte gRPC prefix and 2 bytes of protobuf, each in its own DATA frame from grpc-go.
const SMALLEST_REQUEST: u32 = 7;
/// h2's threshold: a DATA frame with fewer payload bytes than this costs the difference.
const SMALL_FRAME: u32 = 256;
/// How many streams of one connection may each have a full window of the smallest
/// requests waiting unread at the same moment before h2 would close the connection.
pub(crate) const FLOODED_STREAMS: u32 = 2;
/// The receive window of a whole client connection: twice (h2's budget is half of it)
/// the cost of [`FLOODED_STREAMS`] full stream windows of 7-byte frames (9,362 frames of
/// 249 bytes each), rounded up to 9 MiB. It is also the most payload a client can make
/// the connection hold unread.
pub(crate) const CONNECTION_WINDOW: u32 = 9 * 1024 * 1024;
const _: () = assert!(
    CONNECTION_WINDOW / 2
        >= FLOODED_STREAMS * (STREAM_WINDOW / SMALLEST_REQUEST) * (SMALL_FRAME - SMALLEST_REQUEST)
);

/// `server` with the HTTP/2 windows of every client connection (see the module docs).
pub(crate) fn http2(server: Server) -> Server {
    server
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .http2_adaptive_window(Some(false))
}

/// What the proxy knows of one client connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// Unique per accepted connection (in logs).
    pub(crate) id: u64,
    pub(crate) remote: Option<SocketAddr>,
    /// The connection's watch budget (`--max-watches-per-connection`).
    pub(crate) watches: ConnScope,
    /// The bytes of Watch requests its streams may have read ahead
    /// (`--max-queued-watch-request-bytes`), as permits.
    pub(crate) requests: RequestBudget,
}

/// The bytes of Watch requests a connection's streams may have read ahead, as permits of
/// the connection's own and of the proxy's whole budget, with both limits (named in a
/// refusal).
#[derive(Debug, Clone)]
pub(crate) struct RequestBudget {
    connection: Arc<Semaphore>,
    limit: usize,
    total: Arc<Semaphore>,
    total_limit: usize,
}

/// A queued request's share of its connection's and of the proxy's queued bytes, given
/// back when its session takes it (dropped).
#[derive(Debug)]
pub(crate) struct Share {
    _connection: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// Which bound a request found spent: the connection's or the proxy's, with its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    Connection(usize),
    Total(usize),
}

impl RequestBudget {
    /// A connection's budget of `limit` bytes within `total` (the proxy's, shared by every
    /// connection, see [`RequestBudget::total`]); limits above what a semaphore holds are
    /// cut to it.
    pub(crate) fn new(limit: usize, total: &(Arc<Semaphore>, usize)) -> RequestBudget {
        RequestBudget {
            connection: Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
            limit,
            total: total.0.clone(),
            total_limit: total.1,
        }
    }

    /// The proxy's whole budget of `limit` bytes, for [`RequestBudget::new`].
    pub(crate) fn total(limit: usize) -> (Arc<Semaphore>, usize) {
        (
            Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
            limit,
        )
    }

    /// `bytes` of both budgets, or which one is spent (then nothing is taken).
    pub(crate) fn take(&self, bytes: usize) -> Result<Share, Over> {
        let n = |limit| u32::try_from(bytes).map_err(|_| limit);
        let connection = n(Over::Connection(self.limit)).and_then(|n| {
            self.connection
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| Over::Connection(self.limit))
        })?;
        let total = self
            .total
            .clone()
            .try_acquire_many_owned(connection.num_permits() as u32)
            .map_err(|_| Over::Total(self.total_limit))?;
        Ok(Share {
            _connection: connection,
            _total: total,
        })
    }

    /// A share of nothing (for the refusal that ends a stream).
    pub(crate) fn nothing(&self) -> Share {
        Share {
            _connection: self
                .connection
                .clone()
                .try_acquire_many_owned(0)
                .expect("never closed"),
            _total: self
                .total
                .clone()
                .try_acquire_many_owned(0)
                .expect("never closed"),
        }
    }

    /// Bytes queued on this connection now.
    pub(crate) fn queued(&self) -> usize {
        self.limit
            .min(Semaphore::MAX_PERMITS)
            .saturating_sub(self.connection.available_permits())
    }
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
    /// Its read side as h2 sees it: an `:authority` with a scheme made acceptable
    /// (`authority_header/`).
    authority: AuthorityFix,
    info: ConnInfo,
    /// Counts it in `etcd_cache_proxy_connections` until it is closed.
    _open: crate::metrics::GaugeGuard,
    /// Its place among `--max-connections` until it is closed.
    _slot: tokio::sync::OwnedSemaphorePermit,
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
        let this = self.get_mut();
        match &mut this.io {
            Io::Plain(io) => this.authority.poll_read(Pin::new(io), cx, buf),
            Io::Tls(io) => this.authority.poll_read(Pin::new(io.as_mut()), cx, buf),
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
///
/// At most `max_connections` are open at once (`--max-connections`): one accepted beyond
/// is closed at once, counted in `etcd_cache_proxy_connections_refused_total` and
/// logged (at most once a second) with the limit.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    max_connections: usize,
    queued_request_bytes: usize,
    queued_request_bytes_total: usize,
) -> impl Stream<Item = io::Result<Conn>> {
    let (ready, taken) = mpsc::channel(READY_QUEUE);
    let slots = Arc::new(Semaphore::new(max_connections));
    tokio::spawn(accept(
        listener,
        tls.map(TlsAcceptor::from),
        ready,
        slots,
        max_connections,
        queued_request_bytes,
        RequestBudget::total(queued_request_bytes_total),
    ));
    tokio_stream::wrappers::ReceiverStream::new(taken)
}

/// The accept loop of [`incoming`]; ends when the server stops taking connections.
async fn accept(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    ready: mpsc::Sender<io::Result<Conn>>,
    slots: Arc<Semaphore>,
    max_connections: usize,
    queued_request_bytes: usize,
    queued_total: (Arc<Semaphore>, usize),
) {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let mut warned: Option<tokio::time::Instant> = None;
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::metrics::get().connection_refused();
            if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                warned = Some(tokio::time::Instant::now());
                tracing::warn!(
                    %remote,
                    max_connections,
                    "connection refused: {max_connections} client connections are open \
                     (--max-connections)"
                );
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let info = ConnInfo {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            remote: Some(remote),
            watches: ConnScope::default(),
            requests: RequestBudget::new(queued_request_bytes, &queued_total),
        };
        let open = crate::metrics::get().connection();
        let Some(acceptor) = tls.clone() else {
            let conn = Conn {
                io: Io::Plain(tcp),
                authority: AuthorityFix::default(),
                info,
                _open: open,
                _slot: slot,
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
                        authority: AuthorityFix::default(),
                        info,
                        _open: open,
                        _slot: slot,
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

/// The watch budget of one client connection (`--max-watches-per-connection`), made on
/// the connection's first Watch stream and shared by all of them.
#[derive(Debug, Default, Clone)]
pub(crate) struct ConnScope(Arc<std::sync::OnceLock<etcd_cache::WatchScope>>);

impl ConnScope {
    /// The connection's scope of `cache`'s watches, made on first use with `limit`.
    pub(crate) fn get_or_init(
        &self,
        cache: &etcd_cache::Cache,
        limit: usize,
    ) -> &etcd_cache::WatchScope {
        self.0.get_or_init(|| cache.scope(limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each connection holds at most its own bound, and all of them together at most the
    /// proxy's: a share given back (its request taken) makes room again for any of them.
    #[test]
    fn queued_requests_are_bounded_per_connection_and_in_total() {
        let total = RequestBudget::total(1_000);
        let a = RequestBudget::new(600, &total);
        let b = RequestBudget::new(600, &total);
        let a1 = a.take(500).unwrap();
        assert_eq!(a.take(200).unwrap_err(), Over::Connection(600));
        let b1 = b.take(400).unwrap();
        assert_eq!(a.queued(), 500);
        assert_eq!(b.queued(), 400);
        // b has room of its own, the proxy has not.
        assert_eq!(b.take(200).unwrap_err(), Over::Total(1_000));
        // A refusal takes nothing.
        assert_eq!(b.queued(), 400);
        let _nothing = b.nothing();
        drop(a1);
        let b2 = b.take(200).unwrap();
        assert_eq!(b.queued(), 600);
        drop((b1, b2));
        assert_eq!(b.queued(), 0);
        // More than a semaphore holds is refused, not a panic.
        let huge = RequestBudget::new(usize::MAX, &RequestBudget::total(usize::MAX));
        assert!(huge.take(usize::MAX).is_err());
    }
}
