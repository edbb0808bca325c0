//! The fan-out bench's results (benches/fanout.rs): how a run serves its subscribers
//! ([`Mode`]), the figures of one run ([`RunResult`]), and what is printed and written
//! from them: the run line, the local and remote tables, the remote comparisons and the
//! charts.

use std::fmt::Write as _;
use std::time::Duration;

use super::chart::{self, Line};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// How a run serves its subscribers.
pub(crate) enum Mode {
    None,
    Direct,
    Proxy,
    Cache,
    /// Remote watchers over M connections, straight to etcd.
    RemoteEtcd,
    /// Remote watchers over M connections through `etcd grpc-proxy start`.
    RemoteGrpcProxy,
    /// Remote watchers over M connections through `etcd-cache-proxy`.
    RemoteCacheProxy,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Direct => "direct",
            Mode::Proxy => "proxy",
            Mode::Cache => "cache",
            Mode::RemoteEtcd => "etcd",
            Mode::RemoteGrpcProxy => "grpc-proxy",
            Mode::RemoteCacheProxy => "cache-proxy",
        }
    }

    pub(crate) fn is_remote(self) -> bool {
        matches!(
            self,
            Mode::RemoteEtcd | Mode::RemoteGrpcProxy | Mode::RemoteCacheProxy
        )
    }

    /// Whether a proxy process serves the run (its CPU and RSS are reported).
    pub(crate) fn has_proxy(self) -> bool {
        matches!(
            self,
            Mode::Proxy | Mode::RemoteGrpcProxy | Mode::RemoteCacheProxy
        )
    }
}

#[derive(Debug, Clone)]
/// The figures of one run.
pub(crate) struct RunResult {
    pub(crate) mode: Mode,
    pub(crate) n: usize,
    /// gRPC connections the watches used (0: in process, no watch at all).
    pub(crate) conns: usize,
    /// Runs of one group share their no-watcher baseline (the remote groups).
    pub(crate) group: usize,
    pub(crate) puts: usize,
    pub(crate) puts_per_s: f64,
    pub(crate) deliveries: u64,
    /// Watch responses with events the subscribers received (events per response =
    /// deliveries / responses).
    pub(crate) responses: u64,
    /// gRPC watch streams the run used, and how many of them the proxy cut (grpc-proxy).
    pub(crate) streams: usize,
    pub(crate) streams_cut: usize,
    pub(crate) deliveries_per_s: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) client_cpu_s: f64,
    pub(crate) etcd_cpu_s: f64,
    pub(crate) proxy_cpu_s: f64,
    pub(crate) client_peak_mib: f64,
    pub(crate) etcd_peak_mib: f64,
    pub(crate) proxy_peak_mib: f64,
    pub(crate) setup: Duration,
}

/// A duration in milliseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The local runs' table (markdown), against the `none` baseline and one direct watch.
pub(crate) fn table(results: &[RunResult], baseline: f64, one_watch: Option<f64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| mode | N | puts | deliveries | puts/s | vs none | vs 1 direct | deliveries/s | p50 ms | p99 ms | client CPU s | etcd CPU s | proxy CPU s | client peak MiB | etcd peak MiB | proxy peak MiB |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in results {
        let vs1 = one_watch.map_or("-".to_string(), |b| format!("{:.2}x", r.puts_per_s / b));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {:.2}x | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} |",
            r.mode.name(),
            r.n,
            r.puts,
            r.deliveries,
            r.puts_per_s,
            r.puts_per_s / baseline,
            vs1,
            r.deliveries_per_s,
            ms(r.p50),
            ms(r.p99),
            r.client_cpu_s,
            r.etcd_cpu_s,
            r.proxy_cpu_s,
            r.client_peak_mib,
            r.etcd_peak_mib,
            r.proxy_peak_mib,
        );
    }
    s
}

