//! Command-line flags (clap derive); every flag has a default and a `--help` line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// etcd's default `--max-request-bytes`: the size above which a watch response is split
/// into fragments (for watches that asked for it).
pub(crate) const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Default of `--max-watches-per-connection`: a tenth of the proxy's default budget.
pub(crate) const DEFAULT_MAX_WATCHES_PER_CONNECTION: usize = etcd_cache::DEFAULT_MAX_WATCHERS / 10;
/// Default of `--max-concurrent-streams`: far above what etcd's clients open on one
/// connection (clientv3 shares one Watch stream among the watches of one context
/// metadata), low enough that one connection cannot hold a session per stream without
/// end.
pub(crate) const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 10_000;
/// Default of `--auth-cache-bytes` (the permission decisions, `authz/`).
pub(crate) const DEFAULT_AUTH_CACHE_BYTES: usize = 64 << 20;
/// Default of `--auth-ask-bytes` (the permission checks in flight, `authz/`).
pub(crate) const DEFAULT_AUTH_ASK_BYTES: usize = 64 << 20;
/// Default of `--max-connections`.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 16_384;
/// Default of `--max-queued-watch-request-bytes`: bytes of Watch requests read from one
/// client connection and not yet taken by their streams' sessions, at most (each request
/// counts its encoded size and its place in the queue; `conn.rs`).
pub(crate) const DEFAULT_QUEUED_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Default of `--max-queued-watch-request-bytes-total`: the same over every client
/// connection at once (many connections cannot make the proxy hold many times the
/// per-connection bound).
pub(crate) const DEFAULT_QUEUED_REQUEST_BYTES_TOTAL: usize = 256 * 1024 * 1024;
/// etcd's gRPC overhead allowance on top of `--max-request-bytes` for received messages.
pub(crate) const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// etcd-cache-proxy: etcd's v3 gRPC API served from an in-memory watch cache.
///
/// Watch and Range inside the cached prefix are answered from memory; everything else
/// is forwarded to etcd.
#[derive(Debug, Clone, Parser)]
#[command(name = "etcd-cache-proxy", version, about, long_about = None)]
pub(crate) struct Config {
    /// etcd client URLs to forward to and to cache from, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    pub(crate) endpoints: Vec<String>,

    /// Address to serve etcd's gRPC API on.
    #[arg(long, default_value = "127.0.0.1:23790")]
    pub(crate) listen_addr: SocketAddr,

    /// Client URL Cluster.MemberList announces, so a client that syncs its endpoints
    /// stays on the proxy. Without it MemberList (and every membership change) is
    /// etcd's, as with etcd's grpc-proxy: a client that syncs its endpoints moves to
    /// etcd's members.
    #[arg(long)]
    pub(crate) advertise_client_url: Option<String>,

    /// Registers the proxy in etcd under this prefix (its key `<prefix>/<url>` holds
    /// --advertise-client-url in the format of etcd's naming resolver), on a lease of
    /// --resolver-ttl seconds it keeps alive, as etcd grpc-proxy's --resolver-prefix:
    /// clients find every live proxy with etcd's resolver, and Cluster.MemberList
    /// through any of them lists them. Needs --resolver-ttl and --advertise-client-url.
    #[arg(long)]
    pub(crate) resolver_prefix: Option<String>,
    /// TTL in seconds of the registration's lease (--resolver-prefix): a proxy that dies
    /// is gone from the list within it.
    #[arg(long, default_value_t = 0)]
    pub(crate) resolver_ttl: u64,

    /// Key prefix held by the cache, relative to --namespace ("" = everything in it).
    /// Ranges and watches inside it are answered from memory, others are forwarded.
    #[arg(long, default_value = "")]
    pub(crate) prefix: String,

    /// Prefix prepended to every key of every client, as etcd grpc-proxy's --namespace:
    /// clients see keys without it, and nothing outside it is readable or writable.
    #[arg(long, default_value = "")]
    pub(crate) namespace: String,

