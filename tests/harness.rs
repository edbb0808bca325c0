//! Tests of the test harness itself: real etcd processes, a three-member cluster, the
//! fault-injecting TCP proxy and etcd's gRPC proxy.

use std::time::Duration;

use etcd_client::{Client, WatchOptions};
use testkit::{grpc_proxy, EtcdCluster, EtcdOptions, EtcdServer, TcpProxy};

/// Every test ends within this, even when something hangs.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);

async fn get_value(client: &mut Client, key: &str) -> Option<String> {
    let resp = client.get(key, None).await.expect("get");
    resp.kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_put_get() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let etcd = EtcdServer::start();
        assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
        let mut client = testkit::client(&[etcd.endpoint()]).await;
        client.put("harness/a", "1", None).await.expect("put");
        assert_eq!(
            get_value(&mut client, "harness/a").await.as_deref(),
            Some("1")
        );

        let status = etcd.status().expect("status over the HTTP gateway");
        assert!(status.version.starts_with("3."), "{status:?}");
        assert_eq!(
            status.leader, status.member_id,
            "a single member leads itself"
        );
        assert!(status.revision >= 2, "{status:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_keep_data_and_ports() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let mut etcd = EtcdServer::start_with(
            EtcdOptions::default().progress_notify_interval(Duration::from_millis(200)),
        );
        let endpoint = etcd.endpoint();
        let mut client = testkit::client(std::slice::from_ref(&endpoint)).await;
        let put = client.put("harness/k", "before", None).await.expect("put");
        let revision = put.header().unwrap().revision();

        etcd.kill();
        assert!(!etcd.is_running());
        assert!(etcd.pid().is_none());
        let err = tokio::time::timeout(Duration::from_secs(5), client.get("harness/k", None))
            .await
            .map(|r| r.is_err())
            .unwrap_or(true);
        assert!(err, "a get against a killed etcd must fail or hang");

        etcd.restart();
        assert!(etcd.is_running());
        assert_eq!(etcd.endpoint(), endpoint, "restart keeps the ports");
        let mut client = testkit::client(&[etcd.endpoint()]).await;
        let resp = client
            .get("harness/k", None)
            .await
            .expect("get after restart");
        assert_eq!(resp.kvs()[0].value_str().unwrap(), "before");
        assert_eq!(resp.header().unwrap().revision(), revision, "data dir kept");
        let log = std::fs::read_to_string(etcd.log_path()).unwrap();
        assert_eq!(log.matches("==== harness: starting etcd").count(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_survives_leader_kill() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let mut cluster = EtcdCluster::start();
        let endpoints = cluster.endpoints();
        assert_eq!(endpoints.len(), 3);
        let mut client = testkit::client(&endpoints).await;
        client.put("harness/c", "0", None).await.expect("put");

        let leader = cluster.leader();
        let ids: Vec<u64> = (0..3)
            .map(|i| cluster.member(i).status().unwrap().member_id)
            .collect();
        for i in 0..3 {
            assert_eq!(
                cluster.member(i).status().unwrap().leader,
                ids[leader],
                "members agree on the leader"
            );
        }
        let killed = cluster.kill_leader();
        assert_eq!(killed, leader);
        assert!(!cluster.member_mut(killed).is_running());
        assert_eq!(cluster.running_endpoints().len(), 2);

        // Writes go through the survivors once a new leader is elected; requests that were
        // routed to the dead member may fail meanwhile.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut written = 0;
        while written < 10 {
            match tokio::time::timeout(
                Duration::from_secs(3),
                client.put("harness/c", written.to_string(), None),
            )
            .await
            {
                Ok(Ok(_)) => written += 1,
                _ => assert!(
                    tokio::time::Instant::now() < deadline,
                    "no write through the survivors"
                ),
            }
        }
        let new_leader = cluster.leader();
        assert_ne!(new_leader, killed);

        cluster.restart(killed);
        assert!(cluster.member_mut(killed).is_running());
        let mut rejoined = testkit::client(&[cluster.member(killed).endpoint()]).await;
        // A serializable read on the rejoined member catches up through raft.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let resp = rejoined
                .get(
                    "harness/c",
                    Some(etcd_client::GetOptions::new().with_serializable()),
                )
                .await
                .expect("get from the rejoined member");
            if resp
                .kvs()
                .first()
                .map(|kv| kv.value_str().unwrap().to_string())
                .as_deref()
                == Some("9")
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "rejoined member did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_drop_all_connections_ends_watch() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let etcd = EtcdServer::start();
        let proxy = TcpProxy::start(etcd.client_addr()).await;
        let mut client = testkit::client(&[proxy.endpoint()]).await;
        let mut watch = client
            .watch("harness/w", Some(WatchOptions::new().with_prefix()))
            .await
            .expect("watch");
        let created = watch
            .message()
            .await
            .expect("watch created")
            .expect("a response");
        assert!(created.created());

        let mut writer = testkit::client(&[etcd.endpoint()]).await;
        writer.put("harness/w/1", "x", None).await.unwrap();
        let event = tokio::time::timeout(Duration::from_secs(5), watch.message())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        assert_eq!(event.events().len(), 1);
        let before = proxy.accepted();
        assert!(before >= 1);
        assert!(proxy.active() >= 1);

        proxy.drop_all_connections();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(_)) = watch.message().await {}
        })
        .await;
        assert!(
            ended.is_ok(),
            "the watch stream must fail or end when its connection drops"
        );
        assert!(proxy.dropped() >= 1);

        // A fresh client through the same proxy works.
        let mut fresh = testkit::client(&[proxy.endpoint()]).await;
        assert_eq!(
            get_value(&mut fresh, "harness/w/1").await.as_deref(),
            Some("x")
        );
        assert!(proxy.accepted() > before);
        assert!(proxy.bytes_forwarded() > 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_blackhole_stalls_then_resumes() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let etcd = EtcdServer::start();
        let proxy = TcpProxy::start(etcd.endpoint()).await;
        let mut client = testkit::client(&[proxy.endpoint()]).await;
        client.put("harness/b", "1", None).await.unwrap();
        let connections = proxy.accepted();

        proxy.set_blackhole(true);
        let stalled =
            tokio::time::timeout(Duration::from_millis(500), client.get("harness/b", None)).await;
        assert!(stalled.is_err(), "a get through a black hole must stall");

        let mut c2 = client.clone();
        let pending = tokio::spawn(async move { c2.get("harness/b", None).await });
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!pending.is_finished(), "still stalled");
        assert_eq!(proxy.accepted(), connections, "a stall, not a reconnect");

        proxy.set_blackhole(false);
        let resp = tokio::time::timeout(Duration::from_secs(10), pending)
            .await
            .expect("the get completes once the black hole ends")
            .unwrap()
            .expect("get");
        assert_eq!(resp.kvs()[0].value_str().unwrap(), "1");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuse_rejects_new_connections_only() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let etcd = EtcdServer::start();
        let proxy = TcpProxy::start(etcd.endpoint()).await;
        let mut client = testkit::client(&[proxy.endpoint()]).await;

        proxy.set_refuse(true);
        // The existing connection still works.
        client
            .put("harness/r", "1", None)
            .await
            .expect("put on the open connection");
        // A new connection is reset at once.
        let refused = tokio::net::TcpStream::connect(proxy.addr()).await;
        if let Ok(mut s) = refused {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 1];
            let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("closed at once");
            assert!(
                matches!(r, Ok(0) | Err(_)),
                "refused connection must be closed"
            );
        }
        assert!(proxy.refused() >= 1);

        proxy.set_refuse(false);
        let mut fresh = testkit::client(&[proxy.endpoint()]).await;
        assert_eq!(
            get_value(&mut fresh, "harness/r").await.as_deref(),
            Some("1")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_proxy_forwards() {
    testkit::init_tracing();
    testkit::bounded(TEST_TIMEOUT, async {
        let etcd = EtcdServer::start();
        let proxy = grpc_proxy(&[etcd.endpoint()]);
        assert!(proxy.pid().is_some());
        let mut client = testkit::client(&[proxy.endpoint()]).await;
        client
            .put("harness/p", "via-proxy", None)
            .await
            .expect("put via grpc-proxy");
        let mut direct = testkit::client(&[etcd.endpoint()]).await;
        assert_eq!(
            get_value(&mut direct, "harness/p").await.as_deref(),
            Some("via-proxy")
        );
    })
    .await;
}

#[test]
#[should_panic(expected = "exited during start")]
fn failed_start_reports_log_tail() {
    EtcdServer::start_with(EtcdOptions::default().arg("--no-such-flag"));
}
