//! A TCP forwarder between a client and etcd, for fault injection.
//!
//! ```no_run
//! # async fn example(etcd: &testkit::EtcdServer) {
//! # use testkit::TcpProxy;
//! let proxy = TcpProxy::start(etcd.client_addr()).await;
//! let client = testkit::client(&[proxy.endpoint()]).await;
//! proxy.drop_all_connections(); // every open connection is reset; new ones are accepted
//! proxy.set_blackhole(true); // connections stay open, no byte moves either way
//! proxy.set_refuse(true); // new connections are reset at once
//! # }
//! ```
//!
//! Needs a tokio runtime. Dropping the proxy stops its listener and every connection.

use std::collections::HashMap;
use std::fmt::Display;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// How long a connection to the upstream may take.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read per forwarding step and direction.
const BUF_SIZE: usize = 64 * 1024;

struct Shared {
    upstream: Mutex<String>,
    refuse: AtomicBool,
    /// `true` while black-holed.
    blackhole: watch::Sender<bool>,
    /// Bumped by `drop_all_connections`; every connection alive at that moment ends.
    epoch: watch::Sender<u64>,
    /// Every live connection's sockets (duplicated handles), so that
    /// `drop_all_connections` shuts them down, and counts them, before it returns.
    sockets: Mutex<HashMap<u64, Sockets>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    dropped: AtomicU64,
    active: AtomicUsize,
    bytes: AtomicU64,
}

/// One connection's sockets, and whether `drop_all_connections` cut it.
#[derive(Default)]
struct Sockets {
    open: Vec<std::net::TcpStream>,
    cut: bool,
}

