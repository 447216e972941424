//! The provider config's watch across a restart: the supervisor starts it again after a panic,
//! and the new watch goes on from what the last one saw.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::actors::ConfigSpec;
use crate::cluster::ApiServer;
use crate::triggers::ConfigRef;

fn data(view: &dyn super::watches::ConfigView) -> Option<String> {
    let current = view.current()?;
    let cm = current.downcast_ref::<ConfigMap>()?;
    cm.data.as_ref()?.get("size").cloned()
}

#[tokio::test]
async fn a_restarted_config_watch_keeps_the_config_and_reruns_on_a_change_made_meanwhile() {
    let server = ApiServer::new();
    let client = server.client();
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("provider".into());
    cm.data = Some([("size".to_string(), "1".to_string())].into());
    configs.create(&PostParams::default(), &cm).await.unwrap();

    let (view, start) = ConfigSpec::trigger(
        &client,
        ConfigRef::<ConfigMap>::namespaced("default", "provider"),
    );
    let reruns = Arc::new(AtomicUsize::new(0));
    let broadcast: Arc<dyn Fn() + Send + Sync> = {
        let reruns = reruns.clone();
        Arc::new(move || {
            reruns.fetch_add(1, Ordering::SeqCst);
        })
    };
    let (listed_tx, mut listed) = tokio::sync::watch::channel(false);
    let listed_tx = Arc::new(listed_tx);

    let first = start(broadcast.clone(), listed_tx.clone());
    listed.wait_for(|l| *l).await.unwrap();
    assert_eq!(data(view.as_ref()).as_deref(), Some("1"));
    // The first list only tells what there is.
    assert_eq!(reruns.load(Ordering::SeqCst), 0);

    // The watch dies (as a task that panicked does); the config changes while none runs.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let patch = serde_json::json!({"data": {"size": "2"}});
    configs
        .patch("provider", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    // Meanwhile the reconciles still read the config as it was, not as missing.
    assert_eq!(data(view.as_ref()).as_deref(), Some("1"));

    // Started again, the watch's first list shows the change: every object runs again, once.
    let second = start(broadcast.clone(), listed_tx.clone());
    tokio::time::timeout(Duration::from_secs(20), async {
        while reruns.load(Ordering::SeqCst) == 0 || data(view.as_ref()).as_deref() != Some("2") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the restarted watch re-runs every object on the change made meanwhile");
    assert_eq!(reruns.load(Ordering::SeqCst), 1);
    second.abort();
}

#[test]
fn a_secrets_function_that_panics_on_a_config_names_no_secret() {
    let cref = ConfigRef::<ConfigMap>::namespaced("default", "provider")
        .secrets_from(|_cm: &ConfigMap| panic!("hostile config"));
    let refs = cref.secrets_from.expect("set");
    assert!(refs(&ConfigMap::default()).is_empty());
}
