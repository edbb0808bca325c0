//! The consistent-read fast path and the fixed-version edge cases on a real server of the
//! run's version (`ETCD_VERSION`, default 3.4; `ETCD_BIN` for any other binary).
//!
//! - A prefix that stays quiet while the rest of the keyspace is written: on a server whose
//!   `RequestProgress` answers are trusted (>= 3.4.31 / 3.5.13, so 3.5.35, 3.6.16 and 3.7.3)
//!   every consistent read is answered from memory; on 3.4.23 every one is sent to etcd. On
//!   both, every answer equals etcd's own read at the answer's revision, and that revision is
//!   at least that of the last write acknowledged before the read.
//! - etcd#17507: a new watch on a quiet prefix, then a `RequestProgress` (a consistent read
//!   right after the cache started): answered, from memory on fixed servers.
//! - etcd#20221: a watch from a future revision, on etcd directly and on the cache: no event
//!   below the start revision, no progress notification below it (fixed etcd sends none),
//!   nothing duplicated, nothing missing.
//!
//! Every test prints a `VERSIONS |` line with what it measured (`--nocapture` shows them).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_cache::{Cache, GetOptions, WatchOptions};
use etcd_client::Client;
use testkit::{EtcdOptions, ServerVersion};

/// Every test ends within this, even when something hangs.
const TEST_LIMIT: Duration = Duration::from_secs(100);

/// One key as both sides report it: key, value, create, mod revision, version.
type Row = (Vec<u8>, Vec<u8>, i64, i64, i64);

/// Whether the cache trusts this release's `RequestProgress` answers (etcd#15220 fixed in
/// 3.4.25 / 3.5.8, etcd#17507 in 3.4.31 / 3.5.13).
fn trusted_release(release: &str) -> bool {
    ServerVersion::parse(release).is_some_and(ServerVersion::trusts_progress)
}

/// The release the server says it runs.
async fn server_release(client: &mut Client) -> String {
    client.status().await.expect("status").version().to_string()
}

/// Waits for the cache's version verdict and checks it against the server's release.
async fn wait_for_verdict(cache: &Cache, release: &str) -> bool {
    let trusted = testkit::wait_for_version_verdict(cache).await;
    assert_eq!(
        trusted,
        trusted_release(release),
        "etcd {release}: versions {:?}",
        cache.server_versions()
    );
    trusted
}

fn rows_of_cache(kvs: &[etcd_cache::KeyValue]) -> Vec<Row> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

/// etcd's own answer for `prefix` at `revision`.
async fn etcd_rows(client: &mut Client, prefix: &str, revision: i64) -> Vec<Row> {
    let resp = client
        .get(
            prefix,
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_revision(revision),
            ),
        )
        .await
        .expect("etcd's read at the revision");
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

/// Writes keys outside the cache's prefix until stopped; returns how many.
fn noise_writer(mut client: Client, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            client
                .put(format!("/noise/k{}", n % 64), n.to_string(), None)
                .await
                .expect("noise put");
            n += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        n
    })
}

