//! The webhook server: one HTTPS listener (rustls, HTTP/1.1) that answers the API server's
//! reviews with [`Webhooks::answer`].
//!
//! Whoever reaches the port is untrusted: a TLS handshake has
//! [`WebhookLimits::handshake_timeout`], a request's headers
//! [`WebhookLimits::header_read_timeout`] and its body [`WebhookLimits::body_timeout`], a body
//! larger than [`WebhookLimits::max_body`] is refused (413) unread, and at most
//! [`WebhookLimits::max_connections`] are served at once (one more is closed at once), so a slow
//! or malicious client cannot hold the listener.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::Webhooks;
use super::tls::{self, Certificates, ServingCert, TlsError};

/// How long and how many clients the webhook server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WebhookLimits {
    /// How long a TLS handshake may take (default 10 s).
    pub handshake_timeout: Duration,
    /// How long a client has to send a request's headers (default 10 s).
    pub header_read_timeout: Duration,
    /// How long a client has to send a request's body (default 30 s).
    pub body_timeout: Duration,
    /// The largest body read (default 16 MiB: a review carries the object and, on an update,
    /// the old one, each up to the API server's 3 MiB request limit, in a JSON that may be
    /// larger than the object's own encoding).
    pub max_body: usize,
    /// How many connections are served at once (default 256).
    pub max_connections: usize,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_body: 16 << 20,
            max_connections: 256,
        }
    }
}

/// The webhook server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate cannot be read or used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Writing the CA bundle into the webhook configurations or CRDs failed.
    #[error("cannot write the CA bundle: {0}")]
    CaBundle(#[source] kube::Error),
    /// Installing the webhooks for a local server ([`Webhooks::local`]) failed, or the API
    /// server did not call them in time.
    #[error("local webhooks: {0}")]
    Install(String),
}

/// The running webhook server; stops when dropped.
#[derive(Debug)]
pub struct WebhookServer {
    addr: SocketAddr,
    serving: ServingCert,
    reviews: Arc<Reviews>,
    tasks: Vec<JoinHandle<()>>,
}

/// How many reviews each path has answered.
#[derive(Debug)]
struct Reviews(Vec<(String, AtomicU64)>);

impl Reviews {
    fn of(webhooks: &Webhooks) -> Self {
        Reviews(
            webhooks
                .paths()
                .into_iter()
                .map(|p| (p, AtomicU64::new(0)))
                .collect(),
        )
    }

