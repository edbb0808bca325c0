//! Running a test body: a time limit that fails the test instead of hanging it, blocking
//! harness calls off the runtime's threads, and log output through the test capture.

use std::future::Future;
use std::panic::Location;
use std::time::Duration;

/// Awaits `f`, failing the test if it takes longer than `limit`.
///
/// A test against real processes can hang (a stream that never ends, a server that never
/// answers); this turns the hang into a panic that says which call timed out.
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// testkit::bounded(Duration::from_secs(90), async {
///     // the test body
/// })
/// .await;
/// # }
/// ```
///
/// # Panics
/// When `limit` passes before `f` completes.
#[track_caller]
pub fn bounded<F: Future>(limit: Duration, f: F) -> impl Future<Output = F::Output> {
    let caller = Location::caller();
    async move {
        match tokio::time::timeout(limit, f).await {
            Ok(output) => output,
            Err(_) => panic!(
                "test did not finish in time: the body bounded at {caller} took over {limit:?}"
            ),
        }
    }
}

/// Runs a blocking harness call (start, kill, restart) off the async runtime's threads.
///
/// # Panics
/// When `f` panics.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("blocking harness call panicked")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bounded_passes_the_output_through() {
        assert_eq!(bounded(Duration::from_secs(1), async { 7 }).await, 7);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "did not finish in time")]
    async fn bounded_fails_a_body_that_hangs() {
        bounded(Duration::from_secs(1), std::future::pending::<()>()).await;
    }
}
