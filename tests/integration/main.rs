//! actorcile's integration tests, as one test binary (one link of kube, tokio and the runtime
//! instead of one per file). Each file is a module: the in-process cluster's API
//! (`cluster_api`), the conformance suite on the in-process and a real server (`conformance`),
//! the runtime, provisioners, references and sharding on the in-process cluster, and the
//! runtime on a real control plane and a real container engine (`real_*`). Shared fixtures are
//! in `common/`.
//!
//! `cargo nextest run --release --all-features --test integration` runs them; a module's tests
//! alone: `cargo nextest run --release --all-features --test integration -E 'test(/^runtime::/)'`.

mod common;

mod adaptive;
mod cluster_api;
mod conformance;
mod external_dependencies;
mod foreign_references;
mod introspection;
mod object_ops;
mod operator;
mod otel;
mod provisioners;
mod real_foreign_references;
mod real_guard;
mod real_kinds;
mod real_podman;
mod real_rbac;
mod real_references;
mod real_remote;
mod real_requested_access;
mod real_runtime;
mod real_streaming_fallback;
mod real_tenancy;
mod real_undecodable;
mod real_webhooks;
mod references;
mod references_prop;
mod remote_application;
mod runtime;
mod sharding;
mod status_fields;
mod status_reasons;
mod triggers;
mod upgrades;
mod waiters;
