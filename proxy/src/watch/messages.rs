//! etcd's Watch messages as the client is sent them, from the cache's replies and from
//! etcd's responses: the cache's response made etcd's ([`from_cache`], keys moved out of
//! the namespace), a forwarded response moved out of the namespace and split between
//! revisions ([`by_revision`]), the merging of a round of the cache's replies into one
//! response per watch ([`Merge`]), and the stream-level progress answer. The client's
//! queue is `outbound.rs`, a refused create `refusal.rs`.

use prost::Message;

use super::id_map::IdMap;
use super::outbound::Outbound;
use super::wire::{self, EncodedEvents};
use crate::namespace::Namespace;
use crate::pb::etcdserverpb::{ResponseHeader, WatchResponse};
use crate::pb::mvccpb::Event;
use crate::upstream::Upstream;

/// etcd's `clientv3.InvalidWatchID`.
pub(crate) const INVALID_WATCH_ID: i64 = -1;
/// Replies of the cache taken in one round of the session's `send_replies` at most.
const BATCH_REPLIES: usize = 4096;
/// Replies of the cache taken from its stream at a time (one future per batch).
const READY_AT_ONCE: usize = 64;
/// A merged events response takes no more events once it is this big (encoded).
const BATCH_BYTES: usize = 64 * 1024;
/// A round of the session's `send_replies` takes no more replies once it holds this many
/// bytes of events (a stream whose client does not read holds no more than this).
const BATCH_TOTAL_BYTES: usize = 4 * 1024 * 1024;

/// The cache's replies of one round, merged: the events of one watch in one response
/// where they follow each other (etcd sends a watcher that is catching up many
/// revisions in one response, `syncWatchers`, and a remote watcher pays per message more
/// than per event). A watch's responses keep their order; responses of different
/// watches may pass each other, as on etcd's streams. The events are the cache's,
/// encoded once (`wire.rs`).
#[derive(Default)]
pub(crate) struct Merge {
    batch: Vec<EncodedEvents>,
    /// Per watch: the index in `batch` of its response still taking events.
    open: IdMap<usize>,
    /// The watch of the last reply pushed and its entry in `batch`: a stream takes a
    /// watch's queued revisions in a row, so most replies go where the last one went,
    /// found without a lookup in `open`.
    last: Option<(i64, usize)>,
    /// Replies taken this round.
    taken: usize,
    /// Bytes of events taken this round.
    total: usize,
}

impl Merge {
    /// Whether the cache's reply `r` merges: events only, of a watch without fragments
    /// (created, canceled and progress responses are not merged: the merged responses
    /// before them go out first).
    pub(crate) fn merges(r: &etcd_cache::WatchResponse, outbound: &Outbound) -> bool {
        !r.created() && !r.canceled() && !r.events().is_empty() && !outbound.fragments(r.watch_id())
    }

    /// Counts a reply taken from the cache.
    pub(crate) fn took(&mut self) {
        self.taken += 1;
    }

    /// Adds an events response of the cache's.
    pub(crate) fn push(&mut self, resp: EncodedEvents) {
        let id = resp.watch_id;
        self.total += resp.events_len();
        let at = match self.last {
            Some((last, at)) if last == id => Some(at),
            _ => self.open.get(&id).copied(),
        };
        match at {
            Some(at) if self.batch[at].events_len() < BATCH_BYTES => {
                self.batch[at].append(resp);
                self.last = Some((id, at));
            }
            _ => {
                let at = self.batch.len();
                self.open.insert(id, at);
                self.last = Some((id, at));
                self.batch.push(resp);
            }
        }
    }

    /// How many more replies the round may take (0: none): what is gathered waits for
    /// the client's queue, at most [`BATCH_REPLIES`] replies and about
    /// [`BATCH_TOTAL_BYTES`] (the replies are taken [`READY_AT_ONCE`] at a time), so a
    /// client that does not read holds up only that much (and its own stream).
    pub(crate) fn room(&self) -> usize {
        if self.total >= BATCH_TOTAL_BYTES {
            return 0;
        }
        BATCH_REPLIES.saturating_sub(self.taken).min(READY_AT_ONCE)
    }

