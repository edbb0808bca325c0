//! Reliability: a checker that records every response every subscriber receives and
//! checks it against etcd's own history, under faults.
//!
//! Guarantees checked per subscriber (see testkit's `reliability::checker`): ordered, unique,
//! reliable (no gap), atomic, resumable, bookmarkable, plus prev_kv == etcd's previous
//! value, filters, ranges, and `cache.get` at a revision == etcd's state at it.
//!
//! Every test runs a seeded random workload. The seed is printed; replay one with
//! `ETCD_CACHE_SEED=<seed> cargo test --test reliability <name> -- --nocapture`
//! (the operations replay exactly; the timing of faults against them does not).
//!
//! The `#[ignore]`d `soak` test loops over every fault for `ETCD_CACHE_SOAK_SECS`
//! seconds (default 600): `cargo xtask soak --duration 600`.

use std::sync::Arc;
use std::time::Duration;

use etcd_cache::{Error, GetOptions, WatchOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{sleep, Instant};

use testkit::reliability::checker::{Class, Violation};
use testkit::reliability::run::{connect, seed, Cfg, Run, Summary};
use testkit::{EtcdCluster, EtcdOptions, EtcdServer, TcpProxy};

/// How long the workload runs under faults in the default (short) run.
const SHORT: Duration = Duration::from_secs(12);
/// Slack on top of the workload for start, heal, drain and check.
const SLACK: Duration = Duration::from_secs(150);

fn etcd_options() -> EtcdOptions {
    EtcdOptions::default().progress_notify_interval(Duration::from_millis(500))
}

fn rand_dur(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo_ms..=hi_ms))
}

// ---------------------------------------------------------------------------------------
// Scenarios (shared by the short tests and the soak)
// ---------------------------------------------------------------------------------------

/// kill -9 and restart a single etcd in the middle of a write burst, repeatedly.
async fn kill9_single(seed: u64, dur: Duration) -> Summary {
    let etcd = testkit::blocking(|| EtcdServer::start_with(etcd_options())).await;
    let ep = etcd.endpoint();
    let etcd = Arc::new(std::sync::Mutex::new(etcd));
    let client = connect(std::slice::from_ref(&ep)).await;
    let mut run = Run::start(Cfg::new("kill9_single_etcd", seed), vec![ep], client).await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    let end = Instant::now() + dur;
    sleep(Duration::from_secs(1)).await;
    while Instant::now() < end {
        sleep(rand_dur(&mut rng, 300, 1500)).await;
        let e = etcd.clone();
        testkit::blocking(move || e.lock().unwrap().kill()).await;
        run.faults += 1;
        sleep(rand_dur(&mut rng, 200, 1500)).await;
        let e = etcd.clone();
        testkit::blocking(move || e.lock().unwrap().restart()).await;
    }
    sleep(Duration::from_secs(1)).await;
    let s = run.finish().await;
    drop(etcd);
    s
}