    /// TLS certificate served to clients (PEM); with --key-file, the proxy serves TLS.
    #[arg(long, requires = "key_file")]
    pub(crate) cert_file: Option<PathBuf>,
    /// TLS key of --cert-file (PEM).
    #[arg(long, requires = "cert_file")]
    pub(crate) key_file: Option<PathBuf>,
    /// CA bundle (PEM) that client certificates must chain to (client certificate auth).
    #[arg(long, requires = "cert_file")]
    pub(crate) trusted_ca_file: Option<PathBuf>,
    /// Certificate revocation lists (PEM): a client whose certificate one of them revokes
    /// is refused at the handshake, as etcd's --client-crl-file. Only with
    /// --trusted-ca-file (without it no client certificate is asked for; the flag is then
    /// ignored with a warning, as etcd ignores it). PEM or DER, as etcd reads it. Given
    /// twice, the last one counts (etcd's e2e framework passes it twice to grpc-proxy).
    #[arg(long, overrides_with = "client_crl_file")]
    pub(crate) client_crl_file: Option<PathBuf>,

    /// CA bundle (PEM) to verify etcd's certificate with; enables TLS toward etcd.
    #[arg(long)]
    pub(crate) cacert: Option<PathBuf>,
    /// Client certificate presented to etcd (PEM).
    #[arg(long, requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// Key of --cert (PEM).
    #[arg(long, requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// Server name expected in etcd's certificate (default: the endpoint's host).
    #[arg(long)]
    pub(crate) upstream_server_name: Option<String>,

    /// etcd user the cache follows etcd with (its list, watch, progress requests and
    /// revision reads), as `name` or `name:password`. Never used for a client's call:
    /// forwarded calls carry the client's token or none. Needs read on the cached prefix
    /// only; a user with the root role is refused (see --allow-root-upstream).
    #[arg(long)]
    pub(crate) user: Option<String>,
    /// Password of --user (when not given as `name:password`). Visible in `ps`: prefer
    /// --password-file or the environment variable.
    #[arg(long, env = "ETCD_CACHE_PROXY_PASSWORD", hide_env_values = true)]
    pub(crate) password: Option<String>,
    /// File holding the password of --user (its first line; a trailing newline is not
    /// part of it), so that the password is not on the command line.
    #[arg(long, conflicts_with = "password")]
    pub(crate) password_file: Option<PathBuf>,

    /// Revisions (event batches) kept in memory for watches that start in the past.
    #[arg(long, default_value_t = etcd_cache::DEFAULT_HISTORY_WINDOW)]
    pub(crate) history_window: usize,
    /// Key and value bytes the history holds at most (the oldest revisions go first when
    /// this or --history-window is reached), so large values cannot grow the proxy
    /// without bound.
    #[arg(long, default_value_t = etcd_cache::DEFAULT_HISTORY_BYTES)]
    pub(crate) history_bytes: usize,
    /// Responses buffered per cache subscriber before it is caught up from the history.
    #[arg(long, default_value_t = etcd_cache::DEFAULT_SUBSCRIBER_BUFFER)]
    pub(crate) subscriber_buffer: usize,
    /// Responses queued per gRPC Watch stream toward its client; a client that does not
    /// read stops here and never stalls others.
    #[arg(long, default_value_t = 64)]
    pub(crate) watch_send_queue: usize,
    /// Interval of progress notifications for watches created with progress_notify.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub(crate) progress_notify_interval: Duration,

