//! A Watch response as it goes on the wire, and the codec that writes it. The cache's
//! events are encoded once per revision and watch options, not once per watch: every
//! watch of one key range and options gets the same shared events from the cache
//! (`etcd_cache::WatchResponse::events_memo` keeps their encoding beside them), and a
//! response to one watch is its own small header and watch id followed by those bytes, as
//! protobuf concatenates the entries of a repeated field. Consecutive revisions for one
//! watch go in one response by putting their bytes one after the other.
//!
//! Everything else (created, canceled, progress, fragments, forwarded watches) is an
//! ordinary [`WatchResponse`] message, encoded by prost.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding;
use prost::Message;
use smallvec::{smallvec, SmallVec};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

use crate::namespace::Namespace;
use crate::pb::etcdserverpb::{ResponseHeader, WatchRequest, WatchResponse};
use crate::pb::mvccpb::{event::EventType, Event};

/// `WatchResponse.header`'s field number in etcd's rpc.proto.
const HEADER: u32 = 1;
/// `WatchResponse.watch_id`'s.
const WATCH_ID: u32 = 2;
/// `WatchResponse.events`'.
const EVENTS: u32 = 11;

/// One response of a Watch stream, as it is written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WireResponse {
    /// A message made whole (created, canceled, progress, fragments, forwarded).
    Message(WatchResponse),
    /// Events of the cache's, encoded once.
    Events(EncodedEvents),
}

/// An events response of one watch made of events encoded once: its header and id, and
/// per revision (oldest first) the encoded `events` entries of that revision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EncodedEvents {
    pub(crate) header: ResponseHeader,
    pub(crate) watch_id: i64,
    /// Mostly one revision: kept inline (no allocation per response).
    revisions: SmallVec<[(i64, Bytes); 1]>,
    /// Bytes of `revisions`.
    len: usize,
}

/// A revision's events encoded for the wire, and that revision: the type of the value
/// `events_memo` keeps beside the cache's shared events (so a watch's response reads
/// both from the one memo, without a walk to the last event's key-value).
struct WireEvents {
    bytes: Bytes,
    revision: i64,
}

impl WireEvents {
    fn new(events: &[etcd_cache::Event], namespace: &Namespace) -> Self {
        WireEvents {
            bytes: encode(events, namespace),
            revision: events
                .last()
                .and_then(|e| e.kv())
                .map_or(0, |kv| kv.mod_revision()),
        }
    }
}

impl EncodedEvents {
    /// The events of the cache's response `r` (one revision), with `header` and `r`'s
    /// watch id; their encoding is made by the first watch that sends them and shared.
    pub(crate) fn from_cache(
        r: &etcd_cache::WatchResponse,
        header: ResponseHeader,
        namespace: &Namespace,
    ) -> Self {
        let (bytes, revision) = match r.events_memo(|events| WireEvents::new(events, namespace)) {
            Some(w) => (w.bytes.clone(), w.revision),
            // Something else was derived from these events first (not by this proxy).
            None => {
                let w = WireEvents::new(r.events(), namespace);
                (w.bytes, w.revision)
            }
        };
        EncodedEvents {
            header,
            watch_id: r.watch_id(),
            len: bytes.len(),
            revisions: smallvec![(revision, bytes)],
        }
    }

    /// One revision's events of `len` opaque bytes for watch `watch_id` (tests of what
    /// carries them; the bytes are not a valid encoding).
    #[cfg(test)]
    pub(crate) fn opaque(watch_id: i64, revision: i64, len: usize) -> Self {
        EncodedEvents {
            header: ResponseHeader {
                revision,
                ..Default::default()
            },
            watch_id,
            len,
            revisions: smallvec![(revision, Bytes::from(vec![0; len]))],
        }
    }

    /// Bytes of events held.
    pub(crate) fn events_len(&self) -> usize {
        self.len
    }

    /// Appends `later`'s revisions (the same watch's next response), taking its header.
    pub(crate) fn append(&mut self, later: EncodedEvents) {
        debug_assert_eq!(self.watch_id, later.watch_id);
        self.header = later.header;
        self.len += later.len;
        self.revisions.extend(later.revisions);
    }

    /// The revision of its last event.
    pub(crate) fn last_revision(&self) -> i64 {
        self.revisions.last().map_or(0, |(r, _)| *r)
    }

    /// The message prost would decode it into (tests, and the rare path that needs one).
    #[cfg(test)]
    pub(crate) fn decode(&self) -> WatchResponse {
        let mut buf = BytesMut::new();
        self.write(&mut buf);
        WatchResponse::decode(buf.freeze()).expect("what is written decodes")
    }

