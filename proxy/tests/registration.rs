//! Several proxies behind one name (issue 20): `--resolver-prefix` / `--resolver-ttl` as
//! etcd grpc-proxy spells them. Each proxy registers its advertised address in etcd, in
//! the format etcd's naming resolver reads, on a lease it keeps alive; Cluster.MemberList
//! through any of them lists the live ones; a proxy killed with SIGKILL is gone within
//! its TTL, one stopped with SIGTERM at once; and a client resumes its watch on another
//! proxy with no gap and no duplicate.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, WatchOptions};
use support::{client, go_program, EtcdOptions, EtcdServer, Proxy};

/// As etcd's docs name it: without "/", since Go's resolver makes the rest of its
/// target the :authority of every call, and an authority with "/" is refused by HTTP/2
/// servers that check it (hyper does; grpc-go does not).
const PREFIX: &str = "___etcd_cache_proxies";
const TTL: u64 = 2;

/// A proxy in front of `upstream` (an endpoint URL), registered under [`PREFIX`].
fn registered_proxy(upstream: &str) -> Proxy {
    Proxy::start(
        upstream,
        &[
            "--advertise-client-url",
            "{addr}",
            "--resolver-prefix",
            PREFIX,
            "--resolver-ttl",
            &TTL.to_string(),
        ],
    )
}

/// The addresses registered under [`PREFIX`] now, in key order, read straight from etcd.
async fn registered(etcd: &mut Client) -> Vec<(String, serde_json::Value)> {
    let resp = etcd
        .get(format!("{PREFIX}/"), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            let key = kv
                .key_str()
                .unwrap()
                .trim_start_matches(PREFIX)
                .trim_start_matches('/');
            (key.to_string(), serde_json::from_slice(kv.value()).unwrap())
        })
        .collect()
}

/// Two proxies registered in front of `etcd`, once both are listed.
async fn two_registered(etcd: &EtcdServer, direct: &mut Client) -> (Proxy, Proxy) {
    let a = registered_proxy(&etcd.endpoint());
    let b = registered_proxy(&etcd.endpoint());
    let want = [a.addr().to_string(), b.addr().to_string()];
    registered_becomes(direct, &want, Duration::from_secs(10)).await;
    (a, b)
}

