//! The fake [`Upstream`]: the test (or benchmark) decides every answer the cache gets
//! from "etcd". The one fake of the crate, used by the unit tests and, through
//! `internals`, by the micro-benchmarks.
//!
//! - `versions`, the keyspace served by `list_page` and `current_revision` are plain
//!   state the test sets;
//! - every call is recorded (list pages with their range, revision and limit; watch
//!   start revisions; progress requests; fallback reads);
//! - each `watch()` hands the test an [`OpenedWatch`]: the sending half of the channel
//!   the cache's [`UpstreamWatch`] reads from. Dropping it ends the stream (`Ok(None)`).
//!   [`FakeUpstream::preset_watch`] makes the channel of the next watch in advance, for
//!   callers that feed events without waiting for the cache to connect.

// The benchmark build (`unstable-bench-internals` without `cfg(test)`) uses a few of the
// fake's controls through `internals`; the unit tests use all of them, and there any unused
// one is reported.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use super::{Header, RangeResponse, Upstream, UpstreamWatch, WatchMsg};

/// The identity the fake etcd answers with.
pub(crate) const FAKE_HEADER: Header = Header {
    cluster_id: 0xc1,
    member_id: 0x3e,
    raft_term: 7,
    revision: 0,
};
use crate::error::{Error, Result};
use crate::key_range::KeyRange;
use crate::kv::{EventType, KeyValue};
use crate::range_request::{RangeRequest, RangeResult};

/// One `list_page` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListCall {
    pub(crate) start: Bytes,
    pub(crate) end: Bytes,
    pub(crate) revision: i64,
    pub(crate) limit: i64,
}

/// The keyspace the scripted etcd serves to lists (at one revision).
#[derive(Debug, Default)]
struct Data {
    revision: i64,
    kvs: BTreeMap<Bytes, KeyValue>,
}

/// The fake etcd.
pub(crate) struct FakeUpstream {
    versions: Mutex<Vec<String>>,
    pub(crate) versions_calls: AtomicUsize,
    data: Mutex<Data>,
    pub(crate) list_calls: Mutex<Vec<ListCall>>,
    /// `list_page` calls (0-based, over the whole test) that fail.
    pub(crate) failing_lists: Mutex<Vec<usize>>,
    /// While true, `list_page` waits (to observe the cache in the middle of a list).
    list_paused: watch::Sender<bool>,
    pub(crate) watch_starts: Mutex<Vec<i64>>,
    opened: mpsc::UnboundedSender<OpenedWatch>,
    /// `RequestProgress` calls, over every watch.
    pub(crate) progress_requests: Arc<AtomicUsize>,
    current_revision: AtomicI64,
    pub(crate) current_calls: AtomicUsize,
    pub(crate) fallback_gets: AtomicUsize,
    /// The key of every fallback get, as sent to etcd.
    fallback_keys: Mutex<Vec<Vec<u8>>>,
    stalled: watch::Sender<bool>,
    /// The channel the next watch reads from, made in advance by `preset_watch`.
    preset: Mutex<Option<mpsc::UnboundedReceiver<Result<WatchMsg>>>>,
    /// The next this many barrier reads never answer.
    hung_barrier_reads: AtomicUsize,
    /// How long `versions` takes.
    versions_delay: Mutex<std::time::Duration>,
    /// Every list fails with this gRPC code (a permanent failure), while set.
    list_refusal: Mutex<Option<tonic::Code>>,
    /// Every list fails as a connection the server closed right after it was made (a TLS
    /// refusal whose alert was not read), while set.
    list_closes: std::sync::atomic::AtomicBool,
    /// etcd's compact revision (0: nothing compacted), as `compacted_at` reports it.
    compact_revision: AtomicI64,
    /// `compacted_at` calls.
    pub(crate) compaction_checks: AtomicUsize,
}

/// The reason of the scripted error that makes the fake watch panic.
const PANIC: &str = "fake: panic in the upstream watch";

/// The test's end of one upstream watch.
pub(crate) struct OpenedWatch {
    pub(crate) start: i64,
    pub(crate) range: KeyRange,
    tx: mpsc::UnboundedSender<Result<WatchMsg>>,
}

