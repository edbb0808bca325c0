//! Integration tests of the watch cache against a real etcd: the paged load, following,
//! replay, filters, limits and bad input, and reads and watches of every form against etcd's.

use std::time::Duration;

use etcd_cache::{
    Cache, Error, EventType, GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions,
    WatchResponse, WatchStream,
};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use testkit::EtcdOptions;

const LIMIT: Duration = Duration::from_secs(90);

/// The next response with events (skipping `created` and progress).
async fn next_events(s: &mut WatchStream) -> WatchResponse {
    loop {
        let r = tokio::time::timeout(Duration::from_secs(20), s.message())
            .await
            .expect("no response within 20 s")
            .expect("stream error")
            .expect("stream ended");
        if !r.events().is_empty() {
            return r;
        }
    }
}

fn keys(r: &WatchResponse) -> Vec<String> {
    r.events()
        .iter()
        .map(|e| e.kv().unwrap().key_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_follow_replay_txn_prevkv_filters() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        for i in 0..25 {
            client
                .put(format!("/app/pre{i:02}"), format!("v{i}"), None)
                .await
                .unwrap();
        }
        client.put("/other/x", "outside", None).await.unwrap();
        let cache = Cache::builder(client.clone())
            .prefix("/app/")
            .page_size(7)
            .build()
            .await
            .unwrap();
        assert!(!cache.is_ready() || cache.revision() > 0);
        cache
            .wait_ready_timeout(Duration::from_secs(20))
            .await
            .unwrap();
        assert!(cache.is_ready());
        let stats = cache.stats();
        assert_eq!(stats.keys, 25, "paged list loaded every key");
        assert_eq!(stats.lists, 1);

        let mut all = cache
            .watch(
                "/app/",
                Some(WatchOptions::new().with_prefix().with_prev_key()),
            )
            .await
            .unwrap();
        let first = all.message().await.unwrap().unwrap();
        assert!(first.created());
        let mut one = cache.watch("/app/k1", None).await.unwrap();
        let mut no_del = cache
            .watch(
                "/app/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoDelete]),
                ),
            )
            .await
            .unwrap();
        let mut no_put = cache
            .watch(
                "/app/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoPut]),
                ),
            )
            .await
            .unwrap();

        let r1 = client
            .put("/app/k1", "a", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let r2 = client
            .put("/app/k1", "b", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        // A transaction writing three keys is one revision and one response.
        let txn = Txn::new()
            .when([Compare::version("/app/k1", CompareOp::Greater, 0)])
            .and_then([
                TxnOp::put("/app/t1", "x", None),
                TxnOp::put("/app/t2", "y", None),
                TxnOp::delete("/app/k1", None),
            ]);
        let r3 = client.txn(txn).await.unwrap().header().unwrap().revision();
        client.put("/other/y", "ignored", None).await.unwrap();
        let r4 = client
            .delete("/app/t1", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();

        let e = next_events(&mut all).await;
        assert_eq!((e.revision(), keys(&e)), (r1, vec!["/app/k1".to_owned()]));
        assert!(
            e.events()[0].prev_kv().is_none(),
            "created key has no prev_kv"
        );
        let e = next_events(&mut all).await;
        assert_eq!(e.revision(), r2);
        assert_eq!(e.events()[0].prev_kv().unwrap().value(), b"a");
        let e = next_events(&mut all).await;
        assert_eq!(e.revision(), r3);
        assert_eq!(
            keys(&e),
            ["/app/t1", "/app/t2", "/app/k1"],
            "one response, etcd's order"
        );
        let del = &e.events()[2];
        assert_eq!(del.event_type(), EventType::Delete);
        assert_eq!(del.prev_kv().unwrap().value(), b"b");
        assert_eq!(del.kv().unwrap().mod_revision(), r3);
        let e = next_events(&mut all).await;
        assert_eq!(e.revision(), r4);
        assert_eq!(e.events()[0].prev_kv().unwrap().value(), b"x");

        // Single key: only its events; the txn response holds only the k1 delete.
        assert_eq!(next_events(&mut one).await.revision(), r1);
        assert_eq!(next_events(&mut one).await.revision(), r2);
        let e = next_events(&mut one).await;
        assert_eq!((e.revision(), keys(&e)), (r3, vec!["/app/k1".to_owned()]));
        assert!(e.events()[0].prev_kv().is_none(), "no prev_kv unless asked");

        // Filters.
        for want in [r1, r2] {
            assert_eq!(next_events(&mut no_del).await.revision(), want);
        }
        let e = next_events(&mut no_del).await;
        assert_eq!(
            (e.revision(), keys(&e)),
            (r3, vec!["/app/t1".to_owned(), "/app/t2".to_owned()])
        );
        let e = next_events(&mut no_put).await;
        assert_eq!((e.revision(), keys(&e)), (r3, vec!["/app/k1".to_owned()]));
        assert_eq!(next_events(&mut no_put).await.revision(), r4);

        // Replay from the middle of the window, then live, seamlessly.
        let mut replay = cache
            .watch(
                "/app/",
                Some(WatchOptions::new().with_prefix().with_start_revision(r2)),
            )
            .await
            .unwrap();
        for want in [r2, r3, r4] {
            let r = next_events(&mut replay).await;
            assert_eq!(r.events()[0].revision(), want);
            assert!(
                r.revision() >= want,
                "the header is at least the events' revision"
            );
        }
        let r5 = client
            .put("/app/live", "1", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        assert_eq!(next_events(&mut replay).await.revision(), r5);

        // A future start revision is delivered when it happens.
        let mut future = cache
            .watch(
                "/app/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(r5 + 2),
                ),
            )
            .await
            .unwrap();
        client.put("/app/f1", "1", None).await.unwrap();
        let r7 = client
            .put("/app/f2", "2", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        assert_eq!(next_events(&mut future).await.revision(), r7);
        cache.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_start_revision_and_bad_input() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) =
            testkit::cache_on_etcd(|b| b.prefix("/app/").history_window(4).max_watchers(3)).await;
        let mut live = cache
            .watch("/app/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let mut revs = Vec::new();
        for i in 0..10 {
            revs.push(
                client
                    .put(format!("/app/k{i}"), "v", None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision(),
            );
        }
        for &r in &revs {
            assert_eq!(next_events(&mut live).await.revision(), r);
        }
        let (floor, head) = cache.history_span();
        assert_eq!(floor, revs[5] + 1);
        assert_eq!(head, revs[9]);
        let mut old = cache
            .watch(
                "/app/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revs[2]),
                ),
            )
            .await
            .unwrap();
        // As etcd: created, then canceled with the compact revision, then the end.
        assert!(old.message().await.unwrap().unwrap().created());
        match old.message().await {
            Ok(Some(r)) if r.canceled() => assert_eq!(r.compact_revision(), floor),
            other => panic!("expected a canceled response, got {other:?}"),
        }
        assert!(
            old.message().await.unwrap().is_none(),
            "stream ends after the compaction signal"
        );
        drop(old);

        // Bad input: clear errors, nothing else changes.
        let bad: Vec<(&str, WatchOptions)> = vec![
            ("", WatchOptions::new()),
            ("/app/b", WatchOptions::new().with_range("/app/a")),
            ("/app/b", WatchOptions::new().with_range("/app/b")),
            ("/other", WatchOptions::new()),
            ("/app/", WatchOptions::new().with_range("/zzz")),
            ("/app/", WatchOptions::new().with_from_key()),
            ("", WatchOptions::new().with_all_keys()),
            ("/app/a", WatchOptions::new().with_start_revision(-1)),
        ];
        for (key, opts) in bad {
            let e = cache.watch(key, Some(opts.clone())).await.expect_err(key);
            assert!(
                matches!(e, Error::InvalidRange { .. } | Error::OutOfRange { .. }),
                "{key}: {e}"
            );
            assert!(!e.to_string().is_empty());
        }
        let e = cache.get("", None).await.unwrap_err();
        assert!(matches!(e, Error::InvalidRange { .. }), "{e}");
        let e = cache
            .get("/app/a", Some(GetOptions::new().with_revision(-3)))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("negative revision"), "{e}");
        let e = cache.get("/other/a", None).await.unwrap_err();
        assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
        let e = cache
            .get(
                "/app/",
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_revision(revs[0])
                        .with_serializable(),
                ),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Compacted { .. }), "{e}");
        let e = cache
            .get(
                "/app/",
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_revision(revs[9] + 1000)
                        .with_serializable(),
                ),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, Error::FutureRevision { .. }), "{e}");

        // Watch limit: 3 allowed, `live` holds one.
        let a = cache.watch("/app/a", None).await.unwrap();
        let b = cache.watch("/app/b", None).await.unwrap();
        let e = cache.watch("/app/c", None).await.unwrap_err();
        assert_eq!(e.to_string(), "at most 3 watches are allowed");
        drop(a);
        let c = cache
            .watch("/app/c", None)
            .await
            .expect("dropping a stream frees its slot");
        drop((b, c));

        // Scoped budget: its drop cancels its watches.
        let scope = cache.scope(1);
        let mut s1 = scope.watch("/app/s", None).await.unwrap();
        assert!(matches!(
            scope.watch("/app/s", None).await,
            Err(Error::WatchLimit { limit: 1 })
        ));
        drop(scope);
        assert!(s1.message().await.unwrap().unwrap().created());
        assert!(
            s1.message().await.unwrap().is_none(),
            "scope drop ends its streams"
        );
        assert_eq!(cache.watcher_count(), 1, "an ended watch frees its slot");
        drop(s1);
        assert_eq!(cache.watcher_count(), 1);

        // The live subscriber saw nothing odd and keeps going.
        let r = client
            .put("/app/after", "v", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        assert_eq!(next_events(&mut live).await.revision(), r);
        cache.close().await;
        assert!(
            live.message().await.unwrap().is_none(),
            "close ends streams"
        );
        assert!(matches!(
            cache.watch("/app/a", None).await,
            Err(Error::Closed)
        ));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_one_subscriber_gets_every_revision_of_a_burst() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, client, cache) = testkit::cache_on_etcd(|b| {
            b.prefix("/burst/")
                .subscriber_buffer(1)
                .history_window(20_000)
        })
        .await;
        let start = cache.revision();
        let mut slow = cache
            .watch("/burst/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let mut fast = cache
            .scope(10)
            .watch("/burst/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        drop(fast.message().await);
        const N: usize = 10_000;
        let writers = 16;
        let mut tasks = Vec::new();
        for w in 0..writers {
            let mut c = client.clone();
            tasks.push(tokio::spawn(async move {
                for i in (w..N).step_by(writers) {
                    c.put(format!("/burst/k{}", i % 97), format!("{i}"), None)
                        .await
                        .unwrap();
                }
            }));
        }
        let mut seen = Vec::with_capacity(N);
        while seen.len() < N {
            let r = next_events(&mut slow).await;
            assert_eq!(r.events().len(), 1);
            seen.push(r.revision());
        }
        for t in tasks {
            t.await.unwrap();
        }
        let want: Vec<i64> = (start + 1..=start + N as i64).collect();
        assert_eq!(seen, want, "every revision once, in order");
        assert!(cache.stats().lagging <= 1);
        cache.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_equals_etcd_for_every_form() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b).await;
        for i in 0..40 {
            client
                .put(
                    format!("/g/{:02}", (i * 7) % 30),
                    format!("v{}", 40 - i),
                    None,
                )
                .await
                .unwrap();
        }
        client.delete("/g/05", None).await.unwrap();
        let mid = client
            .put("/g/mid", "m", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        for i in 0..10 {
            client
                .put(format!("/g/{:02}", i), "late", None)
                .await
                .unwrap();
        }
        client.delete("/g/07", None).await.unwrap();
        let last = client
            .put("/g/zz", "z", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cache.wait_for_revision(last).await.unwrap();

        let cases = [
            Form::key("/g/03"),
            Form::key("/g/07"),
            Form::prefix("/g/"),
            Form::prefix("/g/").limit(5),
            Form::range("/g/1", "/g/2"),
            Form::prefix("/g/").keys_only(),
            Form::prefix("/g/").count_only(),
            Form::prefix("/g/")
                .sort(SortTarget::Value, SortOrder::Descend)
                .limit(7),
            Form::prefix("/g/").sort(SortTarget::Key, SortOrder::Descend),
            // etcd 3.4 sorts only the first limit + 1 keys when the order is None.
            Form::prefix("/g/")
                .sort(SortTarget::Create, SortOrder::None)
                .limit(4),
            Form::prefix("").limit(3),
            Form::prefix("/g/")
                .sort(SortTarget::Mod, SortOrder::Ascend)
                .limit(3),
        ];
        // The same fields of both crates' key-values (their types differ, the names not).
        macro_rules! rows {
            ($resp:expr) => {
                $resp
                    .kvs()
                    .iter()
                    .map(|kv| {
                        let (k, v) = (kv.key().to_vec(), kv.value().to_vec());
                        (k, v, kv.mod_revision(), kv.create_revision(), kv.version())
                    })
                    .collect::<Vec<_>>()
            };
        }
        for rev in [0, mid, last] {
            for form in &cases {
                for serializable in [false, true] {
                    let got = cache
                        .get(form.key, Some(form.ours(rev, serializable)))
                        .await
                        .unwrap();
                    let want = client.get(form.key, Some(form.etcd(rev))).await.unwrap();
                    let (g, w) = (rows!(got), rows!(want));
                    assert_eq!(g, w, "{form:?} at {rev}");
                    assert_eq!(got.count(), want.count(), "{form:?} at {rev}");
                    assert_eq!(got.more(), want.more(), "{form:?} at {rev}");
                    if rev != 0 {
                        assert_eq!(got.revision(), rev);
                    }
                }
            }
        }
        cache.close().await;
    })
    .await;
}

