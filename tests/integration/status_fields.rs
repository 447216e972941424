//! Status fields of a kind's own, set by steps (`Context::set_status_field`) and written in the
//! reconcile's one status write: on the in-process cluster under a paused clock, and on the real
//! API server (which prunes what the CRD's schema does not declare).

use crate::common;
use crate::common::real;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use common::{eventually, test_policy};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt, ResourceExt};

/// How long an in-process wait may take (virtual time).
const LIMIT: Duration = Duration::from_secs(120);

/// A kind whose status holds the runtime's part and an endpoint of its own.
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "status.actorcile.dev",
    version = "v1",
    kind = "Gizmo",
    namespaced,
    status = "GizmoStatus"
)]
pub struct GizmoSpec {
    port: u16,
}

/// The runtime's status fields and the endpoint.
#[derive(
    Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
pub struct GizmoStatus {
    #[serde(flatten)]
    base: ResourceStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
}

/// Sets the endpoint from the spec's port; records the endpoint each reconcile read before.
fn publishing(seen: Arc<Mutex<Vec<Option<String>>>>) -> impl Provisioner<Gizmo> {
    step("publish", move |cx: Context<Gizmo>| {
        let seen = seen.clone();
        async move {
            let before = cx.status_as::<GizmoStatus>().and_then(|s| s.endpoint);
            seen.lock().unwrap().push(before);
            let endpoint = format!("10.0.0.7:{}", cx.object().spec.port);
            if let Err(e) = cx.set_status_field("endpoint", endpoint) {
                return Outcome::Terminal(Reason::new("StatusFieldInvalid", e.to_string()));
            }
            // The runtime's own fields are refused.
            assert!(cx.set_status_field("phase", "Mine").is_err());
            Outcome::Done
        }
    })
}

fn gizmo(name: &str, port: u16) -> Gizmo {
    Gizmo::new(name, GizmoSpec { port })
}

async fn endpoint_of(api: &Api<Gizmo>, name: &str) -> Option<String> {
    api.get_opt(name).await.ok()??.status?.endpoint
}

/// Creates `n` gizmos through `client`'s runtime and checks that each reconcile wrote its status,
/// endpoint included, in one request; then a changed port moves the endpoint with one more.
async fn one_write_per_reconcile(
    client: Client,
    ns: &str,
    policy: SupervisorPolicy,
    limit: Duration,
) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Gizmo>::new(publishing(seen.clone())).namespace(ns))
        .start()
        .await
        .unwrap();
    let api: Api<Gizmo> = Api::namespaced(client.clone(), ns);
    let n = 5;
    for i in 0..n {
        api.create(&PostParams::default(), &gizmo(&format!("g{i}"), 6443))
            .await
            .unwrap();
    }
    eventually("every gizmo Ready with its endpoint", limit, || async {
        let list = api.list(&Default::default()).await.ok()?;
        (list.items.len() == n
            && list.items.iter().all(|g| {
                let s = g.status.clone().unwrap_or_default();
                s.base.is_ready() && s.endpoint.as_deref() == Some("10.0.0.7:6443")
            }))
        .then_some(())
    })
    .await;
    let m = rt.metrics();
    assert_eq!(m.status_writes, n as u64, "one status write per object");
    assert_eq!(m.status_conflicts, 0);
    let k = &rt.kind_metrics()[0];
    assert_eq!(
        k.reconciles_with(actorcile::runtime::ReconcileResult::Done),
        n as u64,
        "one reconcile per object: the status write's echo ran nothing"
    );

    // The port changes: the endpoint moves, in the reconcile's one write; the reconcile read the old one.
    api.patch(
        "g0",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"port": 7443}})),
    )
    .await
    .unwrap();
    eventually("g0's endpoint moved", limit, || async {
        (endpoint_of(&api, "g0").await.as_deref() == Some("10.0.0.7:7443")).then_some(())
    })
    .await;
    assert_eq!(rt.metrics().status_writes, n as u64 + 1);
    assert!(
        seen.lock()
            .unwrap()
            .contains(&Some("10.0.0.7:6443".to_string())),
        "the second reconcile read the first endpoint with cx.status_as()"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_steps_status_field_is_written_with_the_runtimes_in_one_request() {
    let (cluster, _) = common::cluster();
    cluster.install_crd(&Gizmo::crd()).unwrap();
    let mut policy = test_policy();
    policy.kind.poll_interval = None;
    one_write_per_reconcile(cluster.client(), "default", policy, LIMIT).await;
}

#[tokio::test]
async fn a_steps_status_field_is_written_with_the_runtimes_in_one_request_on_a_real_server() {
    real::bounded("status fields", async {
        let env = real::shared_env().await;
        env.install_crds(&[Gizmo::crd()]).await.unwrap();
        let api = real::Ns::create(env.client(), "status-fields").await;
        one_write_per_reconcile(env.client(), &api.ns, real::real_policy(), real::CONVERGE).await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_field_the_status_already_holds_writes_nothing() {
    let (cluster, client) = common::cluster();
    cluster.install_crd(&Gizmo::crd()).unwrap();
    let mut policy = test_policy();
    policy.kind.poll_interval = None;
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Gizmo>::new(publishing(seen.clone())))
        .start()
        .await
        .unwrap();
    let api: Api<Gizmo> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &gizmo("g", 6443))
        .await
        .unwrap();
    eventually("g's endpoint", LIMIT, || async {
        endpoint_of(&api, "g").await.map(|_| ())
    })
    .await;
    // A label change runs a reconcile (a new version) that sets the same endpoint: no write.
    api.patch(
        "g",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .unwrap();
    eventually("the second reconcile ran", LIMIT, || async {
        (seen.lock().unwrap().len() == 2).then_some(())
    })
    .await;
    // Until the runtime is idle (paused time moves only then): the reconcile's write, if any, is in.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(rt.metrics().status_writes, 1, "nothing new to write");
    assert_eq!(api.get("g").await.unwrap().labels().len(), 1);
    rt.shutdown().await;
}