/// The remote runs' baseline: the mean puts/s of the no-watcher runs of their group.
pub(crate) fn group_baseline(results: &[RunResult], group: usize) -> f64 {
    let v: Vec<f64> = results
        .iter()
        .filter(|r| r.mode == Mode::None && r.group == group)
        .map(|r| r.puts_per_s)
        .collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The remote runs' table (markdown), each against its group's baseline.
pub(crate) fn remote_table(results: &[RunResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| variant | N | M | puts | deliveries | streams cut | events/response | puts/s | vs none | deliveries/s | p50 ms | p99 ms | client CPU s | etcd CPU s | etcd CPU µs/put | proxy CPU s | client peak MiB | etcd peak MiB | proxy peak MiB |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in results.iter().filter(|r| r.group > 0) {
        let base = group_baseline(results, r.group);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.2}x | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {:.0} | {:.0} | {} |",
            r.mode.name(),
            r.n,
            r.conns,
            r.puts,
            r.deliveries,
            if r.mode == Mode::None { "-".to_string() } else { format!("{}/{}", r.streams_cut, r.streams) },
            if r.responses > 0 { format!("{:.2}", r.deliveries as f64 / r.responses as f64) } else { "-".into() },
            r.puts_per_s,
            r.puts_per_s / base,
            r.deliveries_per_s,
            ms(r.p50),
            ms(r.p99),
            r.client_cpu_s,
            r.etcd_cpu_s,
            r.etcd_cpu_s * 1e6 / r.puts as f64,
            if r.mode.has_proxy() { format!("{:.2}", r.proxy_cpu_s) } else { "-".into() },
            r.client_peak_mib,
            r.etcd_peak_mib,
            if r.mode.has_proxy() { format!("{:.0}", r.proxy_peak_mib) } else { "-".into() },
        );
    }
    s
}

