//! The in-process cluster, driven through a real `kube::Client`. API behaviour shared with a
//! real kube-apiserver is tested in `conformance.rs`, against both; this file holds what is the
//! in-process server's own: fault injection, the tokio clock, determinism from a seed, its
//! history window, revision and stats, its answers to raw and malformed requests, and behaviour
//! no conformance case covers (garbage collection, namespaces, CRD versions, kube-runtime on it).

use crate::common::plain::{Widget, widget};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use actorcile::cluster::{ApiServer, Faults};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use tower::ServiceExt;

/// Every test is bounded.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("test timed out")
}

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    if !labels.is_empty() {
        c.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    c.data = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
    c
}

fn cluster_with_widgets() -> ApiServer {
    let c = ApiServer::new();
    c.install_crd(&Widget::crd()).unwrap();
    c
}

fn api_err(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Sends a raw request through the tower service; answers (status code, body JSON).
async fn raw(
    c: &ApiServer,
    method: &str,
    uri: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = c.service().oneshot(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Collects the events of a watch that ends by its timeout.
async fn watch_all<K: Clone + serde::de::DeserializeOwned + std::fmt::Debug>(
    api: &Api<K>,
    rv: &str,
    wp: &WatchParams,
) -> Vec<WatchEvent<K>> {
    let events: Vec<WatchEvent<K>> = api
        .watch(wp, rv)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    // kube asks for bookmarks; every watch ends with one. Check it, then leave it out.
    assert!(
        matches!(events.last(), Some(WatchEvent::Bookmark(_))),
        "{events:?}"
    );
    events
        .into_iter()
        .filter(|e| !matches!(e, WatchEvent::Bookmark(_)))
        .collect()
}

// Not in conformance: a write that changes nothing stores nothing (same resourceVersion).
#[tokio::test]
async fn no_op_write_keeps_the_resource_version() {
    bounded(async {
        let c = cluster_with_widgets();
        let ws: Api<Widget> = Api::default_namespaced(c.client());
        ws.create(&PostParams::default(), &widget("w", 1))
            .await
            .unwrap();
        let pp = PatchParams::default();
        let w = ws
            .patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 2}})))
            .await
            .unwrap();
        let again = ws
            .patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 2}})))
            .await
            .unwrap();
        assert_eq!(again.resource_version(), w.resource_version());
    })
    .await;
}

// Not in conformance: resourceVersion=0 lists ignore limit; lists answer the cluster's revision.
#[tokio::test]
async fn list_paging() {
    bounded(async {
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        let n = 12;
        for i in 0..n {
            cms.create(&PostParams::default(), &cm(&format!("cm-{i:02}"), &[]))
                .await
                .unwrap();
        }
        // resourceVersion=0 is served whole, as from the real server's cache.
        let (code, whole) = raw(
            &c,
            "GET",
            "/api/v1/namespaces/default/configmaps?limit=5&resourceVersion=0",
            "",
            "",
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(whole["items"].as_array().unwrap().len(), n);
        assert!(whole["metadata"].get("continue").is_none());
        let l = cms.list(&ListParams::default().limit(5)).await.unwrap();
        assert_eq!(l.metadata.resource_version, Some(c.revision().to_string()));
    })
    .await;
}

// Not in conformance: a watch resumes within `history(5)`; a continue token beyond it is a 410.
#[tokio::test]
async fn too_old_resource_version_is_expired() {
    bounded(async {
        let c = ApiServer::builder().history(5).build();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        cms.create(&PostParams::default(), &cm("first", &[]))
            .await
            .unwrap();
        cms.create(&PostParams::default(), &cm("second", &[]))
            .await
            .unwrap();
        let page = cms.list(&ListParams::default().limit(1)).await.unwrap();
        let token = page.metadata.continue_.clone().expect("a second page");
        for i in 0..20 {
            cms.create(&PostParams::default(), &cm(&format!("n{i}"), &[]))
                .await
                .unwrap();
        }
        // A recent revision is still fine.
        let recent = (c.revision() - 2).to_string();
        let events = watch_all(&cms, &recent, &WatchParams::default().timeout(1)).await;
        assert_eq!(events.len(), 2);
        // A continue token older than the history window expires.
        let (code, reason) = api_err(
            cms.list(&ListParams::default().continue_token(&token))
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (410, "Expired"));
    })
    .await;
}

fn owned_by(name: &str, owner: &ConfigMap, block: bool) -> ConfigMap {
    let mut c = cm(name, &[]);
    c.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        block_owner_deletion: Some(block),
        controller: Some(true),
    }]);
    c
}

