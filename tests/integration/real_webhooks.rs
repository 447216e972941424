//! Admission and conversion webhooks served by the runtime, called by a real kube-apiserver
//! on loopback: a validator's denial and a handler's panic reach the client as denials, a
//! defaulter's change is stored, an object written as one version reads as the other both
//! ways and survives a storage-version change, and the serving certificate and the CA bundle
//! are replaced while writes go on, none failing.
//!
//! Each test has a control plane of its own: the CRD and the webhook configurations are
//! cluster-wide, and each test's server is at a port of its own.
//!
//! Run with `cargo test --release --features envtest,webhooks --test integration real_webhooks::`
//! (the test command runs the conversion case on the oldest supported release too).
#![cfg(all(feature = "envtest", feature = "webhooks"))]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::real::*;

use actorcile::webhooks::{
    Conversion, Convertible, Defaulter, Denial, GeneratedCa, LocalWebhooks, Request, Validator,
    Warnings, Webhooks, migrate_storage_version,
};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::crd::merge_crds;
use kube::{Client, CustomResourceExt};

pub mod v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    /// The hub version.
    #[derive(
        kube::CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema,
    )]
    #[kube(
        group = "webhooks.actorcile.test",
        version = "v1",
        kind = "Gizmo",
        namespaced
    )]
    pub struct GizmoSpec {
        pub replicas: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub color: Option<String>,
    }
}

pub mod v1alpha1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    /// The first version: `replicas` was `size`.
    #[derive(
        kube::CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema,
    )]
    #[kube(
        group = "webhooks.actorcile.test",
        version = "v1alpha1",
        kind = "Gizmo",
        namespaced
    )]
    pub struct GizmoSpec {
        pub size: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub color: Option<String>,
    }
}

impl Convertible<v1::Gizmo> for v1alpha1::Gizmo {
    fn to_hub(self) -> v1::Gizmo {
        v1::Gizmo::new(
            "",
            v1::GizmoSpec {
                replicas: self.spec.size,
                color: self.spec.color,
            },
        )
    }
    fn from_hub(hub: v1::Gizmo) -> Self {
        v1alpha1::Gizmo::new(
            "",
            v1alpha1::GizmoSpec {
                size: hub.spec.replicas,
                color: hub.spec.color,
            },
        )
    }
}

/// At most ten replicas; a name starting with `panic` makes the handler panic.
struct AtMostTen;

impl Validator<v1::Gizmo> for AtMostTen {
    async fn validate(
        &self,
        new: &v1::Gizmo,
        _: Option<&v1::Gizmo>,
        _: &Request,
    ) -> Result<Warnings, Denial> {
        if new
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("panic"))
        {
            panic!("a validator bug");
        }
        if new.spec.replicas > 10 {
            return Err(Denial::invalid(format!(
                "spec.replicas: {} is more than 10",
                new.spec.replicas
            )));
        }
        Ok(Warnings::new())
    }
}

/// The color is blue unless said.
struct Blue;

impl Defaulter<v1::Gizmo> for Blue {
    async fn default(&self, gizmo: &mut v1::Gizmo, _: &Request) -> Result<(), Denial> {
        gizmo.spec.color.get_or_insert_with(|| "blue".into());
        Ok(())
    }
}

fn webhooks() -> Webhooks {
    Webhooks::new("gizmo-operator")
        .validate::<v1::Gizmo>(AtMostTen)
        .defaults::<v1::Gizmo>(Blue)
        .convert(Conversion::<v1::Gizmo>::hub().spoke::<v1alpha1::Gizmo>())
}

/// The CRD of both versions, stored as `storage`.
fn gizmo_crd(storage: &str) -> CustomResourceDefinition {
    merge_crds(vec![v1alpha1::Gizmo::crd(), v1::Gizmo::crd()], storage).expect("merge the versions")
}

/// Waits until `check` holds, polling every 50 ms, for at most [`CONVERGE`].
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {CONVERGE:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `contents` to `path` at once (a rename), as a Secret's mount changes.
fn write_atomically(path: &Path, contents: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).expect("write a certificate file");
    std::fs::rename(&next, path).expect("rename a certificate file");
}

