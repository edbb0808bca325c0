//! The differences listed in `docs/MIGRATING.md` ("What still differs"), checked against
//! etcd and the cache side by side. Each test names the items it checks.

use std::time::Duration;

use etcd_cache::{Cache, Error, GetOptions, WatchOptions};
use testkit::EtcdOptions;

const LIMIT: Duration = Duration::from_secs(90);

/// The next response of an etcd-client stream; `None` if none comes within 1.5 s.
async fn etcd_next(s: &mut etcd_client::WatchStream) -> Option<etcd_client::WatchResponse> {
    tokio::time::timeout(Duration::from_millis(1500), s.message())
        .await
        .ok()
        .map(|r| r.expect("etcd watch").expect("etcd stream ended"))
}

/// The next item of a cache stream: `Some(None)` when the stream ended, `None` if nothing
/// comes within 1.5 s.
async fn cache_next(s: &mut etcd_cache::WatchStream) -> Option<Option<etcd_cache::WatchResponse>> {
    tokio::time::timeout(Duration::from_millis(1500), s.message())
        .await
        .ok()
        .map(|r| r.expect("cache watch"))
}

async fn put(client: &mut etcd_client::Client, key: &str, value: &str) -> i64 {
    let resp = client.put(key, value, None).await.expect("put");
    resp.header().expect("header").revision()
}

fn etcd_opts() -> etcd_client::WatchOptions {
    etcd_client::WatchOptions::new()
}

