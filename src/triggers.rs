//! What re-runs objects besides their own changes: a controller's provider config, the Secrets
//! its objects reference, the children they own and the objects related to them, a poll
//! interval, and the ignore annotation that stops it all.
//!
//! | trigger | set with | re-runs |
//! |---|---|---|
//! | provider config | [`Controller::config`](crate::runtime::Controller::config) | every object of the controller, when the config changes, appears or goes, or a Secret it names does ([`ConfigRef::secrets_from`]) |
//! | Secrets | [`Controller::secrets`](crate::runtime::Controller::secrets) | only the objects that reference the Secret that changed |
//! | owned children | [`Controller::owns`](crate::runtime::Controller::owns) | the owners (by owner reference) of a child that changed or went, unless the runtime's own write made the change |
//! | related objects | [`Controller::watches`](crate::runtime::Controller::watches) | the objects a function of the related object names |
//! | poll | the policy's `poll_interval` (with `poll_jitter`), or [`ConfigRef::poll_interval_from`] | each Ready object, that long after its last done reconcile |
//! | [`ignore_annotation`](crate::names::OperatorNames::ignore_annotation) (`<domain>/ignore: "true"`) | on an object | nothing: the object's reconciles are skipped while it is set |
//!
//! A config change fans out through the same queue as every other wake-up: each object's reconcile
//! waits for a reconcile slot (the policy's `max_concurrent_reconciles`), and passive objects get a live
//! actor only when a slot is free. So 10 000 objects re-run at the pace the slots allow, with
//! at most `max_concurrent_reconciles` reconciles in flight and no burst of actors or API requests — not
//! all at once as `kube_runtime::Controller::reconcile_all_on` enqueues them.
//!
//! ```no_run
//! use std::time::Duration;
//! use actorcile::prelude::*;
//! use actorcile::triggers::ConfigRef;
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kube::runtime::reflector::ObjectRef;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "Site", namespaced, status = "ResourceStatus")]
//! # struct SiteSpec { tls_secret: String }
//! # fn tree() -> impl Provisioner<Site> { step("s", |_cx: Context<Site>| async { Outcome::Done }) }
//!
//! let controller = Controller::<Site>::new(tree())
//!     // every Site re-runs when this ConfigMap changes; steps read it with cx.config::<ConfigMap>()
//!     .config(ConfigRef::<ConfigMap>::namespaced("operators", "site-provider").poll_interval_from(
//!         |cm: &ConfigMap| {
//!             let secs = cm.data.as_ref()?.get("pollSeconds")?.parse().ok()?;
//!             Some(Duration::from_secs(secs))
//!         },
//!     ))
//!     // a Site re-runs when the Secret it names changes
//!     .secrets(|site: &Site| {
//!         let ns = site.metadata.namespace.as_deref().unwrap_or("default");
//!         vec![ObjectRef::<Secret>::new(&site.spec.tls_secret).within(ns)]
//!     });
//! ```

pub use crate::messages::{Cause, Trigger};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;

/// Reads a poll interval out of a config object.
pub(crate) type PollFrom<C> = Arc<dyn Fn(&C) -> Option<Duration> + Send + Sync>;

/// Reads the Secrets a config object names ([`ConfigRef::secrets_from`]).
pub(crate) type SecretsFrom<C> = Arc<dyn Fn(&C) -> Vec<ObjectRef<Secret>> + Send + Sync>;

/// The one object a controller reads its provider config from (see
/// [`Controller::config`](crate::runtime::Controller::config)).
pub struct ConfigRef<C> {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) poll_from: Option<PollFrom<C>>,
    pub(crate) secrets_from: Option<SecretsFrom<C>>,
    /// The cluster it is read from, when not the one the objects live in.
    pub(crate) client: Option<kube::Client>,
}

