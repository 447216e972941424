//! Requested cluster access ([`AccessRequest`]): the operator holds no kubeconfig of its own for
//! the cluster; it asks the platform for access by writing a request object, waits until the
//! request's status names a Secret with a kubeconfig, and deletes the request once its
//! children there are deprovisioned (openmcp's `AccessRequest`, or any request kind of the
//! same shape).

use super::*;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};

/// What a request's status says of the access asked for (read by [`AccessRequest`]'s grant
/// reader; [`openmcp_grant`] by default).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Grant {
    /// Not granted yet: the reason, for the object's status.
    Pending(String),
    /// Granted: the kubeconfig is in this Secret (its namespace, `None` for the request's own).
    Granted {
        /// The Secret's namespace (`None`: the request's).
        namespace: Option<String>,
        /// The Secret's name.
        name: String,
    },
    /// Refused by the platform: why. Retrying does not help until someone acts.
    Denied(String),
}

/// openmcp's `AccessRequest` status: `phase: Granted` with `secretRef: {name, namespace}`;
/// `phase: Denied` (or `Failed`) refuses with the status's `message` (or its `reason`);
/// anything else is pending.
///
/// ```
/// use actorcile::provisioners::{Grant, openmcp_grant};
/// let request: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "clusters.openmcp.cloud/v1alpha1", "kind": "AccessRequest",
///     "metadata": { "name": "tenant-a", "namespace": "platform" },
///     "status": { "phase": "Granted", "secretRef": { "name": "tenant-a-kubeconfig" } }
/// })).unwrap();
/// assert_eq!(
///     openmcp_grant(&request),
///     Grant::Granted { namespace: None, name: "tenant-a-kubeconfig".into() }
/// );
/// ```
pub fn openmcp_grant(request: &DynamicObject) -> Grant {
    let status = request.data.get("status");
    let field = |f: &str| status.and_then(|s| s.get(f)).and_then(|v| v.as_str());
    match field("phase") {
        Some("Granted") => {
            let secret = status.and_then(|s| s.get("secretRef"));
            let text = |f: &str| secret.and_then(|s| s.get(f)).and_then(|v| v.as_str());
            match text("name") {
                Some(name) if !name.is_empty() => Grant::Granted {
                    namespace: text("namespace").map(str::to_string),
                    name: name.to_string(),
                },
                _ => Grant::Pending("granted, but no Secret named yet".into()),
            }
        }
        Some(phase @ ("Denied" | "Failed")) => Grant::Denied(
            field("message")
                .or(field("reason"))
                .map(str::to_string)
                .unwrap_or_else(|| format!("phase {phase}")),
        ),
        Some(phase) => Grant::Pending(format!("phase {phase}")),
        None => Grant::Pending("no status yet".into()),
    }
}

type GrantReader = Arc<dyn Fn(&DynamicObject) -> Grant + Send + Sync>;
type SecretRules = Arc<dyn Fn(KubeconfigSecret) -> KubeconfigSecret + Send + Sync>;

/// A cluster reached through access the platform grants on request: a [`RemoteCluster`] for
/// [`remote`] whose access is a request object of a kind the author names, in the cluster the
/// remote is declared in.
///
/// - **Provision**: the request is applied (server-side apply, the operator's field manager,
///   its `spec` built by the author from the object) and its status read by the grant reader
///   ([`openmcp_grant`] unless [`granted_when`](Self::granted_when) says otherwise). Until it
///   is granted the remote yields (`RemoteClusterUnavailable`, naming the request); a denied
///   request is `UserActionRequired` (`RemoteAccessDenied`). Granted, the kubeconfig is read
///   from the Secret the status names, key `kubeconfig`, with every rule of
///   [`KubeconfigSecret`] (inline credentials only, refused servers, bounded requests);
///   [`kubeconfig`](Self::kubeconfig) changes the key or the rules.
/// - **Deprovision**: the remote's children are deprovisioned through the granted access,
///   then the request is deleted, and the remote waits until it is gone. A request that is
///   gone, pending or denied at that point gives no access, and nothing can have been made
///   through it since: the children's deprovision is skipped and the request deleted.
///
/// The request is asked for per object when its name is made from the object (openmcp's
/// `WorkloadCluster(true)`: every object gets a workload cluster of its own):
///
/// ```no_run
/// use actorcile::prelude::*;
/// use actorcile::provisioners::{AccessRequest, remote};
/// use kube::ResourceExt;
/// use kube::api::{ApiResource, GroupVersionKind};
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "Tenant", namespaced)]
/// # struct TenantSpec {}
///
/// fn tree(names: OperatorNames) -> impl Provisioner<Tenant> {
///     let requests = ApiResource::from_gvk(&GroupVersionKind::gvk(
///         "clusters.openmcp.cloud", "v1alpha1", "AccessRequest",
///     ));
///     remote(
///         "workload-cluster",
///         move |t: &Tenant| {
///             AccessRequest::new(&names, &requests, "platform", format!("{}-workload", t.name_any()))
///                 .spec(serde_json::json!({ "purpose": "workload", "tenant": t.name_any() }))
///         },
///         vec![/* the tree run in the granted cluster */],
///     )
/// }
/// ```
#[derive(Clone)]
pub struct AccessRequest {
    resource: ApiResource,
    namespace: String,
    name: String,
    spec: serde_json::Value,
    field_manager: String,
    grant: GrantReader,
    secret: SecretRules,
}

