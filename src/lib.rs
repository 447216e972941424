//! # actorcile
//!
//! An actor-based reconcile runtime for Kubernetes operators, on ractor, kube, kube-runtime and
//! tokio. Every managed resource gets a supervised actor that runs its provisioner tree;
//! a provisioner that would block yields, and the yield becomes a scheduled self-message.
//! Readiness, references and deletion ordering between resources are messages between
//! resource actors under a manager supervisor.
//!
//! # What an operator uses
//!
//! - [`prelude`]: the usual imports, in one.
//! - [`provisioners`]: the [`Provisioner`](provisioners::Provisioner) trait, its
//!   [`Outcome`](provisioners::Outcome), the [`Context`](provisioners::Context) a reconcile gets, and
//!   the combinators.
//! - [`runtime`]: the [`Runtime`](runtime::Runtime) an operator embeds, its controllers and
//!   metrics.
//! - [`names`]: the operator's own names ([`OperatorNames`](names::OperatorNames)), from
//!   which the runtime names its finalizer, field manager and Leases.
//! - [`policy`]: the [`SupervisorPolicy`](policy::SupervisorPolicy) tunables, per kind, runtime-wide
//!   and for the Leases, loadable from TOML.
//! - [`status`]: the `Ready` condition, phases and observed generation.
//! - [`references`]: readiness and references between resources.
//! - [`cluster`] (feature `cluster`, a test tool, off by default): an in-process Kubernetes API
//!   server for tests, benchmarks and simulation, the crate `actorcile-apiserver`. Operators
//!   take it in `[dev-dependencies]`.
//! - [`envtest`] (feature `envtest`): a real etcd + kube-apiserver for tests, the crate
//!   `actorcile-envtest`.
//! - [`rbac`]: the Roles and ClusterRole a runtime needs, and its preflight check.
//! - [`crds`]: render and install an operator's CustomResourceDefinitions.
//! - [`health`]: what the runtime's liveness and readiness probes answer.
//! - [`testing`]: helpers for an operator's own tests (a deterministic policy, waits for a
//!   status).
//! - [`leader`]: leader election on a Lease, and signal handling in
//!   [`RuntimeBuilder::run`](runtime::RuntimeBuilder::run).
//! - What an operator binary usually takes, each a feature of its own (feature `operator` is
//!   all four): [`metrics`] (feature `metrics`, Prometheus), [`admin`] (feature `admin`:
//!   `/metrics`, `/healthz`, `/readyz`), [`telemetry`] (feature `telemetry`, tracing set-up) and
//!   [`cli`] (feature `cli`: the flags, with clap; it takes `admin` and `telemetry`).
//! - [`triggers`]: what re-runs objects besides their own changes, and why each reconcile ran
//!   ([`Trigger`](triggers::Trigger)).
//! - [`introspect`]: "why is it not Ready?": what the runtime knows of one object now, served
//!   on an address of its own ([`RuntimeBuilder::introspection`](runtime::RuntimeBuilder::introspection),
//!   feature `admin`).
//! - [`adaptive`]: reconcile slots that follow what the API server can take (additive increase,
//!   multiplicative decrease on 429s and rising latency).
//! - [`webhooks`] (feature `webhooks`): admission (validating, defaulting) and conversion
//!   webhooks for the managed kinds, served over TLS by the runtime.
//! - Feature `otel`: the reconciles' spans exported over OTLP (`telemetry::Otlp`, and
//!   `--otlp-endpoint` with `cli`).
//!
//! # TLS
//!
//! The default features are kube's own, `rustls-tls` and `ring`. The TLS stack is the
//! binary's choice: with `default-features = false`, take `openssl-tls`, or `rustls-tls` with
//! `aws-lc-rs` (for FIPS), which are passed through to kube.
//!
//! # Inside (private; read the source)
//!
//! `ARCHITECTURE.md` at the repository's root follows one watch event to a status write, file by
//! file.
//!
//! | module | what it holds |
//! |---|---|
//! | `actors/` | the manager supervisor, the resource actor, the watch feeder, the trigger watches (its `mod.rs` has a file map and a glossary) |
//! | `messages/` | every message the actors exchange, one file per receiver; plain data |
//! | `cache/` | a kind's cache: a table of objects per watched namespace, its writer, the passive objects' encoding |
//! | `scheduling/` | when reconciles start: reconcile slots and who gets the next, the timer task, the activation queue, passive objects' wake-ups, a reconcile's deadline |
//! | `after_reconcile/` | what follows a reconcile, as plain data: the status to write, the readiness to announce, the next wake-up, the backoff's step |
//! | `writes/` | the actors' API writes: status, finalizer, shard label, Events |
//! | `counters.rs` | the runtime's counters: atomics every controller shares, what the metrics and `RuntimeHandle::metrics` read |
//! | `object_api.rs` | the typed API calls of one object's namespace |
//! | `event_recorder.rs` | a controller's Kubernetes Events: kube-runtime's recorder, split by object |
//!
//! Dependencies run one way: `cluster` and `envtest` are crates of their own that know nothing
//! of the rest; `status` depends only on `names`; `references` on `status`; `provisioners` on
//! `status`, `references`, `rbac`, `policy`, `object_api`, `event_recorder` and `providers`;
//! `messages` and `policy` are plain data; `cache`, `scheduling`, `sharding`, `counters`,
//! `after_reconcile` and `writes` import nothing of the actors; `actors` use all of those; and
//! `runtime` starts the actors. Every layer may fail with the crate's [`Error`] (`runtime/error.rs`,
//! which imports only the types its variants carry). The library never imports its command line.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod actors;
pub mod adaptive;
#[cfg(feature = "admin")]
pub mod admin;
mod after_reconcile;
mod cache;
#[cfg(feature = "cli")]
pub mod cli;
mod counters;
#[cfg(feature = "cluster")]
#[doc(inline)]
pub use actorcile_apiserver as cluster;
// The crate's own unit tests run on the in-process server whatever the features.
#[cfg(all(test, not(feature = "cluster")))]
use actorcile_apiserver as cluster;
pub mod crds;
#[cfg(feature = "envtest")]
#[doc(inline)]
pub use actorcile_envtest as envtest;
mod event_budget;
mod event_recorder;
/// Private parsers opened to the fuzz targets (feature `fuzzing`); not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod hash;
pub mod health;
pub mod introspect;
pub mod leader;
mod lease;
mod lenient;
mod messages;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod names;
mod object_api;
pub mod policy;
pub mod providers;
pub mod provisioners;
pub mod rbac;
pub mod references;
pub mod runtime;
mod scheduling;
pub mod sharding;
mod signals;
#[cfg(test)]
mod span_capture;
pub mod status;
#[cfg(feature = "telemetry")]
pub mod telemetry;
pub mod testing;
#[cfg(any(feature = "webhooks", feature = "otel"))]
mod tls;
pub mod triggers;
mod watch_tasks;
#[cfg(feature = "webhooks")]
pub mod webhooks;
mod writes;

