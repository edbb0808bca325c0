//! etcd's v3 gRPC messages, servers and clients, generated at build time from the protos
//! inside the `etcd-client` crate (see `build.rs`). Keys and values are `Bytes`.
#![allow(
    dead_code,
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rustdoc::all
)]

pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}
