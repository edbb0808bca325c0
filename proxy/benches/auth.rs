//! The cost of etcd's auth through the proxy, as ratios in one run (real etcd, the real
//! proxy binary): a cached serializable Range and a cached watch create by a user with
//! read on the range, against the same with auth off, after the first ask of its
//! (token, range); the asks etcd carries for repeated reads, and for U users each
//! opening 10 watches on 10 ranges.
//!
//! `cargo bench -p etcd-cache-proxy --bench auth` (`AUTH_BENCH_USERS`, default 100;
//! `AUTH_BENCH_READS`, default 10,000; `ETCD_VERSION` picks the server).

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, Permission, WatchOptions};
use support::{auth_asks as asks, free_port, EtcdOptions, EtcdServer, Proxy};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn connect(endpoint: &str, user: Option<(&str, &str)>) -> Client {
    let mut opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
    if let Some((u, p)) = user {
        opts = opts.with_user(u, p);
    }
    Client::connect([endpoint], Some(opts)).await.unwrap()
}

struct Setup {
    _etcd: EtcdServer,
    proxy: Proxy,
    metrics: SocketAddr,
}

async fn setup(auth: bool, users: usize) -> Setup {
    let etcd = tokio::task::spawn_blocking(|| EtcdServer::start_with(EtcdOptions::default()))
        .await
        .unwrap();
    let mut admin = connect(&etcd.endpoint(), None).await;
    for r in 0..10 {
        admin.put(format!("/app/r{r}/k"), "v", None).await.unwrap();
    }
    if auth {
        admin.user_add("root", "rootpw", None).await.unwrap();
        admin.user_grant_role("root", "root").await.unwrap();
        admin.role_add("app").await.unwrap();
        admin
            .role_grant_permission("app", Permission::read("/app/").with_prefix())
            .await
            .unwrap();
        for u in ["cacher".to_string()]
            .into_iter()
            .chain((0..users).map(|i| format!("u{i}")))
        {
            admin.user_add(u.as_str(), "pw", None).await.unwrap();
            admin.user_grant_role(u.as_str(), "app").await.unwrap();
        }
        admin.auth_enable().await.unwrap();
    }
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let endpoint = etcd.endpoint();
    let m = metrics.to_string();
    let proxy = tokio::task::spawn_blocking(move || {
        let mut args = vec!["--prefix", "/app/", "--metrics-addr", &m];
        if auth {
            args.extend(["--user", "cacher:pw"]);
        }
        Proxy::start(&endpoint, &args)
    })
    .await
    .unwrap();
    Setup {
        _etcd: etcd,
        proxy,
        metrics,
    }
}

/// Mean time of `n` serializable reads of one key, after a first one.
async fn reads(c: &mut Client, n: usize) -> Duration {
    let opts = || Some(GetOptions::new().with_serializable());
    c.get("/app/r0/k", opts()).await.unwrap();
    let start = Instant::now();
    for _ in 0..n {
        c.get("/app/r0/k", opts()).await.unwrap();
    }
    start.elapsed() / n as u32
}

/// Mean time of `n` watch creates (and their `created`) on one stream, after a first.
async fn creates(c: &mut Client, n: usize) -> Duration {
    let opts = || Some(WatchOptions::new().with_prefix());
    let mut s = c.watch("/app/r1/", opts()).await.unwrap();
    s.message().await.unwrap().unwrap();
    let start = Instant::now();
    for _ in 0..n {
        s.watch("/app/r1/", opts()).await.unwrap();
        let r = s.message().await.unwrap().unwrap();
        assert!(r.created() && !r.canceled(), "{}", r.cancel_reason());
    }
    start.elapsed() / n as u32
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs benches without `--bench`: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("auth: skipped (needs `cargo bench -p etcd-cache-proxy --bench auth`)");
        return;
    }
    let users = env_or("AUTH_BENCH_USERS", 100);
    let n = env_or("AUTH_BENCH_READS", 10_000);
    let off = setup(false, 0).await;
    let on = setup(true, users).await;
    let mut anon = connect(&off.proxy.endpoint(), None).await;
    let mut user = connect(&on.proxy.endpoint(), Some(("u0", "pw"))).await;
    println!(
        "auth bench: etcd {:?}, {n} reads a round, 3 rounds alternated",
        testkit::EtcdVersion::from_env()
    );
    let mut ratios = Vec::new();
    for round in 0..3 {
        let before = asks(on.metrics);
        let t_off = reads(&mut anon, n).await;
        let t_on = reads(&mut user, n).await;
        let made = asks(on.metrics) - before;
        let c_off = creates(&mut anon, n / 10).await;
        let c_on = creates(&mut user, n / 10).await;
        let (r, c) = (
            t_on.as_secs_f64() / t_off.as_secs_f64(),
            c_on.as_secs_f64() / c_off.as_secs_f64(),
        );
        ratios.push((r, c));
        println!(
            "round {round}: cached Range {t_off:?} auth off, {t_on:?} auth on ({r:.2}x), {made} asks to etcd for {} reads; watch create {c_off:?} / {c_on:?} ({c:.2}x)",
            n + 1
        );
    }
    // U users, each 10 watches on 10 ranges: asks at most one per (user, range).
    let before = asks(on.metrics);
    let start = Instant::now();
    let mut streams = Vec::new();
    for u in 0..users {
        let mut c = connect(&on.proxy.endpoint(), Some((&format!("u{u}"), "pw"))).await;
        for r in 0..10 {
            let mut s = c
                .watch(
                    format!("/app/r{r}/"),
                    Some(WatchOptions::new().with_prefix()),
                )
                .await
                .unwrap();
            let m = s.message().await.unwrap().unwrap();
            assert!(m.created() && !m.canceled());
            streams.push(s);
        }
    }
    let made = asks(on.metrics) - before;
    println!(
        "{users} users x 10 watches on 10 ranges: {made} asks to etcd (bound: {} = one per user and range) in {:?}",
        users * 10,
        start.elapsed()
    );
    let mut sorted: Vec<f64> = ratios.iter().map(|r| r.0).collect();
    sorted.sort_by(f64::total_cmp);
    println!(
        "median cached Range ratio auth on / off: {:.2}x (goal <= 1.2x)",
        sorted[1]
    );
}
