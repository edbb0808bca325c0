//! The cache on etcd with TLS (certificates made at test time), client-certificate auth, and
//! etcd's user/password auth with a role limited to the cache's prefix; the run's server
//! (`ETCD_VERSION`).
//!
//! On each: load (keys written before the cache), follow (writes reach a subscriber, in
//! order, no gap), reconnect (etcd killed and restarted; the subscriber sees every revision
//! once), consistent reads (each compared with etcd's at its revision), and the version
//! probe: with `CacheBuilder::connect_options` carrying the same TLS and credentials every
//! member's version is learned (trusted on a fixed server); without them the members read
//! as unknown (`stats().unknown_versions`) and the cache takes the slow path.
//!
//! Failures: a wrong CA, a missing or foreign client certificate, a permission denied, a
//! password changed or a permission revoked under a running cache: `Error::Failed` from a
//! bounded `wait_ready()` or the cache's status, never a hang or an endless retry. Tokens:
//! simple tokens with a 2 s TTL and a restart (etcd forgets every token), JWT tokens made
//! old by an auth-store change: the cache authenticates again and keeps working.

use std::time::{Duration, Instant};

use etcd_cache::{Cache, CacheStatus, Error, GetOptions, WatchOptions};
use etcd_client::{Client, ConnectOptions, Permission};
use testkit::{EtcdOptions, EtcdServer, ServerVersion, TestPki};

/// Every test ends within this.
const TEST_LIMIT: Duration = Duration::from_secs(90);
/// How long a cache that etcd refuses for good may take to stop.
const FAIL_WITHIN: Duration = Duration::from_secs(5);

fn base_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
}

async fn connect(endpoint: &str, options: ConnectOptions) -> Client {
    testkit::Connect::new()
        .options(options)
        .retry_for(Duration::from_secs(15))
        .client(&[endpoint])
        .await
}

/// Whether the server's release answers `RequestProgress` in a way the cache trusts.
async fn fixed(client: &mut Client) -> (String, bool) {
    let release = client.status().await.unwrap().version().to_string();
    let fixed = ServerVersion::parse(&release).is_some_and(ServerVersion::trusts_progress);
    (release, fixed)
}

type Row = (Vec<u8>, Vec<u8>, i64, i64);

async fn etcd_rows(client: &mut Client, prefix: &str, revision: i64) -> Vec<Row> {
    let resp = client
        .get(
            prefix,
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_revision(revision),
            ),
        )
        .await
        .expect("etcd's read at the revision");
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

fn cache_rows(kvs: &[etcd_cache::KeyValue]) -> Vec<Row> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

