//! RangeStream (etcd 3.7's streamed Range, which Kubernetes 1.37 lists with) through the
//! proxy in front of etcd 3.4 (and 3.5 and 3.6 in `--full-matrix` runs), which have none, and 3.7:
//! one API whatever the member behind the proxy. Inside the cached prefix the cache
//! answers it; outside (forwarded), etcd 3.7 streams it and for the older ones the proxy
//! answers it with one Range, so a client never gets `Unimplemented` for part of its
//! lists. (`cargo xtask test` builds 3.7 for every run: xtask's PICKED_VERSIONS.)

mod raw;
mod support;

use futures::StreamExt;
use raw::etcdserverpb::{kv_client::KvClient, RangeRequest};
use support::{client, start_etcd, start_proxy, EtcdOptions};
use testkit::EtcdVersion;

fn prefix(p: &str) -> RangeRequest {
    let mut end = p.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    RangeRequest {
        key: p.as_bytes().to_vec().into(),
        range_end: end.into(),
        ..Default::default()
    }
}

/// The keys and values of a RangeStream, chunks joined; its count; or the error.
async fn streamed(kv: &mut KvClient<tonic::transport::Channel>, req: RangeRequest) -> String {
    let mut stream = match kv.range_stream(req).await {
        Ok(s) => s.into_inner(),
        Err(s) => return format!("{:?}: {}", s.code(), s.message()),
    };
    let (mut kvs, mut count) = (Vec::new(), 0);
    while let Some(chunk) = stream.next().await {
        let r = chunk.unwrap().range_response.unwrap_or_default();
        kvs.extend(r.kvs.iter().map(|kv| {
            format!(
                "{}={}",
                String::from_utf8_lossy(&kv.key),
                String::from_utf8_lossy(&kv.value)
            )
        }));
        count = count.max(r.count);
    }
    format!("count {count}: {}", kvs.join(","))
}

/// The same as [`streamed`], from a plain Range.
async fn ranged(kv: &mut KvClient<tonic::transport::Channel>, req: RangeRequest) -> String {
    let r = kv.range(req).await.unwrap().into_inner();
    let kvs: Vec<String> = r
        .kvs
        .iter()
        .map(|kv| {
            format!(
                "{}={}",
                String::from_utf8_lossy(&kv.key),
                String::from_utf8_lossy(&kv.value)
            )
        })
        .collect();
    format!("count {}: {}", r.count, kvs.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_is_answered_in_front_of_etcd_with_and_without_it() {
    let mut versions = vec![EtcdVersion::V3_4, EtcdVersion::V3_7];
    if testkit::full_matrix() {
        versions.extend([EtcdVersion::V3_5, EtcdVersion::V3_6]);
    }
    for version in versions {
        let etcd = start_etcd(EtcdOptions::default().version(version)).await;
        let mut admin = client(&etcd.endpoint()).await;
        for i in 0..50 {
            admin.put(format!("/k/{i:02}"), "v", None).await.unwrap();
            admin.put(format!("/o/{i:02}"), "w", None).await.unwrap();
        }
        let proxy = start_proxy(
            etcd.endpoint(),
            vec!["--prefix".to_string(), "/k/".to_string()],
        )
        .await;
        let mut direct = KvClient::new(raw::channel(&etcd.endpoint()).await);
        let mut via = KvClient::new(raw::channel(&proxy.endpoint()).await);
        for p in ["/k/", "/o/"] {
            let want = ranged(&mut direct, prefix(p)).await;
            assert!(want.starts_with("count 50: "), "{want}");
            // Twice: the second after the proxy has learned whether etcd has it.
            for round in 0..2 {
                let got = streamed(&mut via, prefix(p)).await;
                assert_eq!(got, want, "etcd {version}, {p}, round {round}");
            }
            let etcd_streamed = streamed(&mut direct, prefix(p)).await;
            if version != EtcdVersion::V3_7 {
                assert!(
                    etcd_streamed.starts_with("Unimplemented"),
                    "{etcd_streamed}"
                );
            } else {
                assert_eq!(etcd_streamed, want, "etcd {version} itself, {p}");
            }
        }
        // A RangeStream below the cache's window is forwarded as well.
        let mut at = prefix("/o/");
        at.revision = 5;
        let want = ranged(&mut direct, at.clone()).await;
        assert_eq!(
            streamed(&mut via, at).await,
            want,
            "etcd {version}, revision 5"
        );
    }
}