    fn write(&self, buf: &mut impl BufMut) {
        encoding::message::encode(HEADER, &self.header, buf);
        if self.watch_id != 0 {
            encoding::int64::encode(WATCH_ID, &self.watch_id, buf);
        }
        for (_, bytes) in &self.revisions {
            buf.put_slice(bytes);
        }
    }

    fn encoded_len(&self) -> usize {
        let id = if self.watch_id == 0 {
            0
        } else {
            encoding::int64::encoded_len(WATCH_ID, &self.watch_id)
        };
        encoding::message::encoded_len(HEADER, &self.header) + id + self.len
    }
}

/// `events` as the `events` entries of a `WatchResponse` (field 11, one per event), keys
/// moved out of the namespace.
fn encode(events: &[etcd_cache::Event], namespace: &Namespace) -> Bytes {
    let pb: Vec<Event> = events.iter().map(|e| event(e, namespace)).collect();
    let len = pb
        .iter()
        .map(|e| {
            encoding::key_len(EVENTS)
                + encoding::encoded_len_varint(e.encoded_len() as u64)
                + e.encoded_len()
        })
        .sum();
    let mut buf = BytesMut::with_capacity(len);
    for e in &pb {
        encoding::message::encode(EVENTS, e, &mut buf);
    }
    buf.freeze()
}

/// The cache's event as etcd's message, its keys moved out of the namespace.
pub(crate) fn event(e: &etcd_cache::Event, namespace: &Namespace) -> Event {
    let kind = match e.event_type() {
        etcd_cache::EventType::Put => EventType::Put,
        etcd_cache::EventType::Delete => EventType::Delete,
    };
    Event {
        r#type: kind as i32,
        kv: e.kv().map(|kv| namespace.kv_from_cache(kv)),
        prev_kv: e.prev_kv().map(|kv| namespace.kv_from_cache(kv)),
    }
}

impl WireResponse {
    pub(crate) fn watch_id(&self) -> i64 {
        match self {
            WireResponse::Message(m) => m.watch_id,
            WireResponse::Events(e) => e.watch_id,
        }
    }

    /// The revision of its last event (0 without events).
    pub(crate) fn last_revision(&self) -> i64 {
        match self {
            WireResponse::Message(m) => m
                .events
                .last()
                .and_then(|e| e.kv.as_ref())
                .map_or(0, |kv| kv.mod_revision),
            WireResponse::Events(e) => e.last_revision(),
        }
    }

    /// Splits it into its events at or below `bound` and the rest (either may be
    /// `None`). The flags that end a watch stay with the later part.
    pub(crate) fn split(self, bound: i64) -> (Option<Self>, Option<Self>) {
        match self {
            WireResponse::Message(m) => {
                let (low, high) = split_message(m, bound);
                (low.map(Self::Message), high.map(Self::Message))
            }
            WireResponse::Events(mut e) => {
                let at = e.revisions.partition_point(|(r, _)| *r <= bound);
                if at == e.revisions.len() {
                    return (Some(Self::Events(e)), None);
                }
                if at == 0 {
                    return (None, Some(Self::Events(e)));
                }
                let high: SmallVec<[(i64, Bytes); 1]> = e.revisions.drain(at..).collect();
                let high_len = high.iter().map(|(_, b)| b.len()).sum();
                e.len -= high_len;
                let later = EncodedEvents {
                    header: e.header,
                    watch_id: e.watch_id,
                    revisions: high,
                    len: high_len,
                };
                (Some(Self::Events(e)), Some(Self::Events(later)))
            }
        }
    }
}

impl From<EncodedEvents> for WireResponse {
    fn from(e: EncodedEvents) -> Self {
        WireResponse::Events(e)
    }
}

impl From<WatchResponse> for WireResponse {
    fn from(m: WatchResponse) -> Self {
        WireResponse::Message(m)
    }
}

/// Splits a message's events at `bound` (see [`WireResponse::split`]).
fn split_message(
    mut r: WatchResponse,
    bound: i64,
) -> (Option<WatchResponse>, Option<WatchResponse>) {
    let at = r
        .events
        .iter()
        .position(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision) > bound)
        .unwrap_or(r.events.len());
    if r.events.is_empty() || at == r.events.len() {
        return (Some(r), None);
    }
    if at == 0 {
        return (None, Some(r));
    }
    let high_events = r.events.split_off(at);
    let low = WatchResponse {
        events: std::mem::take(&mut r.events),
        canceled: false,
        compact_revision: 0,
        cancel_reason: String::new(),
        ..r.clone()
    };
    r.events = high_events;
    (Some(low), Some(r))
}