/// Items 1, 6, 7, 8, 9, 10, 11 and 14.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_differ_as_documented() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        for i in 0..3 {
            put(&mut client, &format!("/d/k{i}"), "v0").await;
        }
        let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/d/")).await;
        let loaded = cache.revision();

        // 14: right after the load, a watch from the load revision is canceled as
        // compacted, with the window's floor and etcd's text; etcd serves it.
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(loaded);
        let mut s = cache.watch("/d/", Some(opts)).await.unwrap();
        assert!(cache_next(&mut s).await.unwrap().unwrap().created());
        let r = cache_next(&mut s).await.unwrap().unwrap();
        assert!(r.canceled() && r.compact_revision() > 0, "{r:?}");
        assert_eq!(r.compact_revision(), cache.history_span().0);
        assert_eq!(r.compact_revision(), loaded + 1);
        assert_eq!(
            r.cancel_reason(),
            "mvcc: required revision has been compacted"
        );
        assert_eq!(
            r.header().unwrap().revision(),
            cache.revision(),
            "10: canceled header"
        );
        assert!(
            cache_next(&mut s).await.unwrap().is_none(),
            "8: the stream ends"
        );
        let mut e = client
            .watch(
                "/d/",
                Some(etcd_opts().with_prefix().with_start_revision(loaded)),
            )
            .await
            .unwrap();
        assert!(etcd_next(&mut e).await.unwrap().created());
        assert_eq!(etcd_next(&mut e).await.unwrap().events().len(), 1);

        // 14: etcd's own compaction signal: an empty reason and header revision 0 (3.4).
        let r1 = put(&mut client, "/d/k0", "v1").await;
        let r2 = put(&mut client, "/d/k1", "v1").await;
        client.compact(r2, None).await.unwrap();
        let mut e = client
            .watch(
                "/d/",
                Some(etcd_opts().with_prefix().with_start_revision(r1)),
            )
            .await
            .unwrap();
        assert!(etcd_next(&mut e).await.unwrap().created());
        let c = etcd_next(&mut e).await.unwrap();
        assert!(c.canceled() && c.compact_revision() == r2, "{c:?}");
        println!(
            "etcd's compaction cancel: reason {:?}, header revision {:?}",
            c.cancel_reason(),
            c.header().map(|h| h.revision())
        );
        assert_eq!(c.cancel_reason(), "");

        // 9, 10: a replay of two revisions: one response from etcd, two from the cache,
        // whose headers carry the stream's revision (revisions after etcd's compaction:
        // below it the cache cancels as etcd does).
        let q1 = put(&mut client, "/d/k0", "v2").await;
        let q2 = put(&mut client, "/d/k1", "v2").await;
        cache.wait_for_revision(q2).await.unwrap();
        let opts = WatchOptions::new().with_prefix().with_start_revision(q1);
        let mut s = cache.watch("/d/", Some(opts)).await.unwrap();
        let created = cache_next(&mut s).await.unwrap().unwrap();
        assert!(created.created());
        assert_eq!(created.revision(), q2);
        for want in [q1, q2] {
            let r = cache_next(&mut s).await.unwrap().unwrap();
            assert_eq!(r.events().len(), 1);
            assert_eq!(r.events()[0].kv().unwrap().mod_revision(), want);
            assert_eq!(r.header().unwrap().revision(), q2, "the stream's revision");
            assert!(!r.fragment());
        }
        let r3 = put(&mut client, "/d/k2", "v1").await;
        let r4 = put(&mut client, "/d/k2", "v2").await;
        let mut e = client
            .watch(
                "/d/",
                Some(etcd_opts().with_prefix().with_start_revision(r3)),
            )
            .await
            .unwrap();
        assert!(etcd_next(&mut e).await.unwrap().created());
        let both = etcd_next(&mut e).await.unwrap();
        let revisions: Vec<i64> = both
            .events()
            .iter()
            .map(|ev| ev.kv().unwrap().mod_revision())
            .collect();
        assert_eq!(
            revisions,
            [r3, r4],
            "etcd packs the replay into one response"
        );

        // 1, 6: refused at the call by the cache; answered by etcd.
        let refused = [
            ("out of prefix", "/elsewhere", WatchOptions::new()),
            ("empty key", "", WatchOptions::new()),
            (
                "end before key",
                "/d/k2",
                WatchOptions::new().with_range("/d/k1"),
            ),
            (
                "negative start",
                "/d/k1",
                WatchOptions::new().with_start_revision(-5),
            ),
            (
                "negative id",
                "/d/k1",
                WatchOptions::new().with_watch_id(-2),
            ),
        ];
        for (what, key, opts) in refused {
            match cache.watch(key, Some(opts)).await {
                Err(Error::InvalidRange { .. } | Error::OutOfRange { .. }) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
        let mut e = client.watch("", None).await.unwrap();
        let r = etcd_next(&mut e).await.unwrap();
        assert!(
            r.created() && !r.canceled(),
            "etcd watches the empty key: {r:?}"
        );
        let mut e = client
            .watch("/d/k2", Some(etcd_opts().with_range("/d/k1")))
            .await
            .unwrap();
        let r = etcd_next(&mut e).await.unwrap();
        assert!(r.created() && r.canceled() && r.watch_id() == -1, "{r:?}");
        assert_eq!(r.cancel_reason(), "mvcc: watcher range is empty");
        let mut e = client
            .watch("/d/k1", Some(etcd_opts().with_start_revision(-5)))
            .await
            .unwrap();
        // etcd takes it as compacted: 3.4 creates the watch, then cancels it with its
        // compaction revision (-1 before the first compaction); later versions refuse it
        // at creation (watch id -1, compact_revision 0, etcd's reason).
        let r = etcd_next(&mut e).await.unwrap();
        assert!(r.created(), "{r:?}");
        if r.canceled() {
            assert_eq!(r.watch_id(), -1, "{r:?}");
            assert_eq!(
                r.cancel_reason(),
                "etcdserver: mvcc: required revision has been compacted"
            );
        } else {
            let r = etcd_next(&mut e).await.unwrap();
            assert!(r.canceled() && r.compact_revision() == r2, "{r:?}");
        }

        // 6: a duplicate watch id.
        let mut s = cache
            .watch("/d/k1", Some(WatchOptions::new().with_watch_id(7)))
            .await
            .unwrap();
        let dup = s
            .watch("/d/k2", Some(WatchOptions::new().with_watch_id(7)))
            .await;
        assert!(
            matches!(dup, Err(Error::WatchIdInUse { watch_id: 7 })),
            "{dup:?}"
        );
        let mut e = client
            .watch("/d/k1", Some(etcd_opts().with_watch_id(7)))
            .await
            .unwrap();
        e.watch("/d/k2", Some(etcd_opts().with_watch_id(7)))
            .await
            .unwrap();
        assert_eq!(etcd_next(&mut e).await.unwrap().watch_id(), 7);
        let r = etcd_next(&mut e).await.unwrap();
        assert!(r.created() && r.canceled() && r.watch_id() == -1, "{r:?}");
        assert_eq!(
            r.cancel_reason(),
            "mvcc: duplicate watch ID provided on the WatchStream"
        );

        // 7, 8, 11: ids, the end of the stream, progress.
        cache.wait_for_revision(r4).await.unwrap();
        let mut s = cache.watch("/d/k1", None).await.unwrap();
        s.watch("/d/k2", None).await.unwrap();
        let mut e = client.watch("/d/k1", None).await.unwrap();
        e.watch("/d/k2", None).await.unwrap();
        for _ in 0..2 {
            assert!(cache_next(&mut s).await.unwrap().unwrap().created());
            assert!(etcd_next(&mut e).await.unwrap().created());
        }
        s.request_progress().await.unwrap();
        e.request_progress().await.unwrap();
        let (p, q) = (
            cache_next(&mut s).await.unwrap().unwrap(),
            etcd_next(&mut e).await.unwrap(),
        );
        assert!(p.is_progress_notify() && p.watch_id() == -1, "{p:?}");
        assert_eq!(q.watch_id(), -1, "{q:?}");
        assert_eq!(p.revision(), q.header().unwrap().revision());
        s.cancel(1).await.unwrap();
        e.cancel(1).await.unwrap();
        assert!(cache_next(&mut s).await.unwrap().unwrap().canceled());
        assert!(etcd_next(&mut e).await.unwrap().canceled());
        s.watch("/d/k0", None).await.unwrap();
        e.watch("/d/k0", None).await.unwrap();
        let (c, d) = (
            cache_next(&mut s).await.unwrap().unwrap(),
            etcd_next(&mut e).await.unwrap(),
        );
        assert_eq!((c.watch_id(), d.watch_id()), (2, 2), "neither reuses id 1");
        for id in [0, 2] {
            s.cancel(id).await.unwrap();
            assert!(cache_next(&mut s).await.unwrap().unwrap().canceled());
        }
        for id in [0, 2] {
            e.cancel(id).await.unwrap();
            assert!(etcd_next(&mut e).await.unwrap().canceled());
        }
        assert!(
            cache_next(&mut s).await.unwrap().is_none(),
            "the cache's stream ends"
        );
        assert!(etcd_next(&mut e).await.is_none(), "etcd's stays open");
        cache.close().await;
    })
    .await;
}

