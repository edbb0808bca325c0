//! etcd with auth on: the proxy's --user credentials feed the cache and the calls that
//! carry no token; a client's own token (got through the proxy) is passed on; an
//! expired proxy token is renewed.

mod support;

use std::time::Duration;

use etcd_client::{ConnectOptions, WatchOptions};
use support::{client, start_etcd, start_proxy, EtcdOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_through_the_proxy() {
    let etcd = start_etcd(EtcdOptions::default().arg("--auth-token-ttl=1")).await;
    let mut admin = client(&etcd.endpoint()).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("reader", "readerpw", None).await.unwrap();
    admin.role_add("ro").await.unwrap();
    admin
        .role_grant_permission("ro", etcd_client::Permission::read("/a/").with_prefix())
        .await
        .unwrap();
    admin.user_grant_role("reader", "ro").await.unwrap();
    admin.auth_enable().await.unwrap();

    let proxy = start_proxy(etcd.endpoint(), vec!["--user".into(), "root:rootpw".into()]).await;
    // Anonymous calls through the proxy carry its token.
    let mut anon = etcd_client::Client::connect([proxy.endpoint()], None)
        .await
        .unwrap();
    anon.put("/a/1", "v", None).await.unwrap();
    assert_eq!(anon.get("/a/1", None).await.unwrap().kvs()[0].value(), b"v");
    // After the token expired (1 s), the proxy authenticates again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    anon.put("/a/2", "v", None).await.unwrap();
    // A client's own credentials: authenticated through the proxy, its token is used.
    let opts = ConnectOptions::new().with_user("reader", "readerpw");
    let mut reader = etcd_client::Client::connect([proxy.endpoint()], Some(opts))
        .await
        .unwrap();
    let err = reader
        .put("/a/3", "no", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("permission denied"), "{err}");
    // Wrong credentials are refused by etcd.
    let bad = ConnectOptions::new().with_user("reader", "wrong");
    let refused = etcd_client::Client::connect([proxy.endpoint()], Some(bad)).await;
    assert!(refused.is_err());
    // The cache, on the proxy's credentials, serves watches.
    let mut w = anon
        .watch("/a/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(w.message().await.unwrap().unwrap().created());
    let rev = anon
        .put("/a/4", "w", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let r = w.message().await.unwrap().unwrap();
    assert_eq!(r.header().unwrap().revision(), rev);
}