/// A TCP forwarder on 127.0.0.1 with a random port, in front of one upstream address.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on 127.0.0.1 (random port) and forwards every connection to `upstream`:
    /// `"127.0.0.1:2379"`, `"http://127.0.0.1:2379"` or a `SocketAddr`.
    pub async fn start(upstream: impl Display) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("TcpProxy: cannot bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("TcpProxy: local_addr");
        let shared = Arc::new(Shared {
            upstream: Mutex::new(strip_scheme(&upstream.to_string())),
            refuse: AtomicBool::new(false),
            blackhole: watch::Sender::new(false),
            epoch: watch::Sender::new(0),
            sockets: Mutex::default(),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        TcpProxy { addr, shared, task }
    }

    /// The proxy's URL, `http://127.0.0.1:PORT`, to give to a client instead of etcd's.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Points new connections at another upstream (existing ones keep theirs).
    pub fn set_upstream(&self, upstream: impl Display) {
        *self.shared.upstream.lock().unwrap() = strip_scheme(&upstream.to_string());
    }

    /// Closes every current connection at once, on both sides, with a reset (RST). New
    /// connections are still accepted.
    ///
    /// When it returns, nothing more is forwarded on those connections: their sockets
    /// are shut down before it returns, not when their tasks next run, so a write made
    /// upstream after this call (and its watch event) cannot reach the client through
    /// them, however busy the machine.
    pub fn drop_all_connections(&self) {
        // Under the registry's lock: a task that the bump wakes cannot leave the registry
        // (uncounted) before the sweep below has marked it.
        let mut connections = self.shared.sockets.lock().unwrap();
        self.shared.epoch.send_modify(|e| *e += 1);
        for connection in connections.values_mut().filter(|c| !c.cut) {
            connection.cut = true;
            for socket in &connection.open {
                let _ = socket.shutdown(Shutdown::Both);
            }
            self.shared.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// While `true`: connections stay open but no byte is forwarded in either direction (and
    /// new connections are accepted but not connected upstream) — a stall without a close.
    /// Bytes held during the stall are delivered when it ends.
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// While `true`: new connections are reset as soon as they are accepted. Existing ones
    /// are untouched.
    pub fn set_refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    /// Connections accepted so far (refused ones included).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections refused so far (`set_refuse`).
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections closed by `drop_all_connections` so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// Bytes forwarded so far, both directions together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.shared.bytes.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpProxy")
            .field("addr", &self.addr)
            .field("upstream", &*self.shared.upstream.lock().unwrap())
            .field("accepted", &self.accepted())
            .field("active", &self.active())
            .finish()
    }
}

fn strip_scheme(s: &str) -> String {
    let s = s.trim();
    let s = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .unwrap_or(s);
    s.trim_end_matches('/').to_string()
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // e.g. too many open files: back off a little instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                if shared.refuse.load(Ordering::SeqCst) {
                    shared.refused.fetch_add(1, Ordering::SeqCst);
                    reset(&stream);
                    drop(stream);
                    continue;
                }
                conns.spawn(connection(stream, shared.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Makes the close of `stream` send RST instead of FIN.
fn reset(stream: &TcpStream) {
    #[allow(deprecated)] // a zero linger does not block on close
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Counts a connection as active and keeps its sockets' handles until it ends.
struct ActiveGuard(Arc<Shared>, u64);

impl ActiveGuard {
    /// Counts the connection and enters it in the registry: from here on a
    /// `drop_all_connections` cuts it (and counts it), whatever its task is doing.
    fn new(shared: &Arc<Shared>) -> ActiveGuard {
        shared.active.fetch_add(1, Ordering::SeqCst);
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        shared
            .sockets
            .lock()
            .unwrap()
            .insert(id, Sockets::default());
        ActiveGuard(shared.clone(), id)
    }

    /// Registers a socket of this connection for `drop_all_connections`; `false` if the
    /// connection was cut already (the socket is then shut down at once).
    fn register(&self, socket: &TcpStream) -> bool {
        let mut connections = self.0.sockets.lock().unwrap();
        let connection = connections.entry(self.1).or_default();
        // A duplicated handle of the same socket: shutting it down shuts the socket.
        if let Ok(fd) = socket.as_fd().try_clone_to_owned() {
            let socket = std::net::TcpStream::from(fd);
            if connection.cut {
                let _ = socket.shutdown(Shutdown::Both);
            }
            connection.open.push(socket);
        }
        !connection.cut
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.sockets.lock().unwrap().remove(&self.1);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn connection(mut client: TcpStream, shared: Arc<Shared>) {
    // The registry decides (and counts) which connections a cut ends; the epoch only
    // wakes their tasks. Entered before subscribing: a cut whose bump this connection
    // does not see as a change swept the registry before it was entered, or marked it.
    let guard = ActiveGuard::new(&shared);
    let mut epoch = shared.epoch.subscribe();
    if !guard.register(&client) {
        reset(&client);
        return;
    }
    let _ = client.set_nodelay(true);

    // Connect upstream only while traffic flows (a black hole is a partition).
    let upstream = async {
        wait_open(&mut shared.blackhole.subscribe()).await;
        let addr = shared.upstream.lock().unwrap().clone();
        tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(addr)).await
    };
    let mut upstream = tokio::select! {
        // The cut first: when both are ready, the connection ends.
        biased;
        _ = epoch.changed() => {
            reset(&client);
            return;
        }
        r = upstream => match r {
            Ok(Ok(s)) => s,
            _ => {
                reset(&client);
                return;
            }
        },
    };
    if !guard.register(&upstream) {
        // Cut while connecting upstream.
        reset(&client);
        reset(&upstream);
        return;
    }
    let _ = upstream.set_nodelay(true);

    let cut = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let up = pump(cr, uw, shared.blackhole.subscribe(), &shared.bytes);
        let down = pump(ur, cw, shared.blackhole.subscribe(), &shared.bytes);
        tokio::select! {
            // The cut first: pumps that failed because it shut the sockets down end the
            // connection with a reset, as a cut.
            biased;
            _ = epoch.changed() => true,
            _ = async { tokio::try_join!(up, down) } => false,
        }
    };
    if cut {
        reset(&client);
        reset(&upstream);
    }
}

async fn wait_open(blackhole: &mut watch::Receiver<bool>) {
    let _ = blackhole.wait_for(|on| !*on).await;
}

/// Copies `r` to `w` until EOF (then half-closes `w`) or an error, pausing while black-holed.
async fn pump<R, W>(
    mut r: R,
    mut w: W,
    mut blackhole: watch::Receiver<bool>,
    bytes: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        wait_open(&mut blackhole).await;
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        // Bytes read just as the black hole started are held until it ends.
        wait_open(&mut blackhole).await;
        w.write_all(&buf[..n]).await?;
        bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the upstream writes after `drop_all_connections` returns never reaches the
    /// client (the tests that cut the cache off and write behind its back rely on it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_is_forwarded_once_drop_all_connections_returns() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = TcpProxy::start(upstream.local_addr().unwrap()).await;
        for round in 0..50 {
            let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
            let (mut server, _) = upstream.accept().await.unwrap();
            server.write_all(b"before").await.unwrap();
            let mut buf = [0u8; 6];
            client.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"before", "traffic flows before the cut");
            proxy.drop_all_connections();
            // It may fail, or land in a socket that forwards nothing any more.
            let _ = server.write_all(b"after").await;
            let mut rest = Vec::new();
            let _ = client.read_to_end(&mut rest).await;
            assert!(
                rest.is_empty(),
                "round {round}: {:?} was forwarded after the cut",
                String::from_utf8_lossy(&rest)
            );
        }
        // Every connection ends (its task sees the cut when it next runs).
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while proxy.active() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        assert!(
            ended.await.is_ok(),
            "{} connections still open",
            proxy.active()
        );
        assert_eq!(proxy.dropped(), 50, "every connection was counted as cut");
    }
}
