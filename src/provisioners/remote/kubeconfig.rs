//! The two [`RemoteCluster`]s: a kubeconfig read from a Secret ([`KubeconfigSecret`], with its
//! refusals and bounds), and a fixed client ([`FixedCluster`]).

use super::*;

/// A kubeconfig held in a Secret: key `value` of `<cluster>-kubeconfig` by the Cluster API
/// convention ([`KubeconfigSecret::cluster_api`]), or any Secret and key.
///
/// A Secret that does not exist (yet) or cannot be read is
/// [`RemoteClusterError::Unavailable`]; a missing key or a kubeconfig that does not parse is
/// [`RemoteClusterError::Invalid`]. A rotated Secret takes effect at the next reconcile.
///
/// Whoever can write the Secret chooses the cluster and credentials the operator uses, so the
/// kubeconfig may hold inline credentials only: an `exec` plugin, an `auth-provider`, a
/// `tokenFile` or a certificate or key file path is [`RemoteClusterError::Invalid`] naming the
/// field (as Flux refuses them), unless [`KubeconfigSecret::allow_local_credentials`] opts in.
/// And the Secret must be in the reconciled object's own namespace (for a namespaced object),
/// unless [`KubeconfigSecret::from_any_namespace`] says otherwise.
///
/// The Secret also chooses the server the operator connects to. A server at a link-local
/// address (`169.254.0.0/16`, `fe80::/10`: the cloud metadata services live there) or a cloud
/// metadata name (`metadata.google.internal`, `metadata`) is refused by default; authors add
/// their own rule with [`KubeconfigSecret::refuse_servers`] (their networks, a list of allowed
/// hosts). Only the address as written is checked: a name that resolves to such an address is
/// the authors' rule to refuse. Every request to the remote is bounded: 10 s to connect, 30 s
/// to read or write, and an error answer's body is read to 64 KiB at most.
#[derive(Clone)]
pub struct KubeconfigSecret {
    namespace: String,
    name: String,
    key: String,
    context: Option<String>,
    allow_local_credentials: bool,
    any_namespace: bool,
    refuse: Option<ServerRule>,
}

/// An author's rule on the servers kubeconfigs may name: `Some(why)` refuses.
type ServerRule = Arc<dyn Fn(&http::Uri) -> Option<String> + Send + Sync>;

/// How long a connection to a remote's server may take.
pub(super) const REMOTE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a remote's server may take to answer a request, or to take one.
pub(super) const REMOTE_IO_TIMEOUT: Duration = Duration::from_secs(30);

impl std::fmt::Debug for KubeconfigSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("key", &self.key)
            .field("context", &self.context)
            .field("allow_local_credentials", &self.allow_local_credentials)
            .field("any_namespace", &self.any_namespace)
            .field("refuse_servers", &self.refuse.is_some())
            .finish()
    }
}

/// Why the server `uri` is refused by default, if it is: a link-local address, or a cloud
/// metadata service's name.
pub(crate) fn default_server_refusal(uri: &http::Uri) -> Option<String> {
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if [
        "metadata.google.internal",
        "metadata",
        "metadata.azure.internal",
    ]
    .contains(&host.as_str())
    {
        return Some(format!("{host} is a cloud metadata service"));
    }
    let link_local = match host.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(v4) => v4.is_link_local(),
        std::net::IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local())
                || v6 == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
        }
    };
    link_local.then(|| format!("{host} is a link-local or metadata address"))
}

impl KubeconfigSecret {
    /// Key `value` of Secret `namespace`/`name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            key: "value".into(),
            context: None,
            allow_local_credentials: false,
            any_namespace: false,
            refuse: None,
        }
    }

    /// Refuse kubeconfigs whose server `rule` refuses (it returns why), besides the default
    /// refusals (link-local and metadata addresses). The rule sees the server as written.
    ///
    /// ```
    /// use actorcile::provisioners::KubeconfigSecret;
    /// let secret = KubeconfigSecret::new("tenant-a", "edge-kubeconfig").refuse_servers(|uri| {
    ///     (!uri.host().is_some_and(|h| h.ends_with(".clusters.example.com")))
    ///         .then(|| "only servers under clusters.example.com".to_string())
    /// });
    /// # let _ = secret;
    /// ```
    pub fn refuse_servers(
        mut self,
        rule: impl Fn(&http::Uri) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.refuse = Some(Arc::new(rule));
        self
    }

    /// The Cluster API convention: key `value` of Secret `<cluster>-kubeconfig` in `namespace`.
    pub fn cluster_api(namespace: impl Into<String>, cluster: &str) -> Self {
        Self::new(namespace, format!("{cluster}-kubeconfig"))
    }

    /// Read the kubeconfig from `key` instead of `value`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// Use this context of the kubeconfig instead of its current one.
    pub fn context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    /// Accept what a kubeconfig from a Secret otherwise may not hold: `exec` credential plugins
    /// and `auth-provider`s (commands the operator's pod would run), and file paths
    /// (`tokenFile`, `client-certificate`, `client-key`, `certificate-authority`: files of the
    /// operator's pod, its own service-account token among them, sent to a `server` the
    /// Secret names). Only for Secrets that nobody less trusted than the operator can write.
    pub fn allow_local_credentials(mut self) -> Self {
        self.allow_local_credentials = true;
        self
    }

    /// Allow the Secret to be in another namespace than the reconciled object's (by default a
    /// namespaced object's remote must take its kubeconfig from the object's own namespace; see
    /// [`RemoteCluster::credentials_namespace`]). For a Secret name the operator author
    /// chooses, not one read from the object.
    pub fn from_any_namespace(mut self) -> Self {
        self.any_namespace = true;
        self
    }

    fn describe(&self) -> String {
        format!(
            "kubeconfig Secret {}/{} (key {})",
            self.namespace, self.name, self.key
        )
    }
}

