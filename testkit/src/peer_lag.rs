//! A three-member cluster in which one member can be made to lag: its raft traffic, both
//! ways, passes through a delay line.
//!
//! Each member advertises the address of a forwarder ("front") in front of its real peer
//! listener, so every peer connection passes through one front. A connection belongs to
//! the lagging member when it reaches that member's front (the leader's appends sent as
//! pipeline posts, and the connections other members open to it) or when its first
//! request names that member in `X-Server-From` (the raft streams it opens to the others,
//! over which the leader sends it its appends and heartbeats). Every chunk of such a
//! connection is forwarded `delay` after it was read, in order, both ways. The member
//! then receives the log, and learns what is committed, `delay` late: it applies every
//! change `delay` after the others, while the leader and the third member go on at full
//! speed (they form the quorum).
//!
//! No kernel support is needed (the machines these tests run on have no `netem`).
//! Give the cluster an election timeout well above the delay (`--election-timeout`), or
//! the lagging member calls elections.
//!
//! ```no_run
//! # async fn example() {
//! use std::time::Duration;
//! let opts = testkit::EtcdOptions::default()
//!     .arg("--heartbeat-interval=250")
//!     .arg("--election-timeout=5000");
//! let lagging = testkit::LaggingCluster::start(opts).await;
//! let follower = (lagging.cluster().leader() + 1) % 3;
//! lagging.lag(follower, Duration::from_millis(1500));
//! # }
//! ```

use std::io;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cluster::EtcdCluster;
use crate::etcd::EtcdOptions;
use crate::http::member_status;

/// The most a request head is read before it is forwarded (etcd's peer requests carry a
/// few hundred bytes of headers).
const HEAD_LIMIT: usize = 16 * 1024;
/// Bytes read per chunk and direction.
const CHUNK: usize = 64 * 1024;

/// Which member lags, and by how much.
#[derive(Default)]
struct Lag {
    /// `(member index, its id as etcd writes it in X-Server-From, delay)`.
    target: Mutex<Option<(usize, String, Duration)>>,
}

impl Lag {
    /// The delay for a connection through front `front` whose first request came from
    /// `from` (a member id in hex, if the request named one).
    fn delay(&self, front: usize, from: Option<&str>) -> Duration {
        match &*self.target.lock().unwrap() {
            Some((i, id, d)) if *i == front || from == Some(id.as_str()) => *d,
            _ => Duration::ZERO,
        }
    }
}

/// A three-member [`EtcdCluster`] whose members reach each other through delay lines;
/// [`lag`](LaggingCluster::lag) makes one of them lag. Needs a tokio runtime; dropping it
/// stops the members and the fronts.
pub struct LaggingCluster {
    cluster: EtcdCluster,
    lag: Arc<Lag>,
    ids: Vec<u64>,
    fronts: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for LaggingCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaggingCluster")
            .field("cluster", &self.cluster)
            .field("ids", &self.ids)
            .finish_non_exhaustive()
    }
}

impl LaggingCluster {
    /// Starts the fronts, then three members with `opts` (off the async threads), and
    /// waits until all are healthy. Nothing lags yet.
    pub async fn start(opts: EtcdOptions) -> LaggingCluster {
        let lag = Arc::new(Lag::default());
        let mut fronts = Vec::new();
        let mut ports = Vec::new();
        let mut upstreams = Vec::new();
        for i in 0..EtcdCluster::SIZE {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a peer front");
            ports.push(listener.local_addr().expect("front address").port());
            let upstream = Arc::new(AtomicU16::new(0));
            upstreams.push(upstream.clone());
            fronts.push(tokio::spawn(serve_front(
                listener,
                i,
                upstream,
                lag.clone(),
            )));
        }
        let set = move |i: usize, port: u16| upstreams[i].store(port, Ordering::Release);
        let (cluster, ids) = tokio::task::spawn_blocking(move || {
            let cluster = EtcdCluster::start_fronted(opts, &ports, &set);
            let ids = (0..EtcdCluster::SIZE)
                .map(|i| {
                    member_status(cluster.member(i).health_addr())
                        .unwrap_or_else(|| panic!("member {i} has no status"))
                        .member_id
                })
                .collect();
            (cluster, ids)
        })
        .await
        .expect("the cluster's start panicked");
        LaggingCluster {
            cluster,
            lag,
            ids,
            fronts,
        }
    }