    fn count(&self, path: &str) {
        if let Some((_, n)) = self.0.iter().find(|(p, _)| p == path) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get(&self, path: &str) -> u64 {
        self.0
            .iter()
            .find(|(p, _)| p == path)
            .map_or(0, |(_, n)| n.load(Ordering::Relaxed))
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl WebhookServer {
    /// Binds `addr` (port 0 picks a free one) and serves `webhooks` with the certificate from
    /// `certificates`, within `limits`. With a `client`, the CA bundle (when `certificates`
    /// has one) is written into the webhook configurations and the converted CRDs before this
    /// returns, and written again whenever the CA read from the files changes.
    pub async fn bind(
        addr: SocketAddr,
        webhooks: Webhooks,
        certificates: Certificates,
        limits: WebhookLimits,
        client: Option<kube::Client>,
    ) -> Result<Self, WebhookError> {
        let (pem, ca) = tls::load(&certificates)?;
        let serving = ServingCert::new(&pem)?;
        let mut config = rustls::ServerConfig::builder_with_provider(tls::provider()?)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(serving.clone()));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| WebhookError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| WebhookError::Bind { addr, source })?;
        let reviews = Arc::new(Reviews::of(&webhooks));
        let webhooks = Arc::new(webhooks);
        if let (Some(client), Some(ca)) = (&client, &ca) {
            let done = webhooks
                .inject_ca(client, ca)
                .await
                .map_err(WebhookError::CaBundle)?;
            tracing::info!(?done, "webhook CA bundle written");
        }
        tracing::info!(%addr, paths = ?webhooks.paths(), "webhook server listening");
        let mut tasks = vec![tokio::spawn(accept_loop(
            listener,
            acceptor,
            webhooks.clone(),
            limits,
            reviews.clone(),
        ))];
        if let Certificates::Files { files, reload } = certificates {
            tasks.push(tokio::spawn(reload_loop(
                files,
                reload,
                serving.clone(),
                pem,
                ca,
                webhooks,
                client,
            )));
        }
        Ok(WebhookServer {
            addr,
            serving,
            reviews,
            tasks,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The certificate it serves (to replace it by hand, where it is not read from files).
    pub fn serving_cert(&self) -> &ServingCert {
        &self.serving
    }

    /// How many reviews posted to `path` it has answered so far (0 for a path not served).
    pub fn reviews(&self, path: &str) -> u64 {
        self.reviews.get(path)
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    webhooks: Arc<Webhooks>,
    limits: WebhookLimits,
    reviews: Arc<Reviews>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "webhook server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "webhook server: too many connections; one closed");
            continue;
        };
        let (acceptor, webhooks, reviews) = (acceptor.clone(), webhooks.clone(), reviews.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let stream =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await
                {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "webhook server: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "webhook server: TLS handshake timed out");
                        return;
                    }
                };
            let service = hyper::service::service_fn(move |req| {
                let (webhooks, reviews) = (webhooks.clone(), reviews.clone());
                async move { Ok::<_, Infallible>(handle(req, &webhooks, limits, &reviews).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "webhook server: connection ended");
            }
        });
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(format!("{body}\n"))))
        .expect("static response parts")
}

async fn handle(
    req: Request<Incoming>,
    webhooks: &Webhooks,
    limits: WebhookLimits,
    reviews: &Reviews,
) -> Response<Full<Bytes>> {
    if req.method() != http::Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    let path = req.uri().path().to_owned();
    if !webhooks.serves(&path) {
        return text(StatusCode::NOT_FOUND, "not a webhook path");
    }
    let started = Instant::now();
    let body = Limited::new(req.into_body(), limits.max_body);
    let body = match tokio::time::timeout(limits.body_timeout, body.collect()).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the review is larger than the server reads",
            );
        }
        Ok(Err(e)) => {
            return text(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            );
        }
        Err(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive in time",
            );
        }
    };
    let Some(answer) = webhooks.answer(&path, &body).await else {
        return text(StatusCode::NOT_FOUND, "not a webhook path");
    };
    reviews.count(&path);
    tracing::debug!(path, elapsed = ?started.elapsed(), "webhook answered");
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&answer).unwrap_or_default(),
        )))
        .expect("static response parts")
}

/// Reads the certificate files every `every`: a changed certificate is served from the next
/// handshake, a changed CA written into the configurations. A read that fails (a file being
/// replaced, a key that does not match yet) keeps what is served and is tried again.
async fn reload_loop(
    files: tls::CertFiles,
    every: Duration,
    serving: ServingCert,
    mut pem: tls::CertPem,
    mut ca: Option<String>,
    webhooks: Arc<Webhooks>,
    client: Option<kube::Client>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    // The CA is written until a write succeeds.
    let mut ca_written = client.is_none() || ca.is_some();
    loop {
        ticks.tick().await;
        match files.read() {
            Ok(now) if now.cert != pem.cert || now.key != pem.key => match serving.set(&now) {
                Ok(()) => {
                    tracing::info!(cert = %files.cert.display(), "webhook certificate reloaded");
                    pem = now;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhook certificate changed but cannot be used yet")
                }
            },
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the webhook certificate"),
        }
        match files.read_ca() {
            Ok(now) if now.is_some() && now != ca => {
                ca = now;
                ca_written = false;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the webhook CA"),
        }
        if let (false, Some(client), Some(bundle)) = (ca_written, &client, &ca) {
            match webhooks.inject_ca(client, bundle).await {
                Ok(done) => {
                    tracing::info!(?done, "webhook CA bundle written");
                    ca_written = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the webhook CA bundle; trying again")
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