#[tokio::test]
async fn owner_references_garbage_collection() {
    bounded(async {
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        let pp = PostParams::default();
        let exists = |name: &'static str| {
            let cms = cms.clone();
            async move { cms.get_opt(name).await.unwrap() }
        };

        // Background: dependents go with the owner, a dependent's finalizer is respected, grandchildren too.
        let owner = cms.create(&pp, &cm("owner", &[])).await.unwrap();
        let child = cms
            .create(&pp, &owned_by("child", &owner, false))
            .await
            .unwrap();
        cms.create(&pp, &owned_by("grandchild", &child, false))
            .await
            .unwrap();
        let mut kept = owned_by("kept", &owner, false);
        kept.metadata.finalizers = Some(vec!["test/hold".into()]);
        cms.create(&pp, &kept).await.unwrap();
        cms.delete("owner", &DeleteParams::default()).await.unwrap();
        assert!(exists("owner").await.is_none());
        assert!(exists("child").await.is_none());
        assert!(exists("grandchild").await.is_none());
        let kept = exists("kept").await.expect("held by its finalizer");
        assert!(kept.metadata.deletion_timestamp.is_some());

        // Orphan: dependents stay, without the owner reference.
        let owner = cms.create(&pp, &cm("owner2", &[])).await.unwrap();
        cms.create(&pp, &owned_by("orphan", &owner, true))
            .await
            .unwrap();
        cms.delete("owner2", &DeleteParams::orphan()).await.unwrap();
        let orphan = exists("orphan").await.expect("orphaned, not deleted");
        assert!(
            orphan
                .metadata
                .owner_references
                .unwrap_or_default()
                .is_empty()
        );

        // Foreground: the owner waits (foregroundDeletion) for its blocking dependents.
        let owner = cms.create(&pp, &cm("owner3", &[])).await.unwrap();
        let mut slow = owned_by("slow", &owner, true);
        slow.metadata.finalizers = Some(vec!["test/hold".into()]);
        cms.create(&pp, &slow).await.unwrap();
        cms.delete("owner3", &DeleteParams::foreground())
            .await
            .unwrap();
        let o = exists("owner3").await.expect("waiting for its dependent");
        assert!(o.finalizers().contains(&"foregroundDeletion".to_string()));
        assert!(o.metadata.deletion_timestamp.is_some());
        assert!(
            exists("slow")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
        );
        cms.patch(
            "slow",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        assert!(exists("slow").await.is_none());
        assert!(
            exists("owner3").await.is_none(),
            "the owner goes once its dependents are gone"
        );
    })
    .await;
}

