//! A rolling upgrade, the path etcd supports: three members of 3.4.23 (Debian's) moved one
//! at a time to 3.5.35 (stopped, restarted on the new binary with the same data dir and
//! ports), while caches, subscribers and readers run.
//!
//! - The reliability run (testkit's `reliability::run`) drives a seeded workload on `/rel/` with
//!   fixed and churning subscribers and readers, and checks every response against etcd's
//!   own history (order, gaps, duplicates, atomic revisions, prev_kv, reads at revisions).
//! - A second cache on the quiet prefix `/quiet/` is read (consistent reads) throughout, each
//!   answer compared with etcd's at the answer's revision and with the last acknowledged
//!   write; its `stats()` say whether each read was answered from memory or by etcd.
//! - While any member runs 3.4.23 the cache must not trust `RequestProgress` answers; once
//!   every member runs 3.5.35 it must reach the fast path without a restart, within the
//!   probe's refresh (30 s) and a margin.
//!
//! Needs both versions: Debian's etcd 3.4.23 and the Go-built 3.5 (`cargo xtask etcd-bins`,
//! or `ETCD_CACHE_ETCD_DIR`); `ETCD_VERSION` and `ETCD_BIN` do not apply here. Outside
//! `--full-matrix` it is not run when 3.5 is not built (the default `cargo xtask test`
//! builds only 3.7).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_cache::{Cache, GetOptions};
use etcd_client::Client;
use parking_lot::Mutex;
use testkit::reliability::run::{connect, seed, Cfg, Run};
use testkit::{EtcdBinaries, EtcdCluster, EtcdOptions, EtcdVersion};

/// The whole test, even when something hangs.
const TEST_LIMIT: Duration = Duration::from_secs(170);
/// The version probe refreshes every 30 s; this is its refresh and a margin for the probe
/// itself and a loaded machine.
const FAST_PATH_WITHIN: Duration = Duration::from_secs(45);
/// How long the workload runs in each mixed state, and on the fast path at the end.
const DWELL: Duration = Duration::from_secs(3);

/// One consistent read of the quiet cache.
#[derive(Debug, Clone, Copy)]
struct Read {
    /// Members on the new version when the read started and when it ended.
    upgraded: (usize, usize),
    /// The cache's trust in progress answers before and after the read.
    trusted: (bool, bool),
    /// Answered by etcd (the cache's fallback counter moved).
    from_etcd: bool,
    /// The cache followed etcd for the whole read: ready before and after, and no
    /// reconnect in between. A read while the cache's watch reconnects (after the
    /// member it followed restarted) goes to etcd, trusted or not: etcd answers what
    /// the cache cannot prove current.
    following: bool,
}

#[derive(Default)]
struct Reads {
    done: Mutex<Vec<Read>>,
    /// Reads that returned an error (a member was stopped); never a wrong answer.
    errors: AtomicUsize,
    /// Answers compared with etcd's.
    checked: AtomicUsize,
}

/// The rows of a read, as both sides report them.
fn rows_cache(kvs: &[etcd_cache::KeyValue]) -> Vec<(Vec<u8>, Vec<u8>, i64, i64)> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

fn rows_etcd(kvs: &[etcd_client::KeyValue]) -> Vec<(Vec<u8>, Vec<u8>, i64, i64)> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