/// A write that completed before `watch()` is never delivered to a watch "from now",
/// even when the cache has not applied it yet (etcd's semantics for start revision 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_now_skips_writes_completed_before_it() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/now/")).await;
        for i in 0..100 {
            let before = client
                .put("/now/k", format!("before-{i}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            let mut w = cache.watch("/now/k", None).await.unwrap();
            let after = client
                .put("/now/k", format!("after-{i}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            let r = next_events(&mut w).await;
            assert!(
                r.revision() > before,
                "round {i}: got the write before watch()"
            );
            assert_eq!(r.revision(), after, "round {i}");
            assert_eq!(
                r.events()[0].kv().unwrap().value_str().unwrap(),
                format!("after-{i}")
            );
        }
        cache.close().await;
    })
    .await;
}

/// Watches from now added one after another to one stream: `WatchStream::watch`
/// returns without waiting for etcd, so 2,000 adds share a few barrier reads (etcd's own
/// count of Range calls), their `created` responses come in the order of the adds, none
/// is below a write that completed before its add, and each watch gets every write
/// from its start on: none before its add, none missed after its `created`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_added_to_one_stream_share_round_trips_and_start_after_earlier_writes() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/adds/")).await;
        let addr = etcd.client_addr();
        let ranges = || async move {
            testkit::blocking(move || testkit::grpc_started(addr, "Range"))
                .await
                .expect("etcd's /metrics")
        };
        const N: usize = 2_000;
        let mut stream = cache.watch_stream();
        let mut writes = Vec::new(); // (adds made before it, its revision)
        let ranges_before = ranges().await;
        for i in 0..N {
            if i % 100 == 50 {
                let put = client.put("/adds/k", format!("{i}"), None).await.unwrap();
                writes.push((i, put.header().unwrap().revision()));
            }
            stream.watch("/adds/k", None).await.unwrap();
        }
        // `created` responses in the order of the adds; the events of the watches
        // created first come between them.
        let mut created = Vec::with_capacity(N);
        let mut got: Vec<Vec<i64>> = vec![Vec::new(); N];
        while created.len() < N {
            let r = tokio::time::timeout(Duration::from_secs(20), stream.message())
                .await
                .expect("a response within 20 s")
                .unwrap()
                .unwrap();
            if r.created() {
                assert_eq!(r.watch_id(), created.len() as i64, "in order: {r:?}");
                created.push(r.revision());
            } else {
                let seen = &mut got[r.watch_id() as usize];
                seen.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
            }
        }
        let range_calls = ranges().await - ranges_before;
        for &(adds_before, revision) in &writes {
            for (id, &c) in created.iter().enumerate().skip(adds_before) {
                assert!(
                    c >= revision,
                    "watch {id}, added after the write at {revision}, created at {c}"
                );
            }
        }
        assert!(
            range_calls <= 100,
            "{N} watches added on one stream (with {} writes between): {range_calls} Range calls to etcd",
            writes.len()
        );
        let last = client.put("/adds/k", "last", None).await.unwrap();
        writes.push((N, last.header().unwrap().revision()));
        let mut done = 0;
        while done < N {
            let r = next_events(&mut stream).await;
            let seen = &mut got[r.watch_id() as usize];
            seen.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
            if seen.last() == Some(&writes[writes.len() - 1].1) {
                done += 1;
            }
        }
        // Each watch gets every write from some revision on: after the last write
        // before its add, and at the latest from the one after its `created` (whose
        // header is the stream's, which other watches' events may have moved on).
        let all: Vec<i64> = writes.iter().map(|w| w.1).collect();
        for (id, seen) in got.iter().enumerate() {
            let before = writes
                .iter()
                .filter(|w| w.0 <= id)
                .map(|w| w.1)
                .max()
                .unwrap_or(0);
            let first = seen[0];
            let want: Vec<i64> = all.iter().copied().filter(|&r| r >= first).collect();
            assert_eq!(seen, &want, "watch {id}: every write from its first on");
            assert!(
                first > before,
                "watch {id} got {first}, written before it was added"
            );
            assert!(
                all.iter().all(|&r| r <= created[id] || r >= first),
                "watch {id} (created at {}) missed writes: {seen:?}",
                created[id]
            );
        }
        println!(
            "ADDS | {N} watches from now added to one stream: {range_calls} Range calls to etcd"
        );
        cache.close().await;
    })
    .await;
}

