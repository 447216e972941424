//! The admin server (feature `operator`): `/metrics`, `/healthz` and `/readyz` on one address,
//! `127.0.0.1:8080` by default ([`DEFAULT_ADMIN_ADDR`]; a Pod's probes need `0.0.0.0`, which is
//! then said explicitly, e.g. `--admin-addr 0.0.0.0:8080`).
//!
//! - `/healthz`: 200 while the runtime's supervisors are alive (the root and every
//!   controller's manager), 503 once one stopped or escalated.
//! - `/readyz`: 200 once every controller's first list is in its cache (until then 503, with
//!   the kinds still listing), 503 again while the runtime shuts down.
//! - `/metrics`: the [`Registry`] in the OpenMetrics text format.
//!
//! The runtime starts it with [`RuntimeBuilder::admin`](crate::runtime::RuntimeBuilder::admin),
//! before any controller: an address that cannot be bound fails start-up.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::Error;
use crate::health::{Health, Probe};

/// Where the admin server listens unless told otherwise.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:8080";

/// The running admin server; stops when dropped.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Bind `addr` and serve `registry` and `health` on it. Port 0 picks a free port
    /// ([`AdminServer::local_addr`] says which).
    pub async fn bind(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: Arc<Health>,
    ) -> Result<Self, Error> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Admin { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Admin { addr, source })?;
        tracing::info!(%addr, "admin server listening (/metrics, /healthz, /readyz)");
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin server: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (registry, health) = (registry.clone(), health.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let answer = answer(&req, &registry, &health);
                        async move { Ok::<_, Infallible>(answer) }
                    });
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!(error = %e, "admin server: connection ended");
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(req: &Request<Incoming>, registry: &Registry, health: &Health) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts")
    };
    let probe = |p: Probe| {
        let status = if p.ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        text(status, p.detail + "\n")
    };
    if req.method() != http::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/healthz" | "/livez" => probe(health.live()),
        "/readyz" => probe(health.ready()),
        "/metrics" => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => Response::builder()
                    .status(StatusCode::OK)
                    .header(
                        http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                    .body(Full::new(Bytes::from(body)))
                    .expect("static response parts"),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}
