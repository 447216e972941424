//! Fixtures for the runtime's tests on a real etcd + kube-apiserver (`actorcile::envtest`):
//! the shared control plane with the sample CRDs installed, a namespace per test, and helpers
//! that work on `Widget`s in that namespace. Include next to `mod common;` with
//! `#[path = "common/real.rs"] mod real;`.
//!
//! Real time here (no paused clock): every wait is bounded, and tests wrap themselves in
//! [`bounded`].
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::envtest::Envtest;
use actorcile::prelude::*;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt, ResourceExt};

use crate::common::{Gadget, Widget, WidgetSpec, eventually};

/// Bound on one whole test (control-plane start-up included).
pub const TEST_LIMIT: Duration = Duration::from_secs(240);
/// Bound on one wait for the runtime to converge.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// Run `test` bounded by [`TEST_LIMIT`]; a hang fails the test instead of blocking CI.
/// Runtime logs go to the test output when `RUST_LOG` is set (e.g. `RUST_LOG=actorcile=debug`).
pub async fn bounded<F: Future<Output = ()>>(what: &str, test: F) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    if tokio::time::timeout(TEST_LIMIT, test).await.is_err() {
        panic!("{what}: did not finish within {TEST_LIMIT:?}");
    }
}

/// `K::crd()` without the `default: ""` entries schemars writes for `#[serde(default)]` string
/// fields. kube-apiserver v1.20 decodes such a default as null and rejects the whole CRD
/// (422: `...default: Invalid value: "null": in body must be of type string`). The test fixture
/// has such a field (`WidgetSpec::note`); actorcile's own `status::Condition` drops them from its
/// schema, which `real_runtime::resource_status_schema_installs_on_a_real_apiserver_as_generated`
/// checks.
pub fn crd_for_v1_20<K: CustomResourceExt>() -> CustomResourceDefinition {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("default").is_some_and(|d| d.as_str() == Some("")) {
                    m.remove("default");
                }
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(K::crd()).expect("a CRD serializes");
    strip(&mut v);
    serde_json::from_value(v).expect("a CRD deserializes")
}

/// The sample CRDs, installable on the v1.20 server (see [`crd_for_v1_20`]).
pub fn sample_crds() -> Vec<CustomResourceDefinition> {
    vec![crd_for_v1_20::<Widget>(), crd_for_v1_20::<Gadget>()]
}

/// The process-wide control plane with the `Widget` and `Gadget` CRDs installed.
pub async fn shared_env() -> &'static Envtest {
    let env = Envtest::shared()
        .await
        .expect("start etcd + kube-apiserver (run scripts/install-test-deps.sh)");
    env.install_crds(&sample_crds())
        .await
        .expect("install the sample CRDs");
    env
}

/// A control plane of its own (for tests that restart the apiserver), CRDs installed.
pub async fn own_env() -> Envtest {
    Envtest::builder()
        .crds(sample_crds())
        .start()
        .await
        .expect("start etcd + kube-apiserver (run scripts/install-test-deps.sh)")
}

/// Create namespace `name` (already existing is fine).
pub async fn create_namespace(client: &Client, name: &str) {
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.to_string());
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// A policy for real-time tests: short yields and backoffs, no passivation, reproducible jitter.
pub fn real_policy() -> SupervisorPolicy {
    let mut p = SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            seed: Some(1),
            idle_timeout: None,
            yield_delay: Duration::from_millis(100),
            dependency_poll: Duration::from_secs(2),
            // Shorter than the tests' waits: a restarting apiserver answers 503 with `Retry-After:
            // 10`, which kube's client retries itself, longer each time; a write caught in that is
            // abandoned and sent again within them.
            write_timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        },
        runtime: actorcile::policy::RuntimePolicy {
            shutdown_timeout: Duration::from_secs(10),
            ..Default::default()
        },
        ..Default::default()
    };
    p.kind.restart.backoff.jitter = false;
    p.kind.restart.backoff.min = Duration::from_millis(50);
    p.kind.restart.backoff.max = Duration::from_secs(1);
    p.kind.error_backoff.jitter = false;
    p.kind.error_backoff.min = Duration::from_millis(100);
    p.kind.error_backoff.max = Duration::from_secs(2);
    p
}

