//! Test support: real etcd processes ([`etcd`]), a fault-injecting TCP forwarder ([`proxy`]),
//! and small async helpers.
//!
//! Use it from an integration test with `mod support;`.
#![allow(dead_code, unreachable_pub)]

pub mod etcd;
pub mod proxy;

use std::time::{Duration, Instant};

/// How long [`client`] keeps trying to connect.
pub const CONNECT_RETRY_FOR: Duration = Duration::from_secs(10);

/// An etcd-client connected to `endpoints`, retried for up to ~10 s until a `status` call
/// answers (connections are lazy, so a successful `connect` alone proves nothing).
pub async fn client<S: AsRef<str>>(endpoints: &[S]) -> etcd_client::Client {
    let deadline = Instant::now() + CONNECT_RETRY_FOR;
    let mut last_error: String;
    loop {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        match etcd_client::Client::connect(endpoints, Some(options)).await {
            Ok(mut client) => {
                match tokio::time::timeout(Duration::from_secs(2), client.status()).await {
                    Ok(Ok(_)) => return client,
                    Ok(Err(e)) => last_error = e.to_string(),
                    Err(_) => last_error = "status call timed out".to_string(),
                }
            }
            Err(e) => last_error = e.to_string(),
        }
        if Instant::now() >= deadline {
            let endpoints: Vec<&str> = endpoints.iter().map(AsRef::as_ref).collect();
            panic!(
                "could not connect to etcd at {endpoints:?} within {CONNECT_RETRY_FOR:?}: {last_error}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Installs a `tracing` subscriber filtered by `RUST_LOG` (default `warn`) that writes through
/// the test harness's capture. Safe to call from every test; later calls do nothing.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Runs a blocking harness call (start, kill, restart) off the async runtime's threads.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("blocking harness call panicked")
}