    /// Watches allowed on one client connection; the next is refused with
    /// `ETCD_WATCH_LIMIT: at most N watches are allowed per connection` (0: no limit).
    /// By default a tenth of --max-watches: one client cannot take the whole budget.
    #[arg(long, default_value_t = DEFAULT_MAX_WATCHES_PER_CONNECTION)]
    pub(crate) max_watches_per_connection: usize,
    /// HTTP/2 streams (calls in flight and open Watch, LeaseKeepAlive and other
    /// streams) allowed at once on one client connection, as etcd's
    /// --max-concurrent-streams (etcd's default: no limit). A client past it waits for a
    /// stream to end (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: grpc-go queues the call).
    #[arg(long, default_value_t = DEFAULT_MAX_CONCURRENT_STREAMS)]
    pub(crate) max_concurrent_streams: u32,
    /// Client connections open at once; one beyond is closed at once, logged with this
    /// limit and counted in etcd_cache_proxy_connections_refused_total.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// Bytes of Watch requests one client connection may have sent that its streams'
    /// sessions have not taken yet (the proxy reads Watch streams eagerly: HTTP/2 closes a
    /// connection whose small frames sit unread). A stream whose request finds them spent
    /// ends with ResourceExhausted naming this flag; the connection's other streams go on.
    #[arg(long, default_value_t = DEFAULT_QUEUED_REQUEST_BYTES)]
    pub(crate) max_queued_watch_request_bytes: usize,
    /// Bytes of Watch requests queued over every client connection at once (see
    /// --max-queued-watch-request-bytes): a client with many connections cannot make the
    /// proxy hold many times the per-connection bound. A stream whose request finds them
    /// spent ends with ResourceExhausted naming this flag.
    #[arg(long, default_value_t = DEFAULT_QUEUED_REQUEST_BYTES_TOTAL)]
    pub(crate) max_queued_watch_request_bytes_total: usize,
    /// Watches allowed on the whole proxy.
    #[arg(long, default_value_t = etcd_cache::DEFAULT_MAX_WATCHERS)]
    pub(crate) max_watches: usize,
    /// Largest message sent to a client, in bytes.
    #[arg(long, default_value_t = i32::MAX as usize)]
    pub(crate) max_send_bytes: usize,
    /// Largest message accepted from a client, in bytes (etcd: max-request-bytes + 512 KiB).
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES + GRPC_OVERHEAD_BYTES)]
    pub(crate) max_recv_bytes: usize,
    /// Watch responses of watches created with `fragment` are split above this size, as
    /// etcd splits them above its --max-request-bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub(crate) max_request_bytes: usize,

    /// Address to serve metrics on, in Prometheus' text format at `GET /metrics` (the
    /// cache's `etcd_cache_*` and the proxy's `etcd_cache_proxy_*`). Off when not given.
    #[arg(long)]
    pub(crate) metrics_addr: Option<SocketAddr>,

    /// How often etcd's auth state is learned (on or off, and on etcd >= 3.5 its auth
    /// revision, which drops every cached decision when it moves). Bounds how long a
    /// revoked permission may still be served from memory (etcd 3.4, which has no auth
    /// revision: decisions are asked again every 2 s).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) auth_check_interval: Duration,
    /// etcd's --auth-token-ttl: a decision for a token is kept at most half of it, so a
    /// token that is only used through the cache expires as it does on etcd.
    #[arg(long, value_parser = parse_duration, default_value = "300s")]
    pub(crate) auth_token_ttl: Duration,
    /// Bytes the kept permission decisions take at most (keys, range ends, tokens,
    /// messages and a fixed overhead each): the least recently used token's decisions go
    /// first, so distinct tokens cannot grow the proxy beyond this.
    #[arg(long, default_value_t = DEFAULT_AUTH_CACHE_BYTES)]
    pub(crate) auth_cache_bytes: usize,
    /// Bytes of keys the permission checks in flight at etcd hold at most; a check
    /// beyond that is refused with ResourceExhausted, naming this flag.
    #[arg(long, default_value_t = DEFAULT_AUTH_ASK_BYTES)]
    pub(crate) auth_ask_bytes: usize,
    /// Start even when the proxy's own etcd identity (--user, or the CN of --cert) has
    /// etcd's root role. Without it such a start is refused: the proxy's user needs
    /// read on the cached prefix and nothing else.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub(crate) allow_root_upstream: bool,

    /// Skip verifying etcd's TLS certificate, as grpc-proxy's flag (CAUTION: for tests
    /// only, e.g. etcd's --auto-tls certificates, which no CA signed). The proxy carries
    /// its clients' tokens and passwords to etcd: anyone between it and etcd can read
    /// them. Warned at start, and `etcd_cache_proxy_upstream_tls_unverified` is 1.
    /// `--insecure-skip-tls-verify=true|false` as Go's flags take it.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub(crate) insecure_skip_tls_verify: bool,

    /// How often etcd's member list is asked for and the endpoints that forwarded calls
    /// balance over are set to its members' client URLs, as grpc-proxy's (0: never, the
    /// default; the endpoints stay those of --endpoints).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub(crate) endpoints_auto_sync_interval: Duration,

    /// Lowest TLS version served to clients: TLS1.2 or TLS1.3 (as etcd spells them).
    #[arg(long, value_parser = parse_tls_version, default_value = "TLS1.2")]
    pub(crate) tls_min_version: TlsVersion,
    /// Highest TLS version served to clients: TLS1.2 or TLS1.3 (default: the highest,
    /// TLS1.3; "" is the default, as etcd takes it).
    #[arg(long, value_parser = parse_tls_version, default_value = "")]
    pub(crate) tls_max_version: TlsVersion,

    /// How long in-flight calls may take to finish after SIGTERM or SIGINT.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub(crate) shutdown_timeout: Duration,
}

