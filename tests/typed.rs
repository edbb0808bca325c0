//! Typed views against a real etcd: a value is decoded once whatever the number of
//! readers and watchers, every holder gets the same `Arc`; bad values are reported per
//! key; index lookups match a scan; the list-watch stream's state equals etcd's at every
//! `InitDone` and after every change, through a slow consumer, a compaction while
//! disconnected and an etcd kill -9.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_cache::{
    decode_with, Cache, Codec, Error, JsonCodec, KeyValue, ListItem, ListWatch, ListWatchEvent,
    ProstCodec, TypedKv, TypedView, TypedWatchStream, WatchOptions,
};
use etcd_client::{Client, GetOptions as EtcdGet};
use testkit::{EtcdOptions, TcpProxy};

const LIMIT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, PartialEq, serde::Deserialize)]
struct Service {
    owner: String,
    port: u16,
}

fn service(owner: &str, port: u16) -> String {
    format!(r#"{{"owner":"{owner}","port":{port}}}"#)
}

/// A JSON codec of `Service` that counts its calls.
fn counting_codec(calls: Arc<AtomicU64>) -> impl Codec<Value = Service> {
    decode_with(move |kv: &KeyValue| {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(serde_json::from_slice::<Service>(kv.value())?)
    })
}

/// A JSON view of `Service` that counts its codec's calls, with an index by owner.
fn counting_view(cache: &Cache, calls: Arc<AtomicU64>) -> TypedView<Service> {
    cache
        .typed(counting_codec(calls))
        .index("owner", |s: &Service| vec![s.owner.clone()])
        .build()
        .unwrap()
}

/// The next typed response with events.
async fn next_events(s: &mut TypedWatchStream<Service>) -> etcd_cache::TypedWatchResponse<Service> {
    loop {
        let r = tokio::time::timeout(WAIT, s.message())
            .await
            .expect("no response within 20 s")
            .expect("stream error")
            .expect("stream ended");
        if !r.events().is_empty() {
            return r;
        }
    }
}

async fn next_item<I: ListItem>(lw: &mut ListWatch<I>) -> ListWatchEvent<I> {
    loop {
        match tokio::time::timeout(WAIT, lw.next())
            .await
            .expect("no list-watch event within 20 s")
        {
            Some(Ok(event)) => return event,
            Some(Err(e)) => eprintln!("list-watch: transient error {e}"),
            None => panic!("list-watch ended"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_is_decoded_once_for_every_watcher_read_and_index() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        for i in 0..20 {
            client
                .put(format!("/app/s{i:02}"), service("a", i), None)
                .await
                .unwrap();
        }
        let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/app/")).await;
        let calls = Arc::new(AtomicU64::new(0));
        let view = counting_view(&cache, calls.clone());
        // 40 watchers, half with previous values, and a list-watch.
        let mut watchers = Vec::new();
        for i in 0..40 {
            let mut opts = WatchOptions::new().with_prefix();
            if i % 2 == 0 {
                opts = opts.with_prev_key();
            }
            watchers.push(view.watch("/app/", Some(opts)).await.unwrap());
        }
        let mut lw = view.list_watch();
        let mut initial = 0;
        loop {
            match next_item(&mut lw).await {
                ListWatchEvent::InitApply(_) => initial += 1,
                ListWatchEvent::InitDone { .. } => break,
                _ => {}
            }
        }
        assert_eq!(initial, 20);
        // 30 puts (10 new keys, 20 changes) and 5 deletes, one per revision.
        let mut puts = 0;
        let mut last = 0;
        for i in 0..30u16 {
            let key = format!("/app/s{:02}", i % 20 + if i < 10 { 20 } else { 0 });
            last = client
                .put(key, service("b", 1000 + i), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            puts += 1;
        }
        for i in 0..5 {
            last = client
                .delete(format!("/app/s{i:02}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
        }
        // Every watcher gets every event; the objects of a revision are one Arc.
        let mut seen: BTreeMap<i64, Arc<Service>> = BTreeMap::new();
        let mut prevs: BTreeMap<i64, Arc<Service>> = BTreeMap::new();
        for (i, w) in watchers.iter_mut().enumerate() {
            let mut at = 0;
            while at < last {
                let r = next_events(w).await;
                for ev in r.events() {
                    at = ev.kv().mod_revision();
                    if let Some(obj) = ev.object() {
                        let first = seen.entry(at).or_insert_with(|| obj.clone());
                        assert!(Arc::ptr_eq(first, obj), "watcher {i}: another Arc at {at}");
                    }
                    if let Some(prev) = ev.prev() {
                        assert_eq!(i % 2, 0, "previous values only where asked");
                        let obj = prev.object().unwrap();
                        let first = prevs.entry(at).or_insert_with(|| obj.clone());
                        assert!(Arc::ptr_eq(first, obj));
                    }
                }
            }
        }
        assert_eq!(seen.len(), puts);
        // The list-watch and reads share them too; so do the previous values, which
        // are the objects of earlier revisions.
        for _ in 0..35 {
            match next_item(&mut lw).await {
                ListWatchEvent::Apply(o) => {
                    assert!(Arc::ptr_eq(o.object().unwrap(), &seen[&o.mod_revision()]));
                }
                ListWatchEvent::Delete { last, .. } => assert!(last.is_some()),
                other => panic!("unexpected {other:?}"),
            }
        }
        let listed = view.list().await.unwrap();
        assert_eq!(listed.revision(), last);
        for item in listed.items() {
            if let Some(obj) = seen.get(&item.mod_revision()) {
                assert!(Arc::ptr_eq(obj, item.object().unwrap()));
            }
        }
        let got = view.get("/app/s15").await.unwrap().unwrap();
        assert!(Arc::ptr_eq(
            got.object().unwrap(),
            &seen[&got.mod_revision()]
        ));
        let by = view.by_index("owner", "b").await.unwrap();
        assert_eq!(by.revision(), last);
        for item in by.items() {
            assert!(Arc::ptr_eq(
                item.object().unwrap(),
                &seen[&item.mod_revision()]
            ));
        }
        // One decode per value: the 20 listed, then one per put, whatever the number of
        // watchers (40 + a list-watch + the index), reads and previous values.
        assert_eq!(calls.load(Ordering::SeqCst), 20 + puts as u64);
        assert_eq!(view.decodes(), (20 + puts as u64, 0));
        cache.close().await;
    })
    .await;
}

#[derive(Clone, PartialEq, prost::Message)]
struct Lease {
    #[prost(int64, tag = "1")]
    ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_are_reported_per_key_and_the_next_good_value_recovers() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/")).await;
        let json = cache
            .typed(JsonCodec::<Service>::new())
            .prefix("/j/")
            .build()
            .unwrap();
        let pb = cache
            .typed(ProstCodec::<Lease>::new())
            .prefix("/p/")
            .build()
            .unwrap();
        let mut jw = json
            .watch("/j/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let mut lw = json.list_watch();
        assert!(matches!(
            next_item(&mut lw).await,
            ListWatchEvent::Init { restarted: false }
        ));
        assert!(matches!(
            next_item(&mut lw).await,
            ListWatchEvent::InitDone { .. }
        ));

        client.put("/j/good", service("a", 1), None).await.unwrap();
        let bad = client
            .put("/j/bad", "{not json", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        client.put("/j/empty", "", None).await.unwrap();
        client.put("/j/after", service("a", 2), None).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 4 {
            for ev in next_events(&mut jw).await.events() {
                got.push((
                    ev.kv().key_str().unwrap().to_owned(),
                    ev.value().unwrap().map(|s| s.port).map_err(|e| e.clone()),
                ));
            }
        }
        assert_eq!(got[0], ("/j/good".to_owned(), Ok(1)));
        let e = got[1].1.clone().unwrap_err();
        assert_eq!((e.key(), e.mod_revision()), (&b"/j/bad"[..], bad));
        assert!(
            e.to_string().contains("/j/bad") && e.to_string().contains(&bad.to_string()),
            "{e}"
        );
        assert!(got[2].1.is_err(), "an empty value is not a JSON object");
        assert_eq!(
            got[3],
            ("/j/after".to_owned(), Ok(2)),
            "the other keys keep flowing"
        );
        // The list-watch hands the errors out per key too, and goes on.
        let mut applied = Vec::new();
        while applied.len() < 4 {
            if let ListWatchEvent::Apply(o) = next_item(&mut lw).await {
                applied.push(o.value().is_ok());
            }
        }
        assert_eq!(applied, [true, false, false, true]);
        // A read reports it as well; the next good value recovers the key.
        assert!(json.get("/j/bad").await.unwrap().unwrap().value().is_err());
        client.put("/j/bad", service("c", 3), None).await.unwrap();
        let r = next_events(&mut jw).await;
        assert_eq!(r.events()[0].object().unwrap().port, 3);
        assert_eq!(
            json.get("/j/bad")
                .await
                .unwrap()
                .unwrap()
                .object()
                .unwrap()
                .owner,
            "c"
        );
        assert_eq!(json.decodes(), (5, 2));

        // Protobuf: a message of another type (a string where an int64 is) and an
        // empty value are refused; a good one decodes.
        client
            .put(
                "/p/ok",
                prost::Message::encode_to_vec(&Lease { ttl: 30 }),
                None,
            )
            .await
            .unwrap();
        client
            .put(
                "/p/other",
                prost::Message::encode_to_vec(&Named { name: "x".into() }),
                None,
            )
            .await
            .unwrap();
        client.put("/p/empty", "", None).await.unwrap();
        let all = pb.list().await.unwrap();
        let by_key: BTreeMap<_, _> = all
            .items()
            .iter()
            .map(|o| (o.kv().key_str().unwrap().to_owned(), o.clone()))
            .collect();
        assert_eq!(by_key["/p/ok"].object().unwrap().ttl, 30);
        assert!(
            by_key["/p/other"].value().is_err(),
            "another message type is refused"
        );
        assert!(by_key["/p/empty"]
            .value()
            .unwrap_err()
            .message()
            .contains("empty"));
        // A key outside the view is refused with the view's range.
        let err = json.get("/p/ok").await.unwrap_err();
        assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
        assert!(cache
            .typed(JsonCodec::<Service>::new())
            .prefix("/")
            .index("x", |_| vec![])
            .index("x", |_| vec![])
            .build()
            .is_err());
        cache.close().await;
    })
    .await;
}

/// The keys `view.by_index("owner", owner)` should give, from a scan of a list.
fn scan(list: &[TypedKv<Service>], owner: &str) -> Vec<Vec<u8>> {
    list.iter()
        .filter(|o| o.object().is_some_and(|s| s.owner == owner))
        .map(|o| o.key().to_vec())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_lookups_match_a_scan_at_one_revision() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/app/")).await;
        let view = counting_view(&cache, Arc::new(AtomicU64::new(0)));
        let owners = ["a", "b", "c", "d"];
        let mut x: u64 = 7;
        for round in 0..6 {
            for _ in 0..25 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("/app/k{:02}", (x >> 33) % 40);
                match (x >> 20) % 10 {
                    0 => {
                        client.delete(key, None).await.unwrap();
                    }
                    1 => {
                        client.put(key, "not json", None).await.unwrap();
                    }
                    n => {
                        let owner = owners[(n as usize) % owners.len()];
                        client
                            .put(key, service(owner, n as u16), None)
                            .await
                            .unwrap();
                    }
                }
            }
            // Right after the writes (no waiting): a lookup is consistent, so it sees
            // them; it and a list at the same revision agree.
            for owner in owners {
                let by = view.by_index("owner", owner).await.unwrap();
                let list = view.list().await.unwrap();
                assert_eq!(
                    by.revision(),
                    list.revision(),
                    "round {round}: nothing written in between"
                );
                let got: Vec<Vec<u8>> = by.items().iter().map(|o| o.key().to_vec()).collect();
                assert_eq!(
                    got,
                    scan(list.items(), owner),
                    "round {round}, owner {owner}"
                );
            }
        }
        // A write is visible to the next lookup (the lookup waits for it).
        let rev = client
            .put("/app/new", service("z", 1), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let by = view.by_index("owner", "z").await.unwrap();
        assert!(by.revision() >= rev);
        assert_eq!(by.items().len(), 1);
        // A write outside the view moves the cluster's revision only: the lookup still
        // reaches it (the index task asks for a progress answer).
        let outside = client
            .put("/zzz", "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let by = view.by_index("owner", "z").await.unwrap();
        assert!(by.revision() >= outside, "{} < {outside}", by.revision());
        let err = view.by_index("nope", "z").await.unwrap_err();
        assert!(
            matches!(err, Error::UnknownIndex { .. }) && err.to_string().contains("owner"),
            "{err}"
        );
        cache.close().await;
    })
    .await;
}

fn key_of(item: &impl ListItem) -> Vec<u8> {
    item.key_value().key().to_vec()
}

fn value_of(item: &impl ListItem) -> Vec<u8> {
    item.key_value().value().to_vec()
}

/// Applies list-watch events to a state (the consumer's side), checking each complete
/// state against etcd at its revision. Returns when the state is at `until`.
struct Consumer {
    state: BTreeMap<Vec<u8>, Vec<u8>>,
    next: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
    revision: i64,
    restarts: usize,
    checked: usize,
}

impl Consumer {
    fn new() -> Self {
        Consumer {
            state: BTreeMap::new(),
            next: None,
            revision: 0,
            restarts: 0,
            checked: 0,
        }
    }

    async fn etcd_at(client: &mut Client, revision: i64) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let resp = client
            .get(
                "/app/",
                Some(EtcdGet::new().with_prefix().with_revision(revision)),
            )
            .await
            .unwrap();
        resp.kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect()
    }

    /// Consumes until the state is at `until` or later, checking after every change.
    async fn run<I: ListItem>(&mut self, lw: &mut ListWatch<I>, client: &mut Client, until: i64) {
        while self.revision < until || self.next.is_some() {
            let event = next_item(lw).await;
            match event {
                ListWatchEvent::Init { restarted } => {
                    assert_eq!(restarted, self.revision > 0);
                    if restarted {
                        self.restarts += 1;
                    }
                    self.next = Some(BTreeMap::new());
                }
                ListWatchEvent::InitApply(o) => {
                    self.next.as_mut().unwrap().insert(key_of(&o), value_of(&o));
                }
                ListWatchEvent::InitDone { revision } => {
                    assert!(revision >= self.revision, "a state never goes back");
                    self.state = self.next.take().unwrap();
                    self.revision = revision;
                    assert_eq!(
                        self.state,
                        Self::etcd_at(client, revision).await,
                        "state at InitDone {revision}"
                    );
                    self.checked += 1;
                }
                ListWatchEvent::Apply(o) => {
                    let revision = o.key_value().mod_revision();
                    assert!(revision > self.revision, "no change twice");
                    self.revision = revision;
                    self.state.insert(key_of(&o), value_of(&o));
                    assert_eq!(
                        self.state,
                        Self::etcd_at(client, self.revision).await,
                        "state after a put at {}",
                        self.revision
                    );
                    self.checked += 1;
                }
                ListWatchEvent::Delete { key, revision, .. } => {
                    assert!(revision > self.revision, "no change twice");
                    self.revision = revision;
                    self.state.remove(&key[..]);
                    assert_eq!(
                        self.state,
                        Self::etcd_at(client, revision).await,
                        "state after a delete at {revision}"
                    );
                    self.checked += 1;
                }
            }
        }
    }
}

/// A re-list after a compaction gap keeps the key-values that did not change, and their
/// decoded objects with them: only the changed value is decoded again (also when etcd
/// answers the read, as it does while the cache cannot prove it is current: the cache's
/// copies of unchanged versions replace etcd's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_after_a_compaction_gap_decodes_only_what_changed() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(90), async {
        let (etcd, mut direct) = testkit::etcd_with_client(EtcdOptions::default()).await;
        for i in 0..20 {
            let value = service(&format!("team-{i}"), 8000 + i);
            direct
                .put(format!("/app/k{i:02}"), value, None)
                .await
                .unwrap();
        }
        let proxy = TcpProxy::start(etcd.client_addr()).await;
        let via_proxy = testkit::client(&[proxy.endpoint()]).await;
        let cache = testkit::ready_cache(via_proxy, |b| {
            b.prefix("/app/")
                .backoff(Duration::from_millis(20), Duration::from_millis(200))
        })
        .await;
        let calls = Arc::new(AtomicU64::new(0));
        // No index: nothing reads in the background, so every decode is counted here.
        let view = cache.typed(counting_codec(calls.clone())).build().unwrap();
        assert_eq!(view.list().await.unwrap().items().len(), 20);
        assert_eq!(calls.load(Ordering::SeqCst), 20);
        let lists = cache.stats().lists;

        // Cut off; one value changes; etcd compacts past it; the cache re-lists.
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        direct
            .put("/app/k00", service("team-new", 9000), None)
            .await
            .unwrap();
        let put = direct.put("/other/x", "x", None).await.unwrap();
        let last = put.header().unwrap().revision();
        direct.compact(last, None).await.unwrap();
        proxy.set_refuse(false);
        cache.wait_for_revision(last).await.unwrap();
        assert!(cache.stats().lists > lists, "re-listed");

        let listed = view.list().await.unwrap();
        assert_eq!(listed.items().len(), 20);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            21,
            "only the changed value is decoded again"
        );
        let k00 = view.get("/app/k00").await.unwrap().unwrap();
        assert_eq!(k00.object().unwrap().port, 9000);
        cache.close().await;
    })
    .await;
}