/// The Watch service's codec: [`WireResponse`]s out, etcd's `WatchRequest` in (prost).
#[derive(Debug, Default, Clone)]
pub(crate) struct WatchCodec;

/// Writes a [`WireResponse`].
#[derive(Debug, Default, Clone)]
pub(crate) struct WireEncoder;

/// The first buffer of each direction of a Watch stream, where tonic's default is 8 KiB:
/// a stream holds its buffers for life, and an idle one needs neither (a create is
/// tens of bytes, a response of one small event about a hundred). A buffer grows as a
/// message or a batch of them needs.
const STREAM_BUFFER: usize = 1024;
/// How much tonic gathers before it hands a batch of responses to h2: tonic's default.
const YIELD_THRESHOLD: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(STREAM_BUFFER, YIELD_THRESHOLD)
}

impl Encoder for WireEncoder {
    type Item = WireResponse;
    type Error = Status;

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }

    fn encode(&mut self, item: WireResponse, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            WireResponse::Message(m) => m
                .encode(buf)
                .map_err(|e| Status::internal(format!("encoding a watch response: {e}"))),
            WireResponse::Events(e) => {
                buf.reserve(e.encoded_len());
                e.write(buf);
                Ok(())
            }
        }
    }
}

/// Reads etcd's `WatchRequest` (prost), with the stream's small first buffer.
#[derive(Debug, Default)]
pub(crate) struct RequestDecoder(ProstDecoder<WatchRequest>);

impl Decoder for RequestDecoder {
    type Item = WatchRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<WatchRequest>, Status> {
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

impl Codec for WatchCodec {
    type Encode = WireResponse;
    type Decode = WatchRequest;
    type Encoder = WireEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> WireEncoder {
        WireEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision,
            raft_term: 3,
        }
    }

    fn events_at(watch_id: i64, revision: i64, keys: &[&'static str]) -> EncodedEvents {
        let events: Vec<etcd_cache::Event> = keys
            .iter()
            .map(|k| {
                etcd_cache::Event::new(
                    etcd_cache::EventType::Put,
                    etcd_cache::KeyValue::new(*k, "v", 2, revision, 1, 0),
                    Some(etcd_cache::KeyValue::new(*k, "old", 2, 2, 1, 0)),
                )
            })
            .collect();
        let bytes = encode(&events, &Namespace::default());
        EncodedEvents {
            header: header(revision),
            watch_id,
            len: bytes.len(),
            revisions: smallvec![(revision, bytes)],
        }
    }

    /// What is written is what prost writes for the same message.
    #[test]
    fn encoded_events_are_the_message_prost_writes() {
        let mut e = events_at(5, 10, &["/a", "/b"]);
        e.append(events_at(5, 11, &["/c"]));
        let decoded = e.decode();
        assert_eq!(decoded.watch_id, 5);
        assert_eq!(decoded.header, Some(header(11)));
        let keys: Vec<_> = decoded
            .events
            .iter()
            .map(|e| e.kv.as_ref().unwrap().key.clone())
            .collect();
        assert_eq!(keys, ["/a", "/b", "/c"].map(|k| Bytes::from(k.as_bytes())));
        assert_eq!(
            decoded.events[0].prev_kv.as_ref().unwrap().value,
            "old".as_bytes()
        );
        assert_eq!(
            e.encoded_len(),
            decoded.encoded_len(),
            "the same bytes as prost's"
        );
        let zero = events_at(0, 10, &["/a"]).decode();
        assert_eq!(zero.watch_id, 0);
    }

    #[test]
    fn split_keeps_revisions_whole() {
        let mut e = events_at(1, 10, &["/a", "/b"]);
        e.append(events_at(1, 11, &["/c"]));
        e.append(events_at(1, 12, &["/d"]));
        let total = e.events_len();
        let (low, high) = WireResponse::Events(e.clone()).split(11);
        let (Some(WireResponse::Events(low)), Some(WireResponse::Events(high))) = (low, high)
        else {
            panic!("split in two");
        };
        assert_eq!((low.last_revision(), low.decode().events.len()), (11, 3));
        assert_eq!((high.last_revision(), high.decode().events.len()), (12, 1));
        assert_eq!(low.events_len() + high.events_len(), total);
        assert!(matches!(
            WireResponse::Events(e.clone()).split(9),
            (None, Some(_))
        ));
        assert!(matches!(WireResponse::Events(e).split(12), (Some(_), None)));
    }
}