/// Waits (bounded) until `client` answers again, e.g. after a restart.
async fn wait_answering(client: &mut Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout(Duration::from_secs(2), client.get("/outside", None)).await {
            Ok(Ok(_)) => return,
            other => assert!(
                Instant::now() < deadline,
                "the writer does not answer 20 s after the restart: {:?}",
                other.map(|r| r.map(|_| ()))
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Puts `n` keys under `prefix`; returns their revisions.
async fn write(client: &mut Client, prefix: &str, tag: &str, n: usize) -> Vec<i64> {
    let mut revs = Vec::with_capacity(n);
    for i in 0..n {
        let rev = client
            .put(format!("{prefix}{}", i % 7), format!("{tag}-{i}"), None)
            .await
            .unwrap_or_else(|e| panic!("put {tag}-{i}: {e}"))
            .header()
            .unwrap()
            .revision();
        revs.push(rev);
    }
    revs
}

/// Consistent reads, each after a write outside the prefix (`noise`, a key the writer may
/// write): at or after that write, equal to etcd's answer at the read's revision. Returns
/// how many etcd answered.
async fn checked_reads(
    cache: &Cache,
    writer: &mut Client,
    prefix: &str,
    noise: &str,
    n: usize,
) -> u64 {
    let before = cache.stats().fallback_reads;
    for i in 0..n {
        let acked = writer
            .put(noise, i.to_string(), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let resp = cache
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap_or_else(|e| panic!("consistent read {i}: {e}"));
        assert!(
            resp.revision() >= acked,
            "stale: {} < {acked}",
            resp.revision()
        );
        assert_eq!(
            cache_rows(resp.kvs()),
            etcd_rows(writer, prefix, resp.revision()).await,
            "read {i} at {}",
            resp.revision()
        );
    }
    cache.stats().fallback_reads - before
}

/// Receives from `watch` until `last`; asserts exactly the revisions `want`, in order.
async fn expect_revisions(watch: &mut etcd_cache::WatchStream, want: &[i64]) {
    let last = *want.last().unwrap();
    let mut got = Vec::new();
    while !matches!(got.last(), Some(&r) if r >= last) {
        let resp = tokio::time::timeout(Duration::from_secs(30), watch.message())
            .await
            .expect("the subscriber got nothing for 30 s")
            .expect("watch error")
            .expect("watch ended");
        assert!(!resp.canceled(), "canceled: {resp:?}");
        let mut revs: Vec<i64> = resp
            .events()
            .iter()
            .map(|e| e.kv().unwrap().mod_revision())
            .collect();
        revs.dedup();
        got.extend(revs);
    }
    assert_eq!(got, want, "the subscriber's revisions");
}

/// Load, follow, reconnect, consistent reads and the version probe on one server, with the
/// cache's client options `cache_options` (and the same as its `connect_options`) and the
/// test's own writer `writer` (allowed outside the prefix too).
async fn load_follow_reconnect_read_probe(
    name: &str,
    etcd: &mut EtcdServer,
    mut writer: Client,
    cache_options: ConnectOptions,
    prefix: &str,
) -> Cache {
    let (release, fixed) = fixed(&mut writer).await;
    let loaded = write(&mut writer, prefix, "load", 30).await;
    let cache_client = connect(&etcd.endpoint(), cache_options.clone()).await;
    let cache = testkit::ready_cache(cache_client, |b| {
        b.prefix(prefix)
            .connect_options(cache_options.clone())
            .backoff(Duration::from_millis(20), Duration::from_millis(200))
    })
    .await;
    // Load.
    assert!(cache.revision() >= *loaded.last().unwrap());
    let all = cache
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_serializable()),
        )
        .await
        .unwrap();
    assert_eq!(
        cache_rows(all.kvs()),
        etcd_rows(&mut writer, prefix, all.revision()).await
    );
    // The probe with the same TLS and credentials learns every member's version.
    let trusted = testkit::wait_for_version_verdict(&cache).await;
    assert_eq!(
        trusted,
        fixed,
        "etcd {release}: {:?}",
        cache.server_versions()
    );
    assert_eq!(cache.stats().unknown_versions, 0);
    // Follow.
    let mut watch = cache
        .watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(cache.revision() + 1),
            ),
        )
        .await
        .unwrap();
    let mut want = write(&mut writer, prefix, "follow", 20).await;
    // Consistent reads.
    let from_etcd = checked_reads(&cache, &mut writer, prefix, "/outside", 20).await;
    if trusted {
        assert_eq!(from_etcd, 0, "fast path");
    } else {
        assert_eq!(from_etcd, 20, "untrusted: etcd answers");
    }
    // Reconnect: etcd killed and restarted on its data dir.
    let connects = cache.stats().connects;
    let down = Instant::now();
    tokio::task::block_in_place(|| {
        etcd.kill();
        etcd.restart();
    });
    wait_answering(&mut writer).await;
    want.extend(write(&mut writer, prefix, "after", 20).await);
    tokio::time::timeout(
        Duration::from_secs(30),
        cache.wait_for_revision(*want.last().unwrap()),
    )
    .await
    .expect("the cache caught up after the restart within 30 s")
    .unwrap();
    assert!(cache.stats().connects > connects, "it reconnected");
    let back = down.elapsed();
    expect_revisions(&mut watch, &want).await;
    let trusted_again = testkit::wait_for_version_verdict(&cache).await;
    assert_eq!(trusted_again, fixed);
    let from_etcd_after = checked_reads(&cache, &mut writer, prefix, "/outside", 10).await;
    println!(
        "TLS/AUTH | {name} | etcd {release} | loaded {} keys | followed {} revisions, no gap | restart: caught up {back:?} after the kill | consistent reads 30, sent to etcd {} | versions {:?} (unknown 0, trusted {trusted})",
        all.kvs().len(),
        want.len(),
        from_etcd + from_etcd_after,
        cache.server_versions(),
    );
    cache
}