impl OpenedWatch {
    fn send(&self, msg: Result<WatchMsg>) {
        self.tx
            .send(msg)
            .expect("the cache dropped this upstream watch");
    }

    pub(crate) fn created(&self) {
        self.send(Ok(WatchMsg::Created));
    }

    pub(crate) fn events(&self, events: Vec<(EventType, KeyValue)>) {
        self.send(Ok(WatchMsg::Events(events)));
    }

    pub(crate) fn progress(&self, revision: i64, requested: bool) {
        self.send(Ok(WatchMsg::Progress {
            revision,
            requested,
        }));
    }

    pub(crate) fn compacted(&self, compact_revision: i64) {
        self.send(Ok(WatchMsg::Canceled {
            compact_revision,
            reason: "mvcc: required revision has been compacted".into(),
        }));
    }

    /// Sends any message (or error) as the upstream.
    pub(crate) fn send_raw(&self, msg: Result<WatchMsg>) {
        self.send(msg);
    }

    /// Makes the follower's poll of this watch panic (a bug in the cache, simulated).
    pub(crate) fn panic(&self) {
        self.send(Err(Error::Internal {
            reason: PANIC.into(),
        }));
    }

    /// The stream fails (transport error).
    pub(crate) fn fail(&self) {
        self.send(Err(Error::transport("scripted transport error")));
    }

    /// True once the cache dropped its end (the follower left this watch).
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

struct FakeWatch {
    rx: mpsc::UnboundedReceiver<Result<WatchMsg>>,
    requests: Arc<AtomicUsize>,
}

impl UpstreamWatch for FakeWatch {
    fn message(&mut self) -> BoxFuture<'_, Result<Option<WatchMsg>>> {
        Box::pin(async move {
            let msg = self.rx.recv().await.transpose();
            if let Err(Error::Internal { reason }) = &msg {
                assert_ne!(reason, PANIC, "{PANIC}");
            }
            msg
        })
    }

    fn request_progress(&mut self) -> BoxFuture<'_, Result<()>> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }

    fn header(&self) -> Header {
        FAKE_HEADER
    }
}

pub(crate) fn kv(key: &str, value: &str, create: i64, modr: i64, version: i64) -> KeyValue {
    KeyValue::new(key.to_owned(), value.to_owned(), create, modr, version, 0)
}

/// A put event as etcd sends it.
pub(crate) fn put(
    key: &str,
    value: &str,
    create: i64,
    rev: i64,
    version: i64,
) -> (EventType, KeyValue) {
    (EventType::Put, kv(key, value, create, rev, version))
}

/// A delete event as etcd sends it: the key and the deleting revision, nothing else.
pub(crate) fn del(key: &str, rev: i64) -> (EventType, KeyValue) {
    (
        EventType::Delete,
        KeyValue::new(key.to_owned(), "", 0, rev, 0, 0),
    )
}

impl FakeUpstream {
    /// A scripted etcd with these server versions, serving `keys` (created at revision 2,
    /// one revision each) at list revision `revision`.
    pub(crate) fn new(
        versions: &[&str],
        keys: &[(&str, &str)],
        revision: i64,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<OpenedWatch>) {
        let (opened, opened_rx) = mpsc::unbounded_channel();
        let up = Arc::new(FakeUpstream {
            versions: Mutex::new(versions.iter().map(|v| v.to_string()).collect()),
            versions_calls: AtomicUsize::new(0),
            data: Mutex::new(Data::default()),
            list_calls: Mutex::new(Vec::new()),
            failing_lists: Mutex::new(Vec::new()),
            list_paused: watch::Sender::new(false),
            watch_starts: Mutex::new(Vec::new()),
            opened,
            progress_requests: Arc::new(AtomicUsize::new(0)),
            current_revision: AtomicI64::new(revision),
            current_calls: AtomicUsize::new(0),
            fallback_gets: AtomicUsize::new(0),
            fallback_keys: Mutex::new(Vec::new()),
            stalled: watch::Sender::new(false),
            preset: Mutex::new(None),
            hung_barrier_reads: AtomicUsize::new(0),
            versions_delay: Mutex::new(std::time::Duration::ZERO),
            list_refusal: Mutex::new(None),
            list_closes: Default::default(),
            compact_revision: AtomicI64::new(0),
            compaction_checks: AtomicUsize::new(0),
        });
        up.set_data(keys, revision);
        (up, opened_rx)
    }