/// A list-watch of a part of a view (`list_watch_prefix`), and of the cache's key-values:
/// each lists and follows only its own prefix; a prefix outside is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_watch_of_a_sub_prefix_sees_only_its_keys() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        for key in ["/app/a/1", "/app/a/2", "/app/b/1"] {
            client.put(key, service("o", 1), None).await.unwrap();
        }
        let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/app/")).await;
        let view = cache.typed(JsonCodec::<Service>::new()).build().unwrap();
        let refused = view.list_watch_prefix("/other/").unwrap_err();
        assert!(matches!(refused, Error::OutOfRange { .. }), "{refused}");
        let mut typed = view.list_watch_prefix("/app/a/").unwrap();
        let mut raw = cache.list_watch("/app/b/").unwrap();

        async fn initial<I: ListItem>(lw: &mut ListWatch<I>) -> Vec<Vec<u8>> {
            let mut keys = Vec::new();
            loop {
                match next_item(lw).await {
                    ListWatchEvent::InitApply(o) => keys.push(key_of(&o)),
                    ListWatchEvent::InitDone { .. } => return keys,
                    ListWatchEvent::Init { .. } => {}
                    other => panic!("before InitDone: {other:?}"),
                }
            }
        }
        assert_eq!(
            initial(&mut typed).await,
            vec![b"/app/a/1".to_vec(), b"/app/a/2".to_vec()]
        );
        assert_eq!(initial(&mut raw).await, vec![b"/app/b/1".to_vec()]);

        // Writes to both parts, alternating: each stream gets its own, in order.
        for i in 2..6u16 {
            client.put("/app/b/x", service("o", i), None).await.unwrap();
            client
                .put(format!("/app/a/{i}"), service("o", i), None)
                .await
                .unwrap();
        }
        for i in 2..6u16 {
            match next_item(&mut typed).await {
                ListWatchEvent::Apply(o) => {
                    assert_eq!(o.key(), format!("/app/a/{i}").as_bytes());
                    assert_eq!(o.object().unwrap().port, i);
                }
                other => panic!("expected a put of /app/a/{i}: {other:?}"),
            }
            match next_item(&mut raw).await {
                ListWatchEvent::Apply(kv) => {
                    assert_eq!(kv.key(), b"/app/b/x");
                    assert_eq!(kv.value(), service("o", i).as_bytes());
                }
                other => panic!("expected a put of /app/b/x: {other:?}"),
            }
        }
        cache.close().await;
    })
    .await;
}

