//! Helpers shared by the end-to-end benchmarks (`mod common;`): reading `/proc` and the
//! quick-mode switch. Their etcd and clients come from `testkit`.
#![allow(dead_code)]

use std::sync::OnceLock;

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
