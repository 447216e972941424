//! The admin server (feature `operator`): `/metrics`, `/healthz` and `/readyz` on one address,
//! `127.0.0.1:8080` by default ([`DEFAULT_ADMIN_ADDR`]; a Pod's probes need `0.0.0.0`, which is
//! then said explicitly, e.g. `--admin-addr 0.0.0.0:8080`). `/metrics` can be served on an address
//! of its own instead ([`RuntimeBuilder::metrics_addr`](crate::runtime::RuntimeBuilder::metrics_addr),
//! `--metrics-addr`), e.g. to keep probes reachable by the kubelet and metrics on loopback behind
//! a proxy.
//!
//! Whoever can reach the address is untrusted: a client has [`AdminLimits::header_read_timeout`]
//! to send its request's headers, a connection lives at most
//! [`AdminLimits::connection_lifetime`], at most [`AdminLimits::max_connections`] are open at
//! once, and at most [`AdminLimits::max_connections_per_peer`] from one address (one more is
//! closed at once), so slow or many clients cannot hold the server, and one peer crowding it
//! (a metrics scraper gone wrong, or anyone who reaches the port) leaves room for the kubelet's
//! probes.
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
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::Error;
use crate::health::{Health, Probe};

/// Where the admin server listens unless told otherwise.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:8080";

/// How long and how many clients the admin server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// How long a client has to send a request's headers (default 5 s).
    pub header_read_timeout: Duration,
    /// How long a connection stays open at most, kept alive or not (default 60 s; a scraper
    /// then opens a new one).
    pub connection_lifetime: Duration,
    /// How many connections are served at once (default 64); one more is closed at once.
    pub max_connections: usize,
    /// How many of them one peer address may hold (default 4); one more from it is closed at
    /// once.
    pub max_connections_per_peer: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            connection_lifetime: Duration::from_secs(60),
            max_connections: 64,
            max_connections_per_peer: 4,
        }
    }
}

/// What an admin server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoints {
    /// `/metrics`, `/healthz` and `/readyz`.
    All,
    /// `/healthz` and `/readyz` (metrics are served elsewhere).
    Probes,
    /// `/metrics` only.
    Metrics,
}