// ---------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------

fn tls_options(pki: &TestPki, identity: Option<&testkit::ClientIdentity>) -> ConnectOptions {
    base_options().with_tls(pki.client_tls(identity))
}

/// A second cache on the same server, built without `connect_options`: its probe cannot
/// reach the members, which read as unknown; it stays on the slow path, and correct.
async fn probe_without_options_is_unknown(
    etcd: &EtcdServer,
    client_options: ConnectOptions,
    writer: &mut Client,
    prefix: &str,
) -> (usize, Vec<String>) {
    let client = connect(&etcd.endpoint(), client_options).await;
    let cache = testkit::ready_cache(client, |b| b.prefix(prefix)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while cache.stats().unknown_versions == 0 {
        assert!(
            Instant::now() < deadline,
            "the probe without options still learned {:?}",
            cache.server_versions()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = cache.stats();
    assert!(!stats.progress_trusted, "unknown versions are not trusted");
    let from_etcd = checked_reads(&cache, writer, prefix, "/outside", 5).await;
    assert_eq!(from_etcd, 5, "untrusted: etcd answers");
    let versions = cache.server_versions();
    cache.close().await;
    (stats.unknown_versions, versions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_server_certificate() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let pki = TestPki::new();
        let mut etcd = testkit::blocking({
            let tls = pki.server_tls(false);
            move || EtcdServer::start_with(EtcdOptions::default().tls(tls))
        })
        .await;
        assert!(etcd.endpoint().starts_with("https://127.0.0.1:"));
        let options = tls_options(&pki, None);
        let mut writer = connect(&etcd.endpoint(), options.clone()).await;
        let cache =
            load_follow_reconnect_read_probe("TLS", &mut etcd, writer.clone(), options.clone(), "/app/")
                .await;
        let (unknown, versions) =
            probe_without_options_is_unknown(&etcd, options, &mut writer, "/app/").await;
        println!("TLS/AUTH | TLS, probe without connect_options | unknown {unknown} | versions {versions:?}");
        cache.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let pki = TestPki::new();
        let mut etcd = testkit::blocking({
            let tls = pki.server_tls(true);
            move || EtcdServer::start_with(EtcdOptions::default().tls(tls))
        })
        .await;
        let identity = pki.client_identity("app");
        let options = tls_options(&pki, Some(&identity));
        let mut writer = connect(&etcd.endpoint(), options.clone()).await;
        let cache = load_follow_reconnect_read_probe(
            "mTLS (--client-cert-auth)",
            &mut etcd,
            writer.clone(),
            options.clone(),
            "/app/",
        )
        .await;
        let (unknown, versions) =
            probe_without_options_is_unknown(&etcd, options, &mut writer, "/app/").await;
        println!("TLS/AUTH | mTLS, probe without connect_options | unknown {unknown} | versions {versions:?}");
        cache.close().await;
    })
    .await;
}

/// Builds a cache on `client` (short back-off) and waits for it, bounded: it must not
/// become ready, and must stop with [`Error::Failed`]. Returns the error and how long it took.
async fn must_fail(client: Client, prefix: &str) -> (Error, Duration) {
    let cache = Cache::builder(client)
        .prefix(prefix)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .await
        .expect("build never fails on a well-formed configuration");
    let started = Instant::now();
    // `wait_ready` itself, without a time limit of its own: a permanent refusal must end
    // it. The bound only turns a hang into a failure.
    let err = match tokio::time::timeout(FAIL_WITHIN, cache.wait_ready()).await {
        Ok(Ok(())) => panic!("the cache became ready"),
        Ok(Err(e)) => e,
        Err(_) => panic!(
            "wait_ready() still waiting after {FAIL_WITHIN:?}: status {:?}",
            cache.status()
        ),
    };
    let took = started.elapsed();
    assert!(matches!(err, Error::Failed { .. }), "{err:?}");
    assert!(matches!(cache.status(), CacheStatus::Failed { .. }));
    // Reads and watches say the same, at once.
    let read = cache.get(prefix, None).await.expect_err("a stopped cache");
    assert!(matches!(read, Error::Failed { .. }), "{read:?}");
    cache.close().await;
    (err, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_wrong_ca_or_client_certificate_is_a_clear_error() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let pki = TestPki::new();
        let other = TestPki::new();
        let etcd = testkit::blocking({
            let tls = pki.server_tls(true);
            move || EtcdServer::start_with(EtcdOptions::default().tls(tls))
        })
        .await;
        // etcd's alert for a refused client certificate reaches the client only when it
        // reads before it writes (seldom on a busy machine: it sees the connection
        // closed or a broken pipe instead); the cache then says so after a few
        // connections closed in a row (`Error::ClosedAtConnect`). Either is clear.
        const REFUSED: &[&str] = &[
            "received fatal alert",
            "client certificate missing or not trusted",
        ];
        let cases = [
            (
                "a CA that did not sign the server's certificate",
                tls_options(&other, Some(&pki.client_identity("app"))),
                &["invalid peer certificate"][..],
            ),
            ("no client certificate", tls_options(&pki, None), REFUSED),
            (
                "a client certificate of another CA",
                tls_options(&pki, Some(&other.client_identity("app"))),
                REFUSED,
            ),
        ];
        for (what, options, says) in cases {
            // etcd-client connects lazily: the connect itself succeeds.
            let client = Client::connect([etcd.endpoint()], Some(options))
                .await
                .expect("a lazy connect");
            let (err, took) = must_fail(client, "/app/").await;
            let text = format!("{err}: {:?}", err);
            assert!(says.iter().any(|s| text.contains(s)), "{what}: {text}");
            println!("TLS/AUTH | failure: {what} | Error::Failed after {took:?}: {err}");
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// User/password auth
// ---------------------------------------------------------------------------------------

const ROOT_PASSWORD: &str = "root-secret";
const APP_PASSWORD: &str = "app-secret";

fn user_options(user: &str, password: &str) -> ConnectOptions {
    base_options()
        .with_user(user, password)
        .with_auto_token_refresh(true)
}

/// Turns etcd's auth on: `root` (role root); `app` and `app2` with readwrite on `/app/`
/// only (role `app-rw`); `other` with readwrite on `/other/` only. Returns a root client.
async fn enable_auth(etcd: &EtcdServer) -> Client {
    let mut admin = connect(&etcd.endpoint(), base_options()).await;
    admin.user_add("root", ROOT_PASSWORD, None).await.unwrap();
    // etcdctl creates the root role on `auth enable`; the API does not.
    let _ = admin.role_add("root").await;
    admin.user_grant_role("root", "root").await.unwrap();
    for (role, prefix) in [("app-rw", "/app/"), ("other-rw", "/other/")] {
        admin.role_add(role).await.unwrap();
        admin
            .role_grant_permission(role, Permission::read_write(prefix).with_prefix())
            .await
            .unwrap();
    }
    for (user, password, role) in [
        ("app", APP_PASSWORD, "app-rw"),
        ("app2", "app2-secret", "app-rw"),
        ("other", "other-secret", "other-rw"),
    ] {
        admin.user_add(user, password, None).await.unwrap();
        admin.user_grant_role(user, role).await.unwrap();
    }
    admin.auth_enable().await.unwrap();
    connect(&etcd.endpoint(), user_options("root", ROOT_PASSWORD)).await
}

/// A ready cache for `user` on `/app/`, its client and `connect_options` with the same
/// credentials (automatic token refresh on), and a subscriber from the next revision.
async fn user_cache(
    etcd: &EtcdServer,
    user: &str,
    password: &str,
) -> (Cache, etcd_cache::WatchStream) {
    let options = user_options(user, password);
    let client = connect(&etcd.endpoint(), options.clone()).await;
    let cache = testkit::ready_cache(client, |b| {
        b.prefix("/app/")
            .connect_options(options.clone())
            .backoff(Duration::from_millis(20), Duration::from_millis(200))
    })
    .await;
    let watch = cache
        .watch(
            "/app/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(cache.revision() + 1),
            ),
        )
        .await
        .unwrap();
    (cache, watch)
}

/// Kills and restarts etcd (it forgets every simple token), and waits until `root` answers.
async fn restart(etcd: &mut EtcdServer, root: &mut Client) {
    tokio::task::block_in_place(|| {
        etcd.kill();
        etcd.restart();
    });
    wait_answering(root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_user_with_a_role_on_the_prefix() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let mut etcd = testkit::blocking(EtcdServer::start).await;
        let root = enable_auth(&etcd).await;
        // The role really is limited to the prefix.
        let mut app = connect(&etcd.endpoint(), user_options("app", APP_PASSWORD)).await;
        let denied = app
            .put("/outside", "x", None)
            .await
            .expect_err("outside the role");
        assert!(denied.to_string().contains("permission denied"), "{denied}");
        let cache = load_follow_reconnect_read_probe(
            "auth (user app, role readwrite on /app/)",
            &mut etcd,
            root,
            user_options("app", APP_PASSWORD),
            "/app/",
        )
        .await;
        cache.close().await;
        // The probe without the credentials: from 3.5 on, Status on a member needs a user
        // when auth is on, and the member reads as unknown; 3.4 answers Status to anyone.
        let client = connect(&etcd.endpoint(), user_options("app", APP_PASSWORD)).await;
        let blind = testkit::ready_cache(client, |b| b.prefix("/app/")).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while blind.server_versions().is_empty() {
            assert!(Instant::now() < deadline, "no version probe within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let unknown = blind.stats().unknown_versions;
        if unknown > 0 {
            assert!(
                !blind.stats().progress_trusted,
                "unknown versions are not trusted"
            );
        } else {
            let (release, fixed) = fixed(&mut app).await;
            assert_eq!(
                testkit::wait_for_version_verdict(&blind).await,
                fixed,
                "etcd {release}"
            );
        }
        println!(
            "TLS/AUTH | auth, probe without connect_options | unknown {unknown} | versions {:?}",
            blind.server_versions()
        );
        blind.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_are_clear_errors() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let etcd = testkit::blocking(EtcdServer::start).await;
        let _root = enable_auth(&etcd).await;
        // A bad password: etcd-client authenticates when it connects, so there is no
        // client to build a cache on.
        let bad = Client::connect([etcd.endpoint()], Some(user_options("app", "wrong")))
            .await
            .err()
            .expect("a bad password is refused at connect");
        assert!(bad.to_string().contains("authentication failed"), "{bad}");
        println!("TLS/AUTH | failure: bad password | Client::connect: {bad}");
        // No credentials at all.
        let anonymous = Client::connect([etcd.endpoint()], Some(base_options()))
            .await
            .unwrap();
        let (err, took) = must_fail(anonymous, "/app/").await;
        assert!(err.to_string().contains("user name is empty"), "{err}");
        println!("TLS/AUTH | failure: no credentials | Error::Failed after {took:?}: {err}");
        // A role without the prefix.
        let other = connect(&etcd.endpoint(), user_options("other", "other-secret")).await;
        let (err, took) = must_fail(other, "/app/").await;
        assert!(err.to_string().contains("permission denied"), "{err}");
        println!("TLS/AUTH | failure: permission denied | Error::Failed after {took:?}: {err}");
    })
    .await;
}

/// Waits (bounded) for the cache to stop, and returns its error.
async fn wait_failed(cache: &Cache, limit: Duration) -> Error {
    let deadline = Instant::now() + limit;
    loop {
        if let CacheStatus::Failed { error } = cache.status() {
            return Error::Failed { source: error };
        }
        assert!(
            Instant::now() < deadline,
            "the cache did not stop within {limit:?}: {:?}",
            cache.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Auth changes while caches run, each followed by a restart (etcd forgets every simple
/// token, so each cache reconnects with a new watch and must authenticate again):
/// an unrelated change (a new user) is survived; a changed password and a revoked
/// permission stop the caches concerned with a clear `Error::Failed`, never a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_changes_under_running_caches() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let mut etcd = testkit::blocking(EtcdServer::start).await;
        let mut root = enable_auth(&etcd).await;
        let (app, mut app_watch) = user_cache(&etcd, "app", APP_PASSWORD).await;
        let (app2, _app2_watch) = user_cache(&etcd, "app2", "app2-secret").await;
        let mut want = write(&mut root, "/app/", "before", 5).await;

        // An unrelated change to the auth store, then a restart: both caches go on.
        root.user_add("late", "late-secret", None).await.unwrap();
        checked_reads(&app, &mut root, "/app/", "/outside", 3).await;
        want.extend(write(&mut root, "/app/", "after-change", 5).await);
        restart(&mut etcd, &mut root).await;
        want.extend(write(&mut root, "/app/", "after-restart", 5).await);
        for cache in [&app, &app2] {
            tokio::time::timeout(
                Duration::from_secs(20),
                cache.wait_for_revision(*want.last().unwrap()),
            )
            .await
            .expect("caught up after the restart within 20 s")
            .unwrap();
        }
        expect_revisions(&mut app_watch, &want).await;
        checked_reads(&app, &mut root, "/app/", "/outside", 3).await;
        println!("TLS/AUTH | auth store changed (a user added), then a restart | both caches caught up, subscriber exact ({} revisions)", want.len());

        // app2's password changes: etcd drops its tokens; at the next watch (after the
        // restart) the cache cannot authenticate any more.
        root.user_change_password("app2", "new-secret").await.unwrap();
        restart(&mut etcd, &mut root).await;
        write(&mut root, "/app/", "after-password", 3).await;
        let err = wait_failed(&app2, Duration::from_secs(20)).await;
        assert!(err.to_string().contains("authentication failed"), "{err}");
        println!("TLS/AUTH | password changed, then a restart | Error::Failed: {err}");
        app2.close().await;

        // app's role loses the prefix: the next watch (after the restart) is refused.
        root.role_revoke_permission(
            "app-rw",
            "/app/",
            Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
        )
        .await
        .unwrap();
        restart(&mut etcd, &mut root).await;
        let err = wait_failed(&app, Duration::from_secs(20)).await;
        assert!(err.to_string().contains("permission denied"), "{err}");
        println!("TLS/AUTH | permission revoked, then a restart | Error::Failed: {err}");
        app.close().await;
    })
    .await;
}

/// Simple tokens with a 2 s TTL (they expire after 2 s unused), then a restart (etcd
/// forgets every token). The cache authenticates again whenever etcd refuses its token,
/// with or without `with_auto_token_refresh` (which covers only failed calls of
/// etcd-client, not a watch refused in a watch response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_token_expiry_and_restart() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let mut etcd = testkit::blocking(|| {
            EtcdServer::start_with(
                EtcdOptions::default()
                    .arg("--auth-token=simple")
                    .arg("--auth-token-ttl=2"),
            )
        })
        .await;
        let mut root = enable_auth(&etcd).await;
        let prefix = "/app/";
        for refresh in [true, false] {
            let options = base_options()
                .with_user("app", APP_PASSWORD)
                .with_auto_token_refresh(refresh);
            let client = connect(&etcd.endpoint(), options.clone()).await;
            let cache = testkit::ready_cache(client, |b| {
                b.prefix(prefix)
                    .connect_options(options.clone())
                    .upstream_idle_timeout(Duration::from_secs(3))
                    .backoff(Duration::from_millis(20), Duration::from_millis(200))
            })
            .await;
            let mut watch = cache
                .watch(
                    prefix,
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(cache.revision() + 1),
                    ),
                )
                .await
                .unwrap();
            // Idle past the TTL and the idle timeout: the cache's token expires, and its
            // liveness probe runs with it.
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert!(
                matches!(cache.status(), CacheStatus::Ready),
                "refresh {refresh}: {:?}",
                cache.status()
            );
            let mut want = write(&mut root, prefix, "after-ttl", 5).await;
            let from_etcd = checked_reads(&cache, &mut root, prefix, "/outside", 5).await;
            restart(&mut etcd, &mut root).await;
            want.extend(write(&mut root, prefix, "after-restart", 5).await);
            tokio::time::timeout(
                Duration::from_secs(20),
                cache.wait_for_revision(*want.last().unwrap()),
            )
            .await
            .expect("caught up after the restart within 20 s")
            .unwrap();
            expect_revisions(&mut watch, &want).await;
            // Idle past the TTL once more, then reads.
            tokio::time::sleep(Duration::from_secs(5)).await;
            checked_reads(&cache, &mut root, prefix, "/outside", 5).await;
            assert!(matches!(cache.status(), CacheStatus::Ready));
            println!("TLS/AUTH | token TTL 2 s, auto refresh {refresh} | expiry twice and a restart: ready, subscriber exact ({} revisions), reads checked (sent to etcd {from_etcd} of 5 before the restart) | connects {}", want.len(), cache.stats().connects);
            cache.close().await;
        }
    })
    .await;
}

