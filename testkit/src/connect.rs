//! An etcd-client that has been heard from: connect, then retry until a `status` call answers.
//!
//! etcd-client connects lazily, so a successful `Client::connect` alone proves nothing about
//! the server; [`Connect`] calls `status` on every attempt and retries for a while, which
//! covers an etcd that is still starting or a member that is just coming back.

use std::fmt;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::{sleep, timeout, Instant};

/// How long [`client`] keeps trying to connect.
pub const CONNECT_RETRY_FOR: Duration = Duration::from_secs(10);
/// How long one attempt may take to connect, and then to answer `status`.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between two attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// An etcd-client connected to `endpoints` with the test defaults of [`Connect::new`]: retried
/// for up to [`CONNECT_RETRY_FOR`] until a `status` call answers.
///
/// # Panics
/// When no attempt succeeds in that time; the message names the endpoints and the last error.
pub async fn client<S: AsRef<str>>(endpoints: &[S]) -> Client {
    Connect::new().client(endpoints).await
}

/// How to connect: etcd-client's [`ConnectOptions`] and how long to retry.
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// // Short keep-alives notice a stalled connection within about two seconds.
/// let options = etcd_client::ConnectOptions::new()
///     .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
///     .with_keep_alive_while_idle(true);
/// let client = testkit::Connect::new()
///     .options(options)
///     .retry_for(Duration::from_secs(20))
///     .client(&["http://127.0.0.1:2379"])
///     .await;
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Connect {
    options: Option<ConnectOptions>,
    retry_for: Duration,
}

impl Default for Connect {
    fn default() -> Self {
        Self::new()
    }
}

impl Connect {
    /// The test defaults: a 2 s connect timeout and 5 s HTTP/2 keep-alives (so a dead
    /// connection is noticed), retried for [`CONNECT_RETRY_FOR`].
    pub fn new() -> Self {
        Connect {
            options: Some(
                ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5)),
            ),
            retry_for: CONNECT_RETRY_FOR,
        }
    }

    /// etcd-client's own defaults (no options at all), retried for [`CONNECT_RETRY_FOR`]:
    /// the client an application would have, which is what the benchmarks compare against.
    pub fn plain() -> Self {
        Connect {
            options: None,
            retry_for: CONNECT_RETRY_FOR,
        }
    }

    /// Connects with `options` instead.
    pub fn options(self, options: ConnectOptions) -> Self {
        Connect {
            options: Some(options),
            ..self
        }
    }

    /// Keeps trying for `limit` instead.
    pub fn retry_for(self, limit: Duration) -> Self {
        Connect {
            retry_for: limit,
            ..self
        }
    }

    /// A client on `endpoints` once a `status` call through it has answered.
    ///
    /// # Errors
    /// [`ConnectError`] when no attempt succeeded within the retry time.
    pub async fn try_client<S: AsRef<str>>(&self, endpoints: &[S]) -> Result<Client, ConnectError> {
        let deadline = Instant::now() + self.retry_for;
        loop {
            let last = match timeout(
                ATTEMPT_TIMEOUT,
                Client::connect(endpoints, self.options.clone()),
            )
            .await
            {
                Ok(Ok(mut client)) => match timeout(STATUS_TIMEOUT, client.status()).await {
                    Ok(Ok(_)) => return Ok(client),
                    Ok(Err(e)) => Failure::Etcd(e),
                    Err(_) => Failure::StatusTimedOut,
                },
                Ok(Err(e)) => Failure::Etcd(e),
                Err(_) => Failure::ConnectTimedOut,
            };
            if Instant::now() >= deadline {
                return Err(ConnectError {
                    endpoints: endpoints.iter().map(|e| e.as_ref().to_string()).collect(),
                    retry_for: self.retry_for,
                    last,
                });
            }
            sleep(RETRY_PAUSE).await;
        }
    }

    /// [`try_client`](Self::try_client) for a test: a failure is a panic.
    ///
    /// # Panics
    /// When no attempt succeeded within the retry time.
    pub async fn client<S: AsRef<str>>(&self, endpoints: &[S]) -> Client {
        self.try_client(endpoints)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// No connection to etcd answered within the retry time.
#[derive(Debug)]
pub struct ConnectError {
    endpoints: Vec<String>,
    retry_for: Duration,
    last: Failure,
}

/// What went wrong on the last attempt.
#[derive(Debug)]
enum Failure {
    Etcd(etcd_client::Error),
    ConnectTimedOut,
    StatusTimedOut,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "could not connect to etcd at {:?} within {:?}: ",
            self.endpoints, self.retry_for
        )?;
        match &self.last {
            Failure::Etcd(e) => write!(f, "{e}"),
            Failure::ConnectTimedOut => write!(f, "connect timed out after {ATTEMPT_TIMEOUT:?}"),
            Failure::StatusTimedOut => write!(f, "status call timed out after {STATUS_TIMEOUT:?}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.last {
            Failure::Etcd(e) => Some(e),
            Failure::ConnectTimedOut | Failure::StatusTimedOut => None,
        }
    }
}

/// For benchmarks and examples whose errors are strings: `connect.try_client(eps).await?`.
impl From<ConnectError> for String {
    fn from(e: ConnectError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_server_is_an_error_that_names_the_endpoint() {
        let endpoint = format!("http://127.0.0.1:{}", crate::free_port());
        let Err(e) = Connect::new()
            .retry_for(Duration::ZERO)
            .try_client(&[endpoint.as_str()])
            .await
        else {
            panic!("connected to {endpoint}, where nothing listens");
        };
        let text = e.to_string();
        assert!(text.starts_with("could not connect to etcd at"), "{text}");
        assert!(text.contains(&endpoint), "{text}");
    }
}
