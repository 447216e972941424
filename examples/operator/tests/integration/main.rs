//! The example operator's integration tests, as one test binary: the operator process on a real
//! control plane (`process`) sharded replicas (`sharding`),
//! its webhooks on a real and the in-process server (`webhooks`), and its deploy kit: the Helm
//! chart, the image and the alert rules (`deploy`).

mod common;

mod deploy;
mod process;
mod sharding;
mod webhooks;
