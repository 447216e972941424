//! An operator that deploys one Helm application into a remote cluster through Argo CD.
//!
//! Each `Tenant` (`example.actorcile.dev/v1`) gets the chart `web` at the version its spec
//! names, deployed by Argo CD into the namespace of the tenant's name in the cluster `edge`.
//! The provisioner tree is one `remote` (register `edge` with Argo CD, then run the children
//! there) around one `application`:
//!
//! ```text
//! remote("edge")  ── registered with Argo CD (a cluster Secret in namespace argocd)
//! └── application("web")  ── an argoproj.io Application, found again by its identity labels
//! ```
//!
//! Argo CD cannot run here, so a stand-in (`stand_in_argo_cd` below) plays its application
//! controller: it marks each Application Synced and Healthy and writes one ConfigMap for the
//! release into the edge; on deletion it removes the ConfigMap, then Argo CD's resources
//! finalizer. With a real Argo CD, drop the stand-in.
//!
//! The run creates one tenant, waits until it is Ready, prints what was deployed, deletes the
//! tenant, waits until it is gone and checks that the registration went with it.
//!
//! ```text
//! cargo run --release --example remote_app                       # in-process clusters
//! cargo run --release --example remote_app --features envtest -- --envtest   # real ones
//! ```

use std::sync::Arc;
use std::time::Duration;

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use actorcile::provisioners::argocd::{ArgoCd, RESOURCES_FINALIZER, application_crd};
use actorcile::provisioners::{AppRef, Catalog, FixedCluster, application, boxed, remote};
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A tenant of the platform: gets the `web` application in the edge cluster.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "example.actorcile.dev",
    version = "v1",
    kind = "Tenant",
    namespaced,
    status = "ResourceStatus"
)]
pub struct TenantSpec {
    /// The version of the `web` chart.
    pub version: String,
}

#[derive(Parser)]
struct Args {
    /// Run on two real etcd + kube-apiserver pairs (needs `--features envtest`).
    #[arg(long)]
    envtest: bool,
}

/// The operator: what an operator author writes.
fn tenant_tree(argo: Arc<ArgoCd>, edge: FixedCluster) -> impl Provisioner<Tenant> {
    let charts =
        Arc::new(Catalog::new().chart("web", "1.0.0", "https://charts.example.com", "web"));
    remote(
        "edge",
        move |_t: &Tenant| edge.clone(),
        vec![boxed(
            application("web", argo.clone(), charts, |t: &Tenant| {
                AppRef::new("web", t.spec.version.clone())
            })
            .namespace(|t: &Tenant| t.name_any())
            .parameters(|t: &Tenant| Ok([("tenant".to_string(), t.name_any())].into())),
        )],
    )
    .registered_with(argo)
}

/// Two clusters: (management, edge), and how the edge is reached.
struct Clusters {
    management: Client,
    edge: Client,
    edge_access: FixedCluster,
    _keep: Box<dyn std::any::Any>,
}

fn in_process() -> Clusters {
    let management = ApiServer::new();
    management
        .install_crd(&Tenant::crd())
        .expect("install the Tenant CRD");
    management
        .install_crd(&application_crd())
        .expect("install the Application CRD");
    let edge = ApiServer::new();
    let edge_client = edge.client();
    // An in-process cluster has no URL: the children use its client, and Argo CD is given a
    // placeholder address (the stand-in reaches the edge through the client).
    let placeholder = kube::Config::new("https://edge.invalid".parse().expect("a URL"));
    Clusters {
        management: management.client(),
        edge: edge_client.clone(),
        edge_access: FixedCluster::client("edge", edge_client).registered_as(placeholder),
        _keep: Box::new((management, edge)),
    }
}

