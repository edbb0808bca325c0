//! etcd's gRPC API as raw generated stubs (the proxy's own build generates them; see
//! `build.rs`), for tests that send what etcd-client would never send: any token, any
//! metadata, pipelined stream requests.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::all)]

pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;

/// A channel to `endpoint` (`http://host:port`).
pub async fn channel(endpoint: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

/// `msg` with the tokens given (each as one `token` metadata value, in order).
pub fn with_tokens<T>(msg: T, tokens: &[&str]) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    let md: &mut MetadataMap = req.metadata_mut();
    for t in tokens {
        md.append("token", AsciiMetadataValue::try_from(*t).unwrap());
    }
    req
}

/// etcd's answer as code and message (or "ok").
pub fn outcome<T>(r: &Result<tonic::Response<T>, tonic::Status>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}
