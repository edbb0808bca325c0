//! What following etcd's auth state costs etcd and the proxy: an idle proxy writes
//! nothing to etcd's raft log (its auth-state poll is a read), and a flood of distinct
//! garbage tokens with long keys grows the proxy no further than `--auth-cache-bytes`,
//! while another client's cached reads keep their latency.

mod raw;
mod support;

use std::time::{Duration, Instant};

use etcd_client::{Client, Permission};
use raw::etcdserverpb::{kv_client::KvClient, RangeRequest};
use support::{start_etcd, start_proxy, EtcdOptions};
use testkit::EtcdVersion;

/// Users `root` (root) and `cacher` (read on /app/, the proxy's user), then auth on.
async fn enable_auth(admin: &mut Client) {
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("cacher", "pw", None).await.unwrap();
    admin.role_add("cache").await.unwrap();
    admin
        .role_grant_permission("cache", Permission::read("/app/").with_prefix())
        .await
        .unwrap();
    admin.user_grant_role("cacher", "cache").await.unwrap();
    admin.auth_enable().await.unwrap();
}

/// etcd's raft index, as its Status reports it.
async fn raft_index(c: &mut Client) -> u64 {
    c.status().await.unwrap().raft_index()
}

/// etcd's raft index does not move while a proxy in front of it is idle: not with auth
/// off, not with auth on (its own user feeding the cache, no client), over many polls of
/// etcd's auth state (`--auth-check-interval 100ms`), on 3.4 (no `AuthStatus`) and 3.7
/// (where `AuthStatus`, which the poll asked before, is a raft request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_proxy_writes_nothing_to_etcds_raft_log() {
    for (version, auth) in [
        (EtcdVersion::V3_4, false),
        (EtcdVersion::V3_4, true),
        (EtcdVersion::V3_7, false),
        (EtcdVersion::V3_7, true),
    ] {
        let etcd = start_etcd(EtcdOptions::default().version(version)).await;
        let mut admin = support::client(&etcd.endpoint()).await;
        admin.put("/app/a", "1", None).await.unwrap();
        let mut args = vec!["--prefix", "/app/", "--auth-check-interval", "100ms"];
        if auth {
            enable_auth(&mut admin).await;
            admin = etcd_client::Client::connect(
                [etcd.endpoint()],
                Some(etcd_client::ConnectOptions::new().with_user("root", "rootpw")),
            )
            .await
            .unwrap();
            args.extend(["--user", "cacher:pw"]);
        }
        let proxy = start_proxy(
            etcd.endpoint(),
            args.iter().map(|s| s.to_string()).collect(),
        )
        .await;
        // No client call: one served from memory (a refusal included) is a decision kept
        // for 10 s, during which the proxy follows etcd's auth revision (AuthStatus, a
        // raft request on 3.5+); it is not idle then. The cache's version probe of each
        // member (which authenticates, a raft request) is the last of its start.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !proxy.log_text().contains("server versions") {
            assert!(Instant::now() < deadline, "{}", proxy.log_tail());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before = raft_index(&mut admin).await;
        // 30 polls of etcd's auth state; AuthStatus, a raft request, would show in it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = raft_index(&mut admin).await;
        assert_eq!(
            after,
            before,
            "etcd {version}, auth {auth}: etcd's raft index moved while the proxy was idle:\n{}",
            proxy.log_tail()
        );
    }
}

/// Keys of the garbage-token flood.
const KEY_BYTES: usize = 256 << 10;
/// Distinct garbage tokens of the flood.
const TOKENS: usize = 512;

/// Distinct garbage tokens, each with a 256 KiB key inside the cached prefix: etcd
/// refuses each, and the proxy keeps each refusal, within `--auth-cache-bytes` (8 MiB
/// here); without a bound in bytes the proxy grew by the keys it kept (128 MiB here).
/// Meanwhile another client's cached reads stay answered; their p99 is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_tokens_with_long_keys_stay_within_the_decision_bound() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut admin = support::client(&etcd.endpoint()).await;
    admin.put("/app/a", "1", None).await.unwrap();
    enable_auth(&mut admin).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        [
            "--prefix",
            "/app/",
            "--user",
            "cacher:pw",
            "--auth-cache-bytes",
            "8388608",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    )
    .await;
    let pid = proxy.pid().unwrap();
    let token = {
        let mut a =
            raw::etcdserverpb::auth_client::AuthClient::new(raw::channel(&etcd.endpoint()).await);
        a.authenticate(raw::etcdserverpb::AuthenticateRequest {
            name: "cacher".into(),
            password: "pw".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token
    };
    // The other client: cached reads with a good token, timed.
    let endpoint = proxy.endpoint();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let mut kv = KvClient::new(raw::channel(&endpoint).await);
        let mut lat = Vec::new();
        loop {
            let req = raw::with_tokens(
                RangeRequest {
                    key: b"/app/a".to_vec().into(),
                    serializable: true,
                    ..Default::default()
                },
                &[&token],
            );
            let t = Instant::now();
            let r = kv.range(req).await;
            lat.push(t.elapsed());
            assert!(r.is_ok(), "{r:?}");
            if stop_rx.try_recv().is_ok() {
                return lat;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });

    let mut kv = KvClient::new(raw::channel(&proxy.endpoint()).await);
    let long_key: Vec<u8> = [b"/app/".as_slice(), &vec![b'k'; KEY_BYTES]].concat();
    let warm = support::rss_kib(pid);
    let mut refusals = 0;
    for i in 0..TOKENS {
        let req = raw::with_tokens(
            RangeRequest {
                key: long_key.clone().into(),
                serializable: true,
                ..Default::default()
            },
            // No `.`: etcd reads `x.N` as a simple token and waits for raft index N.
            &[&format!("garbage-{i}")],
        );
        let r = kv.range(req).await;
        assert!(
            raw::outcome(&r).contains("invalid auth token"),
            "{}",
            raw::outcome(&r)
        );
        refusals += 1;
    }
    let grown_mib = support::rss_kib(pid).saturating_sub(warm) / 1024;
    let _ = stop_tx.send(());
    let mut lat = reader.await.unwrap();
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100];
    println!(
        "{refusals} garbage tokens with {} KiB keys: the proxy grew {grown_mib} MiB \
         (--auth-cache-bytes 8 MiB); another client's cached reads: {} reads, p50 {:?}, \
         p99 {p99:?}",
        KEY_BYTES >> 10,
        lat.len(),
        lat[lat.len() / 2]
    );
    // 128 MiB of keys were refused; what is kept is 8 MiB, the rest is the allocator's
    // slack for requests in flight.
    assert!(
        grown_mib < 64,
        "the proxy grew {grown_mib} MiB under {TOKENS} garbage tokens with long keys"
    );
}
