//! One in-process API server for every run of a target (built once per process), with a
//! ConfigMap and a custom resource of a kind with a schema and a status subresource to work on.
//!
//! Beyond "never panics", every answer a target gets is checked: an error answer is a
//! Kubernetes `Status` object in JSON whose code is the answer's, as clients expect (or, for a
//! path not served at all, kube-apiserver's plain `404 page not found`).

#![allow(dead_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actorcile::cluster::{ApiServer, ApiService};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tower::ServiceExt;

pub struct Fixture {
    rt: tokio::runtime::Runtime,
    server: ApiServer,
    service: ApiService,
    sent: AtomicU64,
}

/// The paths a request goes to: collections and objects of a built-in kind, of the custom
/// kind, its status, namespaces, discovery.
pub const PATHS: &[&str] = &[
    "/api/v1/namespaces/default/configmaps",
    "/api/v1/namespaces/default/configmaps/cm",
    "/apis/fuzz.actorcile.dev/v1/namespaces/default/things",
    "/apis/fuzz.actorcile.dev/v1/namespaces/default/things/t",
    "/apis/fuzz.actorcile.dev/v1/namespaces/default/things/t/status",
    "/apis/fuzz.actorcile.dev/v1/things",
    "/api/v1/namespaces",
    "/api/v1/namespaces/default",
    "/api",
    "/apis",
    "/apis/fuzz.actorcile.dev/v1",
    "/api/v1/namespaces/default/secrets",
    "/apis/coordination.k8s.io/v1/namespaces/default/leases",
];

pub const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/yaml",
    "text/plain",
];

pub const METHODS: &[Method] = &[
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

fn crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "things.fuzz.actorcile.dev" },
        "spec": {
            "group": "fuzz.actorcile.dev",
            "names": { "kind": "Thing", "plural": "things", "singular": "thing", "listKind": "ThingList" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": { "type": "object", "properties": {
                            "size": { "type": "integer", "minimum": 0, "maximum": 100 },
                            "name": { "type": "string", "maxLength": 63, "pattern": "^[a-z]+$" },
                            "tags": { "type": "array", "items": { "type": "string" }, "maxItems": 8 },
                            "mode": { "type": "string", "enum": ["a", "b"] },
                            "extra": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
                        }, "required": ["size"] },
                        "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
                    }
                }}
            }]
        }
    }))
    .expect("a valid CRD")
}

pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime");
        // A short history: every write keeps its object in it, and a fuzzer writes millions.
        let server = rt.block_on(async { ApiServer::builder().history(1_000).build() });
        server.install_crd(&crd()).expect("install the CRD");
        let service = server.service();
        let f = Fixture {
            rt,
            server,
            service,
            sent: AtomicU64::new(0),
        };
        f.reset();
        f
    })
}

impl Fixture {
    /// The ConfigMap and the custom resource as they start: created, or deleted and created
    /// again. The in-process cluster, unlike etcd, sets no limit on an object's size, so
    /// patches that keep adding fields would grow them without bound.
    fn reset(&self) {
        for path in [PATHS[1], PATHS[3]] {
            self.send_unchecked(&Method::DELETE, path, CONTENT_TYPES[0], Vec::new());
        }
        let cm = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","labels":{"app":"x","tier":"web"}},"data":{"k":"v"}}"#;
        self.send_unchecked(&Method::POST, PATHS[0], CONTENT_TYPES[0], cm.to_vec());
        let t = br#"{"apiVersion":"fuzz.actorcile.dev/v1","kind":"Thing","metadata":{"name":"t","labels":{"app":"y"}},"spec":{"size":3,"name":"abc","tags":["a"]}}"#;
        self.send_unchecked(&Method::POST, PATHS[2], CONTENT_TYPES[0], t.to_vec());
    }

    fn send_unchecked(&self, method: &Method, path: &str, content_type: &str, body: Vec<u8>) {
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(bytes::Bytes::from(body)))
            .expect("a fixed request");
        let service = self.service.clone();
        self.rt.block_on(async move {
            let _ = service.oneshot(req).await;
        });
    }

    /// Sends one request and checks the answer (see the module docs). A URI that `http` cannot
    /// even build is no request at all.
    pub fn send(&self, method: &Method, path_and_query: &str, content_type: &str, body: Vec<u8>) {
        if self.sent.fetch_add(1, Ordering::Relaxed) % 1_000 == 999 {
            self.reset();
        }
        let Ok(req) = Request::builder()
            .method(method.clone())
            .uri(path_and_query)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(bytes::Bytes::from(body)))
        else {
            return;
        };
        let watch = path_and_query.contains("watch");
        let service = self.service.clone();
        self.rt.block_on(async move {
            let answer = service.oneshot(req).await.expect("the service never fails");
            let status = answer.status();
            if watch {
                return; // a stream: dropping it ends the watch
            }
            let body = tokio::time::timeout(Duration::from_secs(5), answer.into_body().collect())
                .await
                .expect("a non-watch answer ends")
                .expect("a readable body")
                .to_bytes();
            // kube-apiserver's answer to a path it does not serve is plain text, as here.
            let not_served =
                status == http::StatusCode::NOT_FOUND && &body[..] == b"404 page not found\n";
            if (status.is_client_error() || status.is_server_error()) && !not_served {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
                    panic!(
                        "error answer {status} is not JSON ({e}): {:?}",
                        String::from_utf8_lossy(&body)
                    )
                });
                assert_eq!(v["kind"], "Status", "error answer {status}: {v}");
                assert_eq!(v["code"].as_u64(), Some(u64::from(status.as_u16())), "{v}");
            }
        });
    }

    pub fn server(&self) -> &ApiServer {
        &self.server
    }
}

/// `s` percent-encoded for a query value.
pub fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
