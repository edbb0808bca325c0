//! A revoked permission on a three-member cluster, with the proxy in front of a
//! follower: etcd applies the revocation on the leader first, and the proxy's decisions
//! must follow etcd's, not the follower's view. Its cached reads and cached watches end
//! within the documented bound: on etcd >= 3.5 the auth revision, polled every
//! `--auth-check-interval` (1 s), so 2 s from the revocation; on 3.4, which has no auth
//! revision, decisions are asked again every 2 s and open watches checked every 10 s.
//! The same holds with a member that lags 1.5 s in the proxy's balance.

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

        support::revoke_reader(&mut admin).await;
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

/// The proxy balances over the leader and a follower that applies every change 1.5 s
/// late. A revocation made on the leader must end every reader's cached reads within the
/// bound, and a reader once refused must stay refused: a decision asked again after the
/// revocation may reach the lagging follower, which still allows the read (a serializable
/// ask there would be kept until the auth state moves again, that is, for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_holds_when_a_follower_lags() {
    const READERS: usize = 6;
    const LAG: Duration = Duration::from_millis(1500);
    for version in [EtcdVersion::V3_4, EtcdVersion::V3_7] {
        // Heartbeats arrive LAG late at the lagging member: an election timeout well
        // above it, so that it does not call elections (3.4 has no pre-vote).
        let opts = EtcdOptions::default()
            .version(version)
            .arg("--heartbeat-interval=250")
            .arg("--election-timeout=5000");
        let lagging = testkit::LaggingCluster::start(opts).await;
        let cluster = lagging.cluster();
        let leader = cluster.leader();
        let slow = (leader + 1) % EtcdCluster::SIZE;
        let leader_url = cluster.member(leader).endpoint();
        let slow_url = cluster.member(slow).endpoint();
        let mut admin = support::client(&leader_url).await;
        support::add_users(&mut admin).await;
        admin.auth_enable().await.unwrap();
        let mut admin = connect(&leader_url, "root", "rootpw").await;
        let proxy = support::start_proxy(
            format!("{leader_url},{slow_url}"),
            ["--prefix", "/app/", "--user", "cacher:pw"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
        .await;
        // Authenticated before the lag: an Authenticate through the lagging member
        // waits for it.
        let mut slow_root = connect(&slow_url, "root", "rootpw").await;
        let mut slow_reader = connect(&slow_url, "reader", "pw").await;
        let mut readers = Vec::new();
        for _ in 0..READERS {
            let mut r = connect(&proxy.endpoint(), "reader", "pw").await;
            for _ in 0..5 {
                r.get("/app/a/x", None).await.unwrap();
            }
            readers.push(r);
        }

        lagging.lag(slow, LAG);
        // The lag holds: a write acknowledged by the leader is not yet readable on the
        // lagging member (a serializable read answers from what it applied).
        admin.put("/app/a/lag", "1", None).await.unwrap();
        let seen = slow_root
            .get(
                "/app/a/lag",
                Some(etcd_client::GetOptions::new().with_serializable()),
            )
            .await
            .unwrap();
        assert_eq!(seen.count(), 0, "{version:?}: the member does not lag");
        // The readers' decisions are fresh: served from memory.
        for r in &mut readers {
            r.get("/app/a/x", None).await.unwrap();
        }

        // Watches opened just before the revocation. Through the lagging member a
        // create waits for the cluster's revision (a linearizable read there, LAG late
        // both ways), so some are still waiting for their `created` when the proxy learns
        // of the revocation from the leader. Each must end refused (at its create, or
        // canceled after it), none left running. (The pause only lets the creates go
        // out first; any order is a valid run.)
        let watchers: Vec<_> = readers
            .iter()
            .enumerate()
            .map(|(i, r)| tokio::spawn(watch_until_refused(version, i, r.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        support::revoke_reader(&mut admin).await;
        let revoked = Instant::now();
        // The lagging member itself still allows a serializable read: it has not applied
        // the revocation (so the decisions above had a stale member to ask).
        let stale = slow_reader
            .get(
                "/app/a/x",
                Some(etcd_client::GetOptions::new().with_serializable()),
            )
            .await;
        assert!(
            stale.is_ok(),
            "{version:?}: the lagging member refused at once: {stale:?}"
        );
        let (goal, limit) = bounds(version);
        // Each reader reads in its own task until it has been refused and LAG * 2 more
        // have passed (by then the lagging member has applied the revocation too). The
        // bound is on when the last read that was served had started (a read waits for
        // its decision's ask).
        let tasks: Vec<_> = readers
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                tokio::spawn(async move {
                    let mut refused: Option<Duration> = None;
                    let mut last_served = Duration::ZERO;
                    loop {
                        let started = revoked.elapsed();
                        match r.get("/app/a/x", None).await {
                            Err(e) if e.to_string().contains("permission denied") => {
                                refused.get_or_insert(revoked.elapsed());
                            }
                            Err(e) => panic!("{version:?}: reader {i}: {e}"),
                            Ok(_) => {
                                assert!(
                                    refused.is_none(),
                                    "{version:?}: reader {i} was refused {:?} after the \
                                     revocation, then served again by a read started {started:?} \
                                     after it (a decision asked of the lagging member)",
                                    refused.unwrap()
                                );
                                last_served = started;
                                assert!(
                                    started < limit,
                                    "{version:?}: reader {i}: cached reads still served \
                                     {started:?} after the revocation"
                                );
                            }
                        }
                        if refused.is_some_and(|at| revoked.elapsed() > at + LAG * 2) {
                            return last_served;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            })
            .collect();
        let mut last = Duration::ZERO;
        for t in tasks {
            last = last.max(t.await.unwrap());
        }
        // A watch's check is an ask: hedged (the proxy asks every member when the one
        // it picked has not answered within 150 ms), so the lagging member, which answers
        // only after a round trip to the leader LAG late both ways, does not add to it.
        // (Before the hedge, 3.4-5.9 s on 3.7.3 and 10.2 s on 3.4.23; with it about
        // 0.6 s on both.)
        let watch_limit = limit;
        let mut watches_ended = Duration::ZERO;
        let mut canceled = 0;
        for w in watchers {
            let (ended, was_created) = tokio::time::timeout(watch_limit + LAG, w)
                .await
                .unwrap_or_else(|_| panic!("{version:?}: a watch still ran {watch_limit:?} after"))
                .unwrap();
            let after = ended.saturating_duration_since(revoked);
            assert!(
                after < watch_limit,
                "{version:?}: a watch ended {after:?} after the revocation"
            );
            watches_ended = watches_ended.max(after);
            canceled += usize::from(was_created);
        }
        println!(
            "{version:?}, proxy over the leader and a member lagging {LAG:?}: the last read \
             served to any of {READERS} readers started {last:?} after the revocation \
             (goal {goal:?}); none served again once refused; {READERS} watches opened \
             at the revocation ended within {watches_ended:?} ({canceled} canceled after \
             their created, the others refused at their create)"
        );
        lagging.lag(slow, Duration::ZERO);
        drop(proxy);
        drop(lagging);
    }
}

/// Opens a watch on `/app/a/` and reads it until the proxy refuses it: at its create, or
/// by a cancel with etcd's reason. Returns when, and whether it had been created.
async fn watch_until_refused(
    version: EtcdVersion,
    i: usize,
    mut client: Client,
) -> (Instant, bool) {
    let denied = |e: &etcd_client::Error| e.to_string().contains("permission denied");
    let mut stream = match client
        .watch("/app/a/", Some(WatchOptions::new().with_prefix()))
        .await
    {
        Err(e) if denied(&e) => return (Instant::now(), false),
        Err(e) => panic!("{version:?}: watch {i}: {e}"),
        Ok(stream) => stream,
    };
    let mut created = false;
    loop {
        match stream.message().await {
            Ok(Some(m)) if m.canceled() => {
                assert!(
                    m.cancel_reason().contains("permission denied"),
                    "{version:?}: watch {i} canceled with {:?}",
                    m.cancel_reason()
                );
                return (Instant::now(), created);
            }
            Ok(Some(m)) => created |= m.created(),
            Ok(None) => panic!("{version:?}: watch {i} ended without a cancel"),
            Err(e) if denied(&e) => return (Instant::now(), created),
            Err(e) => panic!("{version:?}: watch {i}: {e}"),
        }
    }
}
