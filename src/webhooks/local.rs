//! An operator's webhooks served on loopback to a real API server, for tests: what
//! controller-runtime's envtest does with `WebhookInstallOptions`, and a barrier it lacks.
//!
//! [`Webhooks::local`] makes a CA and a serving certificate for `127.0.0.1` in a directory
//! (the server reads them from there, so a test can rotate them), starts the server on a free
//! loopback port, installs the CRDs with their `conversion` stanza and the webhook
//! configurations pointing at that port, writes the CA bundle into them as the server does
//! when it starts, and waits until the CRDs are
//! `Established` and the API server calls every admission webhook. The API server reads webhook
//! configurations from an informer: until it has seen them, a write passes the webhooks by.
//! Each [`LocalInstall::sample`] is created with `dryRun` (never stored) until every admission
//! path of its kind has answered a review.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;

use super::{
    CertFiles, Certificates, Endpoint, GeneratedCa, WebhookError, WebhookLimits, WebhookServer,
    Webhooks,
};

/// The field manager the installed objects are applied with.
const MANAGER: &str = "actorcile-local-webhooks";

/// What [`Webhooks::local`] installs, and how long it waits; see the [module](self).
#[derive(Debug)]
pub struct LocalInstall {
    webhooks: Webhooks,
    crds: Vec<CustomResourceDefinition>,
    cert_dir: Option<PathBuf>,
    samples: Vec<(ApiResource, serde_json::Value)>,
    timeout: Duration,
    reload: Duration,
}

/// The webhooks served on loopback (see [`Webhooks::local`]); the server stops, and a
/// certificate directory made for it is removed, when this is dropped.
#[derive(Debug)]
pub struct LocalWebhooks {
    server: WebhookServer,
    ca: GeneratedCa,
    cert_dir: PathBuf,
    endpoint: Endpoint,
    crds: Vec<CustomResourceDefinition>,
    _temp: Option<tempfile::TempDir>,
}

impl Webhooks {
    /// These webhooks, to serve on loopback to a real API server for a test; see the
    /// [module](super::local).
    ///
    /// ```no_run
    /// # async fn run(client: kube::Client, webhooks: actorcile::webhooks::Webhooks,
    /// #     crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    /// #     sample: k8s_openapi::api::core::v1::ConfigMap) -> Result<(), actorcile::webhooks::WebhookError> {
    /// let local = webhooks
    ///     .local()
    ///     .crds(vec![crd])
    ///     .sample(&sample) // a valid object of a kind the webhooks admit
    ///     .install(&client)
    ///     .await?;
    /// // Every write from here on goes through the webhooks.
    /// # drop(local);
    /// # Ok(())
    /// # }
    /// ```
    pub fn local(self) -> LocalInstall {
        LocalInstall {
            webhooks: self,
            crds: Vec::new(),
            cert_dir: None,
            samples: Vec::new(),
            timeout: Duration::from_secs(60),
            reload: Duration::from_millis(100),
        }
    }
}

impl LocalInstall {
    /// The CRDs to install (server-side applied), with the `conversion` stanza added to those
    /// of a kind with a conversion.
    pub fn crds(mut self, crds: Vec<CustomResourceDefinition>) -> Self {
        self.crds = crds;
        self
    }

    /// Where the certificate files are written (`tls.crt`, `tls.key`, `ca.crt`) and read
    /// from, every `reload`, as from a mounted Secret; default a temporary directory, removed
    /// with the [`LocalWebhooks`].
    pub fn cert_dir(mut self, dir: impl Into<PathBuf>, reload: Duration) -> Self {
        self.cert_dir = Some(dir.into());
        self.reload = reload;
        self
    }