/// JWT tokens carry the auth store's revision: after any change to the auth store (here a
/// new user) etcd refuses every older token with "revision of auth store is old", which
/// etcd-client does not refresh. The cache authenticates again and goes on; so does a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_jwt_tokens_and_an_auth_store_change() {
    testkit::init_tracing();
    testkit::bounded(TEST_LIMIT, async {
        let pki = TestPki::new();
        let arg = pki.jwt_auth_token_arg(600);
        let mut etcd =
            testkit::blocking(move || EtcdServer::start_with(EtcdOptions::default().arg(arg)))
                .await;
        let mut root = enable_auth(&etcd).await;
        let (cache, mut watch) = user_cache(&etcd, "app", APP_PASSWORD).await;
        let mut want = write(&mut root, "/app/", "before", 5).await;
        checked_reads(&cache, &mut root, "/app/", "/outside", 3).await;
        root.user_add("late", "late-secret", None).await.unwrap();
        // The test's own client is refused as well, and etcd-client does not refresh it.
        let refused = root.get("/app/", None).await.expect_err("an old JWT token");
        assert!(refused.to_string().contains("revision of auth store is old"), "{refused}");
        root.refresh_token().await.unwrap();
        let from_etcd = checked_reads(&cache, &mut root, "/app/", "/outside", 3).await;
        want.extend(write(&mut root, "/app/", "after-change", 5).await);
        tokio::time::timeout(
            Duration::from_secs(10),
            cache.wait_for_revision(*want.last().unwrap()),
        )
        .await
        .expect("followed after the auth change")
        .unwrap();
        restart(&mut etcd, &mut root).await;
        want.extend(write(&mut root, "/app/", "after-restart", 5).await);
        tokio::time::timeout(
            Duration::from_secs(20),
            cache.wait_for_revision(*want.last().unwrap()),
        )
        .await
        .expect("caught up after the restart within 20 s")
        .unwrap();
        expect_revisions(&mut watch, &want).await;
        checked_reads(&cache, &mut root, "/app/", "/outside", 3).await;
        assert!(matches!(cache.status(), CacheStatus::Ready));
        println!("TLS/AUTH | JWT tokens, an auth store change, then a restart | reads checked (sent to etcd {from_etcd} of 3 after the change), subscriber exact ({} revisions)", want.len());
        cache.close().await;
    })
    .await;
}