/// A consistent read, checked: at or after `acked` (linearizable), and equal to etcd's own
/// read at the answer's revision. Returns the answer's revision.
async fn checked_read(cache: &Cache, client: &mut Client, prefix: &str, acked: i64) -> i64 {
    let resp = cache
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("consistent read");
    let at = resp.revision();
    assert!(
        at >= acked,
        "stale read: answered at {at}, a write was acknowledged at {acked} before the read"
    );
    let header = resp.header().expect("a header").revision();
    assert!(
        header >= at,
        "header {header} below the data's revision {at}"
    );
    let got = rows_of_cache(resp.kvs());
    let want = etcd_rows(client, prefix, at).await;
    assert_eq!(got, want, "stale or wrong read at revision {at}");
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_prefix_reads_from_memory_on_fixed_servers() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let release = server_release(&mut client).await;
        for i in 0..5 {
            client
                .put(format!("/quiet/k{i}"), format!("initial-{i}"), None)
                .await
                .unwrap();
        }
        let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/quiet/")).await;
        let trusted = wait_for_verdict(&cache, &release).await;

        let stop = Arc::new(AtomicBool::new(false));
        let noise = noise_writer(client.clone(), stop.clone());
        let before = cache.stats();
        const READS: usize = 300;
        let mut quiet_writes = 0;
        let mut latencies = Vec::with_capacity(READS);
        for i in 0..READS {
            if i % 50 == 25 {
                // The prefix changes now and then, so that a stale answer would show.
                client
                    .put(format!("/quiet/k{}", i % 5), format!("v{i}"), None)
                    .await
                    .unwrap();
                quiet_writes += 1;
            }
            // A write outside the prefix acknowledged just before the read: the cluster is
            // ahead of everything the cache has applied.
            let acked = client
                .put("/noise/before-read", i.to_string(), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            let started = Instant::now();
            checked_read(&cache, &mut client, "/quiet/", acked).await;
            latencies.push(started.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        let noise_writes = noise.await.unwrap();
        let after = cache.stats();
        let from_etcd = after.fallback_reads - before.fallback_reads;
        let from_memory = READS as u64 - from_etcd;
        let requests = after.progress_requests - before.progress_requests;
        latencies.sort();
        println!(
            "VERSIONS | quiet prefix | etcd {release} | trusted {trusted} | consistent reads {READS} | from memory {from_memory} | sent to etcd {from_etcd} | stale 0 | RequestProgress sent {requests} | read p50 {:?} p99 {:?} | writes: prefix {quiet_writes}, elsewhere {}",
            latencies[READS / 2],
            latencies[READS * 99 / 100],
            noise_writes + READS as u64,
        );
        if trusted {
            assert_eq!(from_etcd, 0, "etcd {release} is fixed: every read from memory");
            assert!(requests > 0, "the reads waited on RequestProgress answers");
        } else {
            assert_eq!(
                from_etcd, READS as u64,
                "etcd {release} has etcd#15220/#17507: every read that the cache cannot prove current goes to etcd"
            );
            assert_eq!(requests, 0, "no RequestProgress to an untrusted server");
        }
        cache.close().await;
    })
    .await;
}

/// etcd#17507 (fixed in 3.4.31 / 3.5.13): after the fix of etcd#15220, a new watch on a
/// quiet key could get no answer to `RequestProgress` at all. Asked of the server directly
/// (informational on an untrusted server) and through new caches (asserted: every read
/// answered correctly, from memory on a fixed server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_request_on_a_new_watch_of_a_quiet_key() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let release = server_release(&mut client).await;
        let fixed = trusted_release(&release);
        client.put("/q17507/only", "x", None).await.unwrap();
        for i in 0..20 {
            client.put(format!("/noise/{i}"), "n", None).await.unwrap();
        }

        // The server itself: a new watch from now on a quiet key, then RequestProgress.
        const RAW: usize = 20;
        let mut answered = 0;
        let mut behind = 0;
        for i in 0..RAW {
            let current = client
                .put(format!("/noise/raw{i}"), "n", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            let mut stream = client
                .watch("/q17507/only", Some(etcd_client::WatchOptions::new()))
                .await
                .unwrap();
            let created = stream.message().await.unwrap().expect("created");
            assert!(created.created());
            let watch_id = created.watch_id();
            stream.request_progress().await.unwrap();
            match tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
                Ok(Ok(Some(resp))) => {
                    assert!(resp.events().is_empty(), "no event was written to the key");
                    answered += 1;
                    let rev = resp.header().unwrap().revision();
                    if rev < current {
                        behind += 1;
                    }
                }
                Ok(other) => panic!("watch stream ended: {other:?}"),
                Err(_) => {}
            }
            stream.cancel(watch_id).await.unwrap();
        }
        println!(
            "VERSIONS | etcd#17507 raw | etcd {release} | new watches on a quiet key {RAW} | RequestProgress answered within 2 s {answered} | answers behind the revision {behind}"
        );
        if fixed {
            assert_eq!(answered, RAW, "etcd {release} must answer every RequestProgress");
            assert_eq!(behind, 0);
        }

        // Through the cache: each cache is a new upstream watch on a quiet prefix; its first
        // consistent read needs a progress answer (on a fixed server) or goes to etcd.
        const CACHES: usize = 5;
        let mut from_etcd = 0;
        let mut slowest = Duration::ZERO;
        for i in 0..CACHES {
            let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/q17507/")).await;
            assert_eq!(wait_for_verdict(&cache, &release).await, fixed);
            let acked = client
                .put(format!("/noise/c{i}"), "n", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            let started = Instant::now();
            checked_read(&cache, &mut client, "/q17507/", acked).await;
            slowest = slowest.max(started.elapsed());
            from_etcd += cache.stats().fallback_reads;
            cache.close().await;
        }
        println!(
            "VERSIONS | etcd#17507 cache | etcd {release} | new caches {CACHES} | first reads sent to etcd {from_etcd} | stale 0 | slowest {slowest:?}"
        );
        if fixed {
            assert_eq!(from_etcd, 0, "etcd {release}: answered from memory");
        } else {
            assert_eq!(from_etcd, CACHES as u64, "untrusted: etcd answers");
        }
    })
    .await;
}

