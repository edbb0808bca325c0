//! etcd's gRPC services but Watch (`watch/`), one file each, as tonic's generated traits
//! name them: `kv` (ranges inside the cached prefix from memory, the rest and every write
//! forwarded), `lease`, `cluster` (MemberList with the registered proxies), `maintenance`,
//! `auth` (the Auth service forwarded; a change drops the decisions `authz/` keeps),
//! `election`, `lock`. Each forwards with the caller's token (`upstream/`).

pub(crate) mod auth;
pub(crate) mod cluster;
pub(crate) mod election;
pub(crate) mod kv;
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod maintenance;