impl std::fmt::Debug for AccessRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessRequest")
            .field("kind", &self.resource.kind)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl AccessRequest {
    /// The request `namespace`/`name` of kind `resource`, written with the field manager of
    /// `names`, with an empty spec (see [`spec`](Self::spec)).
    pub fn new(
        names: &crate::names::OperatorNames,
        resource: &ApiResource,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            resource: resource.clone(),
            namespace: namespace.into(),
            name: name.into(),
            spec: serde_json::json!({}),
            field_manager: names.field_manager().to_string(),
            grant: Arc::new(openmcp_grant),
            secret: Arc::new(|s| s.key("kubeconfig")),
        }
    }

    /// The request's `spec` (what access to which cluster; built from the object).
    pub fn spec(mut self, spec: serde_json::Value) -> Self {
        self.spec = spec;
        self
    }

    /// Read the request's status with `grant` instead of [`openmcp_grant`].
    pub fn granted_when(
        mut self,
        grant: impl Fn(&DynamicObject) -> Grant + Send + Sync + 'static,
    ) -> Self {
        self.grant = Arc::new(grant);
        self
    }

    /// How the granted Secret is read: `rules` gets [`KubeconfigSecret::new`] of the Secret
    /// the status names and returns it with its key, context and rules (the default sets key
    /// `kubeconfig`).
    pub fn kubeconfig(
        mut self,
        rules: impl Fn(KubeconfigSecret) -> KubeconfigSecret + Send + Sync + 'static,
    ) -> Self {
        self.secret = Arc::new(rules);
        self
    }

    fn api(&self, scope: &Client) -> Api<DynamicObject> {
        Api::namespaced_with(scope.clone(), &self.namespace, &self.resource)
    }

    fn describe(&self) -> String {
        format!("{} {}/{}", self.resource.kind, self.namespace, self.name)
    }

    fn unavailable(&self, why: &str, source: Option<kube::Error>) -> RemoteClusterError {
        RemoteClusterError::Unavailable {
            what: format!("access request {} {why}", self.describe()),
            source,
        }
    }

    /// The request as the server has it (`None`: there is none).
    async fn get(&self, scope: &Client) -> Result<Option<DynamicObject>, RemoteClusterError> {
        self.api(scope)
            .get_opt(&self.name)
            .await
            .map_err(|e| self.unavailable("cannot be read", Some(e)))
    }

    /// Write the request (when it is missing or its spec differs), and return it.
    async fn apply(&self, scope: &Client) -> Result<DynamicObject, RemoteClusterError> {
        if let Some(current) = self.get(scope).await?
            && current.data.get("spec") == Some(&self.spec)
        {
            return Ok(current);
        }
        let request = serde_json::json!({
            "apiVersion": self.resource.api_version,
            "kind": self.resource.kind,
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": self.spec,
        });
        let params = PatchParams::apply(&self.field_manager).force();
        self.api(scope)
            .patch(&self.name, &params, &Patch::Apply(request))
            .await
            .map_err(|e| self.unavailable("cannot be written", Some(e)))
    }

    /// The access `request` grants, or why it grants none.
    async fn granted(
        &self,
        scope: &Client,
        request: &DynamicObject,
    ) -> Result<RemoteAccess, RemoteClusterError> {
        if request.metadata.deletion_timestamp.is_some() {
            return Err(self.unavailable("is being deleted", None));
        }
        match (self.grant)(request) {
            Grant::Pending(why) => {
                Err(self.unavailable(&format!("is not granted yet: {why}"), None))
            }
            Grant::Denied(why) => Err(RemoteClusterError::Denied {
                what: format!("access request {} was denied: {why}", self.describe()),
            }),
            Grant::Granted { namespace, name } => {
                let ns = namespace.unwrap_or_else(|| self.namespace.clone());
                (self.secret)(KubeconfigSecret::new(ns, name))
                    .access(scope)
                    .await
            }
        }
    }
}

#[async_trait]
impl RemoteCluster for AccessRequest {
    /// `<kind>/<namespace>/<name>` of the request, the kind in lowercase.
    fn id(&self) -> String {
        format!(
            "{}/{}/{}",
            self.resource.kind.to_ascii_lowercase(),
            self.namespace,
            self.name
        )
    }

    async fn access(&self, scope: &Client) -> Result<RemoteAccess, RemoteClusterError> {
        let request = self.apply(scope).await?;
        self.granted(scope, &request).await
    }

    async fn access_to_deprovision(
        &self,
        scope: &Client,
    ) -> Result<Option<RemoteAccess>, RemoteClusterError> {
        let Some(request) = self.get(scope).await? else {
            return Ok(None);
        };
        match (self.grant)(&request) {
            Grant::Granted { .. } => {}
            Grant::Pending(_) | Grant::Denied(_) => return Ok(None),
        }
        match self.granted(scope, &request).await {
            Ok(access) => Ok(Some(access)),
            // Deleted meanwhile: nothing is reachable through it any more.
            Err(_) if request.metadata.deletion_timestamp.is_some() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn release(&self, scope: &Client) -> Result<bool, RemoteClusterError> {
        match self.get(scope).await? {
            None => return Ok(true),
            Some(r) if r.metadata.deletion_timestamp.is_some() => return Ok(false),
            Some(_) => {}
        }
        match self
            .api(scope)
            .delete(&self.name, &DeleteParams::default())
            .await
        {
            // Gone at once, or still there (finalizers of the platform's): read to know.
            Ok(_) => Ok(self.get(scope).await?.is_none()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
            Err(e) => Err(self.unavailable("cannot be deleted", Some(e))),
        }
    }
}