    /// The merged responses so far, to be sent in order, with header revisions that do
    /// not go down along them (a merged response carries its last event's header).
    pub(crate) fn drain(&mut self) -> Vec<EncodedEvents> {
        self.open.clear();
        self.last = None;
        let mut revision = 0;
        let mut out = std::mem::take(&mut self.batch);
        for resp in &mut out {
            resp.header.revision = resp.header.revision.max(revision);
            revision = resp.header.revision;
        }
        out
    }
}

/// The cache's response as etcd's message, its keys moved out of the namespace.
pub(crate) fn from_cache(
    r: &etcd_cache::WatchResponse,
    upstream: &Upstream,
    namespace: &Namespace,
) -> WatchResponse {
    WatchResponse {
        header: Some(upstream.header_from_cache(r.header(), r.revision())),
        watch_id: r.watch_id(),
        created: r.created(),
        canceled: r.canceled(),
        compact_revision: r.compact_revision(),
        // etcd gives no reason with a compaction (its clients read compact_revision).
        cancel_reason: if r.compact_revision() > 0 {
            String::new()
        } else {
            r.cancel_reason().to_string()
        },
        fragment: false,
        events: r
            .events()
            .iter()
            .map(|e| wire::event(e, namespace))
            .collect(),
    }
}

/// A response of a forwarded watch, its keys moved out of the namespace.
pub(crate) fn out_of_namespace(resp: &mut WatchResponse, namespace: &Namespace) {
    for e in &mut resp.events {
        if let Some(kv) = e.kv.as_mut() {
            namespace.kv_out(kv);
        }
        if let Some(kv) = e.prev_kv.as_mut() {
            namespace.kv_out(kv);
        }
    }
}

/// The revision up to which etcd's response `resp` of a forwarded watch proves the
/// client has everything of that watch: its last event's, or its own progress
/// notification's; none for the rest.
pub(crate) fn sent_through(resp: &WatchResponse) -> Option<i64> {
    if resp.created || resp.canceled || resp.watch_id == INVALID_WATCH_ID {
        return None;
    }
    match resp.events.last().and_then(|e| e.kv.as_ref()) {
        Some(kv) => Some(kv.mod_revision),
        None => resp.header.as_ref().map(|h| h.revision),
    }
}

/// Whether etcd's `resp` is a stream-level progress answer (watch id -1, nothing else).
pub(crate) fn is_progress(resp: &WatchResponse) -> bool {
    resp.watch_id == INVALID_WATCH_ID && !resp.created && !resp.canceled && resp.events.is_empty()
}

/// The stream-level progress answer (watch id -1) at `header`'s revision.
pub(crate) fn progress(header: ResponseHeader) -> WatchResponse {
    WatchResponse {
        header: Some(header),
        watch_id: INVALID_WATCH_ID,
        ..Default::default()
    }
}

/// An events response of etcd's for a forwarded watch, split between revisions into
/// responses of about [`BATCH_BYTES`] each, as the cache's are merged: etcd sends a
/// catching-up watcher up to 1,000 revisions in one message, which can be more than a
/// client takes in one (4 MiB for etcd-client, tonic's default). A revision's events stay
/// in one response, however big (all events of one revision in one response, as etcd).
pub(crate) fn by_revision(mut resp: WatchResponse) -> Vec<WatchResponse> {
    if resp.created || resp.canceled || resp.events.len() < 2 || resp.encoded_len() <= BATCH_BYTES {
        return vec![resp];
    }
    let revision = |e: &Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
    let events = std::mem::take(&mut resp.events);
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut bytes = 0;
    let mut last = None;
    for ev in events {
        let rev = revision(&ev);
        if last.is_some_and(|l| l != rev) && bytes >= BATCH_BYTES {
            out.push(WatchResponse {
                events: std::mem::take(&mut cur),
                ..resp.clone()
            });
            bytes = 0;
        }
        last = Some(rev);
        bytes += ev.encoded_len();
        cur.push(ev);
    }
    resp.events = cur;
    out.push(resp);
    out
}