    /// Replaces what lists return: `keys` (the i-th created and modified at revision
    /// i + 2) at `revision`. Also sets the current revision.
    pub(crate) fn set_data(&self, keys: &[(&str, &str)], revision: i64) {
        let mut d = self.data.lock();
        d.revision = revision;
        d.kvs = keys
            .iter()
            .enumerate()
            .map(|(i, (k, v))| {
                let rev = i as i64 + 2;
                (Bytes::from(k.to_string()), kv(k, v, rev, rev, 1))
            })
            .collect();
        self.current_revision.store(revision, Ordering::SeqCst);
    }

    /// Replaces what lists return with exactly these key-values at `revision`.
    pub(crate) fn set_kvs(&self, kvs: Vec<KeyValue>, revision: i64) {
        let mut d = self.data.lock();
        d.revision = revision;
        d.kvs = kvs
            .into_iter()
            .map(|kv| (kv.key_bytes().clone(), kv))
            .collect();
        self.current_revision.store(revision, Ordering::SeqCst);
    }

    pub(crate) fn set_current_revision(&self, revision: i64) {
        self.current_revision.store(revision, Ordering::SeqCst);
    }

    /// etcd compacts up to `revision` (behind the cache: its watch does not say).
    pub(crate) fn compact(&self, revision: i64) {
        self.compact_revision.fetch_max(revision, Ordering::SeqCst);
    }

    /// The next `n` barrier reads never answer (a half-open connection).
    pub(crate) fn hang_next_barrier_reads(&self, n: usize) {
        self.hung_barrier_reads.store(n, Ordering::SeqCst);
    }

    /// `versions` takes this long (black-holed members).
    pub(crate) fn set_versions_delay(&self, delay: std::time::Duration) {
        *self.versions_delay.lock() = delay;
    }

    /// While `Some`, every list fails with this gRPC code.
    pub(crate) fn refuse_lists(&self, code: Option<tonic::Code>) {
        *self.list_refusal.lock() = code;
    }

    /// While `closes`, every list fails as a connection closed right after the connect.
    pub(crate) fn close_lists(&self, closes: bool) {
        self.list_closes.store(closes, Ordering::SeqCst);
    }

    /// While set, unary calls (the revision barrier's reads) never answer.
    pub(crate) fn set_stalled(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }

    pub(crate) fn set_versions(&self, versions: &[&str]) {
        *self.versions.lock() = versions.iter().map(|v| v.to_string()).collect();
    }

    pub(crate) fn pause_lists(&self, paused: bool) {
        self.list_paused.send_replace(paused);
    }

    pub(crate) fn requests(&self) -> usize {
        self.progress_requests.load(Ordering::SeqCst)
    }

    pub(crate) fn fallbacks(&self) -> usize {
        self.fallback_gets.load(Ordering::SeqCst)
    }

    /// The keys the fallback gets sent, in order.
    pub(crate) fn fallback_keys(&self) -> Vec<Vec<u8>> {
        self.fallback_keys.lock().clone()
    }

    pub(crate) fn lists(&self) -> Vec<ListCall> {
        self.list_calls.lock().clone()
    }

    /// Makes the channel of the next watch now: what is sent through the returned end
    /// is what that watch reads, whenever the cache opens it. (Its `start` and `range`
    /// are unknown here and left empty.)
    #[cfg(feature = "unstable-bench-internals")]
    pub(crate) fn preset_watch(&self) -> OpenedWatch {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.preset.lock() = Some(rx);
        OpenedWatch {
            start: 0,
            range: KeyRange::for_prefix(b""),
            tx,
        }
    }
}