/// Waits until the registered addresses are `want` (sorted); fails after `limit`.
async fn registered_becomes(etcd: &mut Client, want: &[String], limit: Duration) -> Duration {
    let started = Instant::now();
    let mut want = want.to_vec();
    want.sort();
    loop {
        let now: Vec<String> = registered(etcd).await.into_iter().map(|(k, _)| k).collect();
        if now == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "registered {now:?}, want {want:?} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn member_urls(via: &str) -> Vec<String> {
    let mut c = client(via).await;
    let mut urls: Vec<String> = c
        .member_list()
        .await
        .unwrap()
        .members()
        .iter()
        .flat_map(|m| m.client_urls().iter().cloned())
        .collect();
    urls.sort();
    urls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_proxies_are_listed_and_leave_when_they_stop_or_die() {
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut direct = client(&etcd.endpoint()).await;
    let (mut a, mut b) = two_registered(&etcd, &mut direct).await;
    let (addr_a, addr_b) = (a.addr().to_string(), b.addr().to_string());
    // The value etcd's endpoints manager writes: an add update, grpc-proxy's metadata.
    for (addr, v) in registered(&mut direct).await {
        assert_eq!(v["Op"], 0, "{v}");
        assert_eq!(v["Addr"], addr.as_str(), "{v}");
        let meta: serde_json::Value =
            serde_json::from_str(v["Metadata"].as_str().expect("metadata is a string")).unwrap();
        assert!(meta["name"].as_str().is_some_and(|n| !n.is_empty()), "{v}");
    }
    // Each lists both, as grpc-proxy's cluster proxy does.
    let both = {
        let mut v = vec![addr_a.clone(), addr_b.clone()];
        v.sort();
        v
    };
    assert_eq!(member_urls(&a.endpoint()).await, both);
    assert_eq!(member_urls(&b.endpoint()).await, both);
    // etcdctl's `member list` through a proxy shows them too.
    if let Some(out) = etcdctl_member_list(&a.endpoint()) {
        assert!(out.contains(&addr_a) && out.contains(&addr_b), "{out}");
    }
    // B dies: etcd drops it when its lease expires, after the TTL (etcd checks leases
    // every 500 ms; the bound has 8 s of margin for a loaded machine: the time is printed).
    b.kill();
    let gone = registered_becomes(
        &mut direct,
        std::slice::from_ref(&addr_a),
        Duration::from_secs(TTL + 8),
    )
    .await;
    eprintln!("a proxy killed with SIGKILL left the list after {gone:?} (TTL {TTL} s)");
    assert_eq!(member_urls(&a.endpoint()).await, vec![addr_a.clone()]);
    // A stops: it deregisters itself before it exits.
    let status = a.terminate(Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        registered(&mut direct).await.is_empty(),
        "a proxy stopped with SIGTERM is deregistered before it exits"
    );
}

/// etcd's naming resolver over the prefix (Go's clientv3, as fleets use it) finds every
/// live proxy, and a connection it resolves reads through them.
#[test]
fn go_clients_find_the_proxies_with_etcds_resolver() {
    let Some(bin) = go_program() else { return };
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let a = registered_proxy(&etcd.endpoint());
    let b = registered_proxy(&etcd.endpoint());
    let want = format!("{},{}", a.addr(), b.addr());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(&bin)
            .args([
                "-etcd",
                &etcd.endpoint(),
                "-prefix",
                PREFIX,
                "-want",
                &want,
                "resolver",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && stdout.contains("OK resolver") {
            break;
        }
        // Until both have registered (each does once it serves).
        assert!(
            Instant::now() < deadline,
            "resolver: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Go's clientv3 watcher on a connection that etcd's naming resolver keeps on the live
/// registered proxies: both proxies it started with are killed (SIGKILL) in turn, a
/// third registers meanwhile, and the watch resumes each time on a live one, from the
/// revision after its last event: every put once, in order (the Go program checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_watch_through_the_resolver_survives_its_proxies_dying() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let Some(bin) = go_program() else { return };
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut direct = client(&etcd.endpoint()).await;
    let (mut a, mut b) = two_registered(&etcd, &mut direct).await;
    let addr_b = b.addr().to_string();
    const PER_STEP: usize = 40;
    let mut child = Command::new(&bin)
        .args(["-etcd", &etcd.endpoint(), "-prefix", PREFIX, "-key", "/rw/"])
        .args(["-count", &(3 * PER_STEP).to_string(), "resolver-watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the Go watcher is ready within 30 s");
    assert_eq!(line.as_deref(), Some("READY"));
    let mut next = 0;
    let mut write = async |direct: &mut Client| {
        for _ in 0..PER_STEP {
            direct
                .put(format!("/rw/{next:04}"), "v", None)
                .await
                .unwrap();
            next += 1;
        }
    };
    write(&mut direct).await;
    a.kill();
    write(&mut direct).await;
    let c = registered_proxy(&etcd.endpoint());
    registered_becomes(
        &mut direct,
        &[addr_b, c.addr().to_string()],
        Duration::from_secs(3 * TTL + 10),
    )
    .await;
    b.kill();
    write(&mut direct).await;
    let done = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(line) = rx.recv().await {
            if line == "OK resolver-watch" {
                return true;
            }
        }
        false
    })
    .await;
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        done == Ok(true) && status.success(),
        "the Go watcher: {status}, {stderr}"
    );
}

/// A client on two registered proxies whose proxy dies resumes its watch on the other,
/// from its last revision: every event once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_on_another_proxy_without_a_gap() {
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut direct = client(&etcd.endpoint()).await;
    let mut a = registered_proxy(&etcd.endpoint());
    let b = registered_proxy(&etcd.endpoint());
    let mut via_a = client(&a.endpoint()).await;
    let mut stream = via_a
        .watch("/m/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert!(first.created());
    let mut written = Vec::new();
    let mut seen = Vec::new();
    for i in 0..20 {
        let r = direct
            .put(format!("/m/{}", i % 3), "v", None)
            .await
            .unwrap();
        written.push(r.header().unwrap().revision());
    }
    while seen.len() < 20 {
        let r = stream.message().await.unwrap().unwrap();
        seen.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
    }
    // A dies; writes go on meanwhile.
    a.kill();
    for i in 0..20 {
        let r = direct
            .put(format!("/m/{}", i % 3), "w", None)
            .await
            .unwrap();
        written.push(r.header().unwrap().revision());
    }
    // The client resumes on B from the revision after the last it saw.
    let next = seen.last().unwrap() + 1;
    let mut via_b = client(&b.endpoint()).await;
    let mut stream = via_b
        .watch(
            "/m/",
            Some(WatchOptions::new().with_prefix().with_start_revision(next)),
        )
        .await
        .unwrap();
    assert!(stream.message().await.unwrap().unwrap().created());
    while seen.len() < written.len() {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("no event from the second proxy")
            .unwrap()
            .unwrap();
        seen.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
    }
    assert_eq!(
        seen, written,
        "every event once, in order, across the two proxies"
    );
}

fn etcdctl_member_list(endpoint: &str) -> Option<String> {
    let bin = std::env::var("ETCDCTL_BIN").unwrap_or_else(|_| "etcdctl".into());
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "member", "list"])
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "etcdctl member list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A proxy cut off from etcd for longer than its TTL is deregistered by etcd (its lease
/// expires), and registers again once etcd is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_cut_off_longer_than_its_ttl_registers_again() {
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut direct = client(&etcd.endpoint()).await;
    let cut = testkit::TcpProxy::start(etcd.client_addr()).await;
    let proxy = registered_proxy(&cut.endpoint());
    let me = [proxy.addr().to_string()];
    registered_becomes(&mut direct, &me, Duration::from_secs(10)).await;
    // Silence between the proxy and etcd: no renewal reaches etcd.
    cut.set_blackhole(true);
    registered_becomes(&mut direct, &[], Duration::from_secs(TTL + 10)).await;
    cut.set_blackhole(false);
    cut.drop_all_connections();
    let back = registered_becomes(&mut direct, &me, Duration::from_secs(20)).await;
    eprintln!("registered again {back:?} after etcd was reachable again");
}

/// With etcd's auth on, MemberList through a proxy reads the registrations with the
/// caller's token: a caller etcd lets read `--resolver-prefix` gets every registered
/// proxy, one it does not gets the proxy alone (the registrations were read with the
/// proxy's own user before, and listed to anyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_are_listed_only_to_callers_that_may_read_them() {
    use etcd_client::{ConnectOptions, Permission};
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut admin = client(&etcd.endpoint()).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    for (user, perms) in [
        (
            "cacher",
            vec![
                Permission::read("/app/").with_prefix(),
                Permission::read_write(format!("{PREFIX}/")).with_prefix(),
            ],
        ),
        ("reader", vec![Permission::read("/app/").with_prefix()]),
    ] {
        admin.user_add(user, "pw", None).await.unwrap();
        admin.role_add(user).await.unwrap();
        for p in perms {
            admin.role_grant_permission(user, p).await.unwrap();
        }
        admin.user_grant_role(user, user).await.unwrap();
    }
    admin.auth_enable().await.unwrap();
    let start = |endpoint: String| {
        Proxy::start(
            &endpoint,
            &[
                "--prefix",
                "/app/",
                "--user",
                "cacher:pw",
                "--advertise-client-url",
                "{addr}",
                "--resolver-prefix",
                PREFIX,
                "--resolver-ttl",
                &TTL.to_string(),
            ],
        )
    };
    let a = start(etcd.endpoint());
    let b = start(etcd.endpoint());
    let mut direct = Client::connect(
        [etcd.endpoint()],
        Some(ConnectOptions::new().with_user("root", "rootpw")),
    )
    .await
    .unwrap();
    let both = [a.addr().to_string(), b.addr().to_string()];
    registered_becomes(&mut direct, &both, Duration::from_secs(10)).await;
    let urls = |user: &'static str, pw: &'static str| {
        let endpoint = a.endpoint();
        async move {
            let opts = ConnectOptions::new().with_user(user, pw);
            let mut c = Client::connect([endpoint], Some(opts)).await.unwrap();
            let mut urls: Vec<String> = c
                .member_list()
                .await
                .unwrap()
                .members()
                .iter()
                .flat_map(|m| m.client_urls().iter().cloned())
                .collect();
            urls.sort();
            urls
        }
    };
    let mut want = both.to_vec();
    want.sort();
    assert_eq!(urls("root", "rootpw").await, want);
    assert_eq!(urls("reader", "pw").await, [a.addr().to_string()]);
}