/// A put event of `key` with a value of `value_len` bytes at revision 7 (tests).
#[cfg(test)]
pub(super) fn test_put(key: &str, value_len: usize) -> Event {
    use crate::pb::mvccpb::{event::EventType, KeyValue};
    Event {
        r#type: EventType::Put as i32,
        kv: Some(KeyValue {
            key: key.as_bytes().to_vec().into(),
            value: vec![b'x'; value_len].into(),
            mod_revision: 7,
            create_revision: 7,
            version: 1,
            lease: 0,
        }),
        prev_kv: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value_len: usize) -> Event {
        test_put(key, value_len)
    }

    /// A watch's replies go to its open response wherever the stream took them (the
    /// last reply's watch found without a lookup, another's through the map), a full
    /// response is followed by a new one that takes the watch's later replies, and
    /// headers never go down along the drained responses.
    #[test]
    fn merge_gathers_each_watchs_replies_in_order() {
        let mut merge = Merge::default();
        let half = BATCH_BYTES / 2;
        for (watch_id, revision, len) in [
            (1, 10, 10),
            (1, 11, 10),
            (2, 10, 10),
            (1, 12, 10),
            (2, 11, half),
            (2, 12, half),
            (2, 13, 10),
            (1, 14, 10),
            (2, 14, 10),
        ] {
            merge.took();
            merge.push(EncodedEvents::opaque(watch_id, revision, len));
        }
        let drained: Vec<(i64, i64, i64, usize)> = merge
            .drain()
            .iter()
            .map(|r| {
                (
                    r.watch_id,
                    r.header.revision,
                    r.last_revision(),
                    r.events_len(),
                )
            })
            .collect();
        assert_eq!(
            drained,
            [(1, 14, 14, 40), (2, 14, 12, 10 + 2 * half), (2, 14, 14, 20),],
            "watch 1 in one response; watch 2's third reply filled its first, the \
             later ones went to its second (header: not below the response before)"
        );
        assert!(merge.drain().is_empty(), "drained");
        merge.push(EncodedEvents::opaque(2, 15, 10));
        assert_eq!(merge.drain().len(), 1, "a new round starts a new response");
    }

    #[test]
    fn forwarded_responses_split_between_revisions_only() {
        let at = |key: &str, len: usize, rev: i64| {
            let mut e = put(key, len);
            e.kv.as_mut().unwrap().mod_revision = rev;
            e
        };
        // Three revisions of 40 KiB each, the second with two events.
        let events = vec![
            at("a", 40 * 1024, 5),
            at("b", 40 * 1024, 6),
            at("c", 40 * 1024, 6),
            at("d", 40 * 1024, 7),
        ];
        let resp = WatchResponse {
            watch_id: 3,
            events: events.clone(),
            ..Default::default()
        };
        let parts = by_revision(resp.clone());
        let revs: Vec<Vec<i64>> = parts
            .iter()
            .map(|p| {
                p.events
                    .iter()
                    .map(|e| e.kv.as_ref().unwrap().mod_revision)
                    .collect()
            })
            .collect();
        assert_eq!(revs, vec![vec![5, 6, 6], vec![7]]);
        assert!(parts.iter().all(|p| p.watch_id == 3 && !p.fragment));
        let all: Vec<Event> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(all, events, "every event once, in order");
        // Small responses and one-revision ones stay whole.
        let small = WatchResponse {
            events: vec![at("a", 10, 5), at("b", 10, 6)],
            ..Default::default()
        };
        assert_eq!(by_revision(small).len(), 1);
        let one = WatchResponse {
            events: vec![at("a", 40 * 1024, 5), at("b", 40 * 1024, 5)],
            ..Default::default()
        };
        assert_eq!(by_revision(one).len(), 1);
    }
}