/// Retries `f` on etcd errors for a while (members restart during the test).
async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let failure = match tokio::time::timeout(Duration::from_secs(3), f()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out after 3 s".to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "{what} kept failing for 30 s: {failure}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the quiet cache until stopped: a write outside the prefix (acknowledged), now and
/// then one inside it, then a consistent read checked against that write and against etcd's
/// answer at the read's revision.
async fn quiet_reader(
    cache: Cache,
    client: Client,
    upgraded: Arc<AtomicUsize>,
    reads: Arc<Reads>,
    stop: Arc<AtomicBool>,
) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        if i.is_multiple_of(40) {
            retry("a write inside the quiet prefix", || {
                let mut c = client.clone();
                let key = format!("/quiet/k{}", i % 4);
                async move { c.put(key, i.to_string(), None).await }
            })
            .await;
        }
        let acked = retry("a write outside the prefix", || {
            let mut c = client.clone();
            async move { c.put("/noise/before-read", i.to_string(), None).await }
        })
        .await
        .header()
        .unwrap()
        .revision();
        let before = cache.stats();
        let ready_before = cache.is_ready();
        let up_before = upgraded.load(Ordering::SeqCst);
        let resp = tokio::time::timeout(
            Duration::from_secs(10),
            cache.get("/quiet/", Some(GetOptions::new().with_prefix())),
        )
        .await
        .expect("a consistent read hung for 10 s");
        let ready_after = cache.is_ready();
        let after = cache.stats();
        let up_after = upgraded.load(Ordering::SeqCst);
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                // etcd could not answer (the member it asked is being replaced): an error,
                // not a wrong answer.
                tracing::info!(error = %e, "quiet read failed");
                reads.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let at = resp.revision();
        assert!(
            at >= acked,
            "stale read: at {at}, a write was acknowledged at {acked} before it ({} of 3 members upgraded)",
            up_before
        );
        let want = retry("etcd's read at the revision", || {
            let mut c = client.clone();
            async move {
                c.get(
                    "/quiet/",
                    Some(
                        etcd_client::GetOptions::new()
                            .with_prefix()
                            .with_revision(at),
                    ),
                )
                .await
            }
        })
        .await;
        assert_eq!(
            rows_cache(resp.kvs()),
            rows_etcd(want.kvs()),
            "wrong read at revision {at}"
        );
        reads.checked.fetch_add(1, Ordering::Relaxed);
        reads.done.lock().push(Read {
            upgraded: (up_before, up_after),
            trusted: (before.progress_trusted, after.progress_trusted),
            from_etcd: after.fallback_reads > before.fallback_reads,
            following: ready_before && ready_after && before.connects == after.connects,
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_3_4_to_3_5_safe_path_then_fast_path() {
    testkit::init_tracing();
    // `cargo xtask test` builds only 3.7 of the Go versions (a newcomer's run); this runs
    // where 3.5 is built (`cargo xtask etcd-bins 3.5`) and always in `--full-matrix`
    // (CI's run, which fails here if 3.5 is missing).
    if !testkit::full_matrix()
        && !testkit::etcd_versions::etcd_dir()
            .join("3.5")
            .join("etcd")
            .exists()
    {
        println!(
            "rolling upgrade not run: etcd 3.5 is not built (`cargo xtask etcd-bins 3.5`, or \
             `cargo xtask test --full-matrix`)"
        );
        return;
    }
    testkit::bounded(TEST_LIMIT, async {
        let old = EtcdBinaries::exact(EtcdVersion::V3_4);
        let new = EtcdBinaries::exact(EtcdVersion::V3_5);
        let (from, to) = (old.describe(), new.describe());
        println!("rolling upgrade: {from} -> {to}");
        let cluster = testkit::blocking(move || {
            EtcdCluster::start_with(EtcdOptions::default().binaries(old))
        })
        .await;
        let endpoints = cluster.endpoints();
        let cluster = Arc::new(std::sync::Mutex::new(cluster));

        // The checked workload with its own cache on /rel/.
        let mut run = Run::start(
            Cfg::new("rolling_upgrade", seed()),
            endpoints.clone(),
            connect(&endpoints).await,
        )
        .await;
        // The quiet cache and its reader.
        let direct = connect(&endpoints).await;
        let quiet = testkit::ready_cache(connect(&endpoints).await, |b| b.prefix("/quiet/")).await;
        assert!(
            !testkit::wait_for_version_verdict(&quiet).await,
            "3.4.23 everywhere: untrusted"
        );
        assert!(
            quiet.server_versions().iter().all(|v| v == "3.4.23"),
            "{:?}",
            quiet.server_versions()
        );
        let upgraded = Arc::new(AtomicUsize::new(0));
        let reads = Arc::new(Reads::default());
        let stop = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(quiet_reader(
            quiet.clone(),
            direct.clone(),
            upgraded.clone(),
            reads.clone(),
            stop.clone(),
        ));
        // Samples of the trust, with how many members were upgraded (or being upgraded).
        let samples: Arc<Mutex<Vec<(usize, bool, bool)>>> = Arc::default();
        let sampler = {
            let (quiet, rel, upgraded, samples, stop) = (
                quiet.clone(),
                run.cache.clone(),
                upgraded.clone(),
                samples.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    // `upgraded` counts members whose restart on the new binary has begun.
                    let n = upgraded.load(Ordering::SeqCst);
                    let a = quiet.stats().progress_trusted;
                    let b = rel.stats().progress_trusted;
                    samples.lock().push((n, a, b));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        tokio::time::sleep(DWELL).await;

        let without = |i: usize| -> Vec<String> {
            endpoints
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, e)| e.clone())
                .collect()
        };
        let mut last_healthy = Instant::now();
        for member in 0..EtcdCluster::SIZE {
            run.set_direct(without(member));
            // Counted before the stop: from now on this member may run the new version.
            upgraded.store(member + 1, Ordering::SeqCst);
            let (c, bin) = (cluster.clone(), new.clone());
            let took = testkit::blocking(move || {
                let started = Instant::now();
                c.lock().unwrap().restart_on(member, bin);
                started.elapsed()
            })
            .await;
            last_healthy = Instant::now();
            run.faults += 1;
            run.set_direct(endpoints.clone());
            let releases = cluster.lock().unwrap().releases();
            println!("rolling upgrade: member {member} on {to} after {took:?}; members {releases:?}");
            if member + 1 < EtcdCluster::SIZE {
                tokio::time::sleep(DWELL).await;
                assert!(
                    !quiet.stats().progress_trusted && !run.cache.stats().progress_trusted,
                    "{} of 3 members upgraded: progress answers must not be trusted yet",
                    member + 1
                );
            }
        }

        // Every member runs 3.5.35: both caches reach the fast path by themselves.
        let deadline = last_healthy + FAST_PATH_WITHIN;
        let (mut quiet_at, mut rel_at) = (None, None);
        while quiet_at.is_none() || rel_at.is_none() {
            if quiet_at.is_none() && quiet.stats().progress_trusted {
                quiet_at = Some(last_healthy.elapsed());
            }
            if rel_at.is_none() && run.cache.stats().progress_trusted {
                rel_at = Some(last_healthy.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "no fast path within {FAST_PATH_WITHIN:?} of the last member's upgrade: quiet {:?} {:?}, rel {:?} {:?}",
                quiet.server_versions(),
                quiet.stats().progress_trusted,
                run.cache.server_versions(),
                run.cache.stats().progress_trusted,
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            quiet.server_versions().iter().all(|v| v == "3.5.35"),
            "{:?}",
            quiet.server_versions()
        );
        let trusted_since = Instant::now();
        tokio::time::sleep(DWELL).await;
        stop.store(true, Ordering::Relaxed);
        reader.await.unwrap();
        sampler.await.unwrap();
        let summary = run.finish().await;

        // While a member ran 3.4.23 (fewer than 3 restarts begun), nobody trusted progress.
        let samples = samples.lock().clone();
        let early_trust = samples
            .iter()
            .filter(|(n, a, b)| *n < EtcdCluster::SIZE && (*a || *b))
            .count();
        assert_eq!(early_trust, 0, "trusted while a member ran 3.4.23");

        let done = reads.done.lock().clone();
        let mixed: Vec<&Read> = done
            .iter()
            .filter(|r| r.upgraded.1 < EtcdCluster::SIZE)
            .collect();
        let fast: Vec<&Read> = done
            .iter()
            .filter(|r| r.trusted == (true, true) && r.following)
            .collect();
        let reconnecting = done
            .iter()
            .filter(|r| r.trusted == (true, true) && !r.following)
            .count();
        let mixed_etcd = mixed.iter().filter(|r| r.from_etcd).count();
        let fast_etcd = fast.iter().filter(|r| r.from_etcd).count();
        println!(
            "ROLLING UPGRADE | {from} -> {to} | quiet reads {} checked, stale 0, errors {} | while a member ran 3.4.23: {} reads, {} sent to etcd | on the fast path: {} reads, {} sent to etcd ({} more while the cache reconnected) | fast path after the last member: quiet cache {:?}, workload cache {:?} | trust samples {}",
            reads.checked.load(Ordering::Relaxed),
            reads.errors.load(Ordering::Relaxed),
            mixed.len(),
            mixed_etcd,
            fast.len(),
            fast_etcd,
            reconnecting,
            quiet_at.unwrap(),
            rel_at.unwrap(),
            samples.len(),
        );
        println!("{}", summary.line());
        assert!(!mixed.is_empty() && !fast.is_empty(), "reads in both phases");
        assert_eq!(
            mixed_etcd,
            mixed.len(),
            "untrusted: every read the cache cannot prove current goes to etcd"
        );
        assert_eq!(fast_etcd, 0, "fast path: every read from memory");
        assert!(
            trusted_since.elapsed() >= DWELL,
            "the fast-path phase ran for {DWELL:?}"
        );
        quiet.close().await;
        drop(cluster);
    })
    .await;
}
