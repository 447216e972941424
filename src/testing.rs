//! Helpers for an operator's own tests: a deterministic policy, and waits for what the runtime
//! writes. They use tokio's clock, so under a paused clock
//! (`#[tokio::test(start_paused = true)]`) a wait of minutes costs no real time. Each wait
//! panics with what it waited for once its limit has passed: they are for tests.
//!
//! ```
//! use std::time::Duration;
//!
//! use actorcile::cluster::ApiServer;
//! use actorcile::prelude::*;
//! use actorcile::testing::{deterministic_policy, wait_ready};
//! use kube::CustomResourceExt;
//! use kube::api::{Api, PostParams};
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
//! # struct AppSpec {}
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let cluster = ApiServer::new();
//! cluster.install_crd(&App::crd()).unwrap();
//! let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
//! let runtime = Runtime::builder(cluster.client())
//!     .policy(deterministic_policy())
//!     .controller(Controller::<App>::new(tree))
//!     .start()
//!     .await
//!     .unwrap();
//! let apps: Api<App> = Api::namespaced(cluster.client(), "default");
//! apps.create(&PostParams::default(), &App::new("web", AppSpec {})).await.unwrap();
//! let status = wait_ready(&apps, "web", Duration::from_secs(60)).await;
//! assert_eq!(status.phase, Some(Phase::Ready));
//! runtime.shutdown().await;
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use kube::api::Api;
use tokio::time::Instant;

use crate::ManagedResource;
use crate::policy::SupervisorPolicy;
use crate::status::ResourceStatus;

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(10);

/// The default policy made reproducible: a fixed `seed`, no jitter in the backoffs, and no
/// passivation (`idle_timeout: None`), so that delays are exact and an actor's counters do not
/// depend on when it passivated.
pub fn deterministic_policy() -> SupervisorPolicy {
    let mut p = SupervisorPolicy::default();
    p.kind.seed = Some(1);
    p.kind.idle_timeout = None;
    p.kind.restart.backoff.jitter = false;
    p.kind.error_backoff.jitter = false;
    p
}

/// Calls `check` every 10 ms of tokio time until it returns `Some`, and returns that.
///
/// # Panics
///
/// After `limit`, naming `what` it waited for.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() <= deadline,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The runtime's status of `name` (empty when it has none yet), `None` if it does not exist
/// or cannot be read.
pub async fn status_of<K: ManagedResource>(api: &Api<K>, name: &str) -> Option<ResourceStatus> {
    let obj = api.get_opt(name).await.ok().flatten()?;
    Some(ResourceStatus::of(&obj))
}

/// Waits until `name` is Ready; its status then.
///
/// # Panics
///
/// After `limit`.
pub async fn wait_ready<K: ManagedResource>(
    api: &Api<K>,
    name: &str,
    limit: Duration,
) -> ResourceStatus {
    eventually(&format!("{name} Ready"), limit, || async {
        status_of(api, name).await.filter(|s| s.is_ready())
    })
    .await
}

/// Waits until the reason of `name`'s `Ready` condition is `reason`; its status then.
///
/// # Panics
///
/// After `limit`.
pub async fn wait_reason<K: ManagedResource>(
    api: &Api<K>,
    name: &str,
    reason: &str,
    limit: Duration,
) -> ResourceStatus {
    eventually(&format!("{name} with reason {reason}"), limit, || async {
        status_of(api, name)
            .await
            .filter(|s| s.ready().is_some_and(|c| c.reason == reason))
    })
    .await
}

/// Waits until `name` is gone (its finalizers removed and the object deleted).
///
/// # Panics
///
/// After `limit`.
pub async fn wait_gone<K: ManagedResource>(api: &Api<K>, name: &str, limit: Duration) {
    eventually(&format!("{name} gone"), limit, || async {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await
}