/// The running admin server; stops when dropped.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Bind `addr` and serve `registry` and `health` on it, with the default [`AdminLimits`].
    /// Port 0 picks a free port ([`AdminServer::local_addr`] says which).
    pub async fn bind(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: Arc<Health>,
    ) -> Result<Self, Error> {
        Self::bind_with(
            addr,
            registry,
            health,
            Endpoints::All,
            AdminLimits::default(),
        )
        .await
    }

    /// Bind `addr` and serve `endpoints` on it within `limits`.
    pub async fn bind_with(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: Arc<Health>,
        endpoints: Endpoints,
        limits: AdminLimits,
    ) -> Result<Self, Error> {
        let served = Served::Admin {
            registry,
            health,
            endpoints,
        };
        Self::serve(addr, served, limits).await
    }

    /// Bind `addr` and serve the runtime's introspection on it ([`crate::introspect`]):
    /// `/objects` and `/objects/<Kind>/[<namespace>/]<name>`, within `limits`. An address of
    /// its own, never the probes': it names objects, which a kubelet has no need of.
    pub async fn bind_introspection(
        addr: SocketAddr,
        introspection: Arc<crate::introspect::Introspection>,
        limits: AdminLimits,
    ) -> Result<Self, Error> {
        Self::serve(addr, Served::Objects(introspection), limits).await
    }

    async fn serve(addr: SocketAddr, served: Served, limits: AdminLimits) -> Result<Self, Error> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Admin { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Admin { addr, source })?;
        let paths = served.paths();
        tracing::info!(%addr, paths, "admin server listening");
        let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
        let peers = PeerSlots::new(limits.max_connections_per_peer.max(1));
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin server: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Some(peer_slot) = peers.take(peer.ip()) else {
                    tracing::debug!(peer = %peer.ip(), "admin server: too many connections from one peer; one closed");
                    drop(stream);
                    continue;
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::debug!("admin server: too many connections; one closed");
                    drop(stream);
                    continue;
                };
                let served = served.clone();
                tokio::spawn(async move {
                    let _slots = (slot, peer_slot);
                    let service = hyper::service::service_fn(move |req| {
                        let answer = answer(&req, &served);
                        async move { Ok::<_, Infallible>(answer) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .serve_connection(TokioIo::new(stream), service);
                    match tokio::time::timeout(limits.connection_lifetime, connection).await {
                        Ok(Err(e)) => tracing::debug!(error = %e, "admin server: connection ended"),
                        Ok(Ok(())) => {}
                        Err(_) => {
                            tracing::debug!("admin server: connection closed at its lifetime")
                        }
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

/// How many connections each peer address holds, capped.
#[derive(Clone)]
struct PeerSlots {
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    cap: usize,
}

/// One connection of a peer's; gives its slot back when dropped.
struct PeerSlot {
    peers: PeerSlots,
    ip: std::net::IpAddr,
}

impl PeerSlots {
    fn new(cap: usize) -> Self {
        Self {
            open: Default::default(),
            cap,
        }
    }

    fn take(&self, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one listener answers.
#[derive(Clone)]
enum Served {
    Admin {
        registry: Arc<Registry>,
        health: Arc<Health>,
        endpoints: Endpoints,
    },
    Objects(Arc<crate::introspect::Introspection>),
}

impl Served {
    fn paths(&self) -> &'static str {
        match self {
            Served::Admin { endpoints, .. } => match endpoints {
                Endpoints::All => "/metrics, /healthz, /readyz",
                Endpoints::Probes => "/healthz, /readyz",
                Endpoints::Metrics => "/metrics",
            },
            Served::Objects(_) => "/objects, /objects/<Kind>/[<namespace>/]<name>",
        }
    }
}

fn answer(req: &Request<Incoming>, served: &Served) -> Response<Full<Bytes>> {
    if req.method() != http::Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match served {
        Served::Admin {
            registry,
            health,
            endpoints,
        } => answer_admin(req, *endpoints, registry, health),
        Served::Objects(introspection) => answer_objects(req.uri().path(), introspection),
    }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

/// `/objects`: the kinds; `/objects/<Kind>/<namespace>/<name>` (or `/objects/<Kind>/<name>`):
/// one object's report, as JSON.
fn answer_objects(
    path: &str,
    introspection: &crate::introspect::Introspection,
) -> Response<Full<Bytes>> {
    let json = |body: Vec<u8>| {
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts")
    };
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (kind, namespace, name) = match parts.as_slice() {
        ["objects"] => {
            return json(serde_json::to_vec(&introspection.kinds()).unwrap_or_default());
        }
        ["objects", kind, name] => (*kind, None, *name),
        ["objects", kind, namespace, name] => (*kind, Some(*namespace), *name),
        _ => {
            return plain(
                StatusCode::NOT_FOUND,
                "not found: /objects, /objects/<Kind>/[<namespace>/]<name>\n".into(),
            );
        }
    };
    match introspection.object(kind, namespace, name) {
        Some(report) => json(serde_json::to_vec(&report).unwrap_or_default()),
        None => plain(
            StatusCode::NOT_FOUND,
            format!(
                "no {kind} {} here\n",
                namespace.map_or(name.to_string(), |ns| format!("{ns}/{name}"))
            ),
        ),
    }
}

fn answer_admin(
    req: &Request<Incoming>,
    endpoints: Endpoints,
    registry: &Registry,
    health: &Health,
) -> Response<Full<Bytes>> {
    let text = plain;
    let probe = |p: Probe| {
        let status = if p.ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        text(status, p.detail + "\n")
    };
    let (probes, metrics) = match endpoints {
        Endpoints::All => (true, true),
        Endpoints::Probes => (true, false),
        Endpoints::Metrics => (false, true),
    };
    match req.uri().path() {
        "/healthz" | "/livez" if probes => probe(health.live()),
        "/readyz" if probes => probe(health.ready()),
        "/metrics" if metrics => {
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
            match endpoints {
                Endpoints::All => "not found: /metrics, /healthz, /readyz\n",
                Endpoints::Probes => "not found: /healthz, /readyz\n",
                Endpoints::Metrics => "not found: /metrics\n",
            }
            .into(),
        ),
    }
}