impl Upstream for FakeUpstream {
    fn versions(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        self.versions_calls.fetch_add(1, Ordering::SeqCst);
        let v = self.versions.lock().clone();
        let delay = *self.versions_delay.lock();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(v)
        })
    }

    fn list_page(
        &self,
        range: KeyRange,
        revision: i64,
        limit: i64,
    ) -> BoxFuture<'_, Result<RangeResponse>> {
        Box::pin(async move {
            let mut paused = self.list_paused.subscribe();
            let _ = paused.wait_for(|p| !*p).await;
            let call = {
                let mut calls = self.list_calls.lock();
                calls.push(ListCall {
                    start: range.start.clone(),
                    end: bytes::Bytes::copy_from_slice(range.end()),
                    revision,
                    limit,
                });
                calls.len() - 1
            };
            if let Some(code) = *self.list_refusal.lock() {
                return Err(Error::Upstream(etcd_client::Error::GRpcStatus(
                    tonic::Status::new(code, "etcdserver: scripted refusal"),
                )));
            }
            if self.list_closes.load(Ordering::SeqCst) {
                return Err(crate::error::closed_after_connect());
            }
            if self.failing_lists.lock().contains(&call) {
                return Err(Error::transport(format!(
                    "scripted failure of list call {call}"
                )));
            }
            let d = self.data.lock();
            if revision != 0 && revision != d.revision {
                return Err(Error::protocol(format!(
                    "scripted etcd only serves revision {}, asked {revision}",
                    d.revision
                )));
            }
            let limit = if limit > 0 {
                limit as usize
            } else {
                usize::MAX
            };
            let mut kvs: Vec<KeyValue> = d
                .kvs
                .range(range.bounds())
                .map(|(_, kv)| kv.clone())
                .take(limit.saturating_add(1))
                .collect();
            let more = kvs.len() > limit;
            kvs.truncate(limit);
            Ok(RangeResponse {
                revision: d.revision,
                header: Header {
                    revision: d.revision,
                    ..FAKE_HEADER
                },
                result: RangeResult {
                    count: kvs.len() as i64,
                    kvs,
                    more,
                },
            })
        })
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: i64,
    ) -> BoxFuture<'_, Result<Box<dyn UpstreamWatch>>> {
        Box::pin(async move {
            self.watch_starts.lock().push(start_revision);
            let preset = self.preset.lock().take();
            let rx = match preset {
                Some(rx) => rx,
                None => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let _ = self.opened.send(OpenedWatch {
                        start: start_revision,
                        range,
                        tx,
                    });
                    rx
                }
            };
            Ok(Box::new(FakeWatch {
                rx,
                requests: self.progress_requests.clone(),
            }) as Box<dyn UpstreamWatch>)
        })
    }

    fn current_revision(&self, _range: KeyRange) -> BoxFuture<'_, Result<i64>> {
        self.current_calls.fetch_add(1, Ordering::SeqCst);
        let mut stalled = self.stalled.subscribe();
        let hung = self
            .hung_barrier_reads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        Box::pin(async move {
            if hung {
                std::future::pending::<()>().await;
            }
            // While stalled (a black-holed connection) the barrier read does not answer; when
            // released it answers with the revision etcd has then.
            let _ = stalled.wait_for(|s| !*s).await;
            Ok(self.current_revision.load(Ordering::SeqCst))
        })
    }

    fn compacted_at(
        &self,
        _range: KeyRange,
        revision: i64,
    ) -> BoxFuture<'_, Result<crate::CompactionCheck>> {
        self.compaction_checks.fetch_add(1, Ordering::SeqCst);
        let compacted = self.compact_revision.load(Ordering::SeqCst);
        let etcd_revision = self.current_revision.load(Ordering::SeqCst);
        Box::pin(async move {
            Ok(if revision < compacted {
                crate::CompactionCheck::Compacted(compacted)
            } else {
                crate::CompactionCheck::Readable { etcd_revision }
            })
        })
    }

    fn range(&self, request: RangeRequest) -> BoxFuture<'_, Result<RangeResponse>> {
        self.fallback_gets.fetch_add(1, Ordering::SeqCst);
        self.fallback_keys.lock().push(request.range.start.to_vec());
        // Answers from the listed data at the current revision, as etcd would.
        let revision = self.current_revision.load(Ordering::SeqCst);
        let result = {
            let d = self.data.lock();
            request.answer(d.kvs.range(request.range.bounds()).map(|(_, kv)| kv))
        };
        Box::pin(async move {
            Ok(RangeResponse {
                revision,
                header: Header {
                    revision,
                    ..FAKE_HEADER
                },
                result,
            })
        })
    }
}