impl Config {
    /// The user name and password toward etcd, if any (a `--password-file` read by
    /// [`load_password_file`](Self::load_password_file) is in `password`).
    pub(crate) fn credentials(&self) -> Option<(String, String)> {
        let user = self.user.as_ref()?;
        match user.split_once(':') {
            Some((name, password)) => Some((name.to_string(), password.to_string())),
            None => Some((user.clone(), self.password.clone().unwrap_or_default())),
        }
    }

    /// Reads `--password-file` into `password`.
    ///
    /// # Errors
    /// The file cannot be read, or is given without `--user` or with a password in
    /// `--user name:password`.
    pub(crate) fn load_password_file(&mut self) -> Result<(), ConfigError> {
        let Some(path) = &self.password_file else {
            return Ok(());
        };
        match &self.user {
            None => return Err(ConfigError::PasswordFileWithoutUser),
            Some(u) if u.contains(':') => return Err(ConfigError::PasswordTwice),
            Some(_) => {}
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::PasswordFile {
            path: path.clone(),
            source,
        })?;
        let line = text.lines().next().unwrap_or_default();
        self.password = Some(line.to_string());
        Ok(())
    }

    /// True when a TLS flag toward etcd is given (`--cacert`, `--cert`, or, as
    /// grpc-proxy takes it, `--insecure-skip-tls-verify`).
    fn tls_flags(&self) -> bool {
        self.cacert.is_some() || self.cert.is_some() || self.insecure_skip_tls_verify
    }

    /// True when etcd is reached over TLS: an `https://` endpoint, or a bare
    /// `host:port` with a TLS flag. As etcd's Go client (and so grpc-proxy), an
    /// `http://` endpoint is plain whatever the TLS flags say.
    pub(crate) fn upstream_tls(&self) -> bool {
        self.endpoint_urls()
            .iter()
            .any(|e| e.starts_with("https://"))
    }

