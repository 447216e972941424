//! A stand-in for Argo CD's application controller, for tests on a real kube-apiserver where
//! Argo CD itself cannot run: it watches `Application`s in one namespace (by polling), and does
//! what Argo CD does with them, reduced to what the driver reads:
//!
//! - an Application whose current spec it has not compared yet gets `status.sync` `OutOfSync`
//!   with `comparedTo` and health `Progressing`; on a later look it "deploys": it reads the
//!   cluster Secret that the destination names (`argocd.argoproj.io/secret-type: cluster`),
//!   builds a client from its `server` and `config` exactly as Argo CD would, and creates a
//!   ConfigMap named after the Helm release in the destination namespace; then it reports
//!   `Synced` and the health the test scripted for the owner (default `Healthy`);
//! - an Application being deleted with the resources finalizer: it deletes the ConfigMap it
//!   deployed and removes the finalizer, unless the test holds deletions.
//!
//! What it saw goes to a log, `VIOLATION…` entries for what Argo CD would have failed on (an
//! Application naming a cluster that is not registered).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::provisioners::argocd::{ArgoCd, RESOURCES_FINALIZER, SECRET_TYPE_LABEL};
use actorcile::provisioners::cd::labels;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The scripted health of every Application of one owner (by owner name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Script {
    /// Stays `OutOfSync` / `Progressing`.
    Hold,
    /// Syncs, then reports this health status (`Healthy`, `Degraded`, ...).
    Health(&'static str),
}

/// The fake controller's shared state.
#[derive(Default)]
pub struct FakeArgo {
    scripts: Mutex<HashMap<String, Script>>,
    /// While set, Applications being deleted keep their finalizer.
    pub hold_deletion: AtomicBool,
    log: Mutex<Vec<String>>,
}

impl FakeArgo {
    /// Script the Applications of owner `name`.
    pub fn script(&self, owner: &str, script: Script) {
        self.scripts
            .lock()
            .unwrap()
            .insert(owner.to_string(), script);
    }

    /// What it did, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn push(&self, entry: String) {
        self.log.lock().unwrap().push(entry);
    }

    /// Run it against the Applications in `namespace` of `client`'s cluster until the task is
    /// aborted.
    pub fn spawn(self: &Arc<Self>, client: Client, namespace: &str) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let ns = namespace.to_string();
        tokio::spawn(async move {
            let apps: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &ns, &ArgoCd::application_resource());
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
            loop {
                if let Ok(list) = apps.list(&ListParams::default()).await {
                    for app in list.items {
                        if let Err(e) = me.tick(&apps, &secrets, app).await {
                            me.push(format!("error: {e}"));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    async fn tick(
        &self,
        apps: &Api<DynamicObject>,
        secrets: &Api<Secret>,
        app: DynamicObject,
    ) -> Result<(), String> {
        let name = app.name_any();
        // The owner's name, under whichever operator's domain labelled the Application.
        let owner = app
            .labels()
            .iter()
            .find(|(k, _)| {
                k.starts_with("app.") && k.ends_with(&format!("/{}", labels::OWNER_NAME))
            })
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let spec = app.data.get("spec").cloned().unwrap_or(Value::Null);
        let release = spec
            .pointer("/source/helm/releaseName")
            .and_then(Value::as_str)
            .unwrap_or(&name)
            .to_string();
        let dest_ns = spec
            .pointer("/destination/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        if app.metadata.deletion_timestamp.is_some() {
            if !app.finalizers().iter().any(|f| f == RESOURCES_FINALIZER)
                || self.hold_deletion.load(Ordering::SeqCst)
            {
                return Ok(());
            }
            if let Some(remote) = self.destination(secrets, &spec).await? {
                let cms: Api<ConfigMap> = Api::namespaced(remote, &dest_ns);
                match cms.delete(&release, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(format!("undeploy {release}: {e}")),
                }
            }
            let rest: Vec<String> = app
                .finalizers()
                .iter()
                .filter(|f| *f != RESOURCES_FINALIZER)
                .cloned()
                .collect();
            let patch = json!({ "metadata": {
                "resourceVersion": app.resource_version(), "finalizers": rest } });
            apps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("finalize {name}: {e}"))?;
            self.push(format!("undeployed {release}"));
            return Ok(());
        }
        let compared =
            json!({ "source": spec.get("source"), "destination": spec.get("destination") });
        let status = app.data.get("status");
        let seen = status.and_then(|s| s.pointer("/sync/comparedTo")) == Some(&compared);
        let script = self
            .scripts
            .lock()
            .unwrap()
            .get(&owner)
            .cloned()
            .unwrap_or(Script::Health("Healthy"));
        let new_status = if !seen || script == Script::Hold {
            if !seen {
                // Argo CD resolves the destination when it compares: it must be registered.
                self.destination(secrets, &spec).await?;
                self.push(format!("compared {release}"));
            }
            json!({ "sync": { "status": "OutOfSync", "comparedTo": compared },
                    "health": { "status": "Progressing", "message": "waiting" } })
        } else {
            let Some(remote) = self.destination(secrets, &spec).await? else {
                return Ok(());
            };
            let health = match script {
                Script::Health(h) => h,
                Script::Hold => unreachable!(),
            };
            if status.and_then(|s| s.pointer("/health/status")) == Some(&json!(health))
                && status.and_then(|s| s.pointer("/sync/status")) == Some(&json!("Synced"))
            {
                return Ok(());
            }
            let nss: Api<Namespace> = Api::all(remote.clone());
            let mut n = Namespace::default();
            n.metadata.name = Some(dest_ns.clone());
            match nss.create(&PostParams::default(), &n).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(format!("namespace {dest_ns}: {e}")),
            }
            let cms: Api<ConfigMap> = Api::namespaced(remote, &dest_ns);
            let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": { "name": release },
                             "data": { "parameters": spec.pointer("/source/helm/parameters")
                                 .map(Value::to_string).unwrap_or_default() } });
            cms.patch(
                &release,
                &PatchParams::apply("fake-argocd").force(),
                &Patch::Apply(&cm),
            )
            .await
            .map_err(|e| format!("deploy {release}: {e}"))?;
            self.push(format!("deployed {release} {health}"));
            json!({ "sync": { "status": "Synced", "comparedTo": compared },
                    "health": { "status": health, "message": format!("scripted {health}") } })
        };
        let patch = json!({ "metadata": { "resourceVersion": app.resource_version() },
                            "status": new_status });
        // A conflict (the driver changed the spec meanwhile) is seen again on the next look.
        let _ = apps
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        Ok(())
    }

    /// A client for the Application's destination, built from the cluster Secret it names as
    /// Argo CD would; `None` (and a violation) when that cluster is not registered. The
    /// in-cluster destination is not used by these tests.
    async fn destination(
        &self,
        secrets: &Api<Secret>,
        spec: &Value,
    ) -> Result<Option<Client>, String> {
        let Some(cluster) = spec.pointer("/destination/name").and_then(Value::as_str) else {
            self.push("VIOLATION: in-cluster destination".into());
            return Ok(None);
        };
        let list = secrets
            .list(&ListParams::default().labels(&format!("{SECRET_TYPE_LABEL}=cluster")))
            .await
            .map_err(|e| format!("list cluster secrets: {e}"))?;
        let field = |s: &Secret, k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        };
        let Some(secret) = list
            .items
            .iter()
            .find(|s| field(s, "name").as_deref() == Some(cluster))
        else {
            self.push(format!(
                "VIOLATION: destination {cluster} is not registered"
            ));
            return Ok(None);
        };
        let server = field(secret, "server").ok_or("no server")?;
        let config: Value = serde_json::from_str(&field(secret, "config").ok_or("no config")?)
            .map_err(|e| format!("config: {e}"))?;
        let tls = config.get("tlsClientConfig").cloned().unwrap_or_default();
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{ "name": "c", "cluster": {
                "server": server,
                "certificate-authority-data": tls.get("caData"),
                "insecure-skip-tls-verify": tls.get("insecure"),
            }}],
            "users": [{ "name": "u", "user": {
                "client-certificate-data": tls.get("certData"),
                "client-key-data": tls.get("keyData"),
                "token": config.get("bearerToken"),
            }}],
            "contexts": [{ "name": "c", "context": { "cluster": "c", "user": "u" } }],
        });
        let kubeconfig: kube::config::Kubeconfig =
            serde_json::from_value(kubeconfig).map_err(|e| format!("kubeconfig: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| format!("config from the cluster secret: {e}"))?;
        Ok(Some(Client::try_from(config).map_err(|e| {
            format!("client from the cluster secret: {e}")
        })?))
    }
}