impl<C> ConfigRef<C> {
    /// The cluster-scoped object `name`.
    pub fn cluster(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: None,
            poll_from: None,
            secrets_from: None,
            client: None,
        }
    }

    /// The object `name` in `namespace`.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: Some(namespace.into()),
            poll_from: None,
            secrets_from: None,
            client: None,
        }
    }

    /// Take the poll interval from the config (`None` from `f`: the policy's). The policy's
    /// `poll_jitter` applies to it. The config is input: an interval under 1 s is taken as 1 s
    /// and one over a year as a year, with a warning naming the config (once per value).
    pub fn poll_interval_from(
        mut self,
        f: impl Fn(&C) -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        self.poll_from = Some(Arc::new(f));
        self
    }

    /// Re-run every object when a Secret the config names changes, appears or goes (as when
    /// the config itself changes): `f` says which Secrets the config names, e.g. the
    /// credentials of the provider it configures. The Secrets are watched as metadata only
    /// (their data is never held), in the config's namespace (every namespace for a
    /// cluster-scoped config), so the operator needs `list` and `watch` on Secrets there
    /// ([`RuntimeBuilder::roles`](crate::runtime::RuntimeBuilder::roles) grants them).
    ///
    /// ```
    /// use actorcile::triggers::ConfigRef;
    /// use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// use kube::runtime::reflector::ObjectRef;
    /// let config = ConfigRef::<ConfigMap>::namespaced("operators", "site-provider").secrets_from(
    ///     |cm: &ConfigMap| {
    ///         let name = cm.data.as_ref().and_then(|d| d.get("credentials"));
    ///         name.map(|n| vec![ObjectRef::<Secret>::new(n).within("operators")])
    ///             .unwrap_or_default()
    ///     },
    /// );
    /// # let _ = config;
    /// ```
    ///
    /// The config is input: if `f` panics on a version of it, an error log says so and that
    /// version names no Secret.
    pub fn secrets_from(
        mut self,
        f: impl Fn(&C) -> Vec<ObjectRef<Secret>> + Send + Sync + 'static,
    ) -> Self
    where
        C: kube::Resource<DynamicType = ()>,
    {
        self.secrets_from = Some(Arc::new(move |config: &C| {
            on_untrusted(
                config,
                "the provider config's Secrets function",
                "it names no Secret",
                || f(config),
                Vec::new,
            )
        }));
        self
    }

    /// Read the config (and the Secrets of [`ConfigRef::secrets_from`]) from another cluster
    /// than the one the objects live in, through `client`: a platform cluster that holds the
    /// provider configs of the clusters the operator works on. Its changes re-run the objects
    /// as usual, and a config kind that cluster does not serve fails start-up as usual.
    ///
    /// The roles [`RuntimeBuilder::roles`](crate::runtime::RuntimeBuilder::roles) renders
    /// are for the objects' cluster and leave the config out; in the config's cluster the
    /// operator needs `list` and `watch` on the config object (by `resourceNames`), and on
    /// Secrets in its namespace with `secrets_from`.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use actorcile::triggers::ConfigRef;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// let platform = kube::Client::try_from(
    ///     kube::Config::from_custom_kubeconfig(
    ///         kube::config::Kubeconfig::read_from("/etc/operator/platform.kubeconfig")?,
    ///         &Default::default(),
    ///     )
    ///     .await?,
    /// )?;
    /// let config = ConfigRef::<ConfigMap>::namespaced("onboarding", "provider").in_cluster(platform);
    /// # let _ = config;
    /// # Ok(())
    /// # }
    /// ```
    pub fn in_cluster(mut self, client: kube::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// `namespace/name`, or `name`.
    pub(crate) fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

use crate::hash::FastMap;

/// Which Secrets an object references ([`Controller::secrets`](crate::runtime::Controller::secrets)).
pub(crate) type SecretRefs<K> = Box<dyn Fn(&K) -> Vec<ObjectRef<Secret>> + Send + Sync>;

/// Whether a Secret of an object's namespace, by its metadata, re-runs the object
/// ([`Controller::secrets_where`](crate::runtime::Controller::secrets_where)).
pub(crate) type SecretMatch<K> = Box<dyn Fn(&K, &kube::api::ObjectMeta) -> bool + Send + Sync>;

/// How a controller's objects re-run on Secrets: each names the ones it references, or a
/// predicate chooses among the Secrets of its namespace.
pub(crate) enum SecretsBy<K> {
    /// [`Controller::secrets`](crate::runtime::Controller::secrets).
    Refs(SecretRefs<K>),
    /// [`Controller::secrets_where`](crate::runtime::Controller::secrets_where).
    Matching(SecretMatch<K>),
}

/// Which objects reference which Secrets: kept current from the watch of the objects, read
/// when a Secret changes.
pub(crate) struct SecretIndex<K: kube::Resource<DynamicType = ()>> {
    by_secret: FastMap<ObjectRef<Secret>, HashSet<ObjectRef<K>, ahash::RandomState>>,
    by_object: FastMap<ObjectRef<K>, Vec<ObjectRef<Secret>>>,
}

impl<K: kube::Resource<DynamicType = ()>> Default for SecretIndex<K> {
    fn default() -> Self {
        Self {
            by_secret: FastMap::default(),
            by_object: FastMap::default(),
        }
    }
}

impl<K: kube::Resource<DynamicType = ()>> SecretIndex<K> {
    /// `object` references exactly `secrets` now.
    pub(crate) fn set(&mut self, object: &ObjectRef<K>, mut secrets: Vec<ObjectRef<Secret>>) {
        for s in &mut secrets {
            s.extra = Default::default();
        }
        secrets.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        secrets.dedup();
        if self.by_object.get(object) == Some(&secrets) {
            return;
        }
        self.remove(object);
        if secrets.is_empty() {
            return;
        }
        for s in &secrets {
            self.by_secret
                .entry(s.clone())
                .or_default()
                .insert(object.clone());
        }
        self.by_object.insert(object.clone(), secrets);
    }

    /// `object` is gone.
    pub(crate) fn remove(&mut self, object: &ObjectRef<K>) {
        for s in self.by_object.remove(object).unwrap_or_default() {
            if let Some(objects) = self.by_secret.get_mut(&s) {
                objects.remove(object);
                if objects.is_empty() {
                    self.by_secret.remove(&s);
                }
            }
        }
    }

    /// Forget every object `keep` says no to.
    pub(crate) fn retain(&mut self, keep: impl Fn(&ObjectRef<K>) -> bool) {
        let gone: Vec<_> = self
            .by_object
            .keys()
            .filter(|k| !keep(k))
            .cloned()
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The objects that reference `secret`.
    pub(crate) fn referrers(&self, secret: &ObjectRef<Secret>) -> Vec<ObjectRef<K>> {
        self.by_secret
            .get(secret)
            .map(|o| o.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// `call`'s answer for `obj`, an object anyone who can write its kind wrote: if `call`
/// (`what`, the controller's own function) panics on it, an error log names the object and
/// says `instead`, and `fallback` answers, so one hostile object cannot end a watch.
pub(crate) fn on_untrusted<R: kube::Resource<DynamicType = ()>, T>(
    obj: &R,
    what: &str,
    instead: &str,
    call: impl FnOnce() -> T,
    fallback: impl FnOnce() -> T,
) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|_| {
        let meta = obj.meta();
        tracing::error!(
            kind = %R::kind(&()),
            namespace = meta.namespace.as_deref().unwrap_or(""),
            name = meta.name.as_deref().unwrap_or(""),
            "{what} panicked on this object; {instead}"
        );
        fallback()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn secret(name: &str) -> ObjectRef<Secret> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn the_index_follows_what_each_object_references_now() {
        let mut index = SecretIndex::<ConfigMap>::default();
        let a = ObjectRef::<ConfigMap>::new("a").within("ns");
        let b = ObjectRef::<ConfigMap>::new("b").within("ns");
        index.set(&a, vec![secret("s1"), secret("s2"), secret("s1")]);
        index.set(&b, vec![secret("s2")]);
        assert_eq!(index.referrers(&secret("s1")), vec![a.clone()]);
        assert_eq!(index.referrers(&secret("s2")).len(), 2);
        // a moves from s1 to s3; b goes
        index.set(&a, vec![secret("s3")]);
        index.remove(&b);
        assert!(index.referrers(&secret("s1")).is_empty());
        assert!(index.referrers(&secret("s2")).is_empty());
        assert_eq!(index.referrers(&secret("s3")), vec![a]);
        assert!(index.by_secret.len() == 1 && index.by_object.len() == 1);
    }
}
