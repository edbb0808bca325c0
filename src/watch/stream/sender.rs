//! The request half of a stream: adds and cancels watches and asks for progress, handing
//! each to the response half through the control block.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::control::{Control, Incoming, UnansweredRequest};
use crate::error::{Error, Result};
use crate::watch::options::{Request, WatchOptions};
use crate::watch::register::{add, register, Added};
use crate::watch::subscription::Subscription;

/// The request half of a [`WatchStream`](crate::WatchStream) (from
/// [`WatchStream::split`](crate::WatchStream::split)), as
/// `etcd_client::WatchRequestSender`.
pub struct WatchRequestSender {
    pub(super) control: Arc<Control>,
}

impl std::fmt::Debug for WatchRequestSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchRequestSender").finish_non_exhaustive()
    }
}

impl WatchRequestSender {
    /// Adds a watch to the stream; its `created` response carries its watch id. It
    /// returns without waiting for etcd, as etcd-client's sends the create and returns:
    /// a watch from now starts after the cluster's revision learned by a round trip
    /// sent after this call and shared by every watch waiting (watches added one after
    /// another share it), and its `created` reports where it starts. Replies keep the
    /// order of the requests. Use [`Cache::watch`](crate::Cache::watch) for a watch that
    /// is open when the call returns.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::WatchLimit`],
    /// [`Error::WatchIdInUse`], [`Error::NotReady`] before the cache's first snapshot,
    /// [`Error::Closed`] / [`Error::Failed`]. Nothing is added then.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<()> {
        let added = self.add(key.into(), options).await?;
        self.control.inner.lock().incoming.push(added);
        self.control.notify();
        Ok(())
    }

    /// Adds a watch under a new id on this stream without waiting for etcd: a watch
    /// from now is handed over while its start is learned (its `created` response
    /// follows once it is), as etcd answers a create on its stream; the caller hands it
    /// to the response half.
    pub(super) async fn add(
        &self,
        key: Vec<u8>,
        options: Option<WatchOptions>,
    ) -> Result<Incoming> {
        let (request, watch_id, span) = self.reserve(&key, options)?;
        let control = &self.control;
        let added = add(&control.shared, request, control.scope.as_ref());
        match tracing::Instrument::instrument(added, span.clone()).await {
            Ok(Added::Registered(registration)) => {
                let (sub, created) = self.registered(registration, watch_id, &span);
                Ok(Incoming::Watch(sub, created))
            }
            Ok(Added::Opening(opening)) => {
                let sub_id = opening.sub_id();
                control.inner.lock().ids.insert(watch_id, sub_id);
                let shared = control.shared.clone();
                let opened = async move {
                    let registration = opening.open(&shared).await?;
                    Ok(Subscription::new(shared, registration, watch_id))
                };
                // Dropped unread (the stream is gone), its subscription ends itself.
                let task = tokio::spawn(tracing::Instrument::instrument(opened, span));
                Ok(Incoming::Opening {
                    watch_id,
                    sub_id,
                    task,
                })
            }
            Err(e) => {
                control.inner.lock().ids.remove(watch_id);
                Err(e)
            }
        }
    }

    /// Registers a watch with the cache under a new id on this stream, waiting for
    /// its start (one round trip for a watch from now); the caller hands it to the
    /// response half.
    pub(super) async fn register(
        &self,
        key: Vec<u8>,
        options: Option<WatchOptions>,
    ) -> Result<(Subscription, i64)> {
        let (request, watch_id, span) = self.reserve(&key, options)?;
        let control = &self.control;
        let registered = register(&control.shared, request, control.scope.as_ref());
        match tracing::Instrument::instrument(registered, span.clone()).await {
            Ok(registration) => Ok(self.registered(registration, watch_id, &span)),
            Err(e) => {
                control.inner.lock().ids.remove(watch_id);
                Err(e)
            }
        }
    }

    /// The registered watch, with its id on the stream, and the revision its `created`
    /// response reports.
    fn registered(
        &self,
        registration: crate::watch::register::Registration,
        watch_id: i64,
        span: &tracing::Span,
    ) -> (Subscription, i64) {
        let control = &self.control;
        let (sub, created) = Subscription::new(control.shared.clone(), registration, watch_id);
        span.record("revision", created);
        span.in_scope(|| tracing::trace!(watch_id, "watch opened"));
        control.inner.lock().ids.insert(watch_id, sub.sub_id);
        (sub, created)
    }

    /// Checks a watch request and reserves its id on the stream.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::WatchIdInUse`].
    fn reserve(
        &self,
        key: &[u8],
        options: Option<WatchOptions>,
    ) -> Result<(Request, i64, tracing::Span)> {
        let options = options.unwrap_or_default();
        let control = &self.control;
        let request = Request::new(&control.shared, key, &options)?;
        // Reserve the id first, so that a refused id costs no registration.
        let watch_id = {
            let mut inner = control.inner.lock();
            let id = match options.watch_id() {
                // As etcd: the lowest id above every id given so far; never one reused.
                0 => {
                    while inner.ids.contains(inner.next_id) {
                        inner.next_id += 1;
                    }
                    let id = inner.next_id;
                    inner.next_id += 1;
                    id
                }
                chosen if inner.ids.contains(chosen) => {
                    return Err(Error::WatchIdInUse { watch_id: chosen })
                }
                chosen => chosen,
            };
            inner.ids.insert(id, 0);
            id
        };
        let span = tracing::debug_span!(
            "etcd_cache.watch",
            key = %String::from_utf8_lossy(key),
            watch_id,
            start_revision = request.start_revision,
            revision = tracing::field::Empty,
        );
        Ok((request, watch_id, span))
    }

    /// Cancels the watch `watch_id`, as etcd cancels one: its id is free at once (a
    /// watch added next may take it), it gets no more events, and its `canceled`
    /// response follows the replies to the requests made before this one (the `created`
    /// responses of earlier watches, the `canceled` of earlier cancels), in order. An id
    /// not in use is ignored, as etcd ignores it.
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn cancel(&mut self, watch_id: i64) -> Result<()> {
        let sub_id = {
            let mut inner = self.control.inner.lock();
            let sub_id = inner.ids.get(watch_id);
            if let Some(sub_id) = sub_id {
                inner.ids.remove(watch_id);
                inner.incoming.push(Incoming::Cancel { watch_id, sub_id });
            }
            sub_id
        };
        if sub_id.is_some() {
            // The response half ends the watch when it takes the cancel, at its next
            // poll (before it yields anything more), even if the cancel's reply waits
            // behind a watch that is opening.
            self.control.notify();
        }
        Ok(())
    }

    /// Asks for a progress response for the whole stream (watch id -1), as etcd (on
    /// fixed versions) answers it: at a revision at least the cluster's when asked (one
    /// shared round trip learns it), once every watch on the stream has been delivered
    /// every matching event up to it. Answered by the cache. If the cache cannot prove
    /// that within `consistent_read_timeout` (a quiet prefix on an etcd whose progress
    /// answers cannot be trusted), the answer carries the revision it can prove; never
    /// one below the start of a watch on the stream, so with a watch from a revision the
    /// cache has not reached it waits until the cache has (fixed etcd drops such a
    /// request: etcd#20221).
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn request_progress(&mut self) -> Result<()> {
        let shared = &self.control.shared;
        let deadline = Instant::now() + shared.config().consistent_read_timeout;
        // Without the cluster's revision the answer is what the cache can prove.
        let at_least = shared.cluster_revision_now().await.unwrap_or(0);
        self.control
            .inner
            .lock()
            .incoming
            .push(Incoming::Progress(UnansweredRequest { at_least, deadline }));
        self.control.notify();
        Ok(())
    }
}

impl Drop for WatchRequestSender {
    fn drop(&mut self) {
        self.control.sender_gone.store(true, Ordering::Release);
        self.control.notify();
    }
}
