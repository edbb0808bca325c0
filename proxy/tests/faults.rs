//! Watches through the proxy across faults between the proxy and etcd: every connection
//! cut, and etcd killed with SIGKILL and restarted. The clients of the proxy keep their
//! streams, and every revision reaches them once, in order. A proxy started while etcd
//! is down serves its early clients once etcd is up.

mod support;

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, WatchOptions, WatchStream};
use support::{client, start_etcd, start_proxy, EtcdOptions};
use testkit::TcpProxy;

/// Writes `n` keys directly to etcd, retrying while it is down; returns their revisions.
async fn write(c: &mut Client, tag: &str, n: usize) -> Vec<i64> {
    let mut revs = Vec::new();
    for i in 0..n {
        loop {
            match c.put(format!("/f/{tag}{i}"), "v", None).await {
                Ok(r) => {
                    revs.push(r.header().unwrap().revision());
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    revs
}

async fn read(w: &mut WatchStream, n: usize) -> Vec<i64> {
    let mut revs = Vec::new();
    while revs.len() < n {
        let r = tokio::time::timeout(Duration::from_secs(30), w.message())
            .await
            .expect("the watch stalled across the fault")
            .expect("watch error")
            .expect("watch ended");
        assert!(!r.canceled(), "canceled: {}", r.cancel_reason());
        revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
    }
    revs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_survive_cuts_and_an_etcd_restart() {
    let mut etcd = start_etcd(EtcdOptions::default()).await;
    let cut = TcpProxy::start(etcd.endpoint()).await;
    let proxy = start_proxy(cut.endpoint(), vec![]).await;
    let mut via = client(&proxy.endpoint()).await;
    let mut direct = client(&etcd.endpoint()).await;
    let mut w = via
        .watch("/f/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(w.message().await.unwrap().unwrap().created());

    let mut want = write(&mut direct, "a", 5).await;
    let mut got = read(&mut w, 5).await;
    // Every connection between the proxy and etcd is reset.
    cut.drop_all_connections();
    want.extend(write(&mut direct, "b", 5).await);
    got.extend(read(&mut w, 5).await);
    // etcd is killed and comes back with the same data.
    etcd = tokio::task::spawn_blocking(move || {
        etcd.kill();
        etcd.restart();
        etcd
    })
    .await
    .unwrap();
    let mut direct = client(&etcd.endpoint()).await;
    want.extend(write(&mut direct, "c", 5).await);
    got.extend(read(&mut w, 5).await);
    assert_eq!(got, want, "a gap, a duplicate or a reorder");
    // Reads through the proxy are current again.
    let last = *want.last().unwrap();
    let r = via
        .get("/f/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(r.count(), 15);
    assert!(r.header().unwrap().revision() >= last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_cluster_loses_its_leader() {
    let mut cluster = tokio::task::spawn_blocking(testkit::EtcdCluster::start)
        .await
        .unwrap();
    let endpoints = cluster.endpoints().join(",");
    let proxy = start_proxy(endpoints, vec![]).await;
    let mut via = client(&proxy.endpoint()).await;
    let mut w = via
        .watch("/f/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(w.message().await.unwrap().unwrap().created());
    // Writes go through the proxy (forwarded over its balanced channel).
    let mut want = write(&mut via, "a", 5).await;
    let mut got = read(&mut w, 5).await;
    let (cluster_back, killed) = tokio::task::spawn_blocking(move || {
        let killed = cluster.kill_leader();
        cluster.wait_for_leader(Duration::from_secs(30));
        (cluster, killed)
    })
    .await
    .unwrap();
    cluster = cluster_back;
    want.extend(write(&mut via, "b", 5).await);
    got.extend(read(&mut w, 5).await);
    assert_eq!(
        got, want,
        "a gap, a duplicate or a reorder after member {killed} died"
    );
    // Reads and MemberList keep working.
    let r = via
        .get("/f/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(r.count(), 10);
    // etcd's members (no --advertise-client-url), as grpc-proxy answers. Forwarded, so a
    // call may meet the dead member before the channel's balancer has marked it down:
    // retried as etcd's clients retry, for at most 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let members = loop {
        match via.member_list().await {
            Ok(m) => break m,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("member list: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("member list failed for 10 s: {e}"),
        }
    };
    assert_eq!(members.members().len(), 3);
    drop(cluster);
}

/// A forwarded call whose connection to etcd breaks under it fails as it fails through
/// grpc-go (etcd's clients, grpc-proxy): `Unavailable`, "error reading from server: EOF",
/// which clients retry on another member (etcd's robustness suite, finding R1: tonic's
/// `Unknown: transport error` was passed through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_connection_breaks_is_unavailable() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let cut = TcpProxy::start(etcd.endpoint()).await;
    let proxy = start_proxy(cut.endpoint(), vec![]).await;
    let mut via = client(&proxy.endpoint()).await;
    via.put("/r1/warm", "v", None).await.unwrap();
    cut.set_blackhole(true);
    let mut put = tokio::spawn(async move { via.put("/r1/k", "v", None).await });
    // The put hangs: it is on the proxy's connection to etcd, where no byte moves.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut put)
            .await
            .is_err(),
        "the put answered through a black-holed connection"
    );
    cut.drop_all_connections();
    cut.set_blackhole(false);
    let err = tokio::time::timeout(Duration::from_secs(30), put)
        .await
        .expect("the put still hangs after its connection was reset")
        .unwrap()
        .unwrap_err();
    match err {
        etcd_client::Error::GRpcStatus(s) => assert_eq!(
            (s.code(), s.message()),
            (tonic::Code::Unavailable, "error reading from server: EOF"),
            "{s:?}"
        ),
        other => panic!("not a status: {other:?}"),
    }
    drop(etcd);
}

/// A member and its proxy restarted together (as etcd's robustness suite does through a
/// proxy in front of each member): a client that connects while the proxy starts, before
/// etcd serves, is served as soon as etcd is, as a client of etcd itself would be: the
/// proxy's port accepts from its start (a port that refused until the proxy served would
/// make grpc-go back off a second or more). How soon the proxy tries etcd again is
/// `upstream/dial.rs`'s unit test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_while_the_proxy_starts_is_served_once_etcd_is() {
    let mut etcd = start_etcd(EtcdOptions::default()).await;
    client(&etcd.endpoint())
        .await
        .put("/s/k", "v", None)
        .await
        .unwrap();
    // The proxy's port is picked while etcd holds its own (a port a killed etcd frees may
    // be handed out again, and etcd restarts on its ports).
    let addr = support::free_addr();
    etcd.kill();
    let proxy = support::Proxy::starting_on(addr, &etcd.endpoint(), &[]);

    // While etcd is down the proxy cannot serve, but its port accepts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = tokio::net::TcpStream::connect(proxy.addr()).await {
        assert!(
            Instant::now() < deadline,
            "the proxy's port refused connections while it waited for etcd: {e}\n{}",
            proxy.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
    let mut early = Client::connect([proxy.endpoint()], Some(opts))
        .await
        .expect("a connection made while the proxy starts");
    let read = tokio::spawn(async move { early.get("/s/k", None).await });

    let etcd = tokio::task::spawn_blocking(move || {
        etcd.restart();
        etcd
    })
    .await
    .unwrap();
    let got = match tokio::time::timeout(Duration::from_secs(30), read).await {
        Ok(Ok(Ok(got))) => got,
        other => panic!(
            "the read sent while the proxy started: {other:?}\nproxy:\n{}\netcd:\n{}",
            proxy.log_tail(),
            etcd.log_tail(20)
        ),
    };
    assert_eq!(got.kvs()[0].value(), b"v");
}
