//! Generates the etcd v3 gRPC servers (what the proxy serves) and clients (what it
//! forwards with) from etcd's own protos, as shipped inside the `etcd-client` crate that
//! this package depends on. Nothing generated or copied is committed: the protos are
//! found at build time, in the `etcd-client` source directory that cargo resolved.
//!
//! `ETCD_PROTO_DIR` overrides the search (a directory holding `etcd/api/...`).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROTOS: &[&str] = &[
    "etcd/api/authpb/auth.proto",
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
];

fn main() {
    println!("cargo:rerun-if-env-changed=ETCD_PROTO_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let root = proto_root();
    println!("cargo:rerun-if-changed={}", root.display());
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Keys and values as `Bytes`: the cache holds `Bytes`, so a delivery or a read
        // served from memory hands out a reference count, not a copy.
        .bytes(".")
        .compile_protos(&protos, &[root])
        .expect("compiling etcd's protos");
}

/// The `proto/` directory of the `etcd-client` package in this build's dependency graph.
fn proto_root() -> PathBuf {
    if let Some(dir) = env::var_os("ETCD_PROTO_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("Cargo.toml");
    // `--filter-platform` keeps cargo from wanting the packages of other platforms, so
    // this works offline once the build's own dependencies are downloaded.
    let target = env::var("TARGET").unwrap();
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--filter-platform"])
        .arg(&target)
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("running `cargo metadata` to find etcd-client's protos");
    assert!(
        out.status.success(),
        "`cargo metadata` failed (set ETCD_PROTO_DIR to etcd-client's proto/ directory): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("parsing `cargo metadata` output");
    let packages = meta["packages"].as_array().expect("metadata packages");
    let etcd_client = packages
        .iter()
        .filter(|p| p["name"] == "etcd-client")
        .filter(|p| {
            p["version"]
                .as_str()
                .is_some_and(|v| v.starts_with("0.21."))
        })
        .filter_map(|p| p["manifest_path"].as_str())
        .next()
        .expect("etcd-client 0.21 is not in the dependency graph");
    let dir = Path::new(etcd_client).parent().unwrap().join("proto");
    assert!(
        dir.join(PROTOS[1]).is_file(),
        "no etcd protos under {}",
        dir.display()
    );
    dir
}
