//! One managed kind as a [`Controller`](crate::runtime::Controller) collects it, before it
//! starts: its provisioner tree and options, and the parts (watches of related kinds, start-up
//! hooks, a provider config) with their types erased. `kind_start.rs` starts it.

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use kube::runtime::watcher;
use tokio::task::JoinHandle;

use crate::ManagedResource;
use crate::actors::Shared;
use crate::actors::mailbox::Mailbox;
use crate::actors::watches::{ConfigView, StartConfigWatch};
use crate::messages::ManagerMsg;
use crate::provisioners::BoxProvisioner;
use crate::triggers::SecretsBy;

/// One managed kind as the runtime starts it: its provisioner tree and options, as
/// [`Controller`](crate::runtime::Controller)'s builder methods set them.
pub(crate) struct KindSpec<K: ManagedResource> {
    pub(crate) tree: BoxProvisioner<K>,
    pub(crate) policy: Option<crate::policy::KindPolicy>,
    pub(crate) watcher: watcher::Config,
    /// The namespaces it watches, sorted, without repeats (empty: the runtime's, else all).
    pub(crate) namespaces: Vec<String>,
    pub(crate) finalizer: bool,
    pub(crate) status: bool,
    pub(crate) config: Option<ConfigSpec>,
    pub(crate) secrets: Option<SecretsBy<K>>,
    pub(crate) upgrade: Option<Hook>,
    pub(crate) initialize: Option<Hook>,
    pub(crate) shard_key: Option<crate::sharding::ShardKey<K>>,
    pub(crate) related: Vec<RelatedSpec<K>>,
    pub(crate) max_concurrent_reconciles: Option<usize>,
    /// Whether a provision reconcile is cancelled when its object moves on
    /// ([`Controller::cancel_on_change`](crate::runtime::Controller::cancel_on_change)).
    pub(crate) cancel_on_change: bool,
    /// Who each object's tenant is ([`Controller::tenant`](crate::runtime::Controller::tenant)).
    pub(crate) tenants: crate::scheduling::fair::Tenants<K>,
    /// Whether the cached copies drop what the API server keeps for itself
    /// ([`Controller::prune_cache`](crate::runtime::Controller::prune_cache)).
    pub(crate) prune_cache: bool,
    /// Whether passive objects' cached copies are held encoded
    /// ([`Controller::encode_passive`](crate::runtime::Controller::encode_passive)).
    pub(crate) encode_passive: bool,
}

/// Starts a watch of a related kind in one namespace (`None`: in all): the client, the
/// namespace, the kind's state, the record of the runtime's own child writes, the manager.
pub(crate) type StartRelated<K> = Arc<
    dyn Fn(
            Client,
            Option<String>,
            Arc<Shared<K>>,
            Option<Arc<crate::provisioners::context::OwnWrites>>,
            Mailbox<ManagerMsg<K>>,
        ) -> JoinHandle<()>
        + Send
        + Sync,
>;

/// A watch of children or related objects, its kind erased ([`Controller::owns`],
/// [`Controller::watches`]).
pub(crate) struct RelatedSpec<K: ManagedResource> {
    /// Children the runtime writes (the echoes of its writes run nothing).
    pub(crate) owned: bool,
    /// Whether the related kind is cluster-scoped: one watch, whatever the namespaces.
    pub(crate) cluster_scoped: bool,
    pub(crate) rule: k8s_openapi::api::rbac::v1::PolicyRule,
    /// The related kind's name (for logs and probes).
    pub(crate) kind: String,
    pub(crate) start: StartRelated<K>,
}

/// A controller's start-up hook ([`Controller::on_upgrade`], [`Controller::on_initialize`]).
pub(crate) type Hook =
    Box<dyn FnOnce(Client) -> futures::future::BoxFuture<'static, Result<(), HookError>> + Send>;

pub(crate) fn boxed_hook<F, Fut>(hook: F) -> Hook
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), HookError>> + Send + 'static,
{
    Box::new(move |c| Box::pin(hook(c)))
}

/// What a hook fails with: any error; its message fails the runtime's start-up.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Builds a config's view and what starts its watch ([`Controller::config`]).
pub(crate) type StartConfig =
    Box<dyn FnOnce(&Client) -> (Arc<dyn ConfigView>, StartConfigWatch) + Send>;

/// A controller's provider config, its type erased ([`Controller::config`]).
pub(crate) struct ConfigSpec {
    /// `kind namespace/name`, for errors.
    pub(crate) described: String,
    /// What is wrong with it, found when it was given.
    pub(crate) invalid: Option<String>,
    pub(crate) rules: Vec<crate::rbac::ScopedRule>,
    /// Lists the config's kind once: an API server that does not serve it is a start-up error.
    pub(crate) probe: Box<
        dyn FnOnce(Client) -> futures::future::BoxFuture<'static, Result<(), kube::Error>> + Send,
    >,
    pub(crate) start: StartConfig,
}

impl<K: ManagedResource> KindSpec<K> {
    /// Every object of kind `K`, run by `tree`, with the defaults of
    /// [`Controller::new`](crate::runtime::Controller::new).
    pub(crate) fn new(tree: BoxProvisioner<K>) -> Self {
        Self {
            tree,
            policy: None,
            watcher: watcher::Config::default().streaming_lists(),
            namespaces: Vec::new(),
            finalizer: true,
            status: true,
            config: None,
            secrets: None,
            upgrade: None,
            initialize: None,
            shard_key: None,
            related: Vec::new(),
            max_concurrent_reconciles: None,
            cancel_on_change: true,
            tenants: Default::default(),
            prune_cache: true,
            encode_passive: true,
        }
    }

    /// The namespaces this controller's objects are watched in, one watch each: its own,
    /// else the runtime's `default`; `[None]` for every namespace, and always for a
    /// cluster-scoped kind.
    pub(crate) fn objects_namespaces(&self, default: Option<&str>) -> Vec<Option<String>> {
        if crate::object_api::is_cluster_scoped::<K>() {
            return vec![None];
        }
        if self.namespaces.is_empty() {
            return vec![default.map(str::to_string)];
        }
        self.namespaces.iter().cloned().map(Some).collect()
    }
}
