//! Test support for etcd-cache, shared by its integration tests, benchmarks and examples.
//!
//! Not published: a dev-dependency of the root crate (a dev-dependency cycle, which cargo
//! allows for integration tests, benches and examples; the unit tests inside `src/` do not
//! use it, as they would see a second copy of `etcd_cache`).
//!
//! - Real etcd processes: [`EtcdServer`] (one member on loopback with free ports and a
//!   temporary data directory, killed on drop), [`EtcdCluster`] (three members), and
//!   [`grpc_proxy`] (etcd's own gRPC proxy). Their calls block; from async code wrap them in
//!   [`blocking`].
//! - Faults: [`TcpProxy`], a forwarder that drops, black-holes or refuses connections;
//!   [`LaggingCluster`], three members of which one applies every change late.
//! - Clients: [`client`] and [`Connect`], connect and retry until `status` answers.
//! - Fixtures: [`cache_on_etcd`] (an etcd, a client and a ready cache), or its two halves
//!   [`etcd_with_client`] and [`ready_cache`].
//! - Test bodies: [`bounded`] (a time limit that fails instead of hanging) and
//!   [`init_tracing`]; [`full_matrix`] for the longer variants of `--full-matrix` runs.
//! - Stalls: [`small_puts_while_stopped`] stops a process (SIGSTOP) while etcd sends it
//!   thousands of small watch events.
//!
//! - Versions: [`etcd_versions`] maps `3.4` (Debian's 3.4.23) … `3.7` to binaries and flag
//!   spellings. A run's servers are `$ETCD_VERSION`'s ([`EtcdBinaries::default_for_run`];
//!   `$ETCD_BIN` runs any binary instead); a test picks one with [`EtcdOptions::version`] and
//!   moves a member to another with [`EtcdServer::restart_on`] (a rolling upgrade).
//! - TLS: [`TestPki`] makes a CA, server and client certificates at test time;
//!   [`EtcdOptions::tls`] serves them.
//! - Reliability: [`reliability`], the checker of etcd's watch guarantees against etcd's
//!   own history and the seeded workload it checks, for the reliability tests of both
//!   crates.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn a_put_reaches_the_cache() {
//!     testkit::init_tracing();
//!     testkit::bounded(Duration::from_secs(60), async {
//!         let (_etcd, mut client, cache) =
//!             testkit::cache_on_etcd(|builder| builder.prefix("/app/")).await;
//!         let put = client.put("/app/a", "1", None).await.unwrap();
//!         cache.wait_for_revision(put.header().unwrap().revision()).await.unwrap();
//!         assert_eq!(cache.get("/app/a", None).await.unwrap().kvs().len(), 1);
//!     })
//!     .await;
//! }
//! # fn main() {}
//! ```

mod cluster;
mod connect;
mod etcd;
pub mod etcd_versions;
mod example;
mod fixture;
mod grpc_proxy;
mod http;
mod peer_lag;
pub mod reliability;
mod run;
mod stall;
mod tcp_proxy;
mod tls;

pub use cluster::EtcdCluster;
pub use connect::{client, Connect, ConnectError, CONNECT_RETRY_FOR};
pub use etcd::{
    etcd_binary, free_port, EtcdOptions, EtcdServer, DEFAULT_START_TIMEOUT, PORT_SLOT_ENV,
};
pub use etcd_versions::{EtcdBinaries, EtcdVersion, ServerVersion};
pub use example::{example_main, unique_prefix};
pub use fixture::{
    cache_on_etcd, etcd_with_client, ready_cache, wait_for_version_verdict, READY_TIMEOUT,
    VERDICT_TIMEOUT,
};
pub use grpc_proxy::{grpc_proxy, ProxyProcess};
pub use http::{grpc_started, http_request, is_healthy, member_status, MemberStatus};
pub use peer_lag::LaggingCluster;
pub use run::{blocking, bounded, init_tracing};
pub use stall::{full_matrix, small_puts_while_stopped, StallRound, FULL_MATRIX_ENV, WRITERS};
pub use tcp_proxy::TcpProxy;
pub use tls::{ClientIdentity, ServerTls, TestPki};