    /// A valid object of a kind the webhooks admit, created with `dryRun` until the API
    /// server calls each admission webhook of its kind (its namespace, else `default`).
    pub fn sample<K>(mut self, object: &K) -> Self
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let value = serde_json::to_value(object).unwrap_or_default();
        self.samples.push((ApiResource::erase::<K>(&()), value));
        self
    }

    /// How long the CRDs and the webhooks may take to be served (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts the server, installs what the API server needs to call it, and waits until it
    /// does; see the [module](self).
    pub async fn install(self, client: &Client) -> Result<LocalWebhooks, WebhookError> {
        let (cert_dir, temp) = match self.cert_dir {
            Some(dir) => (dir, None),
            None => {
                let temp =
                    tempfile::tempdir().map_err(|e| local_error("a temporary directory", e))?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        let ca = GeneratedCa::new(&self.webhooks.operator)?;
        let pem = ca.issue(&["127.0.0.1", "localhost"])?;
        std::fs::create_dir_all(&cert_dir)
            .map_err(|e| local_error("the certificate directory", e))?;
        for (file, contents) in [
            ("tls.crt", pem.cert.as_str()),
            ("tls.key", pem.key.as_str()),
            ("ca.crt", &ca.ca_pem()),
        ] {
            write_atomically(&cert_dir.join(file), contents)?;
        }
        let server = WebhookServer::bind(
            ([127, 0, 0, 1], 0).into(),
            self.webhooks.clone(),
            Certificates::Files {
                files: CertFiles::in_dir(&cert_dir),
                reload: self.reload,
            },
            WebhookLimits::default(),
            Some(client.clone()),
        )
        .await?;
        let endpoint = Endpoint::Url(format!("https://{}", server.local_addr()));
        let bundle = ca.ca_pem();
        let webhooks = &self.webhooks;
        // Installed without the CA bundle, as a chart installs them, then written by the
        // runtime, as the server does at start.
        let crds = webhooks
            .crds(self.crds, &endpoint, None)
            .map_err(|e| WebhookError::Install(e.to_string()))?;
        let params = PatchParams::apply(MANAGER).force();
        let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crd_api
                .patch(&name, &params, &Patch::Apply(crd))
                .await
                .map_err(|e| install_error(&name, e))?;
        }
        if let Some(config) = webhooks.validating_configuration(&endpoint, None) {
            let name = webhooks.validating_name();
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .patch(&name, &params, &Patch::Apply(&config))
                .await
                .map_err(|e| install_error(&name, e))?;
        }
        if let Some(config) = webhooks.mutating_configuration(&endpoint, None) {
            let name = webhooks.mutating_name();
            Api::<MutatingWebhookConfiguration>::all(client.clone())
                .patch(&name, &params, &Patch::Apply(&config))
                .await
                .map_err(|e| install_error(&name, e))?;
        }
        webhooks
            .inject_ca(client, &bundle)
            .await
            .map_err(WebhookError::CaBundle)?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            until(
                deadline,
                &format!("the CRD {name} to be Established"),
                || async {
                    crd_api
                        .get_opt(&name)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|c| {
                            c.status
                                .and_then(|s| s.conditions)
                                .unwrap_or_default()
                                .iter()
                                .any(|c| c.type_ == "Established" && c.status == "True")
                        })
                },
            )
            .await?;
        }
        for (resource, object) in &self.samples {
            let paths = webhooks.admission_paths(&resource.group, &resource.kind);
            let ns = object
                .pointer("/metadata/namespace")
                .and_then(|n| n.as_str())
                .unwrap_or("default");
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
            let sample: DynamicObject = serde_json::from_value(object.clone())
                .map_err(|e| WebhookError::Install(format!("a sample is not an object: {e}")))?;
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let what = format!("the API server to call the webhooks of {}", resource.kind);
            until(deadline, &what, || async {
                let before: Vec<u64> = paths.iter().map(|p| server.reviews(p)).collect();
                // Allowed or denied, the answer does not matter: that it was asked does.
                let _ = api.create(&dry_run, &sample).await;
                paths
                    .iter()
                    .zip(before)
                    .all(|(p, before)| server.reviews(p) > before)
            })
            .await?;
        }
        Ok(LocalWebhooks {
            server,
            ca,
            cert_dir,
            endpoint,
            crds,
            _temp: temp,
        })
    }
}

impl LocalWebhooks {
    /// The running server.
    pub fn server(&self) -> &WebhookServer {
        &self.server
    }

    /// The CA that signed the serving certificate, to issue another one.
    pub fn ca(&self) -> &GeneratedCa {
        &self.ca
    }

    /// The directory the server reads its certificate from: write new files there (each
    /// replaced whole, by a rename) to rotate it.
    pub fn cert_dir(&self) -> &Path {
        &self.cert_dir
    }

    /// Where the API server reaches the webhooks.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The CRDs as installed (with their `conversion` stanza).
    pub fn crds(&self) -> &[CustomResourceDefinition] {
        &self.crds
    }
}

impl Webhooks {
    /// The admission paths of `group`'s `kind`, in every version.
    fn admission_paths(&self, group: &str, kind: &str) -> Vec<String> {
        self.admission
            .iter()
            .filter(|w| w.kind.group == group && w.kind.kind == kind)
            .map(|w| w.path())
            .collect()
    }
}

/// Writes `contents` to `path` whole: a reader sees the old file or the new one.
fn write_atomically(path: &Path, contents: &str) -> Result<(), WebhookError> {
    let next = path.with_extension("next");
    std::fs::write(&next, contents)
        .and_then(|()| std::fs::rename(&next, path))
        .map_err(|e| local_error(&path.display().to_string(), e))
}

fn local_error(what: &str, e: std::io::Error) -> WebhookError {
    WebhookError::Install(format!("cannot write {what}: {e}"))
}

fn install_error(name: &str, e: kube::Error) -> WebhookError {
    WebhookError::Install(format!("cannot install {name}: {e}"))
}

/// Polls `check` every 50 ms until it holds, or fails at `deadline` naming `what`.
async fn until<F, Fut>(
    deadline: tokio::time::Instant,
    what: &str,
    mut check: F,
) -> Result<(), WebhookError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if check().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(WebhookError::Install(format!(
                "timed out waiting for {what}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
