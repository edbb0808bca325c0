//! Rust's etcd-client through etcd-cache-proxy against the same calls to etcd directly.

mod support;

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, GetResponse, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use support::{client, start_etcd, start_proxy, EtcdOptions};

const WAIT: Duration = Duration::from_secs(10);

type Kv = (String, String, i64, i64, i64, i64);

fn kvs(r: &GetResponse) -> (i64, bool, Vec<Kv>) {
    let kvs = r
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect();
    (r.count(), r.more(), kvs)
}

async fn message(s: &mut WatchStream) -> WatchResponse {
    step(s, "a watch response").await
}

async fn step(s: &mut WatchStream, what: &str) -> WatchResponse {
    tokio::time::timeout(WAIT, s.message())
        .await
        .unwrap_or_else(|_| panic!("no watch response in time: {what}"))
        .expect("watch error")
        .expect("watch stream ended")
}

type Ev = (i32, String, String, i64, Option<String>);

/// Events (type, key, value, mod revision, prev value) until the stream is quiet.
async fn drain(s: &mut WatchStream) -> Vec<Ev> {
    let mut out = Vec::new();
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(1000), s.message()).await {
        push_events(
            &mut out,
            r.expect("watch error").expect("watch stream ended"),
        );
    }
    out
}

/// The events of `s` compared with `want` (what etcd sent a direct watch of the same
/// form): waits for as many events as `want` holds, however slow the proxy is under
/// load (bounded by `WAIT` per response), then for a short quiet to catch extras. A
/// quiet alone would cut a slow proxy's replay short on a loaded machine.
async fn drain_like(s: &mut WatchStream, want: &[Ev]) -> Vec<Ev> {
    let mut out = Vec::new();
    while out.len() < want.len() {
        push_events(&mut out, step(s, "a replayed event").await);
    }
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(300), s.message()).await {
        push_events(
            &mut out,
            r.expect("watch error").expect("watch stream ended"),
        );
    }
    out
}

fn push_events(out: &mut Vec<Ev>, r: WatchResponse) {
    assert!(!r.canceled(), "canceled: {}", r.cancel_reason());
    for e in r.events() {
        let kv = e.kv().unwrap();
        out.push((
            e.event_type() as i32,
            String::from_utf8_lossy(kv.key()).into_owned(),
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.mod_revision(),
            e.prev_kv()
                .map(|p| String::from_utf8_lossy(p.value()).into_owned()),
        ));
    }
}

