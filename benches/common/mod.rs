//! Helpers shared by the end-to-end benchmarks (`mod common;`): connecting to etcd and
//! reading `/proc`.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Connects to `ep`, retrying for up to 10 s until a `status` call answers.
pub(crate) async fn connect(ep: &str) -> Result<etcd_client::Client, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let err = match etcd_client::Client::connect([ep], None).await {
            Ok(mut c) => match tokio::time::timeout(Duration::from_secs(2), c.status()).await {
                Ok(Ok(_)) => return Ok(c),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timeout".into(),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(format!("cannot connect to {ep}: {err}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 if unknown), for `/proc/*/stat` times.
pub(crate) fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// True when the benchmarks should run their short form (`ETCD_CACHE_BENCH_QUICK=1`, set
/// by `cargo xtask bench --quick`).
pub(crate) fn quick() -> bool {
    std::env::var_os("ETCD_CACHE_BENCH_QUICK").is_some_and(|v| !v.is_empty() && v != "0")
}