/// One response of a watch, reduced to what is checked.
#[derive(Debug)]
enum Seen {
    Events(Vec<(i64, Vec<u8>)>),
    Progress(i64),
}

/// etcd#20221 (fixed in 3.4.38 / 3.5.22 / 3.6.2): a watch from a future revision got
/// progress notifications below its start revision, and a client resuming from one of them
/// got events it had not asked for. Fixed etcd sends no progress below the start revision
/// (it defers a stream-wide progress request's answer until it can); the cache must not
/// either, and must deliver exactly the events from the start on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_future_revision() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(
            EtcdOptions::default().progress_notify_interval(Duration::from_millis(100)),
        )
        .await;
        let release = server_release(&mut client).await;
        let cache = testkit::ready_cache(client.clone(), |b| {
            b.prefix("/q20221/")
                .progress_notify_interval(Duration::from_millis(100))
        })
        .await;
        let current = client
            .put("/q20221/k", "0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cache.wait_for_revision(current).await.unwrap();
        const AHEAD: i64 = 10;
        const WRITES: i64 = 20;
        let start = current + AHEAD;

        // The raw etcd watch and the cache's, both from `start`, with progress notifications.
        let mut raw = client
            .watch(
                "/q20221/",
                Some(
                    etcd_client::WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(start)
                        .with_progress_notify(),
                ),
            )
            .await
            .unwrap();
        let mut local = cache
            .watch(
                "/q20221/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(start)
                        .with_progress_notify(),
                ),
            )
            .await
            .unwrap();
        // A stream-wide progress request on each. Fixed etcd drops one it cannot answer
        // (`rev < w.startRev`: it is never answered); the cache answers it once it has
        // reached the start, never below it.
        raw.request_progress().await.unwrap();
        local.request_progress().await.unwrap();
        // Quiet for a while: periodic progress notifications (100 ms) would come now. The
        // cache's watch is read meanwhile, so that a notification it made would be seen.
        let mut local_early = Vec::new();
        let mut early_answer = None;
        let quiet = tokio::time::sleep(Duration::from_millis(600));
        tokio::pin!(quiet);
        loop {
            tokio::select! {
                _ = &mut quiet => break,
                resp = local.message() => {
                    let resp = resp.unwrap().expect("cache watch open");
                    if resp.watch_id() == -1 {
                        early_answer = Some(resp.header().unwrap().revision());
                    }
                    if !resp.created() {
                        local_early.push(Seen::Progress(resp.header().unwrap().revision()));
                    }
                }
            }
        }
        let mut written = Vec::new();
        for i in 1..=WRITES {
            let rev = client
                .put("/q20221/k", i.to_string(), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            written.push(rev);
        }
        let last = *written.last().unwrap();
        let expected: Vec<i64> = written.iter().copied().filter(|&r| r >= start).collect();

        // Collect both until the last revision was delivered (and, from the cache, the
        // stream-wide progress request was answered).
        let mut raw_seen = Vec::new();
        let (mut done, mut answered) = (false, None);
        while !done {
            let resp = raw.message().await.unwrap().expect("raw watch open");
            if resp.watch_id() == -1 {
                answered = Some(resp.header().unwrap().revision());
            }
            if resp.created() {
                continue;
            }
            let events: Vec<(i64, Vec<u8>)> = resp
                .events()
                .iter()
                .map(|e| {
                    let kv = e.kv().unwrap();
                    (kv.mod_revision(), kv.value().to_vec())
                })
                .collect();
            done |= events.iter().any(|(r, _)| *r >= last);
            raw_seen.push(if events.is_empty() {
                Seen::Progress(resp.header().unwrap().revision())
            } else {
                Seen::Events(events)
            });
        }
        let raw_answer = answered;
        let mut local_seen = local_early;
        let (mut done, mut answered) = (false, early_answer);
        while !done || answered.is_none() {
            let resp = local.message().await.unwrap().expect("cache watch open");
            if resp.watch_id() == -1 {
                answered = Some(resp.header().unwrap().revision());
            }
            if resp.created() {
                continue;
            }
            assert!(!resp.canceled(), "cache watch canceled: {resp:?}");
            let events: Vec<(i64, Vec<u8>)> = resp
                .events()
                .iter()
                .map(|e| {
                    let kv = e.kv().unwrap();
                    (kv.mod_revision(), kv.value().to_vec())
                })
                .collect();
            done |= events.iter().any(|(r, _)| *r >= last);
            local_seen.push(if events.is_empty() {
                Seen::Progress(resp.header().unwrap().revision())
            } else {
                Seen::Events(events)
            });
        }
        let local_answer = answered;

        let summarize = |seen: &[Seen]| {
            let revisions: Vec<i64> = seen
                .iter()
                .flat_map(|s| match s {
                    Seen::Events(e) => e.iter().map(|(r, _)| *r).collect(),
                    Seen::Progress(_) => Vec::new(),
                })
                .collect();
            let low_progress: Vec<i64> = seen
                .iter()
                .filter_map(|s| match s {
                    Seen::Progress(r) if *r < start => Some(*r),
                    _ => None,
                })
                .collect();
            (revisions, low_progress)
        };
        let (raw_revs, raw_low) = summarize(&raw_seen);
        let (local_revs, local_low) = summarize(&local_seen);
        println!(
            "VERSIONS | etcd#20221 | etcd {release} | start {start} (current {current}) | etcd: events {} (below start {}), progress below start {}, stream-wide answer {:?} | cache: events {} (below start {}), progress below start {}, stream-wide answer {:?}",
            raw_revs.len(),
            raw_revs.iter().filter(|&&r| r < start).count(),
            raw_low.len(),
            raw_answer,
            local_revs.len(),
            local_revs.iter().filter(|&&r| r < start).count(),
            local_low.len(),
            local_answer,
        );
        // The cache, on every version: exactly the events from `start`, in order, once.
        assert_eq!(local_revs, expected, "cache watch events: {local_seen:?}");
        assert!(
            local_low.is_empty(),
            "the cache sent progress notifications below the start revision {start}: {local_low:?} \
             (a client resuming from one would get events it did not ask for, etcd#20221)"
        );
        // Fixed etcd (3.4.38 / 3.5.22 / 3.6.2 and later) behaves the same.
        let fixed_20221 =
            ServerVersion::parse(&release).is_some_and(ServerVersion::fixes_etcd_20221);
        assert_eq!(raw_revs, expected, "etcd's own events from the start revision");
        if fixed_20221 {
            assert!(raw_low.is_empty(), "fixed etcd sent progress below the start: {raw_low:?}");
        }

        // And the cache's reads at and around those revisions equal etcd's.
        for &rev in written.iter().step_by(5) {
            let resp = cache
                .get(
                    "/q20221/",
                    Some(GetOptions::new().with_prefix().with_revision(rev)),
                )
                .await
                .unwrap();
            assert_eq!(
                rows_of_cache(resp.kvs()),
                etcd_rows(&mut client, "/q20221/", rev).await
            );
        }
        cache.close().await;
    })
    .await;
}

