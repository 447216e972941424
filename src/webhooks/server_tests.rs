//! The server against clients that misbehave: garbage reviews, bodies over the cap, clients
//! that never finish their handshake, more connections than the cap.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};

use super::*;
use crate::webhooks::{Denial, Request as Info, Validator, Warnings};

#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "server.example.com",
    version = "v1",
    kind = "Thing",
    namespaced
)]
struct ThingSpec {
    size: u32,
}

struct SmallThings;
impl Validator<Thing> for SmallThings {
    async fn validate(&self, new: &Thing, _: Option<&Thing>, _: &Info) -> Result<Warnings, Denial> {
        if new.spec.size > 10 {
            return Err(Denial::invalid("spec.size: at most 10"));
        }
        Ok(Warnings::new())
    }
}

const PATH: &str = "/validate-server-example-com-v1-thing";

struct Running {
    server: WebhookServer,
    connector: TlsConnector,
}

async fn start(limits: WebhookLimits) -> Running {
    let certificates = Certificates::generated("server-test", &["127.0.0.1"]).unwrap();
    let Certificates::Generated { ca, .. } = &certificates else {
        unreachable!("generated certificates")
    };
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(tls::provider().unwrap())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let webhooks = Webhooks::new("server-test").validate::<Thing>(SmallThings);
    let server = WebhookServer::bind(
        ([127, 0, 0, 1], 0).into(),
        webhooks,
        certificates,
        limits,
        None,
    )
    .await
    .unwrap();
    Running {
        server,
        connector: TlsConnector::from(Arc::new(config)),
    }
}

impl Running {
    /// One request on a new connection: the status code and the body.
    async fn post(&self, path: &str, body: &[u8]) -> (u16, String) {
        let tcp = TcpStream::connect(self.server.local_addr()).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = self.connector.connect(name, tcp).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        // A body over the cap is refused before it is read: the write may fail then.
        let _ = tls.write_all(body).await;
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let code = answer
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }
}

fn review(size: u32) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "server.example.com", "version": "v1", "kind": "Thing"},
            "resource": {"group": "server.example.com", "version": "v1", "resource": "things"},
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "name": "t",
            "namespace": "default",
            "object": {
                "apiVersion": "server.example.com/v1",
                "kind": "Thing",
                "metadata": {"name": "t", "namespace": "default"},
                "spec": {"size": size},
            },
            "dryRun": false,
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_review_is_answered_and_a_malformed_one_gets_a_clear_denial() {
    let running = start(WebhookLimits::default()).await;
    let (code, body) = running.post(PATH, &review(3)).await;
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["allowed"], true);

    let (code, body) = running.post(PATH, &review(11)).await;
    assert_eq!(code, 200);
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 422);
    assert_eq!(
        answer["response"]["status"]["message"],
        "spec.size: at most 10"
    );

    let (code, body) = running.post(PATH, b"{\"not\": a review").await;
    assert_eq!(code, 200);
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("does not decode"), "{message}");

    assert_eq!(running.post("/elsewhere", &review(3)).await.0, 404);
}

#[tokio::test]
async fn a_body_over_the_cap_is_refused_and_the_next_request_served() {
    let limits = WebhookLimits {
        max_body: 4 << 10,
        ..WebhookLimits::default()
    };
    let running = start(limits).await;
    let mut huge = review(3);
    huge.extend(std::iter::repeat_n(b' ', 64 << 10));
    let (code, body) = running.post(PATH, &huge).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(running.post(PATH, &review(3)).await.0, 200);
}

#[tokio::test]
async fn clients_that_never_handshake_do_not_hold_the_listener() {
    let limits = WebhookLimits {
        handshake_timeout: Duration::from_millis(200),
        max_connections: 2,
        ..WebhookLimits::default()
    };
    let running = start(limits).await;
    // Two connections that send nothing take both slots; the server closes each when its
    // handshake time is up, which the client sees as the end of the stream.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(
            TcpStream::connect(running.server.local_addr())
                .await
                .unwrap(),
        );
    }
    for mut stream in idle {
        let mut buf = [0u8; 1];
        let read = stream.read(&mut buf).await;
        assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
    }
    // The slots are free again: a well-behaved client is served.
    assert_eq!(running.post(PATH, &review(3)).await.0, 200);
}

#[tokio::test]
async fn a_connection_over_the_cap_is_closed_unserved() {
    let limits = WebhookLimits {
        max_connections: 1,
        ..WebhookLimits::default()
    };
    let running = start(limits).await;
    // One connection that stays silent holds the only slot (for the 10 s handshake time).
    let _holder = TcpStream::connect(running.server.local_addr())
        .await
        .unwrap();
    // Let the server accept it first: the holder's slot is taken once a second connection is
    // refused, which is what this waits for.
    let mut refused = false;
    for _ in 0..3 {
        let mut extra = TcpStream::connect(running.server.local_addr())
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        // The server closes an extra connection without a byte; a served one would wait for
        // our handshake, so a read that does not end in time means "not refused yet".
        match tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                refused = true;
                break;
            }
            _ => {}
        }
    }
    assert!(refused, "a connection over the cap is closed");
}