/// Serves the webhooks on loopback, with the CRD stored as v1alpha1, and waits until the API
/// server calls them.
async fn serve(client: &Client) -> LocalWebhooks {
    webhooks()
        .local()
        .crds(vec![gizmo_crd("v1alpha1")])
        .sample(&gizmo("barrier", 3))
        .install(client)
        .await
        .expect("serve the webhooks")
}

fn gizmo(name: &str, replicas: i32) -> v1::Gizmo {
    let mut g = v1::Gizmo::new(
        name,
        v1::GizmoSpec {
            replicas,
            color: None,
        },
    );
    g.metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    g
}

/// Creates `object`, retrying while the API server has not yet read the CA bundle (its
/// informer of webhook configurations lags the write): an `x509` error, until it knows it.
async fn create_when_trusted<K>(api: &Api<K>, object: &K) -> Result<K, kube::Error>
where
    K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..100 {
        match api.create(&PostParams::default(), object).await {
            Err(kube::Error::Api(s))
                if s.message.contains("x509") || s.message.contains("certificate") =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
    api.create(&PostParams::default(), object).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_denies_with_the_handlers_message_defaults_and_survives_a_panic() {
    bounded("admission webhooks", async {
        let env = own_env().await;
        let client = env.client();
        let _served = serve(&client).await;
        create_namespace(&client, "admission").await;
        let api: Api<v1::Gizmo> = Api::namespaced(client.clone(), "admission");

        let stored = create_when_trusted(&api, &gizmo("small", 3))
            .await
            .expect("an allowed create");
        assert_eq!(
            stored.spec.color.as_deref(),
            Some("blue"),
            "the default is stored"
        );
        assert_eq!(
            api.get("small").await.unwrap().spec.color.as_deref(),
            Some("blue")
        );

        let denied = api.create(&PostParams::default(), &gizmo("huge", 20)).await;
        match denied {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{s:?}");
                assert!(s.message.contains("denied the request"), "{}", s.message);
                assert!(
                    s.message.contains("spec.replicas: 20 is more than 10"),
                    "{}",
                    s.message
                );
            }
            other => panic!("a create of 20 replicas was not denied: {other:?}"),
        }
        assert!(api.get_opt("huge").await.unwrap().is_none());

        let panicked = api
            .create(&PostParams::default(), &gizmo("panic-1", 1))
            .await;
        match panicked {
            Err(kube::Error::Api(s)) => {
                assert!(
                    s.message
                        .contains("the admission handler failed: a validator bug"),
                    "{}",
                    s.message
                );
            }
            other => panic!("a panicking handler did not deny: {other:?}"),
        }
        // The server lives on: the next write is answered.
        api.create(&PostParams::default(), &gizmo("after-panic", 2))
            .await
            .expect("a create after the panic");

        // An update is judged too, against the stored object.
        let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": 11}}));
        assert!(
            api.patch("small", &PatchParams::default(), &patch)
                .await
                .is_err()
        );
        // A dry run is judged and defaulted, and not stored.
        let dry = api
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &gizmo("dry", 1),
            )
            .await
            .expect("a dry-run create");
        assert_eq!(dry.spec.color.as_deref(), Some("blue"));
        assert!(api.get_opt("dry").await.unwrap().is_none());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversion_reads_each_version_as_the_other_and_survives_a_storage_version_change() {
    bounded("conversion webhook", async {
        let env = own_env().await;
        let client = env.client();
        let _served = serve(&client).await;
        create_namespace(&client, "conversion").await;
        let old: Api<v1alpha1::Gizmo> = Api::namespaced(client.clone(), "conversion");
        let new: Api<v1::Gizmo> = Api::namespaced(client.clone(), "conversion");

        let mut alpha = v1alpha1::Gizmo::new(
            "alpha",
            v1alpha1::GizmoSpec {
                size: 4,
                color: Some("red".into()),
            },
        );
        alpha.metadata.name = Some("alpha".into());
        create_when_trusted(&old, &alpha)
            .await
            .expect("create as v1alpha1");
        let as_v1 = new.get("alpha").await.expect("read v1alpha1 as v1");
        assert_eq!(
            as_v1.spec,
            v1::GizmoSpec {
                replicas: 4,
                color: Some("red".into())
            }
        );

        new.create(&PostParams::default(), &gizmo("one", 2))
            .await
            .expect("create as v1");
        let as_alpha = old.get("one").await.expect("read v1 as v1alpha1");
        assert_eq!(
            as_alpha.spec,
            v1alpha1::GizmoSpec {
                size: 2,
                color: Some("blue".into())
            }
        );

        // A write through the old version is admitted by the v1 webhooks (matchPolicy
        // Equivalent converts it first).
        let mut too_big = alpha.clone();
        too_big.metadata.name = Some("too-big".into());
        too_big.spec.size = 50;
        assert!(old.create(&PostParams::default(), &too_big).await.is_err());

        // The storage version moves to v1, and the stored objects with it.
        let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
        let mut crd = gizmo_crd("v1");
        let served = crd_api.get("gizmos.webhooks.actorcile.test").await.unwrap();
        crd.spec.conversion = served.spec.conversion.clone();
        crd.metadata.resource_version = served.metadata.resource_version.clone();
        crd_api
            .replace(
                "gizmos.webhooks.actorcile.test",
                &PostParams::default(),
                &crd,
            )
            .await
            .expect("make v1 the storage version");
        let migrated = migrate_storage_version(&client, "gizmos.webhooks.actorcile.test")
            .await
            .expect("migrate the stored objects");
        assert_eq!(migrated.version, "v1");
        assert!(migrated.objects >= 2, "{migrated:?}");
        let stored = crd_api.get("gizmos.webhooks.actorcile.test").await.unwrap();
        assert_eq!(
            stored.status.unwrap().stored_versions,
            Some(vec!["v1".to_string()])
        );
        assert_eq!(new.get("alpha").await.unwrap().spec.replicas, 4);
        assert_eq!(old.get("one").await.unwrap().spec.size, 2);
        // Written as v1alpha1 after the change, read as v1.
        let patch = Patch::Merge(serde_json::json!({"spec": {"size": 5}}));
        old.patch("alpha", &PatchParams::default(), &patch)
            .await
            .expect("update as v1alpha1");
        assert_eq!(new.get("alpha").await.unwrap().spec.replicas, 5);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_and_ca_are_picked_up_without_a_restart_or_a_failed_write() {
    bounded("certificate rotation", async {
        let env = own_env().await;
        let client = env.client();
        let served = serve(&client).await;
        create_namespace(&client, "rotation").await;
        let api: Api<v1::Gizmo> = Api::namespaced(client.clone(), "rotation");
        create_when_trusted(&api, &gizmo("first", 1))
            .await
            .expect("a first create");

        // Writes go on all through the rotation; every one must be admitted.
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicUsize::new(0));
        let writer = tokio::spawn({
            let (api, stop, written) = (api.clone(), stop.clone(), written.clone());
            async move {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = written.load(Ordering::Relaxed);
                    match api
                        .create(&PostParams::default(), &gizmo(&format!("w-{n}"), 1))
                        .await
                    {
                        Ok(_) => {}
                        Err(e) => failures.push(e.to_string()),
                    }
                    written.fetch_add(1, Ordering::Relaxed);
                }
                failures
            }
        });

        // A new serving certificate from the same CA (as cert-manager renews one).
        let before = served.server().serving_cert().leaf();
        let renewed = served.ca().issue(&["127.0.0.1"]).unwrap();
        write_atomically(&served.cert_dir().join("tls.key"), &renewed.key);
        write_atomically(&served.cert_dir().join("tls.crt"), &renewed.cert);
        eventually("the renewed certificate to be served", || async {
            served.server().serving_cert().leaf() != before
        })
        .await;
        let at_renewal = written.load(Ordering::Relaxed);
        eventually("writes through the renewed certificate", || async {
            written.load(Ordering::Relaxed) >= at_renewal + 5
        })
        .await;

        // A new CA joins the bundle: the runtime writes it into every configuration and the CRD.
        let next_ca = GeneratedCa::new("gizmo-operator-next").unwrap();
        let bundle = format!("{}{}", served.ca().ca_pem(), next_ca.ca_pem());
        write_atomically(&served.cert_dir().join("ca.crt"), &bundle);
        let bytes = bundle.clone().into_bytes();
        eventually(
            "the new bundle in every configuration and the CRD",
            || async {
                let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .get("gizmo-operator-validating")
                    .await
                    .unwrap();
                let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .get("gizmo-operator-mutating")
                    .await
                    .unwrap();
                let crd = Api::<CustomResourceDefinition>::all(client.clone())
                    .get("gizmos.webhooks.actorcile.test")
                    .await
                    .unwrap();
                let crd_bundle = crd
                    .spec
                    .conversion
                    .and_then(|c| c.webhook)
                    .and_then(|w| w.client_config)
                    .and_then(|c| c.ca_bundle)
                    .map(|b| b.0);
                validating
                    .webhooks
                    .unwrap()
                    .iter()
                    .all(|w| w.client_config.ca_bundle.as_ref().map(|b| &b.0) == Some(&bytes))
                    && mutating
                        .webhooks
                        .unwrap()
                        .iter()
                        .all(|w| w.client_config.ca_bundle.as_ref().map(|b| &b.0) == Some(&bytes))
                    && crd_bundle.as_ref() == Some(&bytes)
            },
        )
        .await;
        let at_bundle = written.load(Ordering::Relaxed);
        eventually("writes after the bundle changed", || async {
            written.load(Ordering::Relaxed) >= at_bundle + 5
        })
        .await;

        stop.store(true, Ordering::Relaxed);
        let failures = writer.await.unwrap();
        assert!(
            failures.is_empty(),
            "writes failed during the rotation: {failures:?}"
        );
    })
    .await;
}

/// What a client sees of a series of writes through the webhooks: each write's stored color
/// or its error's code and message.
async fn admission_transcript(api: &Api<v1::Gizmo>) -> Vec<String> {
    fn seen(result: Result<v1::Gizmo, kube::Error>) -> String {
        match result {
            Ok(g) => format!("ok replicas={} color={:?}", g.spec.replicas, g.spec.color),
            Err(kube::Error::Api(s)) => format!("{} {}", s.code, s.message),
            Err(e) => format!("error {e}"),
        }
    }
    let mut transcript = vec![
        seen(create_when_trusted(api, &gizmo("small", 3)).await),
        seen(api.create(&PostParams::default(), &gizmo("huge", 20)).await),
        seen(
            api.create(&PostParams::default(), &gizmo("panic-1", 1))
                .await,
        ),
    ];
    let mut red = gizmo("red", 2);
    red.spec.color = Some("red".into());
    transcript.push(seen(api.create(&PostParams::default(), &red).await));
    let too_many = Patch::Merge(serde_json::json!({"spec": {"replicas": 11}}));
    transcript.push(seen(
        api.patch("small", &PatchParams::default(), &too_many).await,
    ));
    let uncolored = Patch::Merge(serde_json::json!({"spec": {"replicas": 4, "color": null}}));
    transcript.push(seen(
        api.patch("red", &PatchParams::default(), &uncolored).await,
    ));
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    transcript.push(seen(api.create(&dry, &gizmo("dry", 1)).await));
    transcript.push(format!(
        "dry stored: {}",
        api.get_opt("dry").await.unwrap().is_some()
    ));
    transcript
}

/// What a client sees of writes and reads through both versions: each answer's version and
/// spec, or its error's code and message.
async fn conversion_transcript(client: &Client, ns: &str) -> Vec<String> {
    fn seen<K: kube::Resource<DynamicType = ()> + std::fmt::Debug>(
        result: Result<K, kube::Error>,
        spec: impl Fn(&K) -> String,
    ) -> String {
        match result {
            Ok(k) => format!("{} {}", K::version(&()), spec(&k)),
            Err(kube::Error::Api(s)) => format!("{} {}", s.code, s.message),
            Err(e) => format!("error {e}"),
        }
    }
    let alpha_spec = |g: &v1alpha1::Gizmo| format!("{:?}", g.spec);
    let v1_spec = |g: &v1::Gizmo| format!("{:?}", g.spec);
    let old: Api<v1alpha1::Gizmo> = Api::namespaced(client.clone(), ns);
    let new: Api<v1::Gizmo> = Api::namespaced(client.clone(), ns);
    let alpha = |name: &str, size: i32, color: Option<&str>| {
        let mut g = v1alpha1::Gizmo::new(
            name,
            v1alpha1::GizmoSpec {
                size,
                color: color.map(String::from),
            },
        );
        g.metadata.namespace = None;
        g
    };
    let post = PostParams::default();
    let mut transcript = vec![
        seen(
            old.create(&post, &alpha("red", 4, Some("red"))).await,
            alpha_spec,
        ),
        seen(new.get("red").await, v1_spec),
        // Defaulted and judged by the v1 handlers, answered as v1alpha1.
        seen(
            old.create(&post, &alpha("plain", 2, None)).await,
            alpha_spec,
        ),
        seen(
            old.create(&post, &alpha("huge", 50, None)).await,
            alpha_spec,
        ),
        seen(new.create(&post, &gizmo("one", 3)).await, v1_spec),
        seen(old.get("one").await, alpha_spec),
    ];
    let bigger = Patch::Merge(serde_json::json!({"spec": {"size": 5}}));
    transcript.push(seen(
        old.patch("red", &PatchParams::default(), &bigger).await,
        alpha_spec,
    ));
    transcript.push(seen(new.get("red").await, v1_spec));
    let names = new.list(&Default::default()).await.map(|l| {
        l.items
            .iter()
            .map(|g| {
                format!(
                    "{}={}",
                    g.metadata.name.as_deref().unwrap_or(""),
                    g.spec.replicas
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    });
    transcript.push(format!("{names:?}"));
    transcript
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_server_answers_writes_through_the_same_handlers_as_the_real_one() {
    bounded("admission conformance", async {
        let env = own_env().await;
        let client = env.client();
        let _served = serve(&client).await;
        create_namespace(&client, "conformance").await;
        let real = admission_transcript(&Api::namespaced(client.clone(), "conformance")).await;

        let server = actorcile::cluster::ApiServer::new();
        server.install_crd(&gizmo_crd("v1alpha1")).unwrap();
        webhooks().install_in(&server);
        let in_process = admission_transcript(&Api::namespaced(server.client(), "default")).await;

        assert_eq!(
            real[..4],
            [
                "ok replicas=3 color=Some(\"blue\")".to_string(),
                "422 admission webhook \"vgizmo.webhooks.actorcile.test\" denied the request: \
                 spec.replicas: 20 is more than 10"
                    .into(),
                "500 admission webhook \"vgizmo.webhooks.actorcile.test\" denied the request: \
                 the admission handler failed: a validator bug"
                    .into(),
                "ok replicas=2 color=Some(\"red\")".into(),
            ],
            "{real:#?}"
        );
        assert_eq!(real[5], "ok replicas=4 color=Some(\"blue\")", "{real:#?}");
        assert_eq!(
            in_process, real,
            "the in-process server answers as the real one"
        );

        create_namespace(&client, "versions").await;
        create_namespace(&server.client(), "versions").await;
        let real = conversion_transcript(&client, "versions").await;
        let in_process = conversion_transcript(&server.client(), "versions").await;
        assert_eq!(
            real[..4],
            [
                "v1alpha1 GizmoSpec { size: 4, color: Some(\"red\") }".to_string(),
                "v1 GizmoSpec { replicas: 4, color: Some(\"red\") }".into(),
                "v1alpha1 GizmoSpec { size: 2, color: Some(\"blue\") }".into(),
                "422 admission webhook \"vgizmo.webhooks.actorcile.test\" denied the request: \
                 spec.replicas: 50 is more than 10"
                    .into(),
            ],
            "{real:#?}"
        );
        assert_eq!(
            real[7],
            "v1 GizmoSpec { replicas: 5, color: Some(\"red\") }"
        );
        assert_eq!(
            in_process, real,
            "the in-process server converts as the real one"
        );
    })
    .await;
}
