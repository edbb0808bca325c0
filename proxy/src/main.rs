//! `etcd-cache-proxy`: etcd's v3 gRPC API served from an `etcd-cache`.
//!
//! Watches and ranges inside the cached prefix are answered from memory (one upstream
//! watch for every client); everything else is forwarded to etcd. See `docs/PROXY.md`.
//!
//! One file per etcd service under `services/`, each a thin adapter over the cache or a
//! forwarding client (`kv`, `lease`, `cluster`, `maintenance`, `auth`, `election`,
//! `lock`), and one folder for Watch: `watch` (the per-stream session, the cache-served
//! and the etcd-forwarded sides, the progress machine, the messages sent; its `mod.rs`
//! maps them). Shared pieces: `config` (flags), `upstream` (the seam to etcd: a client's
//! call carries the client's token only), `authz` (what the cache serves goes only to
//! callers etcd allows, and everything the proxy knows of etcd's auth), `cache_slot` (the
//! cache, built for etcd's auth state), `forward_macros` (`forward!`, a unary method
//! passed to etcd as it is, and `call_upstream!`), `namespace`, `state`, `conn`
//! (per-connection info), `authority_header` (below h2 on each connection: an
//! `:authority` with a scheme made acceptable), `layers` (tower layers), `metrics` (the
//! proxy's metrics and the `--metrics-addr` endpoint), `http_front` (HTTP/1.1
//! `/proxy/health` and `/metrics` on the gRPC port), `auto_sync`
//! (`--endpoints-auto-sync-interval`), `etcd_errors` (etcd's errors and refusal texts),
//! `error` (start-up errors),
//! `pb` (the generated code), `server` (start-up and shutdown).

/// The heap is jemalloc's (the `jemalloc` feature, on by default): a watch held 1,545 B of
/// RSS with the system's allocator and 880 B with jemalloc, its live data about 720 B
/// (docs/PERFORMANCE.md, section 9).
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod authority_header;
mod authz;
mod auto_sync;
mod cache_slot;
mod config;
mod conn;
mod error;
mod etcd_errors;
mod forward_macros;
mod http_front;
mod layers;
mod metrics;
mod namespace;
mod pb;
mod register;
mod server;
mod server_tls;
mod services;
mod state;
mod upstream;
mod watch;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Every key etcd makes or users deploy, P-521 included (see Cargo.toml).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = config::Config::parse();
    match server::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                source = s.source();
            }
            tracing::error!("{msg}");
            eprintln!("etcd-cache-proxy: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}