/// Items 16, 17 and 18.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_differ_as_documented() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        for i in 0..3 {
            put(&mut client, &format!("/r/k{i}"), "v0").await;
        }
        let cache =
            testkit::ready_cache(client.clone(), |b| b.prefix("/r/").history_window(3)).await;
        let mut last = 0;
        for i in 0..5 {
            last = put(&mut client, &format!("/r/k{}", i % 3), &format!("v{i}")).await;
        }
        cache.wait_for_revision(last).await.unwrap();
        let floor = cache.history_span().0;

        // 16: revision() is the one asked for; the header the newest, as etcd's.
        let at = last - 1;
        let c = cache
            .get("/r/k0", Some(GetOptions::new().with_revision(at)))
            .await
            .unwrap();
        let e = client
            .get(
                "/r/k0",
                Some(etcd_client::GetOptions::new().with_revision(at)),
            )
            .await
            .unwrap();
        assert_eq!(c.revision(), at);
        assert_eq!(c.header().unwrap().revision(), last);
        assert_eq!(e.header().unwrap().revision(), last);

        // 17: the window, from floor - 1; Compacted names the floor; future revisions.
        let ok = cache
            .get("/r/k0", Some(GetOptions::new().with_revision(floor - 1)))
            .await;
        assert_eq!(ok.unwrap().revision(), floor - 1);
        let old = cache
            .get("/r/k0", Some(GetOptions::new().with_revision(floor - 2)))
            .await;
        assert!(
            matches!(old, Err(Error::Compacted { compact_revision }) if compact_revision == floor),
            "{old:?}"
        );
        let future = cache
            .get("/r/k0", Some(GetOptions::new().with_revision(last + 100)))
            .await;
        assert!(
            matches!(future, Err(Error::FutureRevision { .. })),
            "{future:?}"
        );
        let e = client
            .get(
                "/r/k0",
                Some(etcd_client::GetOptions::new().with_revision(last + 100)),
            )
            .await;
        assert!(format!("{e:?}").contains("future revision"), "{e:?}");

        // 18: what etcd accepts and the cache refuses.
        let e = |o: etcd_client::GetOptions| Some(o);
        let negative_rev = client
            .get("/r/k0", e(etcd_client::GetOptions::new().with_revision(-3)))
            .await
            .unwrap();
        assert_eq!(negative_rev.kvs().len(), 1, "etcd reads the latest");
        let negative_limit = client
            .get(
                "/r/",
                e(etcd_client::GetOptions::new().with_prefix().with_limit(-1)),
            )
            .await
            .unwrap();
        assert_eq!(negative_limit.kvs().len(), 3, "etcd: no limit");
        let backwards = client
            .get(
                "/r/k2",
                e(etcd_client::GetOptions::new().with_range("/r/k1")),
            )
            .await
            .unwrap();
        assert!(backwards.kvs().is_empty(), "etcd: an empty answer");
        assert!(client.get("/elsewhere", None).await.is_ok());
        assert!(
            client.get("", None).await.is_err(),
            "etcd refuses the empty key"
        );
        let refused = [
            (
                "negative revision",
                "/r/k0",
                GetOptions::new().with_revision(-3),
            ),
            (
                "negative limit",
                "/r/",
                GetOptions::new().with_prefix().with_limit(-1),
            ),
            (
                "end before key",
                "/r/k2",
                GetOptions::new().with_range("/r/k1"),
            ),
            ("empty key", "", GetOptions::new()),
        ];
        for (what, key, opts) in refused {
            let got = cache.get(key, Some(opts)).await;
            assert!(
                matches!(got, Err(Error::InvalidRange { .. })),
                "{what}: {got:?}"
            );
        }
        let got = cache.get("/elsewhere", None).await;
        assert!(matches!(got, Err(Error::OutOfRange { .. })), "{got:?}");
        cache.close().await;
    })
    .await;
}