/// One read request, described once and built for both the cache and etcd-client.
#[derive(Debug, Clone, Copy)]
struct Form {
    key: &'static str,
    prefix: bool,
    end: Option<&'static str>,
    limit: i64,
    keys_only: bool,
    count_only: bool,
    sort: Option<(SortTarget, SortOrder)>,
}

impl Form {
    fn key(key: &'static str) -> Self {
        Form {
            key,
            prefix: false,
            end: None,
            limit: 0,
            keys_only: false,
            count_only: false,
            sort: None,
        }
    }
    fn prefix(key: &'static str) -> Self {
        Form {
            prefix: true,
            ..Form::key(key)
        }
    }
    fn range(key: &'static str, end: &'static str) -> Self {
        Form {
            end: Some(end),
            ..Form::key(key)
        }
    }
    fn limit(self, limit: i64) -> Self {
        Form { limit, ..self }
    }
    fn keys_only(self) -> Self {
        Form {
            keys_only: true,
            ..self
        }
    }
    fn count_only(self) -> Self {
        Form {
            count_only: true,
            ..self
        }
    }
    fn sort(self, target: SortTarget, order: SortOrder) -> Self {
        Form {
            sort: Some((target, order)),
            ..self
        }
    }

    fn ours(&self, rev: i64, serializable: bool) -> GetOptions {
        let mut o = GetOptions::new().with_revision(rev).with_limit(self.limit);
        if self.prefix {
            o = o.with_prefix();
        }
        if let Some(end) = self.end {
            o = o.with_range(end);
        }
        if self.keys_only {
            o = o.with_keys_only();
        }
        if self.count_only {
            o = o.with_count_only();
        }
        if let Some((t, ord)) = self.sort {
            o = o.with_sort(t, ord);
        }
        if serializable {
            o = o.with_serializable();
        }
        o
    }