#[cfg(feature = "envtest")]
async fn real() -> Clusters {
    use actorcile::envtest::Envtest;
    let management = Envtest::builder()
        .crds(vec![application_crd(), Tenant::crd()])
        .start()
        .await
        .expect("start the management control plane (run scripts/install-test-deps.sh)");
    let edge = Envtest::start()
        .await
        .expect("start the edge control plane");
    Clusters {
        management: management.client(),
        edge: edge.client(),
        edge_access: FixedCluster::config("edge", edge.config()),
        _keep: Box::new((management, edge)),
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let clusters = if args.envtest {
        #[cfg(feature = "envtest")]
        {
            real().await
        }
        #[cfg(not(feature = "envtest"))]
        {
            eprintln!("--envtest needs --features envtest");
            std::process::exit(2);
        }
    } else {
        in_process()
    };
    let mgmt = clusters.management.clone();
    create_namespace(&mgmt, "argocd").await;
    let stand_in = tokio::spawn(stand_in_argo_cd(mgmt.clone(), clusters.edge.clone()));

    let names = OperatorNames::new("remote-app-operator", "example.actorcile.dev");
    let argo = Arc::new(ArgoCd::new(mgmt.clone(), "argocd", &names));
    // Argo CD syncs in its own time: look again after a second, not the default 5 s.
    let policy = SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            yield_delay: Duration::from_secs(1),
            ..Default::default()
        },
        ..SupervisorPolicy::default()
    };
    let runtime = Runtime::builder(mgmt.clone(), names)
        .policy(policy)
        .controller(Controller::<Tenant>::new(tenant_tree(
            argo,
            clusters.edge_access.clone(),
        )))
        .start()
        .await
        .expect("start the runtime");

    let tenants: Api<Tenant> = Api::namespaced(mgmt.clone(), "default");
    let acme = Tenant::new(
        "acme",
        TenantSpec {
            version: "1.0.0".into(),
        },
    );
    tenants
        .create(&PostParams::default(), &acme)
        .await
        .expect("create the tenant");
    wait("acme is Ready", || async {
        let t = tenants.get("acme").await.ok()?;
        t.status.filter(|s| s.is_ready()).map(|_| ())
    })
    .await;
    let deployed: Api<ConfigMap> = Api::namespaced(clusters.edge.clone(), "acme");
    let cm = deployed
        .get("web")
        .await
        .expect("web is deployed in the edge");
    println!(
        "acme is Ready: release web in the edge's namespace acme, parameters {}",
        cm.data
            .unwrap_or_default()
            .get("parameters")
            .cloned()
            .unwrap_or_default()
    );

    tenants
        .delete("acme", &DeleteParams::default())
        .await
        .expect("delete the tenant");
    wait("acme is gone", || async {
        tenants.get_opt("acme").await.ok()?.is_none().then_some(())
    })
    .await;
    let left = deployed.get_opt("web").await.expect("read the edge");
    let registrations = Api::<Secret>::namespaced(mgmt.clone(), "argocd")
        .list(&ListParams::default().labels("argocd.argoproj.io/secret-type=cluster"))
        .await
        .expect("list cluster secrets")
        .items
        .len();
    println!(
        "acme is gone: web {} in the edge, {registrations} cluster registrations left",
        if left.is_some() { "still" } else { "no longer" }
    );
    runtime.shutdown().await;
    stand_in.abort();
}

/// Poll `check` every 50 ms for up to 60 s.
async fn wait<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    for _ in 0..1200 {
        if check().await.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 60 s");
}

async fn create_namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// Argo CD's part, reduced: sync every Application into the edge once, report it Synced and
/// Healthy, and undeploy it when it is deleted with the resources finalizer.
async fn stand_in_argo_cd(management: Client, edge: Client) {
    let apps: Api<DynamicObject> =
        Api::namespaced_with(management, "argocd", &ArgoCd::application_resource());
    loop {
        for app in apps
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let spec = app.data["spec"].clone();
            let release = spec["source"]["helm"]["releaseName"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let ns = spec["destination"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            let configmaps: Api<ConfigMap> = Api::namespaced(edge.clone(), &ns);
            let name = app.name_any();
            if app.metadata.deletion_timestamp.is_some() {
                let _ = configmaps.delete(&release, &DeleteParams::default()).await;
                let rest: Vec<String> = app
                    .finalizers()
                    .iter()
                    .filter(|f| *f != RESOURCES_FINALIZER)
                    .cloned()
                    .collect();
                let patch = json!({ "metadata": { "finalizers": rest } });
                let _ = apps
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                continue;
            }
            let compared = json!({ "source": spec["source"], "destination": spec["destination"] });
            if app.data.pointer("/status/sync/comparedTo") == Some(&compared) {
                continue;
            }
            create_namespace(&edge, &ns).await;
            let cm = json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": release },
                "data": { "parameters": spec["source"]["helm"]["parameters"].to_string() },
            });
            let applied = configmaps
                .patch(
                    &release,
                    &PatchParams::apply("stand-in-argocd").force(),
                    &Patch::Apply(&cm),
                )
                .await;
            if applied.is_ok() {
                let status = json!({ "status": {
                    "sync": { "status": "Synced", "comparedTo": compared },
                    "health": { "status": "Healthy" },
                }});
                let _ = apps
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