/// A history with puts, overwrites, deletes, a lease and a multi-key txn.
async fn write_history(c: &mut Client) -> i64 {
    let lease = c.lease_grant(60, None).await.unwrap().id();
    for i in 0..5 {
        c.put(format!("/a/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.put("/a/1", "again", None).await.unwrap();
    c.put("/b", "leased", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.delete("/a/2", None).await.unwrap();
    c.txn(Txn::new().and_then([
        TxnOp::put("/a/5", "t5", None),
        TxnOp::put("/c", "t", None),
        TxnOp::delete("/a/3", None),
    ]))
    .await
    .unwrap();
    c.put("/a/0", "zzz", None).await.unwrap();
    put_rev(c, "z", "last").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_match_etcd() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    let first = direct
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let last = write_history(&mut via).await;

    let forms: Vec<(&str, GetOptions)> = vec![
        ("/a/1", GetOptions::new()),
        ("/a/", GetOptions::new().with_prefix()),
        ("/a/1", GetOptions::new().with_range("/a/4")),
        ("/a/3", GetOptions::new().with_from_key()),
        ("", GetOptions::new().with_all_keys()),
        ("/", GetOptions::new().with_prefix().with_limit(3)),
        ("/", GetOptions::new().with_prefix().with_keys_only()),
        ("/", GetOptions::new().with_prefix().with_count_only()),
        ("/", GetOptions::new().with_prefix().with_serializable()),
        (
            "/a/",
            GetOptions::new().with_prefix().with_revision(last - 3),
        ),
        (
            "/a/",
            GetOptions::new().with_prefix().with_revision(first + 2),
        ),
        (
            "/a/",
            GetOptions::new()
                .with_prefix()
                .with_min_mod_revision(first + 4),
        ),
        (
            "/a/",
            GetOptions::new()
                .with_prefix()
                .with_max_mod_revision(first + 4),
        ),
        (
            "/a/",
            GetOptions::new()
                .with_prefix()
                .with_min_create_revision(first + 3),
        ),
        (
            "/a/",
            GetOptions::new()
                .with_prefix()
                .with_max_create_revision(first + 3),
        ),
        ("/a/9", GetOptions::new()),
        // Reversed: etcd answers an empty result.
        ("/b", GetOptions::new().with_range("/a")),
    ];
    let mut forms = forms;
    for target in [
        SortTarget::Key,
        SortTarget::Version,
        SortTarget::Create,
        SortTarget::Mod,
        SortTarget::Value,
    ] {
        for order in [SortOrder::None, SortOrder::Ascend, SortOrder::Descend] {
            forms.push((
                "/",
                GetOptions::new()
                    .with_prefix()
                    .with_sort(target, order)
                    .with_limit(4),
            ));
        }
    }
    for (key, opts) in forms {
        let d = direct.get(key, Some(opts.clone())).await.unwrap();
        let v = via.get(key, Some(opts.clone())).await.unwrap();
        assert_eq!(kvs(&v), kvs(&d), "{key:?} {opts:?}");
        let (dh, vh) = (d.header().unwrap(), v.header().unwrap());
        assert_eq!(
            vh.revision(),
            dh.revision(),
            "header revision of {key:?} {opts:?}"
        );
        assert_eq!(vh.cluster_id(), dh.cluster_id());
        assert_eq!(vh.member_id(), dh.member_id());
    }
    // The same errors as etcd.
    let d = direct.get("", None).await.unwrap_err().to_string();
    let v = via.get("", None).await.unwrap_err().to_string();
    assert_eq!(v, d);
    let future = GetOptions::new().with_revision(last + 100);
    let d = direct
        .get("/a/1", Some(future.clone()))
        .await
        .unwrap_err()
        .to_string();
    let v = via.get("/a/1", Some(future)).await.unwrap_err().to_string();
    assert_eq!(v, d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_match_etcd() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    let first = via
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let last = write_history(&mut direct).await;
    let forms: Vec<(&str, WatchOptions)> = vec![
        ("/a/1", WatchOptions::new()),
        ("/a/", WatchOptions::new().with_prefix()),
        ("/a/1", WatchOptions::new().with_range("/a/4")),
        ("/a/3", WatchOptions::new().with_from_key()),
        ("", WatchOptions::new().with_all_keys()),
        ("/a/", WatchOptions::new().with_prefix().with_prev_key()),
        (
            "/",
            WatchOptions::new()
                .with_prefix()
                .with_filters([WatchFilterType::NoPut]),
        ),
        (
            "/",
            WatchOptions::new()
                .with_prefix()
                .with_filters([WatchFilterType::NoDelete]),
        ),
    ];
    for (key, opts) in forms {
        for start in [first + 1, first + 5, last] {
            let opts = opts.clone().with_start_revision(start);
            let mut d = direct.watch(key, Some(opts.clone())).await.unwrap();
            let mut v = via.watch(key, Some(opts.clone())).await.unwrap();
            let (dc, vc) = (message(&mut d).await, message(&mut v).await);
            assert!(vc.created() && dc.created());
            assert_eq!(vc.watch_id(), dc.watch_id());
            let want = drain(&mut d).await;
            let got = drain_like(&mut v, &want).await;
            assert!(!want.is_empty() || start == last, "{key:?} from {start}");
            assert_eq!(got, want, "{key:?} from {start} {opts:?}");
        }
    }
    // A watch from now gets what is written after it.
    let mut v = via
        .watch("/n", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let created = message(&mut v).await;
    let now = put_rev(&mut direct, "/n/1", "x").await;
    assert!(created.header().unwrap().revision() < now);
    let r = message(&mut v).await;
    assert_eq!(r.events().len(), 1);
    assert_eq!(r.events()[0].event_type(), EventType::Put);
    assert_eq!(r.header().unwrap().revision(), now);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_stream_control_as_etcd() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    for (name, c) in [("etcd", &mut direct), ("proxy", &mut via)] {
        eprintln!("against {name}");
        let mut s = c
            .watch("/w/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let created = step(&mut s, "step 1").await;
        assert!(created.created());
        assert_eq!(created.watch_id(), 0);
        // Several watches on one stream; a client-chosen id; a duplicate id.
        s.watch("/w/b", Some(WatchOptions::new().with_watch_id(7)))
            .await
            .unwrap();
        let r = step(&mut s, "step 2").await;
        assert!(r.created() && !r.canceled());
        assert_eq!(r.watch_id(), 7);
        s.watch("/w/c", Some(WatchOptions::new().with_watch_id(7)))
            .await
            .unwrap();
        let r = step(&mut s, "step 3").await;
        assert!(r.created() && r.canceled());
        assert_eq!(r.watch_id(), -1);
        assert_eq!(
            r.cancel_reason(),
            "mvcc: duplicate watch ID provided on the WatchStream"
        );
        // The next automatic id skips the ones in use.
        s.watch("/w/d", None).await.unwrap();
        let r = step(&mut s, "step 4").await;
        assert_eq!(r.watch_id(), 1);
        // A reversed range.
        s.watch("/w/z", Some(WatchOptions::new().with_range("/w/a")))
            .await
            .unwrap();
        let r = step(&mut s, "step 5").await;
        assert!(r.created() && r.canceled());
        assert_eq!(r.cancel_reason(), "mvcc: watcher range is empty");
        // Cancelling an unknown id gets no answer; a known one is canceled.
        s.cancel(42).await.unwrap();
        s.cancel(7).await.unwrap();
        let r = step(&mut s, "step 6").await;
        assert!(r.canceled());
        assert_eq!(r.watch_id(), 7);
        // Both remaining watches see the next write; the canceled one does not.
        let rev = put_rev(c, "/w/b", "1").await;
        let r = step(&mut s, "step 7").await;
        assert_eq!((r.watch_id(), r.header().unwrap().revision()), (0, rev));
        // WatchProgressRequest: one answer for the stream, watch id -1, at a revision
        // that covers a write completed before it (on keys no watch here matches).
        let other = put_rev(c, "/elsewhere", "x").await;
        s.request_progress().await.unwrap();
        let r = step(&mut s, "step 8").await;
        assert_eq!(r.watch_id(), -1);
        assert!(r.events().is_empty());
        assert!(
            r.header().unwrap().revision() >= other,
            "progress below a completed write"
        );
    }
}

/// A stream-wide progress request on a stream whose watch starts at a future revision is
/// never answered below that start (etcd#20221; fixed etcd drops it, 3.4.23 answers it
/// below the start at once). Each stream is asked once while the start is ahead, then
/// the writes pass the start, then it is asked again: every answer through the proxy is
/// at or above the start, and the last covers the last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_progress_with_a_future_watch_is_never_below_its_start() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut c = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    let now = put_rev(&mut c, "/fp/k", "0").await;
    let start = now + 3;
    let options = WatchOptions::new().with_prefix().with_start_revision(start);
    let mut answers = Vec::new();
    let mut streams = Vec::new();
    for target in [&mut c, &mut via] {
        let mut s = target.watch("/fp/", Some(options.clone())).await.unwrap();
        assert!(message(&mut s).await.created());
        s.request_progress().await.unwrap();
        streams.push(s);
    }
    let mut last = 0;
    for i in 1..=5 {
        last = put_rev(&mut c, "/fp/k", &i.to_string()).await;
    }
    for s in &mut streams {
        s.request_progress().await.unwrap();
        let (mut events, mut progress) = (Vec::new(), Vec::new());
        // Until the answer that covers the last write (the second request's, at least).
        while progress.last().is_none_or(|&r| r < last) {
            let r = message(s).await;
            if r.watch_id() == -1 {
                progress.push(r.header().unwrap().revision());
            }
            events.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        }
        assert_eq!(events, (start..=last).collect::<Vec<_>>());
        answers.push(progress);
    }
    println!("PROGRESS | future watch from {start} (etcd at {now}) | stream-wide answers: etcd {:?}, proxy {:?}", answers[0], answers[1]);
    assert!(
        answers[1].iter().all(|&r| r >= start),
        "the proxy answered below the start {start}: {:?}",
        answers[1]
    );
}

/// A stream-level progress request while a watch of the stream (cached, or forwarded:
/// outside `--prefix`) starts far beyond etcd's revision: fixed etcd drops it
/// (`rev < w.startRev`, etcd#20221), 3.4.23 answers it below the start. Through the
/// proxy it is dropped as fixed etcd drops it: no answer comes before the stream's
/// other watch gets its event, none comes for it once the far watches are canceled
/// (a request held for them would then be answered), and the request made after the
/// cancels is the only one answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_progress_that_etcd_drops_is_dropped_and_holds_nothing() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/fa/c/".into()]).await;
    let mut c = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    let mut writer = client(&etcd.endpoint()).await;
    let now = put_rev(&mut writer, "/fa/c/n", "0").await;
    let far = WatchOptions::new()
        .with_prefix()
        .with_start_revision(now + 1000);
    let mut answers = Vec::new();
    for target in [&mut c, &mut via] {
        let mut s = target.watch("/fa/c/n", None).await.unwrap();
        let n = message(&mut s).await.watch_id();
        let mut far_ids = Vec::new();
        for key in ["/fa/c/", "/fa/e/"] {
            s.watch(key, Some(far.clone())).await.unwrap();
            let r = message(&mut s).await;
            assert!(r.created() && !r.canceled(), "{key}: {}", r.cancel_reason());
            far_ids.push(r.watch_id());
        }
        let mut progress = Vec::new();
        // While the far watches are there: etcd >= 3.5 drops the request. They are
        // canceled before anything is read, so a request held for them would be
        // answered (before the second one) once they are gone.
        s.request_progress().await.unwrap();
        let first = put_rev(&mut writer, "/fa/c/n", "1").await;
        for &id in &far_ids {
            s.cancel(id).await.unwrap();
        }
        let (mut before_event, mut event, mut canceled) = (None, false, 0);
        while !event || canceled < 2 {
            let r = message(&mut s).await;
            if r.watch_id() == -1 {
                progress.push(r.header().unwrap().revision());
            } else if r.canceled() {
                canceled += 1;
            } else {
                assert_eq!(r.watch_id(), n);
                assert_eq!(r.events()[0].kv().unwrap().mod_revision(), first);
                before_event = Some(progress.len());
                event = true;
            }
        }
        let before_event = before_event.expect("the event came");
        let last = put_rev(&mut writer, "/fa/c/n", "2").await;
        s.request_progress().await.unwrap();
        // Until the answer to the second request (at least etcd's revision then).
        while progress.last().is_none_or(|&r| r < last) {
            let r = message(&mut s).await;
            if r.watch_id() == -1 {
                progress.push(r.header().unwrap().revision());
            }
        }
        answers.push((before_event, progress));
    }
    println!(
        "PROGRESS | watches from {} (etcd at {now}) | answers before the event, all answers: etcd {:?}, proxy {:?}",
        now + 1000,
        answers[0],
        answers[1]
    );
    let (before_event, proxy) = &answers[1];
    assert_eq!(*before_event, 0, "the proxy answered below the far start");
    assert_eq!(
        proxy.len(),
        1,
        "the request made while the far watches were there was answered: {proxy:?}"
    );
}

async fn put_rev(c: &mut Client, key: &str, value: &str) -> i64 {
    c.put(key, value, None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_cap_per_connection() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        vec!["--max-watches-per-connection".into(), "2".into()],
    )
    .await;
    let mut via = client(&proxy.endpoint()).await;
    let mut s = via.watch("/cap/a", None).await.unwrap();
    assert!(message(&mut s).await.created());
    s.watch("/cap/b", None).await.unwrap();
    let b = message(&mut s).await;
    assert!(b.created() && !b.canceled());
    s.watch("/cap/c", None).await.unwrap();
    let r = message(&mut s).await;
    assert!(r.created() && r.canceled());
    assert_eq!(
        r.cancel_reason(),
        "ETCD_WATCH_LIMIT: at most 2 watches are allowed per connection"
    );
    // A second stream on the same connection shares the budget.
    let mut s2 = via.watch("/cap/d", None).await.unwrap();
    let r = message(&mut s2).await;
    assert!(r.canceled());
    assert_eq!(
        r.cancel_reason(),
        "ETCD_WATCH_LIMIT: at most 2 watches are allowed per connection"
    );
    // Another connection has its own.
    let mut other = client(&proxy.endpoint()).await;
    let mut s3 = other.watch("/cap/a", None).await.unwrap();
    assert!(!message(&mut s3).await.canceled());
    // The watches that were created still work.
    let rev = put_rev(&mut via, "/cap/a", "1").await;
    let r = message(&mut s).await;
    assert_eq!(r.header().unwrap().revision(), rev);
    assert_eq!(r.watch_id(), 0);
    // Cancelling one frees a slot.
    s.cancel(b.watch_id()).await.unwrap();
    assert!(message(&mut s).await.canceled());
    s.watch("/cap/e", None).await.unwrap();
    let r = message(&mut s).await;
    assert!(r.created() && !r.canceled(), "{}", r.cancel_reason());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_etcds_answer() {
    // etcd takes requests up to --max-request-bytes and messages up to that + 512 KiB;
    // the proxy is given the same receive limit.
    let etcd = start_etcd(EtcdOptions::default().arg("--max-request-bytes=1000")).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        vec!["--max-recv-bytes".into(), (1000 + 512 * 1024).to_string()],
    )
    .await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    // A negative start revision: created and canceled as compacted (etcd >= 3.5; 3.4.23
    // starts such a watch from the oldest revision instead).
    let mut s = via
        .watch("/n", Some(WatchOptions::new().with_start_revision(-1)))
        .await
        .unwrap();
    let r = message(&mut s).await;
    assert!(r.created() && r.canceled());
    assert_eq!(r.watch_id(), -1);
    assert_eq!(
        r.cancel_reason(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    // Empty keys.
    for c in [&mut direct, &mut via] {
        let err = c.put("", "v", None).await.unwrap_err().to_string();
        assert!(err.contains("etcdserver: key is not provided"), "{err}");
    }
    let d = direct.delete("", None).await.unwrap_err().to_string();
    let v = via.delete("", None).await.unwrap_err().to_string();
    assert_eq!(v, d);
    // An oversized message gets grpc-go's answer, and the proxy keeps serving.
    let big = "x".repeat(600_000);
    let d = direct
        .put("/big", big.clone(), None)
        .await
        .unwrap_err()
        .to_string();
    let v = via.put("/big", big, None).await.unwrap_err().to_string();
    assert_eq!(v, d);
    assert!(v.contains("received message larger than max"), "{v}");
    // A request above etcd's --max-request-bytes but below the message limit: etcd's
    // own "request is too large", forwarded.
    let mid = "x".repeat(5_000);
    let d = direct
        .put("/mid", mid.clone(), None)
        .await
        .unwrap_err()
        .to_string();
    let v = via.put("/mid", mid, None).await.unwrap_err().to_string();
    assert_eq!(v, d);
    let mut fresh = client(&proxy.endpoint()).await;
    fresh.put("/small", "ok", None).await.unwrap();
    via.put("/small", "ok", None).await.unwrap();
    // A txn with a compare on a range is forwarded as it is.
    let t = Txn::new()
        .when([Compare::value("/small", CompareOp::Equal, "ok")])
        .and_then([TxnOp::get("/small", None)]);
    assert!(via.txn(t).await.unwrap().succeeded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_confines_every_call() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--namespace".into(), "/t/".into()]).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    direct.put("/outside", "secret", None).await.unwrap();
    direct
        .put("/t0", "just past the namespace", None)
        .await
        .unwrap();
    let mut w = via
        .watch(
            "",
            Some(WatchOptions::new().with_all_keys().with_prev_key()),
        )
        .await
        .unwrap();
    assert!(message(&mut w).await.created());
    via.put("k", "1", None).await.unwrap();
    assert_eq!(
        direct.get("/t/k", None).await.unwrap().kvs()[0].value(),
        b"1"
    );
    let all = via
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(
        kvs(&all).2.iter().map(|k| k.0.clone()).collect::<Vec<_>>(),
        ["k"]
    );
    let from = via
        .get("a", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    assert_eq!(from.count(), 1);
    let r = message(&mut w).await;
    assert_eq!(r.events()[0].kv().unwrap().key(), b"k");
    // Writes outside the namespace are invisible to its watchers.
    direct.put("/outside", "again", None).await.unwrap();
    via.put("k", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    let r = message(&mut w).await;
    assert_eq!(r.events()[0].kv().unwrap().key(), b"k");
    assert_eq!(r.events()[0].prev_kv().unwrap().key(), b"k");
    // A txn sees and writes only namespaced keys.
    let t = Txn::new()
        .when([Compare::value("k", CompareOp::Equal, "2")])
        .and_then([TxnOp::put("j", "3", None), TxnOp::get("k", None)]);
    let resp = via.txn(t).await.unwrap();
    assert!(resp.succeeded());
    assert_eq!(direct.get("/t/j", None).await.unwrap().count(), 1);
    // Delete everything (from the smallest key): only the namespace goes.
    via.delete(
        "\0",
        Some(etcd_client::DeleteOptions::new().with_from_key()),
    )
    .await
    .unwrap();
    assert_eq!(direct.get("/outside", None).await.unwrap().count(), 1);
    assert_eq!(direct.get("/t0", None).await.unwrap().count(), 1);
    assert_eq!(
        direct
            .get("/t/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_cluster_and_status() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    let lease = via.lease_grant(30, None).await.unwrap().id();
    // Keep-alives from two clients for the same lease (coalesced upstream).
    let mut other = client(&proxy.endpoint()).await;
    let (mut k1, mut s1) = via.lease_keep_alive(lease).await.unwrap();
    let (mut k2, mut s2) = other.lease_keep_alive(lease).await.unwrap();
    for _ in 0..3 {
        k1.keep_alive().await.unwrap();
        k2.keep_alive().await.unwrap();
        let (a, b) = (
            s1.message().await.unwrap().unwrap(),
            s2.message().await.unwrap().unwrap(),
        );
        assert_eq!((a.id(), b.id()), (lease, lease));
        assert!(a.ttl() > 0 && b.ttl() > 0);
    }
    via.put("/leased", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let ttl = via
        .lease_time_to_live(
            lease,
            Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
        )
        .await
        .unwrap();
    assert_eq!(ttl.keys(), [b"/leased".to_vec()]);
    assert!(via
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .any(|l| l.id() == lease));
    via.lease_revoke(lease).await.unwrap();
    assert_eq!(direct.get("/leased", None).await.unwrap().count(), 0);
    // Without --advertise-client-url, MemberList is etcd's (as grpc-proxy's); with it,
    // the proxy's own.
    let (d, v) = (
        direct.member_list().await.unwrap(),
        via.member_list().await.unwrap(),
    );
    let urls = |r: &etcd_client::MemberListResponse| {
        r.members()
            .iter()
            .map(|m| m.client_urls().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(urls(&v), urls(&d));
    let advertised = start_proxy(
        etcd.endpoint(),
        vec!["--advertise-client-url".into(), "{self}".into()],
    )
    .await;
    let members = client(&advertised.endpoint())
        .await
        .member_list()
        .await
        .unwrap();
    assert_eq!(members.members().len(), 1);
    assert_eq!(members.members()[0].client_urls(), [advertised.endpoint()]);
    // Status is etcd's.
    let (d, v) = (direct.status().await.unwrap(), via.status().await.unwrap());
    assert_eq!(v.version(), d.version());
    assert_eq!(
        v.header().unwrap().member_id(),
        d.header().unwrap().member_id()
    );
    // Membership changes are etcd's: the same refusal of a peer URL already in use.
    let peer = [etcd.peer_url()];
    let d = direct
        .member_add(peer.clone(), None)
        .await
        .unwrap_err()
        .to_string();
    let v = via.member_add(peer, None).await.unwrap_err().to_string();
    assert_eq!(v, d);
    // Defragment is forwarded (one endpoint: that member).
    via.defragment().await.unwrap();
    // Locks and elections work through the proxy.
    let lease = via.lease_grant(30, None).await.unwrap().id();
    let lock = via
        .lock("l", Some(etcd_client::LockOptions::new().with_lease(lease)))
        .await
        .unwrap();
    assert!(lock.key().starts_with(b"l/"));
    via.unlock(lock.key()).await.unwrap();
    let campaign = via.campaign("e", "me", lease).await.unwrap();
    let leader = via.leader("e").await.unwrap();
    assert_eq!(leader.kv().unwrap().value(), b"me");
    via.resign(Some(
        etcd_client::ResignOptions::new().with_leader(campaign.leader().unwrap().clone()),
    ))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_streams_and_exits() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut via = client(&proxy.endpoint()).await;
    let mut s = via.watch("/s", None).await.unwrap();
    assert!(message(&mut s).await.created());
    let status = tokio::task::spawn_blocking(move || {
        let st = proxy.terminate(Duration::from_secs(15));
        (st, proxy.log_text())
    })
    .await
    .unwrap();
    assert!(
        status.0.is_some_and(|s| s.success()),
        "exit: {:?}\n{}",
        status.0,
        status.1
    );
    let end = tokio::time::timeout(WAIT, s.message()).await.unwrap();
    assert!(end.is_err() || end.unwrap().is_none());
    assert!(status.1.contains("stopped"), "{}", status.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragments_large_responses() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        vec!["--max-request-bytes".into(), "1000".into()],
    )
    .await;
    let mut via = client(&proxy.endpoint()).await;
    let mut s = via
        .watch(
            "/f/",
            Some(WatchOptions::new().with_prefix().with_fragment()),
        )
        .await
        .unwrap();
    assert!(message(&mut s).await.created());
    let ops: Vec<TxnOp> = (0..20)
        .map(|i| TxnOp::put(format!("/f/{i:02}"), "x".repeat(200), None))
        .collect();
    via.txn(Txn::new().and_then(ops)).await.unwrap();
    let mut got = 0;
    let mut parts = 0;
    while got < 20 {
        let r = message(&mut s).await;
        parts += 1;
        got += r.events().len();
        let fragment = r.0.fragment;
        assert_eq!(fragment, got < 20, "fragment flag of part {parts}");
    }
    assert!(parts >= 4, "{parts} parts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_below_the_window_are_forwarded_to_etcd() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut direct = client(&etcd.endpoint()).await;
    // History written before the proxy starts: older than the cache's window.
    let last = write_history(&mut direct).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let mut via = client(&proxy.endpoint()).await;
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(2);
    let mut d = direct.watch("/a/", Some(opts.clone())).await.unwrap();
    let mut v = via.watch("/a/", Some(opts)).await.unwrap();
    assert!(message(&mut d).await.created());
    let created = message(&mut v).await;
    assert!(
        created.created() && !created.canceled(),
        "{}",
        created.cancel_reason()
    );
    let want = drain(&mut d).await;
    let got = drain_like(&mut v, &want).await;
    assert!(!want.is_empty());
    assert_eq!(got, want);
    // The same stream also carries a watch from the cache; a progress request is
    // answered once for both, at or above the last write.
    v.watch("/b", None).await.unwrap();
    assert!(step(&mut v, "cache watch created").await.created());
    v.request_progress().await.unwrap();
    let p = step(&mut v, "progress").await;
    assert_eq!(p.watch_id(), -1);
    assert!(p.header().unwrap().revision() >= last);
    // Live events keep coming on the forwarded watch; cancelling it works.
    let rev = put_rev(&mut direct, "/a/live", "1").await;
    let r = step(&mut v, "live event on the forwarded watch").await;
    assert_eq!(r.watch_id(), created.watch_id());
    assert_eq!(r.header().unwrap().revision(), rev);
    v.cancel(created.watch_id()).await.unwrap();
    let r = step(&mut v, "forwarded cancel").await;
    assert!(r.canceled());
    assert_eq!(r.watch_id(), created.watch_id());
    // A namespace applies to forwarded watches too.
    let ns = start_proxy(etcd.endpoint(), vec!["--namespace".into(), "/a/".into()]).await;
    let mut in_ns = client(&ns.endpoint()).await;
    let mut w = in_ns
        .watch("1", Some(WatchOptions::new().with_start_revision(2)))
        .await
        .unwrap();
    assert!(step(&mut w, "namespaced forwarded created").await.created());
    let evs = drain(&mut w).await;
    assert!(!evs.is_empty() && evs.iter().all(|e| e.1 == "1"), "{evs:?}");
    // Outside the cached prefix: forwarded as well (and ranges there are forwarded).
    let narrow = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/a/".into()]).await;
    let mut n = client(&narrow.endpoint()).await;
    let mut w = n.watch("/c", None).await.unwrap();
    assert!(step(&mut w, "outside-prefix watch created").await.created());
    let rev = put_rev(&mut direct, "/c", "new").await;
    let r = step(&mut w, "outside-prefix event").await;
    assert_eq!(r.header().unwrap().revision(), rev);
    assert_eq!(r.events()[0].kv().unwrap().value(), b"new");
    assert_eq!(n.get("/c", None).await.unwrap().kvs()[0].value(), b"new");
    // Once etcd has compacted the history, a forwarded watch gets etcd's own answer.
    direct.compact(last, None).await.unwrap();
    let opts = WatchOptions::new().with_prefix().with_start_revision(2);
    for c in [&mut direct, &mut via] {
        let mut s = c.watch("/a/", Some(opts.clone())).await.unwrap();
        let mut r = step(&mut s, "compacted").await;
        if r.created() && !r.canceled() {
            r = step(&mut s, "compacted after created").await;
        }
        assert!(r.canceled());
        assert_eq!(r.compact_revision(), last);
    }
}

/// A read or a watch at a revision etcd compacted gets etcd's answer, not the cache's
/// window, whether the Compact went through the proxy or straight to etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_revisions_get_etcds_answer() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/c/".into()]).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut via = client(&proxy.endpoint()).await;
    let mut revs = Vec::new();
    for i in 0..6 {
        let r = via.put("/c/k", format!("v{i}"), None).await.unwrap();
        revs.push(r.header().unwrap().revision());
    }
    // The cache's window holds every one of them.
    let old = revs[1];
    let at = |rev| Some(GetOptions::new().with_revision(rev));
    assert_eq!(via.get("/c/k", at(old)).await.unwrap().kvs().len(), 1);
    let compare = |d: Result<GetResponse, etcd_client::Error>,
                   v: Result<GetResponse, etcd_client::Error>| {
        let s = |r: Result<GetResponse, etcd_client::Error>| match r {
            Ok(r) => format!("ok {:?}", kvs(&r)),
            Err(e) => e.to_string(),
        };
        (s(d), s(v))
    };
    // Compacted through the proxy: at once.
    via.compact(revs[3], None).await.unwrap();
    let (d, v) = compare(
        direct.get("/c/k", at(old)).await,
        via.get("/c/k", at(old)).await,
    );
    assert!(d.contains("compacted"), "{d}");
    assert_eq!(v, d);
    let mut w = via
        .watch("/c/k", Some(WatchOptions::new().with_start_revision(old)))
        .await
        .unwrap();
    let mut canceled = None;
    while canceled.is_none() {
        let r = message(&mut w).await;
        if r.canceled() {
            canceled = Some(r.compact_revision());
        }
    }
    assert_eq!(
        canceled,
        Some(revs[3]),
        "the watch ends with etcd's compact revision"
    );
    // Compacted on etcd directly: the proxy asks etcd before it answers a read at a
    // past revision, so it knows at once.
    direct.compact(revs[5], None).await.unwrap();
    let (d, v) = compare(
        direct.get("/c/k", at(revs[4])).await,
        via.get("/c/k", at(revs[4])).await,
    );
    assert!(d.contains("compacted"), "{d}");
    assert_eq!(v, d);
    // And a read at a revision etcd still has is answered.
    let (d, v) = compare(
        direct.get("/c/k", at(revs[5])).await,
        via.get("/c/k", at(revs[5])).await,
    );
    assert!(d.starts_with("ok"), "{d}");
    assert_eq!(v, d);
}

/// A cache whose list pages are over 4 MiB (1,100 keys of 5 KiB: a page of 1,000 is 5 MB,
/// Kubernetes Pods' size) loads (it refused every page before the crate took etcd's
/// messages of any size: the proxy answered every range through etcd meanwhile), and the
/// proxy's answers from it match etcd's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_whose_pages_are_over_4_mib_loads_and_serves() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut direct = client(&etcd.endpoint()).await;
    let value = "v".repeat(5 * 1024);
    for batch in 0..11 {
        let ops: Vec<TxnOp> = (0..100)
            .map(|i| TxnOp::put(format!("/big/{:05}", batch * 100 + i), value.as_str(), None))
            .collect();
        direct.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    let maddr = support::free_addr();
    let proxy = start_proxy(
        etcd.endpoint(),
        vec!["--metrics-addr".into(), maddr.to_string()],
    )
    .await;
    support::scrape::scrape_until(maddr, "the cache loaded", |s| {
        s.get("etcd_cache_store_keys", &[("cache", "")]) == Some(1_100.0)
    })
    .await;
    let mut via = client(&proxy.endpoint()).await;
    for opts in [
        GetOptions::new().with_prefix().with_limit(10),
        GetOptions::new().with_prefix().with_count_only(),
        GetOptions::new().with_prefix().with_keys_only(),
    ] {
        let want = direct.get("/big/", Some(opts.clone())).await.unwrap();
        let got = via.get("/big/", Some(opts)).await.unwrap();
        assert_eq!(kvs(&got), kvs(&want));
    }
    assert_eq!(
        kvs(&via.get("/big/01099", None).await.unwrap()),
        kvs(&direct.get("/big/01099", None).await.unwrap())
    );
}
