//! Unit tests of the whole cache (follower task, dispatch, watch and read paths) driven
//! by the fake upstream: no etcd, virtual time, every answer chosen by the test.
//!
//! The upstream is `upstream::fake`, the one fake of the crate.
//!
//! - `compaction`: reads and watches below etcd's compaction;
//! - `failures`: back-off, permanent and transient upstream failures, closes at connect,
//!   a panicking follower, a bad message, the consistency check's repair;
//! - `follow`: load, follow, batching, prev_kv, duplicates, reconnect, compaction;
//! - `metrics_facade`: what the cache records through the `metrics` facade (with the
//!   `metrics` feature);
//! - `model`: the whole cache against a model;
//! - `progress`: progress trust by version, the progress requestor, consistent reads,
//!   local progress responses;
//! - `streams`: several watches on one stream, as etcd-client's `WatchStream`;
//! - `subscribers`: slow subscribers, limits, scopes, shutdown, bad input;
//! - `typed_reads`: a typed view's index lookups and list-watch revisions at one
//!   revision;
//! - `waiting_reads`: reads and watches from now that wait for a revision the cache has
//!   not reached (a hung or absent revision probe, paced progress requests, close).

mod compaction;
mod failures;
mod follow;
#[cfg(feature = "metrics")]
mod metrics_facade;
mod model;
mod progress;
mod streams;
mod subscribers;
mod typed_reads;
mod waiting_reads;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::cache::Cache;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::EventType;
use crate::upstream::fake::{FakeUpstream, OpenedWatch};
use crate::watch::{WatchOptions, WatchResponse, WatchStream};

/// The prefix every test cache holds.
const PREFIX: &str = "/app/";

/// A config for the test prefix.
fn config() -> Config {
    Config {
        prefix: Bytes::from_static(PREFIX.as_bytes()),
        ..Default::default()
    }
}

/// Lets every other task run until it blocks, without moving virtual time.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Awaits a test step; fails (instead of hanging) if it never completes.
async fn within<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(3600), fut)
        .await
        .expect("test step never completed")
}

/// The next upstream watch the cache opens.
async fn next_watch(watches: &mut mpsc::UnboundedReceiver<OpenedWatch>) -> OpenedWatch {
    within(watches.recv()).await.expect("upstream dropped")
}

/// A started cache, its scripted upstream, the confirmed upstream watch and the
/// receiver of later watches.
struct Harness {
    cache: Cache,
    up: Arc<FakeUpstream>,
    watch: OpenedWatch,
    watches: mpsc::UnboundedReceiver<OpenedWatch>,
}

/// Starts a cache over `keys` at `revision` on servers of `versions` and confirms its
/// upstream watch; returns once the cache is ready.
async fn ready(cfg: Config, versions: &[&str], keys: &[(&str, &str)], revision: i64) -> Harness {
    let (up, mut watches) = FakeUpstream::new(versions, keys, revision);
    let cache = Cache::start(cfg, up.clone()).expect("valid config");
    let watch = next_watch(&mut watches).await;
    assert_eq!(watch.start, revision + 1);
    watch.created();
    within(cache.wait_ready()).await.expect("ready");
    Harness {
        cache,
        up,
        watch,
        watches,
    }
}

/// Options for a watch on the whole test prefix.
fn prefix_opts() -> Option<WatchOptions> {
    Some(WatchOptions::new().with_prefix())
}

/// Opens a watch on the whole test prefix with `opts` (the prefix range is added).
async fn watch_prefix(cache: &Cache, opts: WatchOptions) -> WatchStream {
    cache
        .watch(PREFIX, Some(opts.with_prefix()))
        .await
        .expect("watch")
}

/// The next response of a stream (fails the test if it never comes).
async fn next(s: &mut WatchStream) -> Result<Option<WatchResponse>> {
    within(s.message()).await
}

/// The next response, which must be an event response; returns its events'
/// revision (the header's is at least that).
async fn next_rev(s: &mut WatchStream) -> i64 {
    let r = next(s).await.expect("no error").expect("not ended");
    assert!(
        !r.events().is_empty(),
        "expected events, got {r:?} (progress: {})",
        r.is_progress_notify()
    );
    let rev = r.events()[0].revision();
    assert!(
        r.events().iter().all(|e| e.revision() == rev),
        "one revision"
    );
    assert!(
        r.revision() >= rev,
        "header {} below events {rev}",
        r.revision()
    );
    rev
}

/// The stream's response if one is ready now, without waiting.
fn now(s: &mut WatchStream) -> Option<Result<Option<WatchResponse>>> {
    futures_util::FutureExt::now_or_never(s.message())
}

/// `(type, key, value, prev value)` of each event of a response.
fn events(r: &WatchResponse) -> Vec<(EventType, String, String, Option<String>)> {
    r.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("kv");
            (
                e.event_type(),
                kv.key_str().unwrap().to_owned(),
                kv.value_str().unwrap().to_owned(),
                e.prev_kv().map(|p| p.value_str().unwrap().to_owned()),
            )
        })
        .collect()
}

/// The Created response every stream starts with.
async fn created(s: &mut WatchStream) -> i64 {
    let r = next(s).await.expect("no error").expect("not ended");
    assert!(r.created(), "expected created, got {r:?}");
    r.revision()
}

/// The compact revision of a response that cancels a watch as compacted.
fn is_compacted(r: &Result<Option<WatchResponse>>) -> Option<i64> {
    match r {
        Ok(Some(resp)) if resp.canceled() && resp.compact_revision() > 0 => {
            assert!(!resp.cancel_reason().is_empty(), "a reason: {resp:?}");
            Some(resp.compact_revision())
        }
        _ => None,
    }
}

/// `n` keys `/app/k0 ..` with values `v0 ..`.
fn keys(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("{PREFIX}k{i}"), format!("v{i}")))
        .collect()
}

fn refs(keys: &[(String, String)]) -> Vec<(&str, &str)> {
    keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn k(name: &str) -> String {
    format!("{PREFIX}{name}")
}