/// Single-key writes (one event per revision, so that every change is a state etcd had).
async fn write(client: &mut Client, from: u64, n: u64) -> i64 {
    let mut last = 0;
    for i in from..from + n {
        let key = format!("/app/k{:02}", i % 17);
        last = if i % 7 == 3 {
            client
                .delete(key, None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision()
        } else {
            client
                .put(key, service("o", i as u16), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision()
        };
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_equals_etcd_through_a_slow_consumer_a_compaction_and_a_kill() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(180), async {
        let (mut etcd, mut direct) = testkit::etcd_with_client(EtcdOptions::default()).await;
        write(&mut direct, 0, 30).await;
        let proxy = TcpProxy::start(etcd.client_addr()).await;
        let via_proxy = testkit::client(&[proxy.endpoint()]).await;
        let cache = testkit::ready_cache(via_proxy, |b| {
            b.prefix("/app/")
                .history_window(16)
                .subscriber_buffer(4)
                .backoff(Duration::from_millis(20), Duration::from_millis(200))
        })
        .await;
        let view = cache.typed(JsonCodec::<Service>::new()).build().unwrap();
        // The typed view's objects and the cache's key-values, through the same faults.
        let mut lw = view.list_watch();
        let mut consumer = Consumer::new();
        let mut kv_lw = cache.list_watch("/app/").unwrap();
        // A prefix the cache does not hold could never be listed: refused at once.
        let refused = cache.list_watch("/other/").unwrap_err();
        assert!(matches!(refused, Error::OutOfRange { .. }), "{refused}");
        let mut kv_consumer = Consumer::new();
        let head = direct
            .get("/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        consumer.run(&mut lw, &mut direct, head).await;
        kv_consumer.run(&mut kv_lw, &mut direct, head).await;
        assert_eq!((consumer.restarts, kv_consumer.restarts), (0, 0));

        // Changes followed one by one.
        let last = write(&mut direct, 30, 20).await;
        consumer.run(&mut lw, &mut direct, last).await;
        kv_consumer.run(&mut kv_lw, &mut direct, last).await;
        assert_eq!((consumer.restarts, kv_consumer.restarts), (0, 0));

        // A slow consumer: 100 revisions while it reads nothing, over a window of 16.
        let last = write(&mut direct, 50, 100).await;
        cache.wait_for_revision(last).await.unwrap();
        consumer.run(&mut lw, &mut direct, last).await;
        kv_consumer.run(&mut kv_lw, &mut direct, last).await;
        assert!(
            consumer.restarts >= 1 && kv_consumer.restarts >= 1,
            "fell out of the window: a new state, not a gap"
        );

        // A compaction while the cache is cut off from etcd.
        let before = (consumer.restarts, kv_consumer.restarts);
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        let last = write(&mut direct, 150, 10).await;
        direct.compact(last, None).await.unwrap();
        proxy.set_refuse(false);
        consumer.run(&mut lw, &mut direct, last).await;
        kv_consumer.run(&mut kv_lw, &mut direct, last).await;
        assert!(
            consumer.restarts > before.0 && kv_consumer.restarts > before.1,
            "the compacted gap gives a new state"
        );

        // etcd killed (-9) and restarted: the state follows on (the cache resumes its
        // watch; a new state only if it had to re-list).
        let etcd = testkit::blocking(move || {
            etcd.kill();
            etcd.restart();
            etcd
        })
        .await;
        let mut direct = testkit::client(&[etcd.endpoint()]).await;
        let last = write(&mut direct, 160, 20).await;
        consumer.run(&mut lw, &mut direct, last).await;
        kv_consumer.run(&mut kv_lw, &mut direct, last).await;
        for (name, c) in [("typed", &consumer), ("key-value", &kv_consumer)] {
            assert!(c.checked >= 40, "{name}: {} states checked", c.checked);
            eprintln!(
                "{name} list-watch: {} states checked against etcd, {} restarts",
                c.checked, c.restarts
            );
        }
        cache.close().await;
    })
    .await;
}
