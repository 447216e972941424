//! The runtime's spans exported over OTLP (feature `otel`), to a collector in the test: one
//! span `reconcile` per reconcile, with the object's kind, namespace, name and generation, and the
//! reconcile's outcome, as attributes; over plain HTTP and over TLS.
#![cfg(all(feature = "otel", feature = "webhooks"))]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::telemetry::Otlp;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use rustls::pki_types::pem::PemObject;
use tracing_subscriber::layer::SubscriberExt;

/// How long the reconcile may take at most (real time: the exporter runs on a thread of its own;
/// a bound against a hang, not a speed goal).
const LIMIT: Duration = Duration::from_secs(120);

/// What the collector received: every span of every export request, with its service name.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(String, Span)>>>);

impl Received {
    /// The attributes of each span named `name`, as text.
    fn spans(&self, name: &str) -> Vec<std::collections::BTreeMap<String, String>> {
        let got = self.0.lock().unwrap();
        got.iter()
            .filter(|(_, s)| s.name == name)
            .map(|(_, s)| {
                s.attributes
                    .iter()
                    .map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                            Some(Value::StringValue(s)) => s,
                            Some(Value::IntValue(i)) => i.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), v)
                    })
                    .collect()
            })
            .collect()
    }

    fn services(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(s, _)| s.clone())
            .collect()
    }
}

/// An OTLP/HTTP collector on a thread of its own (the exporter's requests are blocking): reads
/// each request's body by its Content-Length, answers 200, and keeps what it decodes.
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let received = Received::default();
    let r = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            serve(stream, &r);
        }
    });
    (url, received)
}

/// The collector of [`collector`] behind TLS, its certificate for 127.0.0.1 signed by a CA of
/// its own: the URL, the CA's PEM, and what it received over TLS (a connection that fails its
/// handshake is dropped).
fn tls_collector() -> (String, String, Received) {
    let ca = actorcile::webhooks::GeneratedCa::new("otlp-test").unwrap();
    let pem = ca.issue(&["127.0.0.1"]).unwrap();
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pem.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/v1/traces", listener.local_addr().unwrap());
    let received = Received::default();
    let r = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            // A thread per connection: a pooled connection kept open does not hold back another
            // client's handshake.
            let (config, r) = (config.clone(), r.clone());
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                serve(rustls::StreamOwned::new(conn, stream), &r);
            });
        }
    });
    (url, ca.ca_pem(), received)
}

/// One connection's requests, until it closes or sends something that is not one.
fn serve(stream: impl Read + Write, r: &Received) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = None;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse::<usize>().ok();
            }
        }
        let Some(length) = length else { break };
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            break;
        }
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP request");
        for rs in request.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    r.0.lock().unwrap().push((service.clone(), span));
                }
            }
        }
        let stream = reader.get_mut();
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .and_then(|()| stream.flush())
            .is_err()
        {
            break;
        }
    }
}

/// Each reconcile is one exported span `reconcile`, its attributes naming the object and the outcome.
/// The subscriber is this test's thread's only (a current-thread runtime: every task of the
/// runtime runs on it), so no other test's spans are exported.
#[tokio::test(flavor = "current_thread")]
async fn each_reconcile_is_one_exported_span_naming_the_object_and_its_outcome() {
    let (url, received) = collector();
    let otlp = Otlp::new(&url, "otel-test").expect("an http endpoint");
    let subscriber = tracing_subscriber::registry().with(otlp.layer());
    let _guard = tracing::subscriber::set_default(subscriber);
    let (_cluster, client) = cluster();
    let rt = start_widgets(
        &client,
        test_policy(),
        step("ok", |_cx: Context<Widget>| async { Outcome::Done }),
    )
    .await;
    create(&client, "traced", 1).await;
    wait_ready(&client, "traced", LIMIT).await;
    rt.shutdown().await;
    tokio::task::spawn_blocking(move || otlp.shutdown())
        .await
        .unwrap()
        .expect("the spans exported");
    let runs = received.spans("reconcile");
    assert_eq!(runs.len(), 1, "one reconcile, one span: {runs:?}");
    let run = &runs[0];
    assert_eq!(
        run.get("kind").map(String::as_str),
        Some("Widget"),
        "{run:?}"
    );
    assert_eq!(
        run.get("namespace").map(String::as_str),
        Some("default"),
        "{run:?}"
    );
    assert_eq!(
        run.get("name").map(String::as_str),
        Some("traced"),
        "{run:?}"
    );
    assert_eq!(
        run.get("generation").map(String::as_str),
        Some("1"),
        "{run:?}"
    );
    assert_eq!(
        run.get("outcome").map(String::as_str),
        Some("done"),
        "{run:?}"
    );
    assert!(received.services().iter().all(|s| s == "otel-test"));
}