    fn etcd(&self, rev: i64) -> etcd_client::GetOptions {
        let mut o = etcd_client::GetOptions::new()
            .with_revision(rev)
            .with_limit(self.limit);
        if self.prefix {
            o = o.with_prefix();
        }
        if let Some(end) = self.end {
            o = o.with_range(end);
        }
        if self.keys_only {
            o = o.with_keys_only();
        }
        if self.count_only {
            o = o.with_count_only();
        }
        if let Some((t, ord)) = self.sort {
            let t = match t {
                SortTarget::Key => etcd_client::SortTarget::Key,
                SortTarget::Version => etcd_client::SortTarget::Version,
                SortTarget::Create => etcd_client::SortTarget::Create,
                SortTarget::Mod => etcd_client::SortTarget::Mod,
                SortTarget::Value => etcd_client::SortTarget::Value,
            };
            let ord = match ord {
                SortOrder::None => etcd_client::SortOrder::None,
                SortOrder::Ascend => etcd_client::SortOrder::Ascend,
                SortOrder::Descend => etcd_client::SortOrder::Descend,
            };
            o = o.with_sort(t, ord);
        }
        o
    }
}

/// The range forms that need a whole-keyspace cache (all keys, from a key, explicit
/// ranges) deliver exactly what a direct etcd watch of the same form delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_range_form_matches_etcd_on_a_whole_keyspace_cache() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b).await;
        let forms: Vec<(&str, WatchOptions, etcd_client::WatchOptions)> = vec![
            (
                "",
                WatchOptions::new().with_all_keys(),
                etcd_client::WatchOptions::new().with_all_keys(),
            ),
            (
                "",
                WatchOptions::new().with_prefix(),
                etcd_client::WatchOptions::new().with_prefix(),
            ),
            (
                "k5",
                WatchOptions::new().with_from_key(),
                etcd_client::WatchOptions::new().with_from_key(),
            ),
            (
                "k2",
                WatchOptions::new().with_range("k6"),
                etcd_client::WatchOptions::new().with_range("k6"),
            ),
            (
                "k",
                WatchOptions::new().with_range("\0"),
                etcd_client::WatchOptions::new().with_range("\0"),
            ),
            ("k3", WatchOptions::new(), etcd_client::WatchOptions::new()),
        ];
        let start = client
            .get("k", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision()
            + 1;
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for (key, o, e) in &forms {
            ours.push(
                cache
                    .watch(*key, Some(o.clone().with_start_revision(start)))
                    .await
                    .unwrap(),
            );
            let e = e.clone().with_start_revision(start);
            theirs.push(client.watch_client().watch(*key, Some(e)).await.unwrap());
        }
        let mut last = 0;
        for i in 0..40 {
            let key = format!("{}{}", ["a", "k", "z"][i % 3], i % 9);
            last = if i % 5 == 4 {
                client
                    .delete(key, None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision()
            } else {
                client
                    .put(key, format!("{i}"), None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision()
            };
        }
        // A sentinel revision every form matches (one transaction writes k3 and k5), so
        // that each stream can be read to its end.
        let txn =
            Txn::new().and_then([TxnOp::put("k3", "end", None), TxnOp::put("k5", "end", None)]);
        let sentinel = client.txn(txn).await.unwrap().header().unwrap().revision();
        assert!(sentinel > last);
        for (i, (s, w)) in ours.iter_mut().zip(theirs.iter_mut()).enumerate() {
            let mut got = Vec::new();
            while got
                .last()
                .is_none_or(|(r, _): &(i64, String)| *r < sentinel)
            {
                let r = next_events(s).await;
                for ev in r.events() {
                    got.push((r.revision(), ev.kv().unwrap().key_str().unwrap().to_owned()));
                }
            }
            let mut want = Vec::new();
            while want
                .last()
                .is_none_or(|(r, _): &(i64, String)| *r < sentinel)
            {
                let r = tokio::time::timeout(Duration::from_secs(20), w.message())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                for ev in r.events() {
                    let kv = ev.kv().unwrap();
                    want.push((kv.mod_revision(), kv.key_str().unwrap().to_owned()));
                }
            }
            assert_eq!(got, want, "form {i}: {:?}", forms[i].0);
        }
        cache.close().await;
    })
    .await;
}