/// Three members: kill the member carrying the cache's watch, restart it, then kill the
/// leader and restart it, while writes continue through the survivors.
async fn cluster_failover(seed: u64, dur: Duration) -> Summary {
    let cluster = testkit::blocking(|| EtcdCluster::start_with(etcd_options())).await;
    let direct = cluster.endpoints();
    let cluster = Arc::new(std::sync::Mutex::new(cluster));
    // One forwarder per member, only to see which member the cache's watch uses.
    let mut proxies = Vec::new();
    for ep in &direct {
        proxies.push(TcpProxy::start(ep).await);
    }
    let via: Vec<String> = proxies.iter().map(TcpProxy::endpoint).collect();
    let client = connect(&via).await;
    let mut run = Run::start(Cfg::new("cluster_failover", seed), direct.clone(), client).await;
    let quarter = dur / 4;
    sleep(Duration::from_secs(2)).await;

    // The member whose forwarder carries the most bytes while only writes happen is the
    // one the cache's watch stream is on.
    let before: Vec<u64> = proxies.iter().map(TcpProxy::bytes_forwarded).collect();
    sleep(Duration::from_secs(1)).await;
    let deltas: Vec<u64> = proxies
        .iter()
        .zip(&before)
        .map(|(p, b)| p.bytes_forwarded() - b)
        .collect();
    let watched = (0..deltas.len()).max_by_key(|&i| deltas[i]).unwrap();
    println!("cluster_failover: bytes per member {deltas:?}; the cache watches member {watched}");

    let without = |i: usize| -> Vec<String> {
        direct
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, e)| e.clone())
            .collect()
    };
    for step in 0..2 {
        let victim = if step == 0 {
            watched
        } else {
            let c = cluster.clone();
            testkit::blocking(move || c.lock().unwrap().leader()).await
        };
        println!(
            "cluster_failover: kill -9 member {victim} ({})",
            if step == 0 {
                "the cache's"
            } else {
                "the leader"
            }
        );
        run.set_direct(without(victim));
        let c = cluster.clone();
        testkit::blocking(move || c.lock().unwrap().kill(victim)).await;
        run.faults += 1;
        sleep(quarter).await;
        let c = cluster.clone();
        testkit::blocking(move || c.lock().unwrap().restart(victim)).await;
        run.set_direct(direct.clone());
        sleep(quarter).await;
    }
    let s = run.finish().await;
    drop(proxies);
    drop(cluster);
    s
}

/// A forwarder between the cache and etcd drops every connection, black-holes traffic
/// for a while, or refuses new connections for a while.
async fn proxy_faults(seed: u64, dur: Duration) -> Summary {
    let etcd = testkit::blocking(|| EtcdServer::start_with(etcd_options())).await;
    let proxy = TcpProxy::start(etcd.client_addr()).await;
    let client = connect(&[proxy.endpoint()]).await;
    let mut cfg = Cfg::new("proxy_drops_and_blackholes", seed);
    cfg.churn_every = Some(Duration::from_millis(80));
    let mut run = Run::start(cfg, vec![etcd.endpoint()], client).await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb1ac);
    let end = Instant::now() + dur;
    sleep(Duration::from_millis(500)).await;
    while Instant::now() < end {
        match rng.random_range(0..3) {
            0 => proxy.drop_all_connections(),
            1 => {
                proxy.set_blackhole(true);
                sleep(rand_dur(&mut rng, 500, 3000)).await;
                proxy.set_blackhole(false);
            }
            _ => {
                proxy.set_refuse(true);
                proxy.drop_all_connections();
                sleep(rand_dur(&mut rng, 200, 1500)).await;
                proxy.set_refuse(false);
            }
        }
        run.faults += 1;
        sleep(rand_dur(&mut rng, 300, 1500)).await;
    }
    sleep(Duration::from_secs(1)).await;
    let s = run.finish().await;
    println!(
        "proxy_drops_and_blackholes: proxy accepted {} connections, dropped {}, refused {}",
        proxy.accepted(),
        proxy.dropped(),
        proxy.refused()
    );
    drop(etcd);
    s
}

/// Compaction while the cache is disconnected: its resume revision is gone, it must
/// re-list; subscribers continue or end with Compacted, never with a silent gap.
async fn compaction_while_disconnected(seed: u64, dur: Duration) -> Summary {
    let etcd = testkit::blocking(|| EtcdServer::start_with(etcd_options())).await;
    let proxy = TcpProxy::start(etcd.client_addr()).await;
    let client = connect(&[proxy.endpoint()]).await;
    let mut cfg = Cfg::new("compaction_while_disconnected", seed);
    cfg.relist_expected = true;
    cfg.history_window = 256;
    cfg.churn_every = Some(Duration::from_millis(80));
    let mut run = Run::start(cfg, vec![etcd.endpoint()], client).await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc0c0);
    let rounds = (dur.as_secs() / 4).max(2);
    sleep(Duration::from_secs(1)).await;
    let lists_before = run.cache.stats().lists;
    for _ in 0..rounds {
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        run.faults += 1;
        sleep(rand_dur(&mut rng, 500, 1500)).await;
        let rev = run.etcd_revision().await;
        run.truth.wait_for(rev, Duration::from_secs(20)).await;
        let mut c = run.direct_client().await;
        c.compact(
            rev,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .expect("compact");
        sleep(rand_dur(&mut rng, 100, 500)).await;
        proxy.set_refuse(false);
        run.cache
            .wait_ready_timeout(Duration::from_secs(30))
            .await
            .expect("ready after the compaction");
        sleep(rand_dur(&mut rng, 1000, 2500)).await;
    }
    let relists = run.cache.stats().lists - lists_before;
    println!("compaction_while_disconnected: {relists} re-lists in {rounds} rounds");
    if relists < rounds {
        run.violations.lock().push(Violation {
            guarantee: "resumable",
            sub: None,
            detail: format!(
                "only {relists} re-lists after {rounds} compactions of the resume revision"
            ),
        });
    }
    let s = run.finish().await;
    drop(etcd);
    s
}