/// A `Widget` named `name` in `ns`. `note` is never empty: the v1.20 server stores `""` in a
/// custom resource as null, which the typed `String` field cannot read back.
pub fn widget_in(ns: &str, name: &str, size: i32) -> Widget {
    let mut w = Widget::new(
        name,
        WidgetSpec {
            size,
            note: "new".into(),
            ..Default::default()
        },
    );
    w.metadata.namespace = Some(ns.to_string());
    w
}

/// Reconciles per object name, shared by a provisioner tree and the test.
#[derive(Clone, Default)]
pub struct Reconciles(pub Arc<Mutex<HashMap<String, u32>>>);

impl Reconciles {
    /// Count one more reconcile of `name`; returns the new count.
    pub fn bump(&self, name: &str) -> u32 {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(name.to_string()).or_default();
        *n += 1;
        *n
    }
    /// Reconciles of `name` so far.
    pub fn of(&self, name: &str) -> u32 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
    /// A copy of every count.
    pub fn snapshot(&self) -> HashMap<String, u32> {
        self.0.lock().unwrap().clone()
    }
}

/// An ordered log of events (e.g. `-name` for each deprovision), shared with a tree.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    /// Append `entry`.
    pub fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }
    /// A copy of the log.
    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    /// Whether `entry` was logged.
    pub fn contains(&self, entry: &str) -> bool {
        self.0.lock().unwrap().iter().any(|e| e == entry)
    }
    /// Position of `entry` (panics with the whole log if it is missing).
    pub fn pos(&self, entry: &str) -> usize {
        let l = self.entries();
        l.iter()
            .position(|e| e == entry)
            .unwrap_or_else(|| panic!("{entry} not in {l:?}"))
    }
}

/// `Widget`s of one namespace, through one client.
#[derive(Clone)]
pub struct Ns {
    /// The client (admin unless a test says otherwise).
    pub client: Client,
    /// The namespace.
    pub ns: String,
}

impl Ns {
    /// Create namespace `ns` with `client` and work in it.
    pub async fn create(client: Client, ns: &str) -> Self {
        create_namespace(&client, ns).await;
        Ns {
            client,
            ns: ns.to_string(),
        }
    }

    /// The namespaced `Widget` API.
    pub fn api(&self) -> Api<Widget> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Create a widget of `size`.
    pub async fn create_widget(&self, name: &str, size: i32) -> Widget {
        self.api()
            .create(&PostParams::default(), &widget_in(&self.ns, name, size))
            .await
            .unwrap_or_else(|e| panic!("create widget {name}: {e}"))
    }

    /// Create a widget that needs (readiness) and references the named widgets.
    pub async fn create_with(&self, name: &str, needs: &[&str], refs: &[&str]) -> Widget {
        let mut w = widget_in(&self.ns, name, 1);
        w.spec.needs = needs.iter().map(|s| s.to_string()).collect();
        w.spec.refs = refs.iter().map(|s| s.to_string()).collect();
        self.api()
            .create(&PostParams::default(), &w)
            .await
            .unwrap_or_else(|e| panic!("create widget {name}: {e}"))
    }

    /// Merge-patch `spec` into widget `name`.
    pub async fn patch_spec(&self, name: &str, spec: serde_json::Value) -> Widget {
        self.api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch widget {name}: {e}"))
    }