    /// The members.
    pub fn cluster(&self) -> &EtcdCluster {
        &self.cluster
    }

    /// Member `i`'s id.
    pub fn member_id(&self, i: usize) -> u64 {
        self.ids[i]
    }

    /// Makes member `i` lag by `delay` from now on (the bytes already in flight keep the
    /// delay they were read with). `Duration::ZERO` ends the lag; only one member lags at
    /// a time.
    pub fn lag(&self, i: usize, delay: Duration) {
        let target = (!delay.is_zero()).then(|| (i, format!("{:x}", self.ids[i]), delay));
        *self.lag.target.lock().unwrap() = target;
    }
}

impl Drop for LaggingCluster {
    fn drop(&mut self) {
        for f in &self.fronts {
            f.abort();
        }
    }
}

/// Accepts peer connections for member `index` and forwards them to its peer port.
async fn serve_front(listener: TcpListener, index: usize, upstream: Arc<AtomicU16>, lag: Arc<Lag>) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((inbound, _)) = listener.accept().await {
        let port = upstream.load(Ordering::Acquire);
        let lag = lag.clone();
        connections.spawn(async move {
            let _ = forward(inbound, port, index, lag).await;
        });
        while connections.try_join_next().is_some() {}
    }
}

/// One peer connection: reads the first request head to learn who sent it, then forwards
/// both ways through delay lines.
async fn forward(mut inbound: TcpStream, port: u16, front: usize, lag: Arc<Lag>) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_LIMIT {
        let n = inbound.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let from = sender(&head);
    let outbound = TcpStream::connect(("127.0.0.1", port)).await?;
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let delay = {
        let lag = lag.clone();
        let from = from.clone();
        move || lag.delay(front, from.as_deref())
    };
    let up = tokio::spawn(pump(in_read, out_write, head, delay.clone()));
    let down = tokio::spawn(pump(out_read, in_write, Vec::new(), delay));
    let _ = tokio::join!(up, down);
    Ok(())
}

/// The member id in a request head's `X-Server-From` header, lowercased.
fn sender(head: &[u8]) -> Option<String> {
    let head = String::from_utf8_lossy(head);
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-server-from")
            .then(|| value.trim().to_ascii_lowercase())
    })
}

/// Copies `from` to `to` (after `first`), each chunk `delay()` after it was read.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    first: Vec<u8>,
    delay: impl Fn() -> Duration + Send + 'static,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        if !first.is_empty() && tx.send((Instant::now() + delay(), first)).is_err() {
            return;
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay(), buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    while let Some((due, bytes)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    reader.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_is_read_from_the_request_head() {
        let head = b"GET /raft/stream/msgapp/8e9e05c52164694d HTTP/1.1\r\nHost: x\r\n\
                     X-Server-From: 8E9E05C52164694D\r\nX-Raft-To: 91bc3c398fb3c146\r\n\r\n";
        assert_eq!(sender(head).as_deref(), Some("8e9e05c52164694d"));
        assert_eq!(sender(b"GET /members HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn only_the_lagging_members_connections_are_delayed() {
        let lag = Lag::default();
        assert_eq!(lag.delay(1, Some("b")), Duration::ZERO);
        *lag.target.lock().unwrap() = Some((1, "b".to_string(), Duration::from_secs(1)));
        // Into its own front, from anyone.
        assert_eq!(lag.delay(1, Some("a")), Duration::from_secs(1));
        // Its streams to the others.
        assert_eq!(lag.delay(0, Some("b")), Duration::from_secs(1));
        // The others between themselves.
        assert_eq!(lag.delay(0, Some("c")), Duration::ZERO);
        assert_eq!(lag.delay(2, None), Duration::ZERO);
    }
}