pub use object_api::KindScope;
pub use runtime::Error;

/// The attribute the crate's async traits ([`Provisioner`](provisioners::Provisioner),
/// [`Provider`](providers::Provider), [`CdDriver`](provisioners::cd::CdDriver), …) are
/// implemented with, re-exported so an implementation needs no dependency of its own:
///
/// ```
/// use actorcile::prelude::*;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
/// # struct AppSpec {}
///
/// struct Deploy;
///
/// #[actorcile::async_trait]
/// impl Provisioner<App> for Deploy {
///     fn name(&self) -> &str {
///         "deploy"
///     }
///     async fn provision(&self, _cx: &Context<App>) -> Outcome {
///         Outcome::Done
///     }
///     async fn deprovision(&self, _cx: &Context<App>) -> Outcome {
///         Outcome::Done
///     }
/// }
/// ```
pub use async_trait::async_trait;

/// What a kind must be for actorcile to manage it: a typed Kubernetes resource (a
/// `#[derive(CustomResource)]` type or a k8s-openapi type).
pub trait ManagedResource:
    kube::Resource<DynamicType = (), Scope: object_api::KindScope>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<T> ManagedResource for T where
    T: kube::Resource<DynamicType = (), Scope: object_api::KindScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The user guide's code blocks (`docs/src`), compiled and run as doc tests.
#[cfg(doctest)]
pub mod guide_doctests {
    #[doc = include_str!("../docs/src/getting-started.md")]
    pub struct GettingStarted;
    #[doc = include_str!("../docs/src/provisioners.md")]
    pub struct Provisioners;
    #[doc = include_str!("../docs/src/references.md")]
    pub struct References;
    #[doc = include_str!("../docs/src/policies.md")]
    pub struct Policies;
    #[doc = include_str!("../docs/src/webhooks.md")]
    pub struct Webhooks;
    #[doc = include_str!("../docs/src/testing.md")]
    pub struct Testing;
    #[doc = include_str!("../docs/src/production.md")]
    pub struct Production;
    #[doc = include_str!("../docs/src/deploying.md")]
    pub struct Deploying;
    #[doc = include_str!("../docs/src/migrating.md")]
    pub struct Migrating;
}

/// What most users need, in one import.
pub mod prelude {
    pub use crate::ManagedResource;
    pub use crate::names::OperatorNames;
    pub use crate::policy::{BackoffPolicy, Exhausted, RestartPolicy, SupervisorPolicy};
    pub use crate::provisioners::{
        BoxProvisioner, ChildRules, Context, Outcome, Provisioner, Reason, ResourceProvisioner,
        boxed, concurrent, conditional, guard, resource, serial, step,
    };
    pub use crate::references::{Readiness, Target};
    pub use crate::runtime::{Controller, Runtime, RuntimeHandle};
    pub use crate::status::{ConditionStatus, Phase, ReadyReason, ResourceStatus};
    pub use crate::{concurrent, serial};
}

/// Internals for the crate's own benchmarks (feature `bench-internals`); not part of the API.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench_internals {
    pub use crate::scheduling::{PendingWakeUp, Timers};
}