#[tokio::test]
async fn fault_injection_is_deterministic() {
    bounded(async {
        let faults = Faults {
            error_rate: 0.25,
            seed: 42,
            ..Faults::default()
        };
        let pattern = || async {
            let c = ApiServer::builder().faults(faults.clone()).build();
            let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
            let mut out = Vec::new();
            for i in 0..400 {
                out.push(match cms.get_opt(&format!("x{i}")).await {
                    Ok(_) => false,
                    Err(e) => {
                        assert_eq!(api_err(e), (500, "InternalError".to_string()));
                        true
                    }
                });
            }
            assert_eq!(
                c.stats().injected_errors as usize,
                out.iter().filter(|e| **e).count()
            );
            out
        };
        let a = pattern().await;
        let b = pattern().await;
        assert_eq!(a, b, "same seed, same failures");
        let errors = a.iter().filter(|e| **e).count();
        assert!(
            (60..140).contains(&errors),
            "about 25% of 400, got {errors}"
        );

        // Conflicts hit writes to existing objects only.
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        cms.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap();
        c.set_faults(Faults {
            conflict_rate: 1.0,
            ..Faults::default()
        });
        let err = cms
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"z": "1"}})),
            )
            .await;
        assert_eq!(api_err(err.unwrap_err()), (409, "Conflict".to_string()));
        cms.create(&PostParams::default(), &cm("b", &[]))
            .await
            .unwrap();
        assert!(!cms.get("a").await.unwrap().data.unwrap().contains_key("z"));
        assert_eq!(c.stats().injected_conflicts, 1);
        c.set_faults(Faults::default());
        cms.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"z": "1"}})),
        )
        .await
        .unwrap();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn latency_uses_the_tokio_clock() {
    let c = ApiServer::builder()
        .faults(Faults {
            latency: Duration::from_secs(2),
            latency_jitter: Duration::from_secs(1),
            ..Faults::default()
        })
        .build();
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let t0 = tokio::time::Instant::now();
    let res = tokio::time::timeout(
        Duration::from_secs(60),
        cms.create(&PostParams::default(), &cm("a", &[])),
    )
    .await;
    res.expect("bounded").unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took <= Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn malformed_requests_answer_status() {
    bounded(async {
        let c = cluster_with_widgets();
        let cms = "/api/v1/namespaces/default/configmaps";
        let json = "application/json";
        let check = |(code, body): (u16, Value), want: u16| {
            assert_eq!(code, want, "{body}");
            assert_eq!(body["kind"], "Status", "{body}");
            assert_eq!(body["status"], "Failure");
            assert_eq!(body["code"], want);
            assert!(body["reason"].as_str().is_some_and(|r| !r.is_empty()), "{body}");
            body
        };
        check(raw(&c, "POST", cms, json, "{not json").await, 400);
        check(raw(&c, "POST", cms, json, "[1,2]").await, 400);
        check(raw(&c, "POST", cms, json, r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}"#).await, 400);
        // Custom resources need apiVersion and kind; built-in kinds take them from the URL.
        let b = check(raw(&c, "POST", "/apis/conformance.actorcile.dev/v1/namespaces/default/widgets", json,
            r#"{"metadata":{"name":"x"}}"#).await, 400);
        assert!(b["message"].as_str().unwrap().contains("Object 'Kind' is missing"), "{b}");
        let (code, obj) = raw(&c, "POST", cms, json, r#"{"metadata":{"name":"defaulted"}}"#).await;
        assert_eq!((code, obj["kind"].as_str()), (201, Some("ConfigMap")));
        // A resourceVersion on create is a bare 500, as on the real server.
        let b = raw(&c, "POST", cms, json, r#"{"metadata":{"name":"rv","resourceVersion":"5"}}"#).await;
        assert_eq!((b.0, b.1["message"].as_str()), (500, Some("resourceVersion should not be set on objects to be created")));
        let b = check(raw(&c, "POST", cms, json, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#).await, 422);
        assert_eq!(b["reason"], "Invalid");
        assert_eq!(b["message"], "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required");
        assert_eq!(b["details"]["causes"][0]["reason"], "FieldValueRequired");
        let b = check(raw(&c, "POST", cms, json, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#).await, 422);
        // Word for word what a v1.20 kube-apiserver answers.
        assert_eq!(b["message"], r#"ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"#);
        check(raw(&c, "POST", cms, json, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"other"}}"#).await, 400);
        check(raw(&c, "POST", cms, json, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":"oops"}"#).await, 400);
        check(raw(&c, "POST", cms, json, r#"{"metadata":{"name":"o","ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"p"}]}}"#).await, 422);
        check(raw(&c, "POST", cms, json, r#"{"metadata":{"name":"o","labels":{"a":1}}}"#).await, 400);
        let ok = raw(&c, "POST", cms, json, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#).await;
        assert_eq!(ok.0, 201);
        check(raw(&c, "PUT", &format!("{cms}/x"), json, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"y"}}"#).await, 400);
        check(raw(&c, "PATCH", &format!("{cms}/x"), "application/merge-patch+json", "{{").await, 400);
        check(raw(&c, "PATCH", &format!("{cms}/x"), "text/plain", "{}").await, 415);
        check(raw(&c, "PATCH", &format!("{cms}/x"), "application/merge-patch+json", r#"{"metadata":{"name":"z"}}"#).await, 400);
        check(raw(&c, "PATCH", &format!("{cms}/x"), "application/apply-patch+yaml", r#"{}"#).await, 422);
        check(raw(&c, "DELETE", &format!("{cms}/x"), json, "{bad").await, 400);
        check(raw(&c, "DELETE", &format!("{cms}/x"), json, r#"{"propagationPolicy":"Sideways"}"#).await, 422);
        check(raw(&c, "POST", &format!("{cms}/x"), json, "{}").await, 405);
        check(raw(&c, "OPTIONS", cms, json, "").await, 405);
        let b = check(raw(&c, "GET", "/api/v1/namespaces/default/gizmos", json, "").await, 404);
        assert_eq!(b["reason"], "NotFound");
        // Paths no group serves get the real server's plain-text 404; unknown kinds of built-in groups a Status.
        let plain_404 = |c: &ApiServer, uri: &'static str| {
            let req = http::Request::get(uri).body(Full::new(Bytes::new())).unwrap();
            let svc = c.service();
            async move {
                let resp = svc.oneshot(req).await.unwrap();
                let code = resp.status().as_u16();
                let text = resp.into_body().collect().await.unwrap().to_bytes();
                (code, String::from_utf8(text.to_vec()).unwrap())
            }
        };
        for uri in [
            "/apis/nope.io/v1/things",
            "/nonsense",
            "/apis/conformance.actorcile.dev/v1/namespaces/default/gizmos",
        ] {
            assert_eq!(plain_404(&c, uri).await, (404, "404 page not found\n".to_string()), "{uri}");
        }
        check(raw(&c, "GET", "/apis/apps/v1/namespaces/default/gizmos", json, "").await, 404);
        check(raw(&c, "GET", &format!("{cms}/x/status"), json, "").await, 404);
        check(raw(&c, "GET", &format!("{cms}?labelSelector=a%20in%20(b"), json, "").await, 400);
        check(raw(&c, "GET", &format!("{cms}?limit=many"), json, "").await, 400);
        check(raw(&c, "GET", &format!("{cms}?watch=true&resourceVersion=abc"), json, "").await, 400);
        let b = check(raw(&c, "GET", &format!("{cms}/missing"), json, "").await, 404);
        assert_eq!(b["details"], json!({"name": "missing", "kind": "configmaps"}));
        // Namespaces that do not exist, or are going away.
        let b = check(raw(&c, "POST", "/api/v1/namespaces/ghost/configmaps", json,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#).await, 404);
        assert_eq!(b["details"]["kind"], "namespaces");
        let widgets = "/apis/conformance.actorcile.dev/v1/namespaces/default/widgets";
        let w = r#"{"apiVersion":"conformance.actorcile.dev/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":1}}"#;
        assert_eq!(raw(&c, "POST", widgets, json, w).await.0, 201);
        check(raw(&c, "DELETE", &format!("{widgets}/w/status"), json, "").await, 405);
        assert_eq!(raw(&c, "GET", &format!("{widgets}/w"), json, "").await.0, 200, "still there");
        check(raw(&c, "PATCH", &format!("{widgets}/w"), "application/strategic-merge-patch+json", "{}").await, 415);
        check(raw(&c, "POST", widgets, json, r#"{"apiVersion":"conformance.actorcile.dev/v2","kind":"Widget","metadata":{"name":"w"}}"#).await, 400);
        // Through kube's client, the same errors arrive as kube::Error::Api.
        let err = c.client().request_text(http::Request::get("/apis/nope.io/v1/things").body(vec![]).unwrap()).await;
        assert_eq!(api_err(err.unwrap_err()).0, 404);
        let (code, v) = raw(&c, "GET", "/version", json, "").await;
        assert_eq!((code, v["major"].as_str()), (200, Some("1")));
    })
    .await;
}

#[tokio::test]
async fn namespaces_lifecycle() {
    bounded(async {
        let c = ApiServer::new();
        let nss: Api<Namespace> = Api::all(c.client());
        let names: BTreeSet<String> = nss
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|n| n.name_any())
            .collect();
        for n in ["default", "kube-system", "kube-public"] {
            assert!(names.contains(n));
        }
        let mut ns = Namespace::default();
        ns.metadata.name = Some("team".into());
        let created = nss.create(&PostParams::default(), &ns).await.unwrap();
        assert_eq!(created.status.unwrap().phase.as_deref(), Some("Active"));
        let cms: Api<ConfigMap> = Api::namespaced(c.client(), "team");
        cms.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap();
        let mut held = cm("held", &[]);
        held.metadata.finalizers = Some(vec!["test/hold".into()]);
        cms.create(&PostParams::default(), &held).await.unwrap();
        let gone = nss
            .delete("team", &DeleteParams::default())
            .await
            .unwrap()
            .left()
            .unwrap();
        assert_eq!(gone.status.unwrap().phase.as_deref(), Some("Terminating"));
        assert!(cms.get_opt("a").await.unwrap().is_none());
        let (code, reason) = api_err(
            cms.create(&PostParams::default(), &cm("b", &[]))
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (403, "Forbidden"));
        assert!(
            nss.get_opt("team").await.unwrap().is_some(),
            "still holds 'held'"
        );
        cms.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        assert!(
            nss.get_opt("team").await.unwrap().is_none(),
            "empty, so gone"
        );
    })
    .await;
}

#[tokio::test]
async fn crds_by_api_and_dynamic_objects() {
    bounded(async {
        let c = ApiServer::new();
        let crds: Api<CustomResourceDefinition> = Api::all(c.client());
        let created = crds
            .create(&PostParams::default(), &Widget::crd())
            .await
            .unwrap();
        let conds = created.status.unwrap().conditions.unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        );
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "NamesAccepted" && c.status == "True")
        );
        let gvk = GroupVersionKind::gvk("conformance.actorcile.dev", "v1", "Widget");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
        let dy: Api<DynamicObject> = Api::namespaced_with(c.client(), "default", &ar);
        let obj: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "conformance.actorcile.dev/v1", "kind": "Widget",
            "metadata": {"name": "d"}, "spec": {"size": 4}}),
        )
        .unwrap();
        dy.create(&PostParams::default(), &obj).await.unwrap();
        let typed: Api<Widget> = Api::default_namespaced(c.client());
        assert_eq!(typed.get("d").await.unwrap().spec.size, 4);
        let all: Api<DynamicObject> = Api::all_with(c.client(), &ar);
        assert_eq!(
            all.list(&ListParams::default()).await.unwrap().items.len(),
            1
        );
        // Deleting the CRD removes its objects and stops serving the kind.
        crds.delete(
            "widgets.conformance.actorcile.dev",
            &DeleteParams::default(),
        )
        .await
        .unwrap();
        assert_eq!(api_err(typed.get("d").await.unwrap_err()).0, 404);
        // A CRD with a wrong name is refused.
        let mut bad = Widget::crd();
        bad.metadata.name = Some("wrong.name.io".into());
        assert_eq!(
            api_err(crds.create(&PostParams::default(), &bad).await.unwrap_err()).0,
            422
        );
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_reflector_stays_in_sync() {
    bounded(async {
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        let pp = PostParams::default();
        for i in 0..50 {
            cms.create(&pp, &cm(&format!("pre-{i}"), &[]))
                .await
                .unwrap();
        }
        let (reader, writer) = reflector::store();
        let stream = reflector(
            writer,
            watcher(cms.clone(), watcher::Config::default().page_size(7)),
        );
        let driver = tokio::spawn(stream.applied_objects().for_each(|_| async {}));
        reader.wait_until_ready().await.unwrap();
        assert_eq!(reader.state().len(), 50);
        for i in 0..20 {
            cms.create(&pp, &cm(&format!("new-{i}"), &[]))
                .await
                .unwrap();
        }
        for i in 0..10 {
            cms.delete(&format!("pre-{i}"), &DeleteParams::default())
                .await
                .unwrap();
            cms.patch(
                &format!("pre-{}", i + 10),
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"k": "new"}})),
            )
            .await
            .unwrap();
        }
        let expected: BTreeMap<String, String> = cms
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| (c.name_any(), c.resource_version().unwrap()))
            .collect();
        assert_eq!(expected.len(), 60);
        loop {
            let seen: BTreeMap<String, String> = reader
                .state()
                .iter()
                .map(|c| (c.name_any(), c.resource_version().unwrap()))
                .collect();
            if seen == expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        driver.abort();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_objects() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let c = ApiServer::new();
        let n = 20_000;
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        // A watch open from the start sees every creation.
        let live = cms
            .watch(
                &WatchParams::default().timeout(290),
                &c.revision().to_string(),
            )
            .await
            .unwrap();
        futures::stream::iter(0..n)
            .map(|i| {
                let cms = cms.clone();
                async move {
                    cms.create(
                        &PostParams::default(),
                        &cm(&format!("obj-{i:06}"), &[("i", &(i % 10).to_string())]),
                    )
                    .await
                }
            })
            .buffer_unordered(64)
            .try_collect::<Vec<_>>()
            .await
            .unwrap();
        assert_eq!(c.object_count(), n + 4);
        let added = live.take(n).try_collect::<Vec<_>>().await.unwrap();
        assert!(added.iter().all(|e| matches!(e, WatchEvent::Added(_))));
        // Paged list as kube-runtime does it.
        let mut total = 0;
        let mut lp = ListParams::default().limit(500);
        loop {
            let page = cms.list(&lp).await.unwrap();
            total += page.items.len();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(t) => lp = lp.continue_token(&t),
                None => break,
            }
        }
        assert_eq!(total, n);
        assert_eq!(
            cms.list(&ListParams::default().labels("i=3"))
                .await
                .unwrap()
                .items
                .len(),
            n / 10
        );
        // A watch from "0" starts with every object.
        let initial = cms
            .watch(&WatchParams::default().timeout(290), "0")
            .await
            .unwrap()
            .take(n);
        assert_eq!(initial.try_collect::<Vec<_>>().await.unwrap().len(), n);
        // And a reflector syncs them all.
        let (reader, writer) = reflector::store();
        let driver = tokio::spawn(
            reflector(writer, watcher(cms.clone(), watcher::Config::default()))
                .for_each(|_| async {}),
        );
        reader.wait_until_ready().await.unwrap();
        assert_eq!(reader.state().len(), n);
        driver.abort();
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn secrets_labels_and_discovery() {
    bounded(async {
        let c = ApiServer::new();
        let client = c.client();
        // stringData is folded into base64 data, as the real server does.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::default_namespaced(client.clone());
        let mut s = k8s_openapi::api::core::v1::Secret::default();
        s.metadata.name = Some("s".into());
        s.string_data = Some(BTreeMap::from([(
            "password".to_string(),
            "hunter2".to_string(),
        )]));
        let s = secrets.create(&PostParams::default(), &s).await.unwrap();
        assert!(s.string_data.is_none());
        assert_eq!(s.data.unwrap()["password"].0, b"hunter2");
        // Invalid label syntax: 422.
        let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
        let err = cms
            .create(&PostParams::default(), &cm("l", &[("bad key!", "v")]))
            .await
            .unwrap_err();
        assert_eq!(api_err(err), (422, "Invalid".to_string()));
        // Installing the same CRD twice changes nothing.
        c.install_crd(&Widget::crd()).unwrap();
        let rev = c.revision();
        c.install_crd(&Widget::crd()).unwrap();
        assert_eq!(c.revision(), rev);
        // kube's discovery finds built-in and custom kinds.
        let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
        let found: BTreeSet<String> = discovery
            .groups()
            .flat_map(|g| {
                g.recommended_resources()
                    .into_iter()
                    .map(|(ar, _)| format!("{}/{}", ar.api_version, ar.plural))
            })
            .collect();
        for want in [
            "v1/configmaps",
            "v1/namespaces",
            "coordination.k8s.io/v1/leases",
            "conformance.actorcile.dev/v1/widgets",
        ] {
            assert!(found.contains(want), "{want} missing from {found:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_streaming_list_watcher() {
    bounded(async {
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        for i in 0..10 {
            cms.create(&PostParams::default(), &cm(&format!("s-{i}"), &[]))
                .await
                .unwrap();
        }
        let (reader, writer) = reflector::store();
        let stream = reflector(
            writer,
            watcher(cms.clone(), watcher::Config::default().streaming_lists()),
        );
        let driver = tokio::spawn(stream.applied_objects().for_each(|_| async {}));
        reader.wait_until_ready().await.unwrap();
        assert_eq!(reader.state().len(), 10);
        cms.delete("s-0", &DeleteParams::default()).await.unwrap();
        while reader.state().len() != 9 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        driver.abort();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn reflector_converges_under_paused_clock_with_faults() {
    tokio::time::timeout(Duration::from_secs(3600), async {
        let faults = Faults {
            latency: Duration::from_millis(10),
            latency_jitter: Duration::from_millis(5),
            error_rate: 0.1,
            conflict_rate: 0.2,
            seed: 1,
        };
        let c = ApiServer::builder().faults(faults).build();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        let (reader, writer) = reflector::store();
        let stream = reflector(
            writer,
            watcher(cms.clone(), watcher::Config::default()).default_backoff(),
        );
        let driver = tokio::spawn(stream.for_each(|_| async {}));
        // Writers retry what the faults refuse.
        for i in 0..30 {
            let name = format!("c-{i}");
            while cms
                .create(&PostParams::default(), &cm(&name, &[]))
                .await
                .is_err()
            {
                if cms.get_opt(&name).await.is_ok_and(|o| o.is_some()) {
                    break;
                }
            }
            let p = json!({"data": {"k": "updated"}});
            while cms
                .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                .await
                .is_err()
            {}
        }
        loop {
            let done = reader.state().len() == 30
                && reader
                    .state()
                    .iter()
                    .all(|c| c.data.as_ref().is_some_and(|d| d["k"] == "updated"));
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(c.stats().injected_errors > 0 && c.stats().injected_conflicts > 0);
        driver.abort();
    })
    .await
    .expect("bounded (virtual time)");
}

#[tokio::test]
async fn immutable_config_maps_and_uid_preconditions() {
    bounded(async {
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        let mut frozen = cm("frozen", &[]);
        frozen.immutable = Some(true);
        cms.create(&PostParams::default(), &frozen).await.unwrap();
        let err = cms
            .patch(
                "frozen",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"k": "2"}})),
            )
            .await;
        assert_eq!(api_err(err.unwrap_err()), (422, "Invalid".to_string()));
        // Metadata may still change.
        cms.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
        // A write naming another uid is refused.
        let p = json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}});
        let err = cms
            .patch("frozen", &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap_err();
        assert_eq!(api_err(err), (409, "Conflict".to_string()));
        // Delete preconditions.
        let cur = cms.get("frozen").await.unwrap();
        let stale = kube::api::Preconditions {
            resource_version: Some("1".into()),
            uid: None,
        };
        let err = cms
            .delete("frozen", &DeleteParams::default().preconditions(stale))
            .await
            .unwrap_err();
        assert_eq!(api_err(err).0, 409);
        let ok = kube::api::Preconditions {
            resource_version: cur.resource_version(),
            uid: cur.uid(),
        };
        let gone = cms
            .delete("frozen", &DeleteParams::default().preconditions(ok))
            .await
            .unwrap();
        let status = gone.right().expect("a Status for a built-in kind");
        assert_eq!(status.details.unwrap().uid, cur.uid().unwrap());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn bookmarks_keep_quiet_watches_resumable() {
    tokio::time::timeout(Duration::from_secs(3600), async {
        let c = ApiServer::builder().history(10).build();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        cms.create(&PostParams::default(), &cm("only", &[]))
            .await
            .unwrap();
        // A watch allowing bookmarks gets one periodically and one when it ends, at the current revision.
        let wp = WatchParams::default().timeout(130);
        let mut w = cms
            .watch(&wp, &c.revision().to_string())
            .await
            .unwrap()
            .boxed();
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::default_namespaced(c.client());
        let mut lease = k8s_openapi::api::coordination::v1::Lease::default();
        lease.metadata.name = Some("l".into());
        leases.create(&PostParams::default(), &lease).await.unwrap();
        let mut bookmarks = Vec::new();
        while let Some(ev) = w.try_next().await.unwrap() {
            match ev {
                WatchEvent::Bookmark(b) => bookmarks.push(b.metadata.resource_version),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            bookmarks.len(),
            3,
            "at 60 s, 120 s and the end: {bookmarks:?}"
        );
        assert_eq!(bookmarks.last().unwrap(), &c.revision().to_string());

        // kube-runtime's watcher follows bookmarks, so writes to other kinds do not expire its position.
        let (reader, writer) = reflector::store();
        let driver = tokio::spawn(
            reflector(writer, watcher(cms.clone(), watcher::Config::default()))
                .for_each(|_| async {}),
        );
        reader.wait_until_ready().await.unwrap();
        let lists = c.stats().list;
        for i in 0..30 {
            let mut l = lease.clone();
            l.metadata.name = Some(format!("l{i}"));
            leases.create(&PostParams::default(), &l).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        assert!(
            c.stats().watch >= 3,
            "the watcher re-watched after timeouts"
        );
        assert_eq!(
            c.stats().list,
            lists,
            "no relist: every re-watch resumed from a bookmark"
        );
        driver.abort();
    })
    .await
    .expect("bounded (virtual time)");
}

// Not in conformance: dry runs leave the revision alone; a dryRun other than `All` is a 400.
#[tokio::test]
async fn dry_run_changes_nothing() {
    bounded(async {
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        cms.create(&PostParams::default(), &cm("real", &[]))
            .await
            .unwrap();
        let rev = c.revision();
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        cms.create(&dry, &cm("ghost", &[])).await.unwrap();
        let pp = PatchParams {
            dry_run: true,
            ..PatchParams::default()
        };
        cms.patch("real", &pp, &Patch::Merge(json!({"data": {"k": "dry"}})))
            .await
            .unwrap();
        cms.delete("real", &DeleteParams::default().dry_run())
            .await
            .unwrap();
        assert_eq!(c.revision(), rev, "nothing was written");
        let (code, _) = raw(
            &c,
            "DELETE",
            "/api/v1/namespaces/default/configmaps/real?dryRun=Some",
            "application/json",
            "",
        )
        .await;
        assert_eq!(code, 400);
    })
    .await;
}

#[tokio::test]
async fn workload_kinds_are_stored() {
    bounded(async {
        use k8s_openapi::api::apps::v1::Deployment;
        let c = ApiServer::new();
        let deps: Api<Deployment> = Api::default_namespaced(c.client());
        let d: Deployment = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
        .unwrap();
        let d = deps.create(&PostParams::default(), &d).await.unwrap();
        assert_eq!(d.metadata.generation, Some(1));
        let pp = PatchParams::default();
        let d = deps.patch("web", &pp, &Patch::Merge(json!({"spec": {"replicas": 3}}))).await.unwrap();
        assert_eq!(d.metadata.generation, Some(2));
        let d = deps.patch_status("web", &pp, &Patch::Merge(json!({"status": {"readyReplicas": 3}}))).await.unwrap();
        assert_eq!((d.metadata.generation, d.status.unwrap().ready_replicas), (Some(2), Some(3)));
        // Built-in kinds take strategic merge patches.
        let d = deps.patch("web", &pp, &Patch::Strategic(json!({"spec": {"replicas": 4}}))).await.unwrap();
        assert_eq!(d.spec.unwrap().replicas, Some(4));
    })
    .await;
}

#[tokio::test]
async fn runs_are_deterministic_from_the_seed() {
    bounded(async {
        let run = || async {
            let c = ApiServer::builder().seed(7).build();
            let start = c.revision().to_string();
            let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
            let owner = cms
                .create(&PostParams::default(), &cm("owner", &[]))
                .await
                .unwrap();
            for i in 0..20 {
                cms.create(
                    &PostParams::default(),
                    &owned_by(&format!("dep-{i}"), &owner, i % 2 == 0),
                )
                .await
                .unwrap();
                let mut g = cm("", &[]);
                g.metadata.name = None;
                g.metadata.generate_name = Some("gen-".into());
                let mut g = cms.create(&PostParams::default(), &g).await.unwrap();
                g.metadata.owner_references =
                    owned_by("x", &owner, false).metadata.owner_references;
                cms.replace(&g.name_any(), &PostParams::default(), &g)
                    .await
                    .unwrap();
            }
            cms.delete("owner", &DeleteParams::foreground())
                .await
                .unwrap();
            let events = watch_all(&cms, &start, &WatchParams::default().timeout(1)).await;
            events
                .iter()
                .map(|e| match e {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                        format!(
                            "{} {} {}",
                            o.name_any(),
                            o.uid().unwrap(),
                            o.resource_version().unwrap()
                        )
                    }
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let a = run().await;
        assert_eq!(a.len(), 1 + 20 * 3 + 2 + 40, "{a:#?}");
        assert_eq!(a, run().await);
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_event_recorder() {
    bounded(async {
        use kube::runtime::events::{Event, EventType, Recorder, Reporter};
        let c = ApiServer::new();
        let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
        let obj = cms
            .create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap();
        let reporter = Reporter {
            controller: "test-controller".into(),
            instance: None,
        };
        let recorder = Recorder::new(c.client(), reporter);
        let ev = Event {
            type_: EventType::Normal,
            reason: "Tested".into(),
            note: Some("hello".into()),
            action: "Test".into(),
            secondary: None,
        };
        let reference = kube::Resource::object_ref(&obj, &());
        recorder.publish(&ev, &reference).await.unwrap();
        recorder.publish(&ev, &reference).await.unwrap();
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::default_namespaced(c.client());
        let list = events.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 1, "the second publish updates the series");
        assert_eq!(list.items[0].reason.as_deref(), Some("Tested"));
        assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    })
    .await;
}

#[tokio::test]
async fn kube_runtime_controller_reconciles() {
    bounded(async {
        use kube::runtime::controller::{Action, Controller};
        use std::sync::Arc;

        #[derive(Debug, thiserror::Error)]
        #[error(transparent)]
        struct ReconcileError(#[from] kube::Error);

        async fn reconcile(
            w: Arc<Widget>,
            api: Arc<Api<Widget>>,
        ) -> Result<Action, ReconcileError> {
            let ready = w.spec.size > 0;
            if w.status.as_ref().map(|s| s.ready) != Some(ready) {
                let p = json!({"status": {"ready": ready}});
                api.patch_status(&w.name_any(), &PatchParams::default(), &Patch::Merge(&p))
                    .await?;
            }
            Ok(Action::await_change())
        }
        fn error_policy(_: Arc<Widget>, _: &ReconcileError, _: Arc<Api<Widget>>) -> Action {
            Action::requeue(Duration::from_millis(10))
        }

        let c = cluster_with_widgets();
        // Conflicts on a third of the writes: the controller retries.
        c.set_faults(Faults {
            conflict_rate: 0.3,
            seed: 3,
            ..Faults::default()
        });
        let ws: Api<Widget> = Api::default_namespaced(c.client());
        let ctl = Controller::new(ws.clone(), watcher::Config::default())
            .run(reconcile, error_policy, Arc::new(ws.clone()))
            .for_each(|_| async {});
        let driver = tokio::spawn(ctl);
        for i in 0..25 {
            ws.create(&PostParams::default(), &widget(&format!("w{i}"), i % 2))
                .await
                .unwrap();
        }
        loop {
            let all = ws.list(&ListParams::default()).await.unwrap().items;
            if all.len() == 25
                && all.iter().all(|w| {
                    w.status
                        .as_ref()
                        .is_some_and(|s| s.ready == (w.spec.size > 0))
                })
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(c.stats().injected_conflicts > 0);
        driver.abort();
    })
    .await;
}

#[tokio::test]
async fn crd_versions_share_storage() {
    bounded(async {
        let c = ApiServer::new();
        let mut crd = Widget::crd();
        let mut v2 = crd.spec.versions[0].clone();
        v2.name = "v2".into();
        v2.storage = false;
        crd.spec.versions.push(v2);
        c.install_crd(&crd).unwrap();
        let ar = |v: &str| {
            ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("conformance.actorcile.dev", v, "Widget"),
                "widgets",
            )
        };
        let v1: Api<DynamicObject> = Api::default_namespaced_with(c.client(), &ar("v1"));
        let v2: Api<DynamicObject> = Api::default_namespaced_with(c.client(), &ar("v2"));
        let obj: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "conformance.actorcile.dev/v1", "kind": "Widget",
            "metadata": {"name": "m"}, "spec": {"size": 1}}),
        )
        .unwrap();
        v1.create(&PostParams::default(), &obj).await.unwrap();
        let through_v2 = v2.get("m").await.unwrap();
        assert_eq!(
            through_v2.types.unwrap().api_version,
            "conformance.actorcile.dev/v2"
        );
        assert_eq!(through_v2.data["spec"]["size"], 1);
        // A watch through v2 sees v1 writes as v2 objects.
        let start = c.revision().to_string();
        v1.patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
        let events = watch_all(&v2, &start, &WatchParams::default().timeout(1)).await;
        match events.as_slice() {
            [WatchEvent::Modified(o)] => {
                assert_eq!(
                    o.types.as_ref().unwrap().api_version,
                    "conformance.actorcile.dev/v2"
                );
                assert_eq!(o.data["spec"]["size"], 2);
            }
            other => panic!("unexpected {other:?}"),
        }
        // An unserved version is not routed.
        let v3: Api<DynamicObject> = Api::default_namespaced_with(c.client(), &ar("v3"));
        assert_eq!(api_err(v3.get("m").await.unwrap_err()).0, 404);
    })
    .await;
}

// Not in conformance: a repeated apply writes nothing; a plain write of a field the appliers
// share takes it from both (their entries, left empty, go), and records no entry for a field
// nobody owned (a simplification: the real server records that too).
#[tokio::test]
async fn server_side_apply_field_ownership() {
    bounded(async {
        let c = cluster_with_widgets();
        let ws: Api<Widget> = Api::default_namespaced(c.client());
        let body = |size: i32, label: bool| {
            let mut b = json!({"apiVersion": "conformance.actorcile.dev/v1", "kind": "Widget",
                "metadata": {"name": "a"}, "spec": {"size": size}});
            if label {
                b["metadata"]["labels"] = json!({"l": "1"});
            }
            b
        };
        let w = ws
            .patch("a", &PatchParams::apply("m1"), &Patch::Apply(body(1, true)))
            .await
            .unwrap();
        // Re-applying the same is a no-op: same resourceVersion.
        let again = ws
            .patch("a", &PatchParams::apply("m1"), &Patch::Apply(body(1, true)))
            .await
            .unwrap();
        assert_eq!(again.resource_version(), w.resource_version());
        ws.patch(
            "a",
            &PatchParams::apply("m2").force(),
            &Patch::Apply(body(2, false)),
        )
        .await
        .unwrap();
        ws.patch(
            "a",
            &PatchParams::apply("m1"),
            &Patch::Apply(body(2, false)),
        )
        .await
        .unwrap();
        let editor = PatchParams {
            field_manager: Some("editor".into()),
            ..Default::default()
        };
        let entries = |w: &Widget| -> Vec<(String, String)> {
            w.managed_fields()
                .iter()
                .map(|m| {
                    (
                        m.manager.clone().unwrap_or_default(),
                        m.operation.clone().unwrap_or_default(),
                    )
                })
                .collect()
        };
        let pair = |m: &str, o: &str| (m.to_string(), o.to_string());
        // A label nobody owns: the appliers' entries stay as they are, and none is added.
        let w = ws
            .patch(
                "a",
                &editor,
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await
            .unwrap();
        assert_eq!(entries(&w), [pair("m1", "Apply"), pair("m2", "Apply")]);
        // The size both appliers own: the editor's now.
        let w = ws
            .patch("a", &editor, &Patch::Merge(json!({"spec": {"size": 3}})))
            .await
            .unwrap();
        assert_eq!(entries(&w), [pair("editor", "Update")]);
        assert!(
            w.managed_fields()[0]
                .fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:size").is_some()),
            "{:?}",
            w.managed_fields()
        );
    })
    .await;
}