/// Capacity-1 subscribers: stuck (never polled), slow (one message a second) next to
/// fast ones, with a small history window.
async fn slow_and_stuck(seed: u64, dur: Duration) -> Summary {
    let etcd = testkit::blocking(|| EtcdServer::start_with(etcd_options())).await;
    let client = connect(&[etcd.endpoint()]).await;
    let mut cfg = Cfg::new("slow_and_stuck_subscribers", seed);
    cfg.subscriber_buffer = 1;
    cfg.history_window = 128;
    cfg.fixed = vec![(Class::Fast, 4), (Class::Slow, 3), (Class::Stuck, 3)];
    cfg.write_pause = Duration::from_millis(4);
    let run = Run::start(cfg, vec![etcd.endpoint()], client).await;
    sleep(dur).await;
    let s = run.finish().await;
    println!(
        "slow_and_stuck_subscribers: {} of {} stuck subscribers ended with Compacted",
        s.stuck_compacted, s.stuck
    );
    // Far more than a window of revisions passed: a stuck subscriber cannot still be
    // served (that would mean the cache kept history for it beyond its window).
    if s.revisions > 4 * 128 {
        assert_eq!(
            s.stuck_compacted, s.stuck,
            "seed {seed}: stuck subscribers must leave the window with Compacted"
        );
    }
    drop(etcd);
    s
}