    /// The endpoints as URLs (a bare `host:port` gets `https` with a TLS flag).
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls_flags() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .map(|e| {
                if e.contains("://") {
                    e.to_string()
                } else {
                    format!("{scheme}://{e}")
                }
            })
            .collect()
    }

    /// What cannot work, found before anything is dialed.
    ///
    /// # Errors
    /// Endpoints that mix `http://` and `https://` (one client cannot carry both), an
    /// endpoint of another scheme, TLS flags toward etcd with `http://` endpoints
    /// (which would carry tokens and passwords in clear), or a `--tls-min-version` above
    /// `--tls-max-version`.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        // As grpc-proxy: an empty --tls-max-version is the highest there is.
        if self.tls_min_version > self.tls_max_version {
            return Err(ConfigError::TlsVersions {
                min: self.tls_min_version,
                max: self.tls_max_version,
            });
        }
        // As etcd grpc-proxy checks them (`checkArgs`), with the reason.
        match (&self.resolver_prefix, self.resolver_ttl) {
            (Some(p), 0) if !p.is_empty() => {
                return Err(ConfigError::ResolverWithoutTtl(p.clone()))
            }
            (None, ttl) if ttl > 0 => return Err(ConfigError::TtlWithoutResolver(ttl)),
            (Some(p), _) if p.is_empty() => return Err(ConfigError::EmptyResolverPrefix),
            (Some(_), _) if self.advertise_client_url.is_none() => {
                return Err(ConfigError::ResolverWithoutAdvertise)
            }
            _ => {}
        }
        let urls = self.endpoint_urls();
        if let Some(bad) = urls
            .iter()
            .find(|u| !u.starts_with("http://") && !u.starts_with("https://"))
        {
            return Err(ConfigError::EndpointScheme(bad.clone()));
        }
        let tls = urls.iter().filter(|u| u.starts_with("https://")).count();
        if tls != 0 && tls != urls.len() {
            return Err(ConfigError::MixedSchemes(urls));
        }
        // etcd's Go client (and so grpc-proxy) ignores them: the proxy would carry its
        // clients' tokens and passwords to etcd in clear while its operator asked for TLS.
        if tls == 0 && !self.given_tls_flags().is_empty() {
            return Err(ConfigError::TlsFlagsInClear {
                flags: self.given_tls_flags().join(", "),
                urls,
            });
        }
        Ok(())
    }

    /// The TLS flags toward etcd that are given, by name.
    fn given_tls_flags(&self) -> Vec<&'static str> {
        [
            ("--cacert", self.cacert.is_some()),
            ("--cert", self.cert.is_some()),
            ("--key", self.key.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// A configuration that cannot work, found before anything is dialed: the flags at
/// fault and what to change.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("--password-file without --user: whose password is it?")]
    PasswordFileWithoutUser,
    #[error("--password-file with --user name:password: give the password once")]
    PasswordTwice,
    #[error("--password-file {}", path.display())]
    PasswordFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--tls-min-version {min} is greater than --tls-max-version {max}")]
    TlsVersions { min: TlsVersion, max: TlsVersion },
    #[error(
        "--resolver-prefix {0:?} needs --resolver-ttl (seconds, at least 1): the registration's lease"
    )]
    ResolverWithoutTtl(String),
    #[error("--resolver-ttl {0} without --resolver-prefix: nothing to register")]
    TtlWithoutResolver(u64),
    #[error("--resolver-prefix is empty: give the prefix to register under")]
    EmptyResolverPrefix,
    #[error(
        "--resolver-prefix needs --advertise-client-url: the URL registered for clients to reach this proxy"
    )]
    ResolverWithoutAdvertise,
    #[error("--endpoints: {0:?} is neither http:// nor https://")]
    EndpointScheme(String),
    #[error("--endpoints mixes http:// and https:// ({0:?}): give every endpoint the same scheme")]
    MixedSchemes(Vec<String>),
    #[error(
        "{flags} given, but every endpoint is http:// ({urls:?}): the connection to etcd would be plain text, tokens and passwords included; give https:// endpoints (or host:port, which the TLS flags make https://), or drop the TLS flags"
    )]
    TlsFlagsInClear { flags: String, urls: Vec<String> },
}

/// A TLS version served to clients (`--tls-min-version`, `--tls-max-version`), ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    /// rustls' protocol version.
    pub(crate) fn rustls(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        }
    }
}

impl std::fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsVersion::Tls12 => "TLS1.2",
            TlsVersion::Tls13 => "TLS1.3",
        })
    }
}

/// `TLS1.2` or `TLS1.3`, as etcd's `tlsutil.GetTLSVersion` takes them; `""` is the
/// highest (etcd: Go's default, which is TLS 1.3). TLS 1.0 and 1.1, which etcd does not
/// take either, are refused with that reason.
fn parse_tls_version(s: &str) -> Result<TlsVersion, String> {
    match s {
        "TLS1.2" => Ok(TlsVersion::Tls12),
        "TLS1.3" | "" => Ok(TlsVersion::Tls13),
        _ => Err(format!(
            "unexpected TLS version {s:?} (supported: TLS1.2, TLS1.3)"
        )),
    }
}

/// A boolean flag's value as Go's `flag` package takes it (`--flag`, `--flag=true`,
/// `--flag=false`, `1`, `0`, `t`, `f`, any case of `true`/`false`), as etcd's and
/// grpc-proxy's flags take it: a script written for them works here.
fn parse_go_bool(s: &str) -> std::result::Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!(
            "{s:?} is not a boolean: use true or false (or 1, 0, t, f), as --flag=true"
        )),
    }
}