/// Item 3: before the first load, a watch fails at once with `NotReady`, a serializable
/// read after `consistent_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_before_the_first_load() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (etcd, _client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let proxy = testkit::TcpProxy::start(etcd.endpoint()).await;
        let client = testkit::client(&[proxy.endpoint()]).await;
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        let cache = Cache::builder(client)
            .consistent_read_timeout(Duration::from_millis(300))
            .build()
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let watch = cache.watch("/a", None).await;
        assert!(matches!(watch, Err(Error::NotReady)), "{watch:?}");
        assert!(started.elapsed() < Duration::from_millis(250), "at once");
        let read = cache
            .get("/a", Some(GetOptions::new().with_serializable()))
            .await;
        assert!(matches!(read, Err(Error::NotReady)), "{read:?}");
        cache.close().await;
    })
    .await;
}

/// Items 19, 21 and 22 (no etcd needed).
#[test]
fn types_convert_as_documented() {
    // 19: the same types.
    let _: etcd_client::EventType = etcd_cache::EventType::Put;
    let _: etcd_client::WatchFilterType = etcd_cache::WatchFilterType::NoDelete;
    let _: etcd_client::SortOrder = etcd_cache::SortOrder::Descend;
    let _: etcd_client::SortTarget = etcd_cache::SortTarget::Mod;
    fn same_header(h: etcd_cache::ResponseHeader) -> etcd_client::ResponseHeader {
        h
    }
    let _ = same_header;

    // 21: conversions both ways.
    let kv = etcd_cache::KeyValue::new("/k", "v", 2, 5, 3, 0);
    let theirs = etcd_client::KeyValue::from(&kv);
    assert_eq!((theirs.key(), theirs.value()), (kv.key(), kv.value()));
    assert_eq!(theirs.mod_revision(), 5);
    let back = etcd_cache::KeyValue::from(theirs);
    assert_eq!(back, kv);
    let ev = etcd_cache::Event::new(etcd_cache::EventType::Put, kv.clone(), None);
    let theirs = etcd_client::Event::from(&ev);
    assert_eq!(theirs.kv().unwrap().key(), b"/k");
    assert_eq!(etcd_cache::Event::try_from(theirs).unwrap(), ev);
    assert_eq!(ev.kv().unwrap().key_bytes().as_ref(), b"/k");

    // 22: safe, and the longest valid prefix of invalid UTF-8.
    let bad = etcd_cache::KeyValue::new(&b"ok\xffno"[..], "", 1, 1, 1, 0);
    assert_eq!(bad.key_str_unchecked(), "ok");
    assert!(matches!(bad.key_str(), Err(Error::Utf8(_))));
}
