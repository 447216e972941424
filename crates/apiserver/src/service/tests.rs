//! The tests of `service.rs`: requests through the `tower::Service`, as a client sends them, and
//! the answers' codes, content types and counters.

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::ApiServer;

/// Sends `method path` with `body`; the answer's code, content type and body.
async fn send(cluster: &ApiServer, method: Method, path: &str, body: &str) -> (u16, String, Bytes) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = cluster.service().oneshot(req).await.unwrap();
    let code = resp.status().as_u16();
    let ty = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (code, ty, body)
}

fn json_of(body: &Bytes) -> Value {
    serde_json::from_slice(body).expect("a JSON answer")
}

#[tokio::test]
async fn documents_answer_get_only() {
    let cluster = ApiServer::new();
    let (code, ty, body) = send(&cluster, Method::GET, "/version", "").await;
    assert_eq!((code, ty.as_str()), (200, "application/json"));
    assert_eq!(json_of(&body)["major"], "1");
    let (code, _, body) = send(&cluster, Method::POST, "/api", "{}").await;
    assert_eq!(code, 405);
    assert_eq!(json_of(&body)["reason"], "MethodNotAllowed");
}

#[tokio::test]
async fn unserved_paths_are_a_plain_404_or_a_status_as_the_real_servers_are() {
    let cluster = ApiServer::new();
    let (code, ty, body) = send(&cluster, Method::GET, "/apis/nowhere.example/v1/things", "").await;
    assert_eq!((code, ty.as_str()), (404, "text/plain; charset=utf-8"));
    assert_eq!(&body[..], b"404 page not found\n");
    let (code, ty, body) = send(&cluster, Method::GET, "/api/v1/things", "").await;
    assert_eq!((code, ty.as_str()), (404, "application/json"));
    let status = json_of(&body);
    assert_eq!(
        (status["kind"].as_str(), status["code"].as_i64()),
        (Some("Status"), Some(404))
    );
}

#[tokio::test]
async fn verbs_a_path_does_not_serve_are_refused_and_counted() {
    let cluster = ApiServer::new();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let (code, _, _) = send(
        &cluster,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        &cm.to_string(),
    )
    .await;
    assert_eq!(code, 201);
    // The status subresource serves get, update and patch only.
    let (code, _, _) = send(
        &cluster,
        Method::DELETE,
        "/api/v1/namespaces/default/status",
        "",
    )
    .await;
    assert_eq!(code, 405);
    // A namespaced kind without a namespace: list and watch only.
    let (code, _, _) = send(&cluster, Method::GET, "/api/v1/configmaps/c", "").await;
    assert_eq!(code, 404);
    let (code, _, _) = send(
        &cluster,
        Method::POST,
        "/api/v1/configmaps",
        &cm.to_string(),
    )
    .await;
    assert_eq!(code, 405);
    // A method no verb has.
    let (code, _, _) = send(
        &cluster,
        Method::HEAD,
        "/api/v1/namespaces/default/configmaps/c",
        "",
    )
    .await;
    assert_eq!(code, 405);
    let (code, _, body) = send(&cluster, Method::GET, "/api/v1/configmaps", "").await;
    assert_eq!(code, 200);
    assert_eq!(json_of(&body)["items"][0]["metadata"]["name"], "c");
    let stats = cluster.stats();
    assert_eq!((stats.list, stats.total), (1, 6), "{stats:?}");
    // A body that is not JSON is a 400 naming the decoding.
    let (code, _, body) = send(
        &cluster,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        "{not json",
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        json_of(&body)["message"]
            .as_str()
            .unwrap()
            .contains("decoding"),
        "{body:?}"
    );
}