#[async_trait]
impl RemoteCluster for KubeconfigSecret {
    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn credentials_namespace(&self) -> Option<&str> {
        (!self.any_namespace).then_some(self.namespace.as_str())
    }

    async fn access(&self, scope: &Client) -> Result<RemoteAccess, RemoteClusterError> {
        let secrets: Api<Secret> = Api::namespaced(scope.clone(), &self.namespace);
        let secret = match secrets.get_opt(&self.name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(RemoteClusterError::Unavailable {
                    what: format!("{} does not exist", self.describe()),
                    source: None,
                });
            }
            Err(e) => {
                return Err(RemoteClusterError::Unavailable {
                    what: format!("{} cannot be read", self.describe()),
                    source: Some(e),
                });
            }
        };
        let invalid = |why: &str| RemoteClusterError::Invalid {
            what: format!("{} {why}", self.describe()),
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&self.key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&self.key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| invalid("has no such key"))?;
        self.config_from(&bytes).await
    }
}

impl KubeconfigSecret {
    /// The configuration the Secret's value `bytes` gives, refused unless every credential in
    /// it is inline (unless [`allow_local_credentials`](Self::allow_local_credentials)).
    pub(crate) async fn config_from(
        &self,
        bytes: &[u8],
    ) -> Result<RemoteAccess, RemoteClusterError> {
        let invalid = |why: &str| RemoteClusterError::Invalid {
            what: format!("{} {why}", self.describe()),
        };
        let text = std::str::from_utf8(bytes).map_err(|_| invalid("is not UTF-8 text"))?;
        let kubeconfig =
            Kubeconfig::from_yaml(text).map_err(|_| invalid("does not hold a valid kubeconfig"))?;
        if !self.allow_local_credentials
            && let Some(field) = local_credential(&kubeconfig)
        {
            return Err(invalid(&format!(
                "sets {field}: commands and local files are refused in kubeconfigs read from \
                 Secrets (only inline credentials: token, client-certificate-data, \
                 client-key-data, certificate-authority-data)"
            )));
        }
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|_| invalid("does not hold a usable kubeconfig"))?;
        let refusal = default_server_refusal(&config.cluster_url).or_else(|| {
            self.refuse
                .as_ref()
                .and_then(|rule| rule(&config.cluster_url))
        });
        if let Some(why) = refusal {
            return Err(invalid(&format!("names a server that is refused: {why}")));
        }
        config.connect_timeout = Some(REMOTE_CONNECT_TIMEOUT);
        config.read_timeout = Some(REMOTE_IO_TIMEOUT);
        config.write_timeout = Some(REMOTE_IO_TIMEOUT);
        let version = crate::hash::fnv1a(text);
        Ok(RemoteAccess::config(config, version))
    }
}

/// The first field of `kc` that would make the operator run a command or read a local file,
/// as `users[<name>].exec` or `clusters[<name>].certificate-authority`; `None` when every
/// credential is inline. Every entry is checked, not only the current context's.
fn local_credential(kc: &Kubeconfig) -> Option<String> {
    for user in &kc.auth_infos {
        let Some(a) = &user.auth_info else { continue };
        if let Some(field) = local_auth_field(a) {
            return Some(format!("users[{}].{field}", user.name));
        }
    }
    for cluster in &kc.clusters {
        let Some(c) = &cluster.cluster else { continue };
        if c.certificate_authority.is_some() {
            return Some(format!("clusters[{}].certificate-authority", cluster.name));
        }
    }
    None
}

/// The first field of `a` that is not an inline credential: a command to run (`exec`,
/// `auth-provider`) or a local file to read (`tokenFile`, `client-certificate`, `client-key`).
pub(crate) fn local_auth_field(a: &kube::config::AuthInfo) -> Option<&'static str> {
    [
        ("exec", a.exec.is_some()),
        ("auth-provider", a.auth_provider.is_some()),
        ("tokenFile", a.token_file.is_some()),
        ("client-certificate", a.client_certificate.is_some()),
        ("client-key", a.client_key.is_some()),
    ]
    .into_iter()
    .find_map(|(field, set)| set.then_some(field))
}

/// A cluster reached through a fixed configuration or client (tests, in-process clusters,
/// clusters whose credentials the operator holds itself).
#[derive(Clone, Debug)]
pub struct FixedCluster {
    id: String,
    access: RemoteAccess,
}

impl FixedCluster {
    /// The cluster `id`, reached with `config`.
    pub fn config(id: impl Into<String>, config: kube::Config) -> Self {
        Self {
            id: id.into(),
            access: RemoteAccess::config(config, 0),
        }
    }

    /// The cluster `id`, reached with `client`.
    pub fn client(id: impl Into<String>, client: Client) -> Self {
        Self {
            id: id.into(),
            access: RemoteAccess::client(client),
        }
    }

    /// Registered with a CD driver as `config` (see [`RemoteAccess::registered_as`]).
    pub fn registered_as(mut self, config: kube::Config) -> Self {
        self.access = self.access.registered_as(config);
        self
    }
}

#[async_trait]
impl RemoteCluster for FixedCluster {
    fn id(&self) -> String {
        self.id.clone()
    }

    async fn access(&self, _scope: &Client) -> Result<RemoteAccess, RemoteClusterError> {
        Ok(self.access.clone())
    }
}
