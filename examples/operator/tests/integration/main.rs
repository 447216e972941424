//! The example operator's integration tests, as one test binary: the operator process on a real
//! control plane (`process`) sharded replicas (`sharding`),
//! and its webhooks on a real and the in-process server (`webhooks`).

mod common;

mod process;
mod sharding;
mod webhooks;