/// A cache watch from a future revision and many concurrent ones around it: each gets
/// exactly its events (no duplicates across the wait for the start revision), checked
/// against etcd's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_future_watches_each_get_exactly_their_events() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/fut/")).await;
        let current = client
            .put("/fut/a", "0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cache.wait_for_revision(current).await.unwrap();
        let mut watches = Vec::new();
        for ahead in [1i64, 2, 5, 17, 40, 79] {
            let start = current + ahead;
            let w = cache
                .watch(
                    "/fut/",
                    Some(WatchOptions::new().with_prefix().with_start_revision(start)),
                )
                .await
                .unwrap();
            watches.push((start, w));
        }
        let writes = Arc::new(AtomicU64::new(0));
        let mut revs = BTreeMap::new();
        for i in 1..=80 {
            let key = format!("/fut/{}", ["a", "b", "c"][i % 3]);
            let rev = if i % 7 == 0 {
                client
                    .delete(key.clone(), None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision()
            } else {
                client
                    .put(key.clone(), i.to_string(), None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision()
            };
            client.put("/elsewhere", "x", None).await.unwrap();
            revs.insert(rev, key);
            writes.fetch_add(1, Ordering::Relaxed);
        }
        let last = *revs.keys().next_back().unwrap();
        for (start, mut w) in watches {
            let mut got = Vec::new();
            while !matches!(got.last(), Some(&(r, _)) if r >= last) {
                let resp = w.message().await.unwrap().expect("watch open");
                assert!(!resp.canceled());
                for e in resp.events() {
                    let kv = e.kv().unwrap();
                    got.push((kv.mod_revision(), kv.key_str().unwrap().to_string()));
                }
            }
            let want: Vec<(i64, String)> =
                revs.range(start..).map(|(r, k)| (*r, k.clone())).collect();
            assert_eq!(got, want, "watch from {start}");
        }
        println!(
            "VERSIONS | future watches | writes {} | every watch got exactly its events",
            writes.load(Ordering::Relaxed)
        );
        cache.close().await;
    })
    .await;
}