    /// Delete widget `name` (a missing one is fine).
    pub async fn delete(&self, name: &str) {
        match self.api().delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("delete widget {name}: {e}"),
        }
    }

    /// Widget `name`, if it exists (API errors count as "not now").
    pub async fn get(&self, name: &str) -> Option<Widget> {
        self.api().get_opt(name).await.ok().flatten()
    }

    /// The status of widget `name`, if it exists.
    pub async fn status_of(&self, name: &str) -> Option<ResourceStatus> {
        self.get(name).await.map(|w| w.status.unwrap_or_default())
    }

    /// Wait until widget `name` is Ready; returns it. On timeout the panic shows the last
    /// status seen.
    pub async fn wait_ready(&self, name: &str) -> Widget {
        let deadline = tokio::time::Instant::now() + CONVERGE;
        loop {
            let w = self.get(name).await;
            if let Some(w) = &w
                && w.status.as_ref().is_some_and(|s| s.is_ready())
            {
                return w.clone();
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "timed out after {CONVERGE:?} waiting for {}/{name} Ready; last seen: {:?}",
                    self.ns,
                    w.map(|w| (w.metadata.resource_version, w.metadata.finalizers, w.status))
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Wait until widget `name` is Ready with status observedGeneration `generation`; returns it.
    pub async fn wait_ready_at(&self, name: &str, generation: i64) -> Widget {
        eventually(
            &format!("{}/{name} Ready at generation {generation}", self.ns),
            CONVERGE,
            || async {
                self.get(name).await.filter(|w| {
                    w.status
                        .as_ref()
                        .is_some_and(|s| s.is_ready() && s.observed_generation == Some(generation))
                })
            },
        )
        .await
    }

    /// Wait until every named widget is Ready.
    pub async fn wait_all_ready(&self, names: &[String]) {
        for n in names {
            self.wait_ready(n).await;
        }
    }

    /// Wait until widget `name`'s Ready condition has `reason`; returns the status.
    pub async fn wait_reason(&self, name: &str, reason: &str) -> ResourceStatus {
        eventually(
            &format!("{}/{name} reason {reason}", self.ns),
            CONVERGE,
            || async {
                self.status_of(name)
                    .await
                    .filter(|s| s.ready().is_some_and(|c| c.reason == reason))
            },
        )
        .await
    }

    /// Wait until widget `name` no longer exists.
    pub async fn wait_gone(&self, name: &str) {
        eventually(&format!("{}/{name} gone", self.ns), CONVERGE, || async {
            matches!(self.api().get_opt(name).await, Ok(None)).then_some(())
        })
        .await
    }

    /// Names of the widgets left in the namespace.
    pub async fn names(&self) -> Vec<String> {
        self.api()
            .list(&ListParams::default())
            .await
            .expect("list widgets")
            .items
            .iter()
            .map(|w| w.name_any())
            .collect()
    }
}

/// Collects what tracing writes, for tests of what an operator's log shows. Install it for the
/// test's thread with [`LogBuffer::capture`] (a `#[tokio::test]` runs everything on that thread).
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Routes this thread's tracing events (WARN and above) here until the guard drops.
    pub fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(self.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

/// The Events whose `reason` is `reason`, about objects in `ns`.
pub async fn events_in(
    client: &Client,
    ns: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The permissions a client's requests needed, as (API group, resource[/subresource], verb).
#[derive(Clone, Default)]
pub struct Used(Arc<std::sync::Mutex<BTreeSet<(String, String, String)>>>);

impl Used {
    /// Records the permission `req` needs (requests outside an API group's resources, such as
    /// discovery, are not recorded).
    pub fn record<B>(&self, req: &http::Request<B>) {
        let path: Vec<&str> = req
            .uri()
            .path()
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        let rest = match path.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => return,
        };
        let (group, rest) = rest;
        let rest = match rest {
            ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
            other => other,
        };
        let (resource, named) = match rest {
            [resource] => (resource.to_string(), false),
            [resource, _name] => (resource.to_string(), true),
            [resource, _name, sub] => (format!("{resource}/{sub}"), true),
            _ => return,
        };
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let verb = match (req.method().as_str(), named) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PATCH", _) => "patch",
            ("PUT", _) => "update",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return,
        };
        let mut used = self.0.lock().unwrap();
        // A server-side apply is a patch that Kubernetes also authorizes as a create (of that
        // name) when the object does not exist yet.
        let apply = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/apply-patch"));
        if apply {
            used.insert((group.to_string(), resource.clone(), "create".into()));
        }
        used.insert((group.to_string(), resource, verb.to_string()));
    }

    pub fn take(&self) -> BTreeSet<(String, String, String)> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// Every (API group, resource, verb) `rules` grant, wherever.
pub fn granted(rules: &[actorcile::rbac::ScopedRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.rule.api_groups.iter().flatten() {
            for res in r.rule.resources.iter().flatten() {
                for v in &r.rule.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

/// The envtest's non-admin user as an RBAC subject.
pub fn user_subject(env: &Envtest) -> k8s_openapi::api::rbac::v1::Subject {
    k8s_openapi::api::rbac::v1::Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: env.user_name().into(),
        namespace: None,
    }
}

/// A client of the envtest's non-admin user that records in `used` what each request needed.
pub fn recorded_user_client(env: &Envtest, used: &Used) -> Client {
    kube::client::ClientBuilder::try_from(env.user_config())
        .unwrap()
        .with_layer(&tower::util::MapRequestLayer::new({
            let used = used.clone();
            move |req: http::Request<kube::client::Body>| {
                used.record(&req);
                req
            }
        }))
        .build()
}
