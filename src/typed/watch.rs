//! A cache watch whose events carry the view's objects: [`TypedWatchStream`].

use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::kv::{EventType, KeyValue};
use crate::typed::codec::DecodeError;
use crate::typed::source::{Decoded, Source, TypedKv};
use crate::watch::{WatchResponse, WatchStream};

/// The stream of [`TypedView::watch`](crate::TypedView::watch): a [`WatchStream`] of the cache whose events
/// carry the decoded objects (the same `Arc` for every watcher of the view).
///
/// ```no_run
/// # async fn f(view: etcd_cache::TypedView<String>) -> etcd_cache::Result<()> {
/// use etcd_cache::WatchOptions;
///
/// let mut stream = view.watch(view.prefix().to_vec(), Some(WatchOptions::new().with_prefix())).await?;
/// while let Some(resp) = stream.message().await? {
///     for ev in resp.events() {
///         match ev.object() {
///             Some(obj) => println!("{:?} is now {obj}", ev.kv().key()),
///             None => println!("{:?} deleted or not decodable", ev.kv().key()),
///         }
///     }
/// }
/// # Ok(()) }
/// ```
pub struct TypedWatchStream<T> {
    source: Arc<Source<T>>,
    stream: WatchStream,
}

impl<T> fmt::Debug for TypedWatchStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedWatchStream")
            .field("stream", &self.stream)
            .finish()
    }
}

impl<T: Send + Sync + 'static> TypedWatchStream<T> {
    pub(crate) fn new(source: Arc<Source<T>>, stream: WatchStream) -> Self {
        TypedWatchStream { source, stream }
    }

    /// The next response, its events with their objects; `None` when the stream ends
    /// (as [`WatchStream::message`]).
    ///
    /// # Errors
    /// As [`WatchStream::message`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`WatchStream::message`].
    pub async fn message(&mut self) -> Result<Option<TypedWatchResponse<T>>> {
        Ok(self
            .stream
            .message()
            .await?
            .map(|response| TypedWatchResponse::new(&self.source, response)))
    }

    /// The untyped stream under it: add or cancel watches, request progress.
    pub fn stream(&mut self) -> &mut WatchStream {
        &mut self.stream
    }
}

/// The typed events a view keeps in a set of events' memo, tagged with the view.
type Memo<T> = (u64, Arc<[TypedEvent<T>]>);

/// One response of a [`TypedWatchStream`].
pub struct TypedWatchResponse<T> {
    response: WatchResponse,
    /// This response's own typed events, when the events' memo holds another view's;
    /// `None` when they are read from the memo (or there are none).
    own: Option<Arc<[TypedEvent<T>]>>,
}

impl<T> fmt::Debug for TypedWatchResponse<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedWatchResponse")
            .field("response", &self.response)
            .finish()
    }
}

impl<T: Send + Sync + 'static> TypedWatchResponse<T> {
    /// The typed events of `response`: made once per set of shared events (the memo of
    /// the response's events, tagged with the view), and shared by every watcher of the
    /// view that gets them; built for this response alone when the memo holds another
    /// view's.
    fn new(view: &Source<T>, response: WatchResponse) -> Self {
        if response.events().is_empty() {
            // Created, progress, canceled: nothing to build, nothing to allocate.
            return TypedWatchResponse {
                response,
                own: None,
            };
        }
        let build = |events: &[crate::kv::Event]| -> Arc<[TypedEvent<T>]> {
            events
                .iter()
                .filter_map(|ev| {
                    let kv = ev.kv()?.clone();
                    let value = match ev.event_type() {
                        EventType::Put => Some(view.decode(&kv)),
                        EventType::Delete => None,
                    };
                    Some(TypedEvent {
                        event_type: ev.event_type(),
                        kv,
                        value,
                        prev: ev.prev_kv().map(|p| view.typed_kv(p.clone())),
                    })
                })
                .collect()
        };
        let owner = view.owner();
        // Read back by reference in `events()`: no reference count taken per watcher
        // (1,000 watchers of one revision would all bump the same counter).
        let own = match response.events_memo(|events| (owner, build(events))) {
            Some((o, _)) if *o == owner => None,
            _ => Some(build(response.events())),
        };
        TypedWatchResponse { response, own }
    }
}

impl<T: Send + Sync + 'static> TypedWatchResponse<T> {
    /// The untyped response: header, watch id, created, canceled, compact revision.
    pub fn response(&self) -> &WatchResponse {
        &self.response
    }

    /// The revision of the response (its header's).
    pub fn revision(&self) -> i64 {
        self.response.revision()
    }

    /// The events, with their objects.
    pub fn events(&self) -> &[TypedEvent<T>] {
        if let Some(own) = &self.own {
            return own;
        }
        // Set in `new` (this view's, as checked there), so the closure never runs.
        self.response
            .events_memo(|_| -> Memo<T> { (0, Arc::from(Vec::new())) })
            .map_or(&[], |(_, events)| &**events)
    }
}

/// One event of a [`TypedWatchResponse`].
pub struct TypedEvent<T> {
    event_type: EventType,
    kv: KeyValue,
    value: Option<Decoded<T>>,
    prev: Option<TypedKv<T>>,
}

impl<T> Clone for TypedEvent<T> {
    fn clone(&self) -> Self {
        TypedEvent {
            event_type: self.event_type,
            kv: self.kv.clone(),
            value: self.value.clone(),
            prev: self.prev.clone(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for TypedEvent<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedEvent")
            .field("event_type", &self.event_type)
            .field("kv", &self.kv)
            .field("value", &self.value)
            .finish()
    }
}

impl<T> TypedEvent<T> {
    /// Put or delete.
    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    /// The key-value of the event (for a delete: the key, an empty value and the
    /// delete's revision).
    pub fn kv(&self) -> &KeyValue {
        &self.kv
    }

    /// The new object (`None` for a delete), or why the new value did not decode.
    pub fn value(&self) -> Option<std::result::Result<&Arc<T>, &DecodeError>> {
        self.value.as_ref().map(|v| v.as_ref())
    }

    /// The new object, if this is a put whose value decoded.
    pub fn object(&self) -> Option<&Arc<T>> {
        self.value.as_ref().and_then(|v| v.as_ref().ok())
    }

    /// The previous object, when the watch asked for previous key-values and the key
    /// existed.
    pub fn prev(&self) -> Option<&TypedKv<T>> {
        self.prev.as_ref()
    }
}
