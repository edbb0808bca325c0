//! The HTTP/2 settings of a connection to etcd, and an `etcd_client` channel builder
//! that applies them to every endpoint of a client.
//!
//! ## Why
//! h2 (0.4.16 and later, under tonic and hyper) charges every received DATA frame under
//! 256 bytes `256 - len` bytes of a per-connection budget until the application reads
//! it, and closes the whole connection (GOAWAY `ENHANCE_YOUR_CALM`,
//! `too_many_data_frames`) when the budget runs out. The budget is half the connection
//! window (at least 25,600 bytes); hyper does not let it be set otherwise. etcd sends each
//! watch response in its own DATA frame, most of them small: a process that stops
//! reading for a moment (a stall, a CPU-throttled container) finds a whole stream window
//! of them waiting, and with hyper's default windows (2 MiB per stream, 5 MiB per
//! connection) a window of one-event responses costs more than the budget. The
//! connection dies, and with it every call the client has in flight.
//!
//! ## The rule
//! A stream can hold at most its window of unread bytes, so the most a stream can cost is
//! `STREAM_WINDOW / SMALLEST * (256 - SMALLEST)` for etcd's smallest response. The
//! connection window is sized so that half of it covers four such streams at once;
//! hyper's adaptive window stays off (it sets both windows to one estimate, so that a
//! single stream could exhaust the budget).
//!
//! ## Memory
//! What a peer can make the client hold on one connection: at most the connection window
//! of unread payload (HTTP/2 flow control refuses more), and at most budget / 255 small
//! frames buffered at once, each of which may keep the 8 KiB read buffer it arrived in
//! alive. With these settings: 16 MiB of payload and 32,896 frames, whose buffers are at
//! most 257 MiB; a connection whose reader keeps up holds none of it (see
//! docs/RELIABILITY.md, "HTTP/2 windows and the small-frame guard").

use tokio::sync::mpsc;
use tonic::transport::channel::Change;
use tonic::transport::{Endpoint, Uri};

/// The receive window of each stream to etcd: what etcd may send on one stream before
/// the reader takes it (a watch, a range response). 256 KiB per round trip is 256 MB/s
/// at 1 ms.
pub const UPSTREAM_STREAM_WINDOW: u32 = 256 * 1024;

/// The receive window of a whole connection to etcd: 16 MiB, the most grpc-go (etcd's
/// own client) grows its windows to. Half of it is h2's small-frame budget.
pub const UPSTREAM_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// The smallest DATA frame etcd sends on a stream that stays open: a watch response with
/// a header and nothing else (a progress notification): the 5-byte gRPC prefix, the
/// header's cluster and member ids (10 bytes each as varints), revision and raft term.
const SMALLEST_RESPONSE: u32 = 32;

/// h2's threshold: a DATA frame with fewer payload bytes than this costs the difference.
const SMALL_FRAME: u32 = 256;

/// How many streams may each hold a full window of etcd's smallest responses, unread, at
/// the same moment, before h2 would close the connection: 4 (8 MiB of budget against
/// 8,192 frames of 224 bytes each).
const FLOODED_STREAMS: u32 = (UPSTREAM_CONNECTION_WINDOW / 2)
    / ((UPSTREAM_STREAM_WINDOW / SMALLEST_RESPONSE) * (SMALL_FRAME - SMALLEST_RESPONSE));
const _: () = assert!(FLOODED_STREAMS == 4);

/// The settings the cache uses on its connections to etcd, as an `etcd_client`
/// channel builder: give it to `etcd_client::Client::connect_with_balanced_channel` to
/// connect a client of your own with them (what [`CacheBuilder::connect`] does).
///
/// Stream windows of [`UPSTREAM_STREAM_WINDOW`], connection windows of
/// [`UPSTREAM_CONNECTION_WINDOW`], no adaptive window. A client connected with
/// `etcd_client::Client::connect` has hyper's defaults instead, under which a process
/// that stops reading for a few seconds while etcd sends many small watch events has
/// its connection closed by its own HTTP/2 stack (`too_many_data_frames`); the cache
/// logs a warning and counts `etcd_cache_upstream_disconnects_total{cause="too_many_data_frames"}`
/// when that happens.
///
/// ```no_run
/// # async fn f() -> etcd_cache::Result<()> {
/// use etcd_cache::etcd_client::Client;
///
/// let client = Client::connect_with_balanced_channel(
///     ["127.0.0.1:2379"],
///     None,
///     etcd_cache::EtcdChannel::new(),
/// )
/// .await?;
/// let cache = etcd_cache::Cache::builder(client).prefix("/app/").build().await?;
/// # Ok(()) }
/// ```
///
/// [`CacheBuilder::connect`]: crate::CacheBuilder::connect
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
#[must_use]
pub struct EtcdChannel {}

impl EtcdChannel {
    /// The settings above.
    pub fn new() -> Self {
        EtcdChannel {}
    }

    /// `endpoint` with these settings, for a tonic channel of your own to etcd.
    pub fn endpoint(endpoint: Endpoint) -> Endpoint {
        endpoint
            .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
            .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
            .http2_adaptive_window(false)
    }
}

impl etcd_client::BalancedChannelBuilder for EtcdChannel {
    type Error = tonic::transport::Error;

    /// tonic's balanced channel, behind a task that gives every endpoint the client
    /// inserts (at connect and by `add_endpoint`) these settings. The task ends when the
    /// client's last handle is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime (as tonic's own balanced channel).
    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(etcd_client::Channel, mpsc::Sender<Change<Uri, Endpoint>>), Self::Error> {
        let (channel, to_tonic) = tonic::transport::Channel::balance_channel(buffer_size);
        let (updater, mut changes) = mpsc::channel(buffer_size.max(1));
        tokio::spawn(async move {
            while let Some(change) = changes.recv().await {
                let change = match change {
                    Change::Insert(uri, endpoint) => {
                        Change::Insert(uri, EtcdChannel::endpoint(endpoint))
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
