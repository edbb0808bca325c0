//! A process stopped (SIGSTOP) for a few seconds while etcd sends it thousands of small
//! watch events: what a CPU-throttled container, a busy node or a VM pause looks like to
//! the process's HTTP/2 connections to etcd. When it continues, everything etcd sent
//! meanwhile is waiting for it at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use rustix::process::{kill_process, Pid, Signal};

/// How many writers put at once: enough that etcd batches many puts per fsync.
pub const WRITERS: usize = 64;

/// What one stall round wrote.
#[derive(Debug, Clone, Copy)]
pub struct StallRound {
    /// Puts that etcd applied while the process was stopped (and just around it).
    pub puts: u64,
    /// The revision of the last of them.
    pub last_revision: i64,
}

/// Continues the process (SIGCONT) when dropped: a failing test never leaves it stopped.
struct Stopped(Pid);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill_process(self.0, Signal::CONT);
    }
}

/// Stops the process `pid` (SIGSTOP) for `stall` while [`WRITERS`] writers on `client`
/// put one-byte values under the `prefixes` (writer `i` under `prefixes[i % len]`, each
/// put its own revision, so each one a watch response of its own), then continues it
/// (SIGCONT) and stops the writers. The stall's length is the scenario; the writers
/// start before the stop and end after the continue.
///
/// # Panics
/// If a signal cannot be sent or a put fails.
pub async fn small_puts_while_stopped(
    client: &Client,
    prefixes: &[&str],
    pid: u32,
    stall: Duration,
) -> StallRound {
    assert!(!prefixes.is_empty());
    let pid = Pid::from_raw(i32::try_from(pid).expect("a pid")).expect("a pid");
    let stop = Arc::new(AtomicBool::new(false));
    let puts = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (client, stop, puts) = (client.clone(), stop.clone(), puts.clone());
        let prefix = prefixes[w % prefixes.len()].to_string();
        writers.push(tokio::spawn(async move {
            let mut kv = client.kv_client();
            let mut last = 0;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = kv
                    .put(format!("{prefix}stall/{w}/{i}"), "x", None)
                    .await
                    .expect("a put to etcd");
                last = r.header().map_or(last, |h| h.revision());
                puts.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            last
        }));
    }
    // The writers are under way before the stop.
    while puts.load(Ordering::Relaxed) < WRITERS as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stopped = Stopped(pid);
    kill_process(pid, Signal::STOP).expect("SIGSTOP");
    tokio::time::sleep(stall).await;
    drop(stopped);
    stop.store(true, Ordering::Relaxed);
    let mut last_revision = 0;
    for w in writers {
        last_revision = last_revision.max(w.await.expect("a writer"));
    }
    StallRound {
        puts: puts.load(Ordering::Relaxed),
        last_revision,
    }
}

/// True when `cargo xtask test --full-matrix` runs the tests (it sets
/// `ETCD_CACHE_FULL_MATRIX=1`): their longer variants run then.
pub fn full_matrix() -> bool {
    std::env::var_os(FULL_MATRIX_ENV).is_some_and(|v| v == "1")
}

/// The variable `cargo xtask test --full-matrix` sets for the tests it runs.
pub const FULL_MATRIX_ENV: &str = "ETCD_CACHE_FULL_MATRIX";
