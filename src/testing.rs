//! Helpers for an operator's own tests: a deterministic policy, waits for what the runtime
//! writes, and a log of the reconciles a test's steps ran ([`ReconcileLog`]). They use tokio's
//! clock, so under a paused clock (`#[tokio::test(start_paused = true)]`) a wait of minutes
//! costs no real time. Each wait panics with what it waited for once its limit has passed: they
//! are for tests.
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
//! let runtime = Runtime::builder(cluster.client(), OperatorNames::new("app-operator", "example.com"))
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// One reconcile a [`ReconcileLog`] recorded: the object's name, when it started and when it
/// ended (`None` while it runs), in tokio time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedReconcile {
    /// The name the step recorded (usually the object's).
    pub name: String,
    /// When the reconcile started.
    pub started: Instant,
    /// When it ended, or `None` while it runs.
    pub ended: Option<Instant>,
}

/// Every reconcile a test's steps record, with its start and end in tokio time: how many ran,
/// when, and that no two of one object overlapped. Clones share one log.
///
/// ```
/// use actorcile::prelude::*;
/// use actorcile::testing::ReconcileLog;
/// use kube::ResourceExt;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
/// # struct AppSpec {}
///
/// let log = ReconcileLog::default();
/// let recorded = log.clone();
/// let tree = step("deploy", move |cx: Context<App>| {
///     let log = recorded.clone();
///     async move {
///         let _reconcile = log.record(&cx.object().name_any());
///         Outcome::Done
///     }
/// });
/// # let _ = tree;
/// // … run the runtime, then:
/// assert_eq!(log.count("web"), 0);
/// log.assert_no_overlap("web");
/// ```
#[derive(Clone, Debug, Default)]
pub struct ReconcileLog(Arc<Mutex<Vec<LoggedReconcile>>>);

/// Ends its reconcile in the log when dropped, whether the reconcile finished or was abandoned
/// (its future dropped at a timeout, a lost shard or a shutdown).
#[derive(Debug)]
#[must_use = "the reconcile ends when this is dropped"]
pub struct Recording {
    log: ReconcileLog,
    index: usize,
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.log.end(self.index);
    }
}

impl ReconcileLog {
    /// Records that a reconcile of `name` starts; returns its index for [`ReconcileLog::end`].
    pub fn start(&self, name: &str) -> usize {
        let mut l = self.lock();
        l.push(LoggedReconcile {
            name: name.to_string(),
            started: Instant::now(),
            ended: None,
        });
        l.len() - 1
    }

    /// Records that reconcile `index` (from [`ReconcileLog::start`]) ends now.
    pub fn end(&self, index: usize) {
        if let Some(r) = self.lock().get_mut(index) {
            r.ended = Some(Instant::now());
        }
    }

    /// Records that a reconcile of `name` starts, and that it ends when the returned guard is
    /// dropped.
    pub fn record(&self, name: &str) -> Recording {
        Recording {
            log: self.clone(),
            index: self.start(name),
        }
    }

    /// Every reconcile recorded, in the order they started.
    pub fn entries(&self) -> Vec<LoggedReconcile> {
        self.lock().clone()
    }

    /// How many reconciles of `name` started.
    pub fn count(&self, name: &str) -> usize {
        self.lock().iter().filter(|r| r.name == name).count()
    }

    /// When each reconcile of `name` started.
    pub fn starts(&self, name: &str) -> Vec<Instant> {
        self.lock()
            .iter()
            .filter(|r| r.name == name)
            .map(|r| r.started)
            .collect()
    }

    /// How many reconciles started, of every object.
    pub fn total(&self) -> usize {
        self.lock().len()
    }

    /// # Panics
    ///
    /// If a reconcile of `name` started before the one before it ended, or one has not ended.
    pub fn assert_no_overlap(&self, name: &str) {
        let mut mine: Vec<LoggedReconcile> = self
            .lock()
            .iter()
            .filter(|r| r.name == name)
            .cloned()
            .collect();
        mine.sort_by_key(|r| r.started);
        for w in mine.windows(2) {
            let end = w[0].ended.expect("every reconcile but the last has ended");
            assert!(end <= w[1].started, "overlapping reconciles of {name}");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LoggedReconcile>> {
        // A panicking test step poisons nothing the log's readers cannot use.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A tower layer that counts the 429 (Too Many Requests) answers of the requests through it:
/// under kube's retries (see [`AdaptiveConcurrency::client_with`]), every refused attempt.
///
/// [`AdaptiveConcurrency::client_with`]: crate::adaptive::AdaptiveConcurrency::client_with
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use actorcile::adaptive::{AdaptiveConcurrency, AimdPolicy};
/// use actorcile::testing::CountThrottled;
///
/// let throttled = CountThrottled::default();
/// let adaptive = AdaptiveConcurrency::new(AimdPolicy::default());
/// let client = adaptive.client_with(kube::Config::infer().await?, throttled.clone())?;
/// # let _ = client;
/// println!("{} requests answered 429", throttled.count());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct CountThrottled(Arc<AtomicU64>);

impl CountThrottled {
    /// The 429 answers so far, through every clone.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl<S> tower::Layer<S> for CountThrottled {
    type Service = CountThrottledService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CountThrottledService {
            inner,
            count: self.0.clone(),
        }
    }
}

/// The service of [`CountThrottled`].
#[derive(Clone, Debug)]
pub struct CountThrottledService<S> {
    inner: S,
    count: Arc<AtomicU64>,
}

impl<S, Req, B> tower::Service<Req> for CountThrottledService<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let count = self.count.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answer = answer.await;
            if let Ok(r) = &answer
                && r.status() == http::StatusCode::TOO_MANY_REQUESTS
            {
                count.fetch_add(1, Ordering::Relaxed);
            }
            answer
        })
    }
}
