//! [`WatchStream`]: one stream carrying any number of watches, as etcd-client's. Its
//! request half ([`WatchRequestSender`], `sender.rs`) adds and cancels watches and asks
//! for progress; its response half ([`WatchResponseStream`], `responses.rs`) yields every
//! watch's responses. They share a small control block (`control.rs`): the watches added
//! but not yet polled, the ids in use, and the progress requests.

mod control;
mod responses;
mod sender;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::error::Result;
use crate::shared::Shared;
use crate::subscribers::Scope;
use crate::watch::options::WatchOptions;
use crate::watch::response::WatchResponse;

use control::{Control, Incoming};
pub use responses::WatchResponseStream;
pub use sender::WatchRequestSender;

/// A watch stream: any number of watches, added with [`watch`](Self::watch), each
/// answered in order with a `created` response carrying its id, its events, and a
/// `canceled` response when it ends. Made by [`Cache::watch`](crate::Cache::watch)
/// (with one watch) or [`Cache::watch_stream`](crate::Cache::watch_stream) (empty).
/// Mirrors `etcd_client::WatchStream`; a `futures::Stream` of
/// `Result<WatchResponse>`. Dropping it cancels every watch on it and frees their slots
/// at once.
///
/// [`message`](Self::message) gives `Ok(None)` once no watch is left on the stream.
///
/// ```no_run
/// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
/// use std::collections::HashMap;
///
/// let mut stream = cache.watch("/app/a", None).await?;
/// stream.watch("/app/b", None).await?;
/// let mut names = HashMap::new();
/// while let Some(resp) = stream.message().await? {
///     if resp.created() {
///         names.insert(resp.watch_id(), names.len());
///     }
///     for ev in resp.events() {
///         println!("watch {} saw {:?}", resp.watch_id(), ev.kv().map(|kv| kv.key()));
///     }
/// }
/// # Ok(()) }
/// ```
pub struct WatchStream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("responses", &self.responses)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    /// An empty stream on `shared`, counting its watches against `scope`.
    pub(crate) fn empty(shared: Arc<Shared>, scope: Option<Arc<Scope>>) -> WatchStream {
        let control = Control::new(shared, scope);
        WatchStream {
            sender: WatchRequestSender {
                control: control.clone(),
            },
            responses: WatchResponseStream::new(control),
        }
    }

    /// Adds a watch to this stream. As [`WatchRequestSender::watch`].
    ///
    /// # Errors
    /// As [`WatchRequestSender::watch`].
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<()> {
        // Both halves are here: hand the watch to the response half directly, after the
        // cancels before it.
        let added = self.sender.add(key.into(), options).await?;
        self.responses.take_news();
        self.responses.take_request(added);
        Ok(())
    }

    /// Adds a watch and waits until it is open (for a watch from now, until the
    /// cluster's revision is known), as `etcd_client::Client::watch` returns a stream
    /// whose watch etcd has created: a write made after this returns is delivered.
    pub(crate) async fn watch_open(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<()> {
        let (sub, created) = self.sender.register(key.into(), options).await?;
        self.responses.take_news();
        self.responses.take_request(Incoming::Watch(sub, created));
        Ok(())
    }

    /// Cancels the watch `watch_id`. As [`WatchRequestSender::cancel`].
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn cancel(&mut self, watch_id: i64) -> Result<()> {
        self.sender.cancel(watch_id).await
    }

    /// Asks for a progress response for every watch on the stream. As
    /// [`WatchRequestSender::request_progress`].
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn request_progress(&mut self) -> Result<()> {
        self.sender.request_progress().await
    }

    /// The next response; `Ok(None)` once no watch is left on the stream. As
    /// `etcd_client::WatchStream::message`.
    ///
    /// # Errors
    /// [`Error::Failed`](crate::Error::Failed) once, if the cache stopped on a permanent failure.
    ///
    /// # Cancel safety
    /// Cancel safe: a response is removed from the stream only when it is returned.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        self.responses.message().await
    }

    /// Everything ready now, up to `max` responses, waiting only for the first (a
    /// batch receive; see [`WatchResponseStream::messages`]). Appends to `out` and
    /// returns how many it added; 0 once the stream has ended.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use etcd_cache::WatchOptions;
    ///
    /// let mut stream = cache.watch("/app/", Some(WatchOptions::new().with_prefix())).await?;
    /// let mut batch = Vec::new();
    /// while stream.messages(&mut batch, 256).await? > 0 {
    ///     for resp in batch.drain(..) {
    ///         println!("{} events at {}", resp.events().len(), resp.revision());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Failed`](crate::Error::Failed) once, if the cache stopped on a permanent failure.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`message`](Self::message).
    pub async fn messages(&mut self, out: &mut Vec<WatchResponse>, max: usize) -> Result<usize> {
        self.responses.messages(out, max).await
    }

    /// Splits the stream into its request sender and its response stream, as
    /// etcd-client's: one task can add and cancel watches while another reads. The
    /// response stream then ends once no watch is left *and* the sender is dropped.
    pub fn split(self) -> (WatchRequestSender, WatchResponseStream) {
        let WatchStream {
            sender,
            mut responses,
        } = self;
        responses.end_when_empty = false;
        (sender, responses)
    }

    /// The id of the first watch of a stream made by `Cache::watch` (0 unless chosen
    /// with `with_watch_id`). Each response carries its own watch's id.
    pub fn watch_id(&self) -> i64 {
        self.responses
            .iter()
            .map(|w| w.watch_id)
            .chain(self.responses.pending_created())
            .chain(
                self.sender
                    .control
                    .inner
                    .lock()
                    .incoming
                    .iter()
                    .filter_map(Incoming::watch_id),
            )
            .min()
            .unwrap_or(0)
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchResponse>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.get_mut().responses).poll_next(cx)
    }
}