/// The history is bounded in bytes as well as in revisions: 200 writes of a 100 KB value
/// (each event also carries the 100 KB previous value) stay within a 4 MiB budget, the
/// window's floor moves up instead, and a watch from inside what is left still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_keep_the_history_within_its_byte_budget() {
    const BUDGET: usize = 4 * 1024 * 1024;
    let (_etcd, mut client, cache) =
        testkit::cache_on_etcd(|b| b.prefix("/big/").history_bytes(BUDGET)).await;
    let value = vec![b'v'; 100_000];
    let mut last = 0;
    for _ in 0..200 {
        last = client
            .put("/big/k", value.clone(), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    cache.wait_for_revision(last).await.unwrap();
    let stats = cache.stats();
    assert!(
        stats.history_bytes <= BUDGET,
        "history holds {} bytes, budget {BUDGET}",
        stats.history_bytes
    );
    let (floor, head) = cache.history_span();
    assert_eq!(head, last);
    assert!(head - floor < 100, "the floor moved up: {floor}..{head}");
    // What is left replays, from its floor.
    let mut w = cache
        .watch(
            "/big/k",
            Some(WatchOptions::new().with_start_revision(floor)),
        )
        .await
        .unwrap();
    let mut seen = 0;
    while seen <= head - floor {
        let r = tokio::time::timeout(Duration::from_secs(10), w.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!r.canceled(), "{}", r.cancel_reason());
        seen += r.events().len() as i64;
    }
    assert_eq!(seen, head - floor + 1);
}

/// What etcd answers a watch from `start` on `key`: the revisions of its events up to
/// `until`, or the compact revision it was canceled with.
async fn etcd_watch_answer(
    client: &mut etcd_client::Client,
    key: &str,
    start: i64,
    until: i64,
) -> Result<Vec<i64>, i64> {
    let mut revs = Vec::new();
    let mut stream = client
        .watch(
            key,
            Some(etcd_client::WatchOptions::new().with_start_revision(start)),
        )
        .await
        .unwrap();
    loop {
        let r = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("etcd answered the watch")
            .unwrap()
            .expect("etcd's watch stream ended");
        if r.compact_revision() > 0 {
            return Err(r.compact_revision());
        }
        revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        if revs.last().is_some_and(|&r| r >= until) {
            return Ok(revs);
        }
    }
}

/// The cache's answer to the same watch.
async fn cache_watch_answer(
    cache: &Cache,
    key: &str,
    start: i64,
    until: i64,
) -> Result<Vec<i64>, i64> {
    let mut revs = Vec::new();
    let mut s = cache
        .watch(key, Some(WatchOptions::new().with_start_revision(start)))
        .await
        .unwrap();
    loop {
        let r = tokio::time::timeout(Duration::from_secs(20), s.message())
            .await
            .expect("the cache answered the watch")
            .unwrap()
            .expect("the cache's watch stream ended");
        if r.canceled() {
            assert!(r.compact_revision() > 0, "canceled for compaction: {r:?}");
            return Err(r.compact_revision());
        }
        revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        if revs.last().is_some_and(|&r| r >= until) {
            return Ok(revs);
        }
    }
}

/// etcd compacts behind the cache's back (its watch does not say): reads and watches
/// at the compacted revisions get etcd's answer, the same request sent to both, while
/// the window still holds them. A cache built with `follow_etcd_compaction(false)`
/// answers them from its window (the documented difference).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_watches_below_etcds_compaction_get_etcds_answer() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/app/")).await;
        let window = testkit::ready_cache(client.clone(), |b| {
            b.prefix("/app/").follow_etcd_compaction(false)
        })
        .await;
        let mut revs = Vec::new();
        for i in 0..5 {
            let put = client.put("/app/a", format!("v{i}"), None).await.unwrap();
            revs.push(put.header().unwrap().revision());
        }
        cache.wait_for_revision(revs[4]).await.unwrap();
        window.wait_for_revision(revs[4]).await.unwrap();
        let compact = revs[2];
        client.compact(compact, None).await.unwrap();

        for &rev in &revs {
            let etcd = client
                .get(
                    "/app/a",
                    Some(etcd_client::GetOptions::new().with_revision(rev)),
                )
                .await;
            let cached = cache
                .get("/app/a", Some(GetOptions::new().with_revision(rev)))
                .await;
            match (&etcd, &cached) {
                (Err(e), Err(Error::Compacted { compact_revision })) => {
                    assert!(
                        e.to_string()
                            .contains("required revision has been compacted"),
                        "{e}"
                    );
                    assert_eq!(*compact_revision, compact);
                }
                (Ok(e), Ok(c)) => {
                    let values = |v: Vec<&[u8]>| v.iter().map(|b| b.to_vec()).collect::<Vec<_>>();
                    assert_eq!(
                        values(e.kvs().iter().map(|kv| kv.value()).collect()),
                        values(c.kvs().iter().map(|kv| kv.value()).collect()),
                        "at {rev}"
                    );
                }
                _ => panic!("at {rev}: etcd {etcd:?}, cache {cached:?}"),
            }
            let etcd = etcd_watch_answer(&mut client, "/app/a", rev, revs[4]).await;
            let cached = cache_watch_answer(&cache, "/app/a", rev, revs[4]).await;
            assert_eq!(cached, etcd, "watch from {rev}");
            assert_eq!(etcd.is_err(), rev < compact, "watch from {rev}");
        }
        // Learned: a serializable read below it needs no round trip to be refused.
        let serializable = GetOptions::new().with_revision(revs[0]).with_serializable();
        assert!(matches!(
            cache.get("/app/a", Some(serializable.clone())).await,
            Err(Error::Compacted { compact_revision }) if compact_revision == compact
        ));
        assert_eq!(cache.compacted(revs[1]).await.unwrap(), Some(compact));
        assert_eq!(cache.compacted(compact).await.unwrap(), None);

        // Not following: the window answers, and says what etcd would.
        let old = window
            .get("/app/a", Some(GetOptions::new().with_revision(revs[0])))
            .await
            .unwrap();
        assert_eq!(old.kvs()[0].value(), b"v0");
        assert_eq!(
            cache_watch_answer(&window, "/app/a", revs[0], revs[4]).await,
            Ok(revs.clone())
        );
        assert_eq!(window.compacted(revs[0]).await.unwrap(), Some(compact));
    })
    .await;
}
