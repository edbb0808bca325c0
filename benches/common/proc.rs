//! What the benchmarks read from `/proc`: CPU time and peak RSS of this process or a
//! child (etcd, a proxy), the peak's reset, and the load average. `None` as a pid is this
//! process.

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

fn proc_path(pid: Option<u32>, file: &str) -> String {
    match pid {
        Some(p) => format!("/proc/{p}/{file}"),
        None => format!("/proc/self/{file}"),
    }
}

/// utime + stime of a process, in clock ticks ([`clk_tck`] per second).
pub(crate) fn cpu_ticks(pid: Option<u32>) -> u64 {
    let stat = std::fs::read_to_string(proc_path(pid, "stat")).unwrap_or_default();
    // Fields after the ")" of the command name: state is field 3; utime 14, stime 15.
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    ticks(14) + ticks(15)
}

/// A `kB` field of a process's `status` (`VmHWM`, `VmRSS`), in KiB (0 if absent).
pub(crate) fn status_kib(pid: Option<u32>, field: &str) -> u64 {
    let status = std::fs::read_to_string(proc_path(pid, "status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| {
            v.trim_start_matches(':')
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Peak resident set size in MiB (`VmHWM`).
pub(crate) fn peak_rss_mib(pid: Option<u32>) -> f64 {
    status_kib(pid, "VmHWM") as f64 / 1024.0
}

/// Resets `VmHWM` to the current RSS (Linux `clear_refs` 5). Returns whether it worked.
pub(crate) fn reset_peak(pid: Option<u32>) -> bool {
    std::fs::write(proc_path(pid, "clear_refs"), "5").is_ok()
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