/// Every invalid range and revision form, and the watch limits, fired at a live cache
/// while subscribers are checked.
async fn bad_input(seed: u64, dur: Duration) -> Summary {
    const LIMIT: usize = 24;
    let etcd = testkit::blocking(|| EtcdServer::start_with(etcd_options())).await;
    let client = connect(&[etcd.endpoint()]).await;
    let mut cfg = Cfg::new("bad_input", seed);
    cfg.churn_every = None;
    cfg.max_watchers = LIMIT;
    let mut run = Run::start(cfg, vec![etcd.endpoint()], client).await;
    let cache = run.cache.clone();
    sleep(Duration::from_millis(500)).await;
    let mut bad = Vec::new();
    let end = Instant::now() + dur;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Want {
        Invalid,
        OutOfRange,
        Future,
        Compacted,
    }
    fn kind(e: &Error) -> Option<Want> {
        match e {
            Error::InvalidRange { .. } => Some(Want::Invalid),
            Error::OutOfRange { .. } => Some(Want::OutOfRange),
            Error::FutureRevision { .. } => Some(Want::Future),
            Error::Compacted { .. } => Some(Want::Compacted),
            _ => None,
        }
    }
    // (key, watch options, get options, expected error)
    type Case = (&'static str, Option<WatchOptions>, GetOptions, Want);
    let cases: Vec<Case> = vec![
        (
            "",
            Some(WatchOptions::new()),
            GetOptions::new(),
            Want::Invalid,
        ),
        (
            "",
            Some(WatchOptions::new().with_range("/rel/z")),
            GetOptions::new().with_range("/rel/z"),
            Want::Invalid,
        ),
        (
            "/rel/b",
            Some(WatchOptions::new().with_range("/rel/a")),
            GetOptions::new().with_range("/rel/a"),
            Want::Invalid,
        ),
        (
            "/rel/b",
            Some(WatchOptions::new().with_range("/rel/b")),
            GetOptions::new().with_range("/rel/b"),
            Want::Invalid,
        ),
        (
            "/rel/a",
            Some(WatchOptions::new().with_range("")),
            GetOptions::new().with_range(""),
            Want::Invalid,
        ),
        (
            "/rel/a",
            Some(WatchOptions::new().with_start_revision(-1)),
            GetOptions::new().with_revision(-1),
            Want::Invalid,
        ),
        (
            "/rel/a",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(i64::MIN),
            ),
            GetOptions::new().with_prefix().with_revision(i64::MIN),
            Want::Invalid,
        ),
        (
            "/rel/a",
            None,
            GetOptions::new().with_limit(-1),
            Want::Invalid,
        ),
        (
            "/other",
            Some(WatchOptions::new()),
            GetOptions::new(),
            Want::OutOfRange,
        ),
        (
            "/re",
            Some(WatchOptions::new().with_prefix()),
            GetOptions::new().with_prefix(),
            Want::OutOfRange,
        ),
        (
            "/rel",
            Some(WatchOptions::new()),
            GetOptions::new(),
            Want::OutOfRange,
        ),
        (
            "/rel/a",
            Some(WatchOptions::new().with_from_key()),
            GetOptions::new().with_from_key(),
            Want::OutOfRange,
        ),
        (
            "",
            Some(WatchOptions::new().with_all_keys()),
            GetOptions::new().with_all_keys(),
            Want::OutOfRange,
        ),
        (
            "",
            Some(WatchOptions::new().with_prefix()),
            GetOptions::new().with_prefix(),
            Want::OutOfRange,
        ),
        (
            "/rel/a",
            Some(WatchOptions::new().with_range("/rem")),
            GetOptions::new().with_range("/rem"),
            Want::OutOfRange,
        ),
        (
            "/rel/a",
            Some(WatchOptions::new().with_range("\0")),
            GetOptions::new().with_range("\0"),
            Want::OutOfRange,
        ),
        (
            "/rek",
            Some(WatchOptions::new().with_range("/rel/b")),
            GetOptions::new().with_range("/rel/b"),
            Want::OutOfRange,
        ),
    ];
    let mut rounds = 0u64;
    while Instant::now() < end {
        rounds += 1;
        let watchers_before = cache.watcher_count();
        for (key, wo, go, want) in &cases {
            if let Some(wo) = wo {
                match cache.watch(*key, Some(wo.clone())).await {
                    Err(e) if kind(&e) == Some(*want) && !e.to_string().is_empty() => {}
                    other => bad.push(format!(
                        "watch({key:?}, {wo:?}): want {want:?}, got {:?}",
                        other.map(|_| "a stream")
                    )),
                }
            }
            for serializable in [false, true] {
                let go = if serializable {
                    go.clone().with_serializable()
                } else {
                    go.clone()
                };
                match cache.get(*key, Some(go.clone())).await {
                    Err(e) if kind(&e) == Some(*want) && !e.to_string().is_empty() => {}
                    other => bad.push(format!(
                        "get({key:?}, {go:?}): want {want:?}, got {:?}",
                        other.map(|r| r.revision())
                    )),
                }
            }
            run.faults += 1;
        }
        // Revisions: in the future (get), below the window (get and watch).
        let current = run.etcd_revision().await;
        for serializable in [false, true] {
            for rev in [current + 1_000_000, i64::MAX] {
                let mut go = GetOptions::new().with_prefix().with_revision(rev);
                if serializable {
                    go = go.with_serializable();
                }
                match cache.get("/rel/", Some(go)).await {
                    Err(Error::FutureRevision { requested, .. }) if requested == rev => {}
                    other => bad.push(format!(
                        "get at future {rev}: want FutureRevision, got {:?}",
                        other.map(|r| r.revision())
                    )),
                }
                run.faults += 1;
            }
            let (floor, _) = cache.history_span();
            if floor > 2 {
                let mut go = GetOptions::new().with_prefix().with_revision(1);
                if serializable {
                    go = go.with_serializable();
                }
                match cache.get("/rel/", Some(go)).await {
                    Err(Error::Compacted { compact_revision }) if compact_revision > 1 => {}
                    other => bad.push(format!(
                        "get at 1 (floor {floor}): want Compacted, got {:?}",
                        other.map(|r| r.revision())
                    )),
                }
                run.faults += 1;
            }
        }
        let (floor, _) = cache.history_span();
        if floor > 2 {
            match cache
                .watch(
                    "/rel/",
                    Some(WatchOptions::new().with_prefix().with_start_revision(1)),
                )
                .await
            {
                Ok(mut s) => {
                    let created = s.message().await;
                    if !matches!(&created, Ok(Some(r)) if r.created()) {
                        bad.push(format!("watch from 1: want created first, got {created:?}"));
                    }
                    match s.message().await {
                        Ok(Some(r)) if r.canceled() && r.compact_revision() > 1 => {
                            if !matches!(s.message().await, Ok(None)) {
                                bad.push("a compacted watch did not end after its canceled response".into());
                            }
                        }
                        other => bad.push(format!(
                            "watch from 1 (floor {floor}): want canceled with compact_revision, got {other:?}"
                        )),
                    }
                }
                Err(e) => bad.push(format!(
                    "watch from 1: want a stream that yields Compacted, got {e}"
                )),
            }
            run.faults += 1;
        }
        // A far-future start revision is valid: created, then nothing.
        match cache
            .watch(
                "/rel/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(i64::MAX),
                ),
            )
            .await
        {
            Ok(mut s) => match s.message().await {
                Ok(Some(r)) if r.created() => {}
                other => bad.push(format!("watch from i64::MAX: want created, got {other:?}")),
            },
            Err(e) => bad.push(format!("watch from i64::MAX: {e}")),
        }
        // Failed calls hold no slot.
        let after = cache.watcher_count();
        if after != watchers_before {
            bad.push(format!(
                "watcher count {watchers_before} before the bad calls, {after} after"
            ));
        }
        // The cache-wide limit.
        let mut held = Vec::new();
        let limit_err = loop {
            match cache.watch("/rel/a/0", None).await {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            if held.len() > LIMIT {
                break Error::Closed;
            }
        };
        match &limit_err {
            Error::WatchLimit { limit } if *limit == LIMIT => {
                let text = limit_err.to_string();
                if text != format!("at most {LIMIT} watches are allowed") {
                    bad.push(format!("WatchLimit says {text:?}"));
                }
            }
            other => bad.push(format!(
                "past {LIMIT} watches: want WatchLimit, got {other:?} after {}",
                held.len()
            )),
        }
        if cache.watcher_count() != LIMIT {
            bad.push(format!(
                "{} watchers open at the limit {LIMIT}",
                cache.watcher_count()
            ));
        }
        held.pop();
        if cache.watch("/rel/a/0", None).await.is_err() {
            bad.push("a watch under the limit (after one was dropped) failed".into());
        }
        drop(held);
        run.faults += 1;
        // A scope's limit; dropping the scope ends its streams.
        let scope = cache.scope(2);
        let a = scope.watch("/rel/a/1", None).await;
        let b = scope.watch("/rel/a/2", None).await;
        match scope.watch("/rel/a/3", None).await {
            Err(Error::WatchLimit { limit: 2 }) => {}
            other => bad.push(format!(
                "third watch in a scope of 2: {:?}",
                other.map(|_| "a stream")
            )),
        }
        drop(scope);
        for s in [a, b] {
            match s {
                Ok(mut s) => {
                    let ended = tokio::time::timeout(Duration::from_secs(5), async {
                        loop {
                            match s.message().await {
                                Ok(Some(_)) => continue,
                                other => return other.is_ok(),
                            }
                        }
                    })
                    .await;
                    if ended != Ok(true) {
                        bad.push(format!("a scoped stream did not end with None when its scope was dropped: {ended:?}"));
                    }
                }
                Err(e) => bad.push(format!("scoped watch failed: {e}")),
            }
        }
        run.faults += 1;
        if cache.watcher_count() != watchers_before {
            bad.push(format!(
                "watcher count {} after the limit checks, {watchers_before} before",
                cache.watcher_count()
            ));
        }
        sleep(Duration::from_millis(200)).await;
    }
    println!("bad_input: {rounds} rounds, {} bad requests", run.faults);
    bad.dedup();
    for b in bad {
        run.violations.lock().push(Violation {
            guarantee: "bad input",
            sub: None,
            detail: b,
        });
    }
    let s = run.finish().await;
    drop(etcd);
    s
}

