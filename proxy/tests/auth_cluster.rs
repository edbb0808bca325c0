//! A revoked permission on a three-member cluster, with the proxy in front of a
//! follower: etcd applies the revocation on the leader first, and the proxy's decisions
//! must follow etcd's, not the follower's view. Its cached reads and cached watches end
//! within the documented bound: on etcd >= 3.5 the auth revision, polled every
//! `--auth-check-interval` (1 s), so 2 s from the revocation; on 3.4, which has no auth
//! revision, decisions are asked again every 2 s and open watches checked every 10 s.

mod support;

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, WatchOptions};
use testkit::{EtcdCluster, EtcdOptions, EtcdVersion};

/// Connects with a user, retrying while the cluster settles.
async fn connect(endpoint: &str, user: &str, password: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_user(user, password);
        match Client::connect([endpoint], Some(opts)).await {
            Ok(c) => return c,
            Err(e) => assert!(
                Instant::now() < deadline,
                "connect {endpoint} as {user}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bound (from the revocation) within which the proxy must refuse, and the bound
/// asserted, which adds a margin for a loaded machine.
fn bounds(version: EtcdVersion) -> (Duration, Duration) {
    if version == EtcdVersion::V3_4 {
        (Duration::from_secs(10), Duration::from_secs(15))
    } else {
        (Duration::from_secs(2), Duration::from_secs(5))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_on_a_cluster_ends_cached_reads_and_watches_through_a_follower() {
    for version in [EtcdVersion::V3_4, EtcdVersion::V3_7] {
        let cluster = tokio::task::spawn_blocking(move || {
            EtcdCluster::start_with(EtcdOptions::default().version(version))
        })
        .await
        .unwrap();
        let leader = cluster.leader();
        let follower = (leader + 1) % EtcdCluster::SIZE;
        let leader_url = cluster.member(leader).endpoint();
        let follower_url = cluster.member(follower).endpoint();
        let mut admin = support::client(&leader_url).await;
        support::add_users(&mut admin).await;
        admin.auth_enable().await.unwrap();
        let mut admin = connect(&leader_url, "root", "rootpw").await;
        let proxy = support::start_proxy(
            follower_url.clone(),
            ["--prefix", "/app/", "--user", "cacher:pw"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
        .await;
        let mut reader = connect(&proxy.endpoint(), "reader", "pw").await;
        let mut watch = reader
            .watch("/app/a/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let r = watch.message().await.unwrap().unwrap();
        assert!(r.created() && !r.canceled(), "{version:?}: {r:?}");
        // The decision is kept: these reads are served from memory.
        for _ in 0..20 {
            reader.get("/app/a/x", None).await.unwrap();
        }

        admin
            .role_revoke_permission(
                "ro",
                "/app/a/",
                Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        let revoked = Instant::now();
        let (goal, limit) = bounds(version);
        // Cached reads end.
        let read_refused = loop {
            match reader.get("/app/a/x", None).await {
                Err(e) if e.to_string().contains("permission denied") => break revoked.elapsed(),
                Err(e) => panic!("{version:?}: {e}"),
                Ok(_) => {}
            }
            assert!(
                revoked.elapsed() < limit,
                "{version:?}: cached reads still served {limit:?} after the revocation"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The cached watch is canceled with etcd's reason.
        let left = limit.saturating_sub(revoked.elapsed());
        let r = tokio::time::timeout(left, watch.message())
            .await
            .unwrap_or_else(|_| panic!("{version:?}: the watch still ran {limit:?} after"))
            .unwrap()
            .unwrap();
        let watch_canceled = revoked.elapsed();
        assert!(r.canceled(), "{version:?}: {r:?}");
        assert!(
            r.cancel_reason().contains("permission denied"),
            "{version:?}: {}",
            r.cancel_reason()
        );
        println!(
            "{version:?}, proxy in front of a follower: cached reads refused after \
             {read_refused:?}, the cached watch canceled after {watch_canceled:?} (goal \
             {goal:?})"
        );
        // The follower itself refuses the same read as the proxy now does.
        let mut direct = connect(&follower_url, "reader", "pw").await;
        let d = direct.get("/app/a/x", None).await.unwrap_err().to_string();
        assert!(d.contains("permission denied"), "{version:?}: {d}");
        drop(cluster);
    }
}
