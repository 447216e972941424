//! The example operator's integration tests, as one test binary: the operator process on a real
//! control plane (`process`) and sharded replicas (`sharding`).

mod common;

mod process;
mod sharding;