// ---------------------------------------------------------------------------------------
// The short tests (the default `cargo test` run)
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_single_etcd_mid_write_burst() {
    testkit::init_tracing();
    testkit::bounded(SHORT + SLACK, kill9_single(seed(), SHORT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_kill_watched_member_then_leader() {
    testkit::init_tracing();
    testkit::bounded(SHORT + SLACK, cluster_failover(seed(), SHORT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_connection_drops_and_blackholes() {
    testkit::init_tracing();
    testkit::bounded(SHORT + SLACK, proxy_faults(seed(), SHORT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_cache_disconnected() {
    testkit::init_tracing();
    testkit::bounded(SHORT + SLACK, compaction_while_disconnected(seed(), SHORT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_stuck_subscribers_next_to_fast_ones() {
    testkit::init_tracing();
    testkit::bounded(SHORT + SLACK, slow_and_stuck(seed(), SHORT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_at_a_live_cache() {
    testkit::init_tracing();
    testkit::bounded(SHORT + SLACK, bad_input(seed(), Duration::from_secs(5))).await;
}

// ---------------------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------------------

/// Every scenario in turn, each round with a new seed, for `ETCD_CACHE_SOAK_SECS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long soak: `cargo xtask soak` (ETCD_CACHE_SOAK_SECS)"]
async fn soak() {
    testkit::init_tracing();
    let secs: u64 = std::env::var("ETCD_CACHE_SOAK_SECS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(600);
    let base = seed();
    println!("soak: {secs} s, base seed {base}");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut summaries: Vec<Summary> = Vec::new();
    let mut round = 0u64;
    while Instant::now() < deadline {
        let left = deadline - Instant::now();
        let dur = left
            .min(Duration::from_secs(60))
            .max(Duration::from_secs(5));
        let seed = base.wrapping_add(round);
        let limit = dur + SLACK;
        let s = match round % 6 {
            0 => testkit::bounded(limit, kill9_single(seed, dur)).await,
            1 => testkit::bounded(limit, cluster_failover(seed, dur)).await,
            2 => testkit::bounded(limit, proxy_faults(seed, dur)).await,
            3 => testkit::bounded(limit, compaction_while_disconnected(seed, dur)).await,
            4 => testkit::bounded(limit, slow_and_stuck(seed, dur)).await,
            _ => testkit::bounded(limit, bad_input(seed, dur.min(Duration::from_secs(20)))).await,
        };
        summaries.push(s);
        round += 1;
    }
    println!(
        "soak: {} rounds in {:.0} s",
        summaries.len(),
        started.elapsed().as_secs_f64()
    );
    println!("| fault | runs | events checked | subscribers | faults injected | violations |");
    println!("|---|---|---|---|---|---|");
    let mut names: Vec<&str> = summaries.iter().map(|s| s.name).collect();
    names.dedup();
    names.sort();
    names.dedup();
    for name in names {
        let of: Vec<&Summary> = summaries.iter().filter(|s| s.name == name).collect();
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            of.len(),
            of.iter().map(|s| s.events_checked).sum::<u64>(),
            of.iter().map(|s| s.subscribers).sum::<usize>(),
            of.iter().map(|s| s.faults).sum::<u64>(),
            of.iter().map(|s| s.violations).sum::<usize>(),
        );
    }
}
