//! What every example's `main` does: use `ETCD_ENDPOINTS` or start a throwaway etcd,
//! run the example's scenario on a tokio runtime within a time limit, and turn its
//! outcome into the exit code. And a prefix no other run uses.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use crate::EtcdServer;

/// Runs an example: `run` gets the etcd endpoints (`ETCD_ENDPOINTS`, comma-separated,
/// or a throwaway etcd kept until it returns) and must finish within `limit`. Exits 0
/// on `Ok`, 1 with the message on `Err` or after the limit.
pub fn example_main<F, Fut>(name: &str, limit: Duration, run: F) -> ExitCode
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut _etcd = None;
    let endpoints: Vec<String> = match std::env::var("ETCD_ENDPOINTS") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_owned()).collect(),
        _ => {
            let server = EtcdServer::start();
            println!("started a throwaway etcd at {}", server.endpoint());
            let endpoint = server.endpoint();
            _etcd = Some(server);
            vec![endpoint]
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = runtime.block_on(async {
        tokio::time::timeout(limit, run(endpoints))
            .await
            .unwrap_or_else(|_| Err(format!("did not finish within {limit:?}")))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A prefix no other run uses, so that an example can run against a shared etcd.
pub fn unique_prefix(name: &str) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "/etcd-cache-examples/{name}/{}-{millis}/",
        std::process::id()
    )
}