/// Parses `250ms`, `10s`, `5m`, `1h` or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| format!("not a duration: {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("unknown unit in {s:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("10x").is_err());
    }

    #[test]
    fn tls_follows_the_endpoint_scheme_as_etcds_clients() {
        let parse = |args: &[&str]| Config::parse_from([&["etcd-cache-proxy"], args].concat());
        let c = parse(&["--endpoints", "http://127.0.0.1:2379", "--cacert", "ca.pem"]);
        let err = c.check().unwrap_err().to_string();
        assert!(
            !c.upstream_tls() && err.contains("--cacert given") && err.contains("http://"),
            "{err}"
        );
        let c = parse(&["--endpoints", "127.0.0.1:2379", "--cacert", "ca.pem"]);
        assert_eq!(c.endpoint_urls(), ["https://127.0.0.1:2379"]);
        assert!(c.upstream_tls() && c.check().is_ok());
        let c = parse(&["--endpoints", "https://a:1,http://b:2"]);
        assert!(
            c.check().unwrap_err().to_string().contains("mixes"),
            "{:?}",
            c.check()
        );
        let c = parse(&["--endpoints", "unix://x"]);
        assert!(c.check().is_err());
    }

    /// --resolver-prefix and --resolver-ttl as grpc-proxy checks them: together, and with
    /// --advertise-client-url.
    #[test]
    fn registration_flags_go_together() {
        let parse = |args: &[&str]| Config::parse_from([&["etcd-cache-proxy"], args].concat());
        let url = ["--advertise-client-url", "http://127.0.0.1:23790"];
        let err = |args: &[&str]| parse(args).check().unwrap_err().to_string();
        assert!(err(&["--resolver-prefix", "/p"]).contains("needs --resolver-ttl"));
        assert!(err(&["--resolver-ttl", "5"]).contains("without --resolver-prefix"));
        assert!(err(&["--resolver-prefix", "/p", "--resolver-ttl", "5"])
            .contains("--advertise-client-url"));
        assert!(err(&["--resolver-prefix", "", "--resolver-ttl", "5"]).contains("empty"));
        let ok = parse(
            &[
                &["--resolver-prefix", "/p", "--resolver-ttl", "5"][..],
                &url[..],
            ]
            .concat(),
        );
        assert!(ok.check().is_ok());
        assert!(parse(&url).check().is_ok());
    }

    /// `--insecure-skip-tls-verify` alone makes a bare `host:port` TLS (as grpc-proxy's
    /// client), and with `http://` endpoints it is no error (nothing to verify).
    #[test]
    fn skipping_tls_verification_makes_bare_endpoints_tls() {
        let parse = |args: &[&str]| Config::parse_from([&["etcd-cache-proxy"], args].concat());
        let c = parse(&[
            "--insecure-skip-tls-verify",
            "--endpoints",
            "127.0.0.1:2379",
        ]);
        assert!(c.insecure_skip_tls_verify && c.upstream_tls() && c.check().is_ok());
        let c = parse(&[
            "--insecure-skip-tls-verify",
            "--endpoints",
            "http://127.0.0.1:2379",
        ]);
        assert!(!c.upstream_tls() && c.check().is_ok());
        assert!(!parse(&[]).insecure_skip_tls_verify);
    }

    /// Boolean flags take a value as Go's flags do (`--insecure-skip-tls-verify=true`, as
    /// etcd's e2e framework and scripts written for grpc-proxy pass it); a bad value is
    /// refused naming the values taken; a value after a space is not the flag's (as in Go).
    #[test]
    fn boolean_flags_take_go_values() {
        let parse = |args: &[&str]| Config::try_parse_from([&["etcd-cache-proxy"], args].concat());
        for (arg, want) in [
            ("--insecure-skip-tls-verify", true),
            ("--insecure-skip-tls-verify=true", true),
            ("--insecure-skip-tls-verify=1", true),
            ("--insecure-skip-tls-verify=T", true),
            ("--insecure-skip-tls-verify=false", false),
            ("--insecure-skip-tls-verify=0", false),
            ("--insecure-skip-tls-verify=FALSE", false),
        ] {
            assert_eq!(
                parse(&[arg]).unwrap().insecure_skip_tls_verify,
                want,
                "{arg}"
            );
        }
        assert!(
            parse(&["--allow-root-upstream=true"])
                .unwrap()
                .allow_root_upstream
        );
        assert!(
            !parse(&["--allow-root-upstream=false"])
                .unwrap()
                .allow_root_upstream
        );
        let err = parse(&["--insecure-skip-tls-verify=yes"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"yes\" is not a boolean: use true or false"),
            "{err}"
        );
        assert!(parse(&["--insecure-skip-tls-verify", "true"]).is_err());
    }

    /// `--endpoints-auto-sync-interval`: a duration, 0 (off) by default.
    #[test]
    fn auto_sync_interval_is_a_duration_off_by_default() {
        let parse = |args: &[&str]| Config::try_parse_from([&["etcd-cache-proxy"], args].concat());
        assert_eq!(
            parse(&[]).unwrap().endpoints_auto_sync_interval,
            Duration::ZERO
        );
        let c = parse(&["--endpoints-auto-sync-interval", "1s"]).unwrap();
        assert_eq!(c.endpoints_auto_sync_interval, Duration::from_secs(1));
        let e = parse(&["--endpoints-auto-sync-interval", "soon"]).unwrap_err();
        assert!(
            e.to_string().contains("--endpoints-auto-sync-interval"),
            "{e}"
        );
    }

    /// `--tls-min-version`/`--tls-max-version` as etcd spells them; another value, or a
    /// minimum above the maximum, is a start-up error that names the flag.
    #[test]
    fn tls_versions_as_etcd_spells_them() {
        let parse = |args: &[&str]| Config::try_parse_from([&["etcd-cache-proxy"], args].concat());
        let c = parse(&[]).unwrap();
        assert_eq!(
            (c.tls_min_version, c.tls_max_version),
            (TlsVersion::Tls12, TlsVersion::Tls13)
        );
        let c = parse(&["--tls-min-version", "TLS1.3", "--tls-max-version", ""]).unwrap();
        assert_eq!(
            (c.tls_min_version, c.tls_max_version),
            (TlsVersion::Tls13, TlsVersion::Tls13)
        );
        assert!(c.check().is_ok());
        let c = parse(&["--tls-min-version", "TLS1.2", "--tls-max-version", "TLS1.2"]).unwrap();
        assert!(c.check().is_ok());
        for (flag, bad) in [
            ("--tls-min-version", "TLS1.1"),
            ("--tls-max-version", "tls1.3"),
        ] {
            let e = parse(&[flag, bad]).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains("TLS1.2, TLS1.3"), "{e}");
        }
        let c = parse(&["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"]).unwrap();
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("--tls-min-version TLS1.3") && e.contains("--tls-max-version TLS1.2"),
            "{e}"
        );
    }

    #[test]
    fn flags_parse() {
        let c = Config::parse_from([
            "etcd-cache-proxy",
            "--endpoints",
            "127.0.0.1:2379,http://127.0.0.1:2381",
            "--user",
            "root:pw",
        ]);
        assert_eq!(
            c.endpoint_urls(),
            ["http://127.0.0.1:2379", "http://127.0.0.1:2381"]
        );
        assert_eq!(c.credentials(), Some(("root".into(), "pw".into())));
        assert!(!c.upstream_tls());
    }

    /// `--password-file`: its first line is the password of `--user`; without `--user`,
    /// beside `--user name:password` or `--password`, or unreadable, a start-up error.
    #[test]
    fn a_password_file_gives_the_password_of_user() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let f = file.display().to_string();
        let parse = |args: &[&str]| Config::try_parse_from([&["etcd-cache-proxy"], args].concat());
        let mut c = parse(&["--user", "cacher", "--password-file", &f]).unwrap();
        c.load_password_file().unwrap();
        assert_eq!(c.credentials(), Some(("cacher".into(), "s3cret".into())));
        let mut c = parse(&["--password-file", &f]).unwrap();
        assert!(c
            .load_password_file()
            .unwrap_err()
            .to_string()
            .contains("without --user"));
        let mut c = parse(&["--user", "cacher:pw", "--password-file", &f]).unwrap();
        assert!(c
            .load_password_file()
            .unwrap_err()
            .to_string()
            .contains("give the password once"));
        assert!(parse(&["--user", "c", "--password", "x", "--password-file", &f]).is_err());
        let missing = dir.path().join("none").display().to_string();
        let mut c = parse(&["--user", "cacher", "--password-file", &missing]).unwrap();
        assert!(c
            .load_password_file()
            .unwrap_err()
            .to_string()
            .contains("--password-file"));
    }
}