/// Over TLS: the spans reach a collector whose certificate the given CA signed, and an exporter
/// that does not trust that CA (the system's roots) exports nothing to it.
#[tokio::test(flavor = "current_thread")]
async fn spans_are_exported_over_tls_to_a_collector_the_given_ca_signed() {
    let (url, ca, received) = tls_collector();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    let otlp = Otlp::with_ca_file(&url, "otel-tls-test", &ca_file).expect("an https endpoint");
    let subscriber = tracing_subscriber::registry().with(otlp.layer());
    let guard = tracing::subscriber::set_default(subscriber);
    let (_cluster, client) = cluster();
    let rt = start_widgets(
        &client,
        test_policy(),
        step("ok", |_cx: Context<Widget>| async { Outcome::Done }),
    )
    .await;
    create(&client, "traced-tls", 1).await;
    wait_ready(&client, "traced-tls", LIMIT).await;
    rt.shutdown().await;
    tokio::task::spawn_blocking(move || otlp.shutdown())
        .await
        .unwrap()
        .expect("the spans exported over TLS");
    drop(guard);
    // An exporter trusting the system's roots, not the collector's CA: its export fails the
    // handshake, and nothing of it reaches the collector.
    let untrusting = Otlp::new(&url, "untrusting").expect("an https endpoint");
    {
        let subscriber = tracing_subscriber::registry().with(untrusting.layer());
        let _guard = tracing::subscriber::set_default(subscriber);
        tracing::info_span!("untrusted").in_scope(|| tracing::info!("not to arrive"));
    }
    let _ = tokio::task::spawn_blocking(move || untrusting.shutdown())
        .await
        .unwrap();
    assert!(received.spans("untrusted").is_empty());
    let runs = received.spans("reconcile");
    assert_eq!(runs.len(), 1, "one reconcile, one span: {runs:?}");
    assert_eq!(
        runs[0].get("name").map(String::as_str),
        Some("traced-tls"),
        "{runs:?}"
    );
    assert!(received.services().iter().all(|s| s == "otel-tls-test"));
}

/// An endpoint that is neither an http nor an https URL is refused, naming it, and so is a CA
/// file for plain http or one without a certificate.
#[test]
fn an_endpoint_that_is_not_an_http_url_is_refused() {
    for bad in [
        "collector:4318",
        "file:///etc/passwd",
        "",
        "ftp://collector/v1/traces",
    ] {
        let err = Otlp::new(bad, "x").unwrap_err().to_string();
        assert!(err.contains("OTLP endpoint"), "{bad}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.crt");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let err = Otlp::with_ca_file("http://collector:4318/v1/traces", "x", &empty)
        .unwrap_err()
        .to_string();
    assert!(err.contains("use https"), "{err}");
    let err = Otlp::with_ca_file("https://collector:4318/v1/traces", "x", &empty)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("OTLP CA file") && err.contains("no certificate"),
        "{err}"
    );
    let err = Otlp::with_ca_file(
        "https://collector:4318/v1/traces",
        "x",
        &dir.path().join("missing.crt"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("missing.crt"), "{err}");
}