/// The remote comparisons: every variant against its group's baseline, cache-proxy
/// against grpc-proxy and etcd at the same N, and etcd's CPU per put across N.
pub(crate) fn remote_comparisons(results: &[RunResult]) -> String {
    let mut s = String::new();
    let remote: Vec<&RunResult> = results.iter().filter(|r| r.mode.is_remote()).collect();
    if remote.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "remote comparisons (N watchers over M connections; puts/s ratio to the two no-watcher runs around each group):"
    );
    let find = |m: Mode, n: usize| remote.iter().find(|r| r.mode == m && r.n == n);
    for r in &remote {
        let base = group_baseline(results, r.group);
        let _ = writeln!(
            s,
            "  {:<11} N={:<6} M={:<4} puts/s ratio {:.2}x, {:.0} deliveries/s, p50 {:.2} ms, p99 {:.2} ms, {:.2} events/response, etcd {:.0} µs CPU/put, CPU per delivery: client {:.0} ns, proxy {:.0} ns",
            r.mode.name(),
            r.n,
            r.conns,
            r.puts_per_s / base,
            r.deliveries_per_s,
            ms(r.p50),
            ms(r.p99),
            r.deliveries as f64 / r.responses.max(1) as f64,
            r.etcd_cpu_s * 1e6 / r.puts as f64,
            r.client_cpu_s * 1e9 / r.deliveries.max(1) as f64,
            r.proxy_cpu_s * 1e9 / r.deliveries.max(1) as f64,
        );
    }
    let mut ns: Vec<usize> = remote.iter().map(|r| r.n).collect();
    ns.sort_unstable();
    ns.dedup();
    for &n in &ns {
        let Some(c) = find(Mode::RemoteCacheProxy, n) else {
            continue;
        };
        for other in [Mode::RemoteGrpcProxy, Mode::RemoteEtcd] {
            if let Some(o) = find(other, n) {
                let _ = writeln!(
                    s,
                    "  cache-proxy vs {:<10} N={:<6} deliveries/s {:.2}x, p99 {:.2} ms vs {:.2} ms ({:.3}x), puts/s {:.2}x, etcd CPU {:.2}x, client+etcd+proxy CPU {:.2} s vs {:.2} s",
                    other.name(),
                    n,
                    c.deliveries_per_s / o.deliveries_per_s,
                    ms(c.p99),
                    ms(o.p99),
                    ms(c.p99) / ms(o.p99),
                    c.puts_per_s / o.puts_per_s,
                    c.etcd_cpu_s / o.etcd_cpu_s,
                    c.client_cpu_s + c.etcd_cpu_s + c.proxy_cpu_s,
                    o.client_cpu_s + o.etcd_cpu_s + o.proxy_cpu_s,
                );
            }
        }
        if let Some(g) = find(Mode::RemoteGrpcProxy, n) {
            if n >= 1000 {
                let ratio = c.deliveries_per_s / g.deliveries_per_s;
                let _ = writeln!(
                    s,
                    "  goal N={n}: deliveries/s >= 4x grpc-proxy's: {} ({ratio:.2}x); p99 lower: {} ({:.2} ms vs {:.2} ms){}",
                    if ratio >= 4.0 { "met" } else { "NOT met" },
                    if c.p99 < g.p99 { "met" } else { "NOT met" },
                    ms(c.p99),
                    ms(g.p99),
                    if g.streams_cut > 0 {
                        format!(
                            "; grpc-proxy cut {} of {} streams, so its figures cover only what it delivered",
                            g.streams_cut, g.streams
                        )
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
    for m in [
        Mode::RemoteEtcd,
        Mode::RemoteGrpcProxy,
        Mode::RemoteCacheProxy,
    ] {
        let per_put: Vec<String> = ns
            .iter()
            .filter_map(|&n| find(m, n))
            .map(|r| format!("N={} {:.0}", r.n, r.etcd_cpu_s * 1e6 / r.puts as f64))
            .collect();
        if per_put.is_empty() {
            continue;
        }
        let (lo, hi) =
            ns.iter()
                .filter_map(|&n| find(m, n))
                .fold((f64::MAX, 0f64), |(lo, hi), r| {
                    let v = r.etcd_cpu_s * 1e6 / r.puts as f64;
                    (lo.min(v), hi.max(v))
                });
        let _ = writeln!(
            s,
            "  etcd CPU µs per put with {:<11}: {} (max/min {:.2}x)",
            m.name(),
            per_put.join(", "),
            hi / lo
        );
    }
    s
}

/// The local chart's lines.
pub(crate) const LOCAL_LINES: [(Mode, &str); 3] = [
    (Mode::Direct, "#1f77b4"),
    (Mode::Proxy, "#ff7f0e"),
    (Mode::Cache, "#2ca02c"),
];
/// The remote chart's lines.
pub(crate) const REMOTE_LINES: [(Mode, &str); 3] = [
    (Mode::RemoteEtcd, "#1f77b4"),
    (Mode::RemoteGrpcProxy, "#ff7f0e"),
    (Mode::RemoteCacheProxy, "#2ca02c"),
];

/// The chart of `results`: deliveries/s and p99 against N, one line per mode of `modes`.
pub(crate) fn svg(results: &[RunResult], modes: &[(Mode, &'static str)]) -> String {
    let lines: Vec<Line> = modes
        .iter()
        .map(|&(mode, color)| Line {
            name: mode.name(),
            color,
            points: results
                .iter()
                .filter(|r| r.mode == mode)
                .map(|r| (r.n, [r.deliveries_per_s, ms(r.p99)]))
                .collect(),
        })
        .collect();
    chart::svg(["deliveries/s (log)", "p99 put->delivery ms (log)"], &lines)
}

/// The one-line report of a run, as it ends.
pub(crate) fn print_run(r: &RunResult) {
    println!(
        "run {:<11} N={:<6} M={:<4} {:>6} puts {:>8.0} puts/s  {:>11.0} deliveries/s  p50 {:>8.2} ms  p99 {:>8.2} ms  client {:.2} s CPU {:.0} MiB  etcd {:.2} s CPU {:.0} MiB{}  (set-up {:.1} s)",
        r.mode.name(), r.n, r.conns, r.puts, r.puts_per_s, r.deliveries_per_s, ms(r.p50), ms(r.p99),
        r.client_cpu_s, r.client_peak_mib, r.etcd_cpu_s, r.etcd_peak_mib,
        if r.mode.has_proxy() { format!("  proxy {:.2} s CPU {:.0} MiB", r.proxy_cpu_s, r.proxy_peak_mib) } else { String::new() },
        r.setup.as_secs_f64()
    );
}
