//! The runtime an operator embeds: register controllers, start, shut down gracefully.
//!
//! ```no_run
//! use actorcile::prelude::*;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
//! # struct AppSpec { replicas: i32 }
//! # async fn run(client: kube::Client) -> Result<(), actorcile::Error> {
//! let tree = serial![
//!     step("validate", |_cx: Context<App>| async { Outcome::Done }),
//!     step("deploy", |_cx: Context<App>| async { Outcome::Done }),
//! ];
//! Runtime::builder(client, OperatorNames::new("app-operator", "example.com"))
//!     .policy(SupervisorPolicy::default())
//!     .controller(Controller::<App>::new(tree))
//!     .run_until(async { tokio::signal::ctrl_c().await.ok(); })
//!     .await
//! # }
//! ```
//!
//! | file | what it holds |
//! |---|---|
//! | `controller.rs` | [`Controller`]: one kind, its tree and options |
//! | `builder.rs`, `builder/` | [`Runtime`], [`RuntimeBuilder`]: its options (`builder.rs`), the roles it needs (`roles.rs`), the checks (`validation.rs`), start-up (`start.rs`), running until a signal, on standby for the Lease (`standby.rs`) |
//! | `handle.rs` | [`RuntimeHandle`]: metrics, health, shutdown |
//! | `error.rs` | [`Error`], and the [`Setting`] an invalid one names |
//!
//! Each kind's start-up (watch → feeder → manager → actors) is in the actors
//! (`actors/kind_start.rs`).

mod builder;
mod controller;
mod error;
mod handle;

pub use builder::{Runtime, RuntimeBuilder};
pub use controller::Controller;
pub use error::{ControllerPart, Error, Setting};
pub use handle::RuntimeHandle;

pub use crate::actors::HookError;
pub use crate::counters::{
    HistogramSnapshot, KindMetricsSnapshot, MetricsSnapshot, ReconcileResult,
};
pub use crate::policy::restarts::Escalation;
