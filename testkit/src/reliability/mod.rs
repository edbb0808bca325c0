//! The reliability checker, shared by the root crate's `tests/reliability.rs` and
//! `tests/rolling_upgrade.rs` and by the proxy's `tests/reliability.rs` (see
//! docs/RELIABILITY.md). The tests themselves (the scenarios and their faults) stay in
//! those targets.
//!
//! - [`checker`]: ground truth recorded from etcd itself, what every subscriber received,
//!   and the comparison of the two against etcd's six watch guarantees;
//! - [`run`]: one checked run of the cache: a seeded random workload, fixed and churning
//!   subscribers, readers, then the final drain and the check.
//!
//! The record structs (`Kv`, `SubLog`, `Cfg`, `Summary`, ...) allow `missing_docs`: their
//! fields are named for what they hold, and only the ones that need it are documented.

pub mod checker;
pub mod run;
