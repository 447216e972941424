//! The Kubernetes name rules the runtime checks before it writes a name: DNS subdomains and
//! qualified names (finalizers, condition types). The API server enforces the same rules; the
//! runtime checks first so a bad name is a typed error at start-up, not a failed write later.
//! Also the operator's own names ([`OperatorNames`]), the source of every name the runtime
//! writes into a cluster, and the name this replica goes by, the base of the ids a runtime
//! gives itself.

/// Whether `s` is a DNS subdomain (RFC 1123): at most 253 characters, lowercase alphanumeric
/// labels of at most 63 characters joined by `.`, each label starting and ending alphanumeric
/// (`-` inside).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

pub(crate) fn is_dns_label(l: &str) -> bool {
    let b = l.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a qualified name with a prefix, `prefix/name`, as the API server requires of
/// a finalizer that is not one of Kubernetes' own: the prefix a DNS subdomain, the name at most
/// 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
///
/// ```
/// use actorcile::names::is_prefixed_qualified_name;
/// assert!(is_prefixed_qualified_name("example.com/cleanup"));
/// assert!(!is_prefixed_qualified_name("cleanup"));
/// assert!(!is_prefixed_qualified_name("Example.com/cleanup"));
/// assert!(!is_prefixed_qualified_name("example.com/clean up"));
/// ```
pub fn is_prefixed_qualified_name(s: &str) -> bool {
    let Some((prefix, name)) = s.split_once('/') else {
        return false;
    };
    let b = name.as_bytes();
    is_dns_subdomain(prefix)
        && !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// The finalizer earlier releases put on every object when the operator named none. An
/// operator upgraded from them passes it to
/// [`RuntimeBuilder::migrate_finalizer`](crate::runtime::RuntimeBuilder::migrate_finalizer),
/// or names [`LEGACY_DOMAIN`] its [`former_domain`](OperatorNames::former_domain), which
/// migrates the finalizer too.
pub const LEGACY_FINALIZER: &str = "actorcile.dev/finalizer";

/// The domain of the annotations and labels earlier releases wrote whatever the operator's
/// names: an operator upgraded from them names it its
/// [`former_domain`](OperatorNames::former_domain).
pub const LEGACY_DOMAIN: &str = "actorcile.dev";

/// The field manager of writes made outside a runtime: a provisioner context built by a unit
/// test, a reference index without a runtime.
pub(crate) const STANDALONE_FIELD_MANAGER: &str = "actorcile";

/// The operator's own names: its name (`bucket-operator`) and its domain
/// (`buckets.example.com`). Every name the runtime writes into a cluster on the operator's
/// behalf is made from them, as kube-runtime and controller-runtime operators name their own:
///
/// | written | made from | e.g. |
/// |---|---|---|
/// | the finalizer on every managed object ([`finalizer`](Self::finalizer)) | the domain | `buckets.example.com/finalizer` |
/// | the field manager of every write ([`field_manager`](Self::field_manager)) | the name | `bucket-operator` |
/// | the leader election's Lease ([`leader_lease`](Self::leader_lease), with the flags) | the name | `bucket-operator-leader` |
/// | the sharding Leases' prefix ([`shard_lease_prefix`](Self::shard_lease_prefix), with the flags) | the name | `bucket-operator-shards` |
/// | a reference on its target ([`reference_prefix`](Self::reference_prefix)); on a target of a kind the runtime does not manage also a finalizer of that name | the domain | `ref.buckets.example.com/<hash>` |
/// | the references a referrer holds on kinds the runtime does not manage ([`held_references_annotation`](Self::held_references_annotation)) | the domain | `buckets.example.com/held-references` |
/// | the owner of a child no owner reference can name ([`owner_annotation`](Self::owner_annotation)) | the domain | `owner.buckets.example.com/uid` |
/// | the annotation that stops an object's reconciles ([`ignore_annotation`](Self::ignore_annotation)) | the domain | `buckets.example.com/ignore` |
/// | the labels of CD applications and the annotations of cluster registrations ([`app_label_prefix`](Self::app_label_prefix)) | the domain | `app.buckets.example.com/owner-name` |
/// | the labels of sharding Leases and of sharded objects ([`Sharding`](crate::sharding::Sharding)) | the domain | `shard.buckets.example.com/<lease prefix>` |
///
/// [`RuntimeBuilder::finalizer`](crate::runtime::RuntimeBuilder::finalizer) and
/// [`field_manager`](crate::runtime::RuntimeBuilder::field_manager) override one name each. An
/// operator upgraded from other names keeps its objects with
/// [`RuntimeBuilder::migrate_finalizer`](crate::runtime::RuntimeBuilder::migrate_finalizer), and
/// one upgraded from another domain names it its [`former_domain`](Self::former_domain): the
/// annotations written under it are still read, and its finalizer migrated.
///
/// ```
/// use actorcile::names::OperatorNames;
///
/// let names = OperatorNames::new("bucket-operator", "buckets.example.com");
/// assert_eq!(names.finalizer(), "buckets.example.com/finalizer");
/// assert_eq!(names.field_manager(), "bucket-operator");
/// assert_eq!(names.leader_lease(), "bucket-operator-leader");
/// assert!(names.validate().is_ok());
/// assert!(OperatorNames::new("Bucket Operator", "example.com").validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OperatorNames {
    name: String,
    domain: String,
    former_domain: Option<String>,
}

/// Why [`OperatorNames`] cannot name an operator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorNamesError {
    /// The name is not a DNS label (lowercase alphanumerics and `-`, at most 63): it names a
    /// field manager and the start of Lease names.
    #[error(
        "the operator's name {0:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"
    )]
    Name(String),
    /// The domain is not a DNS subdomain: it prefixes the finalizer.
    #[error("the operator's domain {0:?} is not a DNS subdomain (e.g. buckets.example.com)")]
    Domain(String),
}

impl OperatorNames {
    /// The names of the operator `name` (a DNS label) of `domain` (a DNS subdomain, the
    /// operator's API group or a domain its authors own). Checked by
    /// [`validate`](Self::validate), which [`RuntimeBuilder::start`](crate::runtime::RuntimeBuilder::start) calls.
    pub fn new(name: impl Into<String>, domain: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            domain: domain.into(),
            former_domain: None,
        }
    }

    /// The domain an earlier version of the operator wrote its annotations under (for an
    /// operator upgraded from actorcile's former defaults, [`LEGACY_DOMAIN`]). The runtime
    /// still reads them (references on targets, owner marks on children, the ignore
    /// annotation) and removes a former reference when its referrer releases it; objects that
    /// carry `<former>/finalizer` are migrated as
    /// [`RuntimeBuilder::migrate_finalizer`](crate::runtime::RuntimeBuilder::migrate_finalizer)
    /// does. Keep it until every object was reconciled once after the upgrade.
    ///
    /// ```
    /// use actorcile::names::{LEGACY_DOMAIN, OperatorNames};
    ///
    /// let names = OperatorNames::new("bucket-operator", "buckets.example.com")
    ///     .former_domain(LEGACY_DOMAIN);
    /// assert_eq!(names.former(), Some("actorcile.dev"));
    /// assert_eq!(names.ignore_annotation(), "buckets.example.com/ignore");
    /// ```
    pub fn former_domain(mut self, domain: impl Into<String>) -> Self {
        self.former_domain = Some(domain.into());
        self
    }

    /// The former domain, if one is named.
    pub fn former(&self) -> Option<&str> {
        self.former_domain.as_deref()
    }

    /// The operator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operator's domain.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// `<domain>/finalizer`.
    pub fn finalizer(&self) -> String {
        format!("{}/finalizer", self.domain)
    }

    /// The name itself.
    pub fn field_manager(&self) -> String {
        self.name.clone()
    }

    /// `<name>-leader`: the default Lease of [`RuntimeArgs`](crate::cli::RuntimeArgs)'
    /// `--leader-elect`.
    pub fn leader_lease(&self) -> String {
        format!("{}-leader", self.name)
    }

    /// `<name>-shards`: the default Lease prefix of [`RuntimeArgs`](crate::cli::RuntimeArgs)'
    /// `--shards`.
    pub fn shard_lease_prefix(&self) -> String {
        format!("{}-shards", self.name)
    }

    /// `ref.<domain>/`: a reference is persisted on its target as an annotation with this
    /// prefix (the rest of the key a hash of the referrer, the value the referrer).
    pub fn reference_prefix(&self) -> String {
        format!("ref.{}/", self.domain)
    }

    /// `<domain>/held-references`: the annotation on a referrer that lists the targets of
    /// kinds the runtime does not manage that it holds references on (a JSON list of
    /// [`Target`](crate::references::Target)s). Each such target carries the referrer's
    /// finalizer besides its reference annotation; the list, written on the referrer before
    /// the finalizer goes onto the target, is how those finalizers are found and removed when
    /// the referrer is deleted, after a restart or on another replica as well.
    pub fn held_references_annotation(&self) -> String {
        format!("{}/held-references", self.domain)
    }

    /// `owner.<domain>/uid`: the annotation that marks a child as its owner's where an owner
    /// reference cannot (another namespace, cluster scope, a remote cluster); its value is the
    /// owner's uid.
    pub fn owner_annotation(&self) -> String {
        format!("owner.{}/uid", self.domain)
    }

    /// `app.<domain>/`: the prefix of the labels by which a CD driver finds an application
    /// ([`AppIdentity`](crate::provisioners::cd::AppIdentity)) and of the annotations the Argo
    /// CD driver keeps on cluster registrations.
    pub fn app_label_prefix(&self) -> String {
        format!("app.{}/", self.domain)
    }

    /// `<domain>/ignore`: the annotation that makes the runtime skip an object's reconciles
    /// while it is `"true"`: no provision, no deprovision, no finalizer or status write. Its
    /// finalizer and status stay as they are; removing the annotation (or setting it to
    /// anything else) resumes the object at once. An operator's emergency brake for one
    /// object. A deleted object that carries it waits (its finalizer stays) until the
    /// annotation is removed.
    pub fn ignore_annotation(&self) -> String {
        format!("{}/ignore", self.domain)
    }

    /// Whether the name is a DNS label and the domains DNS subdomains.
    pub fn validate(&self) -> Result<(), OperatorNamesError> {
        if !is_dns_label(&self.name) {
            return Err(OperatorNamesError::Name(self.name.clone()));
        }
        for d in std::iter::once(&self.domain).chain(&self.former_domain) {
            if !is_dns_subdomain(d) {
                return Err(OperatorNamesError::Domain(d.clone()));
            }
        }
        Ok(())
    }

    /// The keys the runtime reads and writes, made once.
    pub(crate) fn keys(&self) -> Keys {
        let former = self.former_domain.as_ref().map(|d| {
            let f = OperatorNames::new(&self.name, d);
            (
                f.reference_prefix(),
                f.owner_annotation(),
                f.ignore_annotation(),
                f.held_references_annotation(),
            )
        });
        Keys {
            names: self.clone(),
            reference: self.reference_prefix(),
            owner: self.owner_annotation(),
            ignore: self.ignore_annotation(),
            held: self.held_references_annotation(),
            former,
        }
    }
}

/// The annotation keys of [`OperatorNames`], made once for a runtime: what it writes (the
/// current domain's) and what it reads (the former domain's as well).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keys {
    /// The names the keys are made from.
    pub(crate) names: OperatorNames,
    reference: String,
    owner: String,
    ignore: String,
    held: String,
    /// The former domain's reference prefix, owner annotation, ignore annotation and held
    /// references annotation.
    former: Option<(String, String, String, String)>,
}

impl Keys {
    /// The keys of contexts and indexes built outside a runtime (unit tests of provisioners).
    pub(crate) fn standalone() -> Self {
        OperatorNames::new(STANDALONE_FIELD_MANAGER, LEGACY_DOMAIN).keys()
    }

    /// The annotation key persisting `from`'s reference, and the former domain's if there is
    /// one (a release removes both).
    pub(crate) fn reference_annotations(
        &self,
        from: &crate::references::Target,
    ) -> (String, Option<String>) {
        // The referrer itself is stored in the value, so the key only needs to be unique; its
        // hash is specified ([`crate::hash`]) so that every version of the operator writes the
        // same key.
        let h = crate::hash::target_hash(from);
        let key = |prefix: &str| format!("{prefix}{h:016x}");
        (
            key(&self.reference),
            self.former.as_ref().map(|(r, _, _, _)| key(r)),
        )
    }

    /// Whether a former domain is read too.
    pub(crate) fn has_former(&self) -> bool {
        self.former.is_some()
    }

    /// Whether `key` is a reference annotation (of either domain).
    pub(crate) fn is_reference(&self, key: &str) -> bool {
        key.starts_with(&self.reference)
            || self
                .former
                .as_ref()
                .is_some_and(|(r, _, _, _)| key.starts_with(r.as_str()))
    }

    /// The annotation a referrer lists its references on kinds the runtime does not manage
    /// under ([`OperatorNames::held_references_annotation`]).
    pub(crate) fn held(&self) -> &str {
        &self.held
    }

    /// The targets of kinds the runtime does not manage that a referrer's annotations say it
    /// holds references on (under the current domain's key and the former's). A value that
    /// is not a list of targets reads as none: the referrer's own author may have edited it,
    /// and what it names is only ever released, under this referrer's own key.
    pub(crate) fn held_in(
        &self,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> Vec<crate::references::Target> {
        let former = self.former.as_ref().map(|(_, _, _, h)| h.as_str());
        let mut held: Vec<crate::references::Target> = std::iter::once(self.held.as_str())
            .chain(former)
            .filter_map(|k| annotations.get(k))
            .filter_map(|v| serde_json::from_str::<Vec<crate::references::Target>>(v).ok())
            .flatten()
            .take(crate::references::MAX_FOREIGN_REFERENCES)
            .collect();
        held.sort_unstable();
        held.dedup();
        held
    }

    /// The former domain's held references annotation, if there is a former domain.
    pub(crate) fn former_held(&self) -> Option<&str> {
        self.former.as_ref().map(|(_, _, _, h)| h.as_str())
    }

    /// The owner annotation to write on a child.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The owner uid a child's annotations name (the current domain's first).
    pub(crate) fn owner_in<'a>(
        &self,
        annotations: &'a std::collections::BTreeMap<String, String>,
    ) -> Option<&'a String> {
        annotations.get(&self.owner).or_else(|| {
            self.former
                .as_ref()
                .and_then(|(_, o, _, _)| annotations.get(o))
        })
    }

    /// Whether `meta` carries the ignore annotation (of either domain) set to `"true"`.
    pub(crate) fn is_ignored(&self, meta: &kube::api::ObjectMeta) -> bool {
        let Some(a) = meta.annotations.as_ref() else {
            return false;
        };
        let set = |k: &str| a.get(k).is_some_and(|v| v == "true");
        set(&self.ignore) || self.former.as_ref().is_some_and(|(_, _, i, _)| set(i))
    }
}

/// What the operator is, as unikorn's `ServiceDescriptor` says it: its application's name,
/// version and source revision. Given to
/// [`RuntimeBuilder::service`](crate::runtime::RuntimeBuilder::service), it is logged when the
/// runtime starts, exported as the `actorcile_build_info` metric's labels, and the Events'
/// reporting controller is the application. [`service_descriptor!`](crate::service_descriptor)
/// makes one from the calling crate's Cargo name and version.
///
/// ```
/// use actorcile::names::ServiceDescriptor;
/// let service = ServiceDescriptor::new("bucket-operator", "1.4.2", "3f9c2ab");
/// assert_eq!(service.to_string(), "bucket-operator 1.4.2 (3f9c2ab)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceDescriptor {
    /// The application's name.
    pub application: String,
    /// Its version.
    pub version: String,
    /// The source revision it was built from (a commit), or `unknown`.
    pub revision: String,
}

impl ServiceDescriptor {
    /// The descriptor of `application` at `version`, built from `revision`.
    pub fn new(
        application: impl Into<String>,
        version: impl Into<String>,
        revision: impl Into<String>,
    ) -> Self {
        Self {
            application: application.into(),
            version: version.into(),
            revision: revision.into(),
        }
    }
}

impl std::fmt::Display for ServiceDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.application, self.version, self.revision
        )
    }
}

/// The [`ServiceDescriptor`] of the crate that calls it: its Cargo package name and version,
/// and the revision the `GIT_REVISION` environment variable held at build time (`unknown`
/// without it).
///
/// ```
/// let service = actorcile::service_descriptor!();
/// assert_eq!(service.application, env!("CARGO_PKG_NAME"));
/// ```
#[macro_export]
macro_rules! service_descriptor {
    () => {
        $crate::names::ServiceDescriptor::new(
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
            match option_env!("GIT_REVISION") {
                Some(r) => r,
                None => "unknown",
            },
        )
    };
}

/// This replica's name: `POD_NAME` (set it from the Pod's name with the downward API), else
/// `HOSTNAME`, else `actorcile`. The base of the ids a runtime gives itself (guard lock
/// holders, leader election identities), which add a suffix so two processes differ.
pub(crate) fn replica_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "actorcile".into())
}

/// This process's identity among the replicas (leader election, sharding): [`replica_name`]
/// and the process id, so two processes on one machine differ.
pub(crate) fn replica_identity() -> String {
    format!("{}-{}", replica_name(), std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_value_true_ignores_an_object_under_either_domain() {
        let names = OperatorNames::new("op", "example.com");
        let set = |key: &str, v: &str| kube::api::ObjectMeta {
            annotations: Some([(key.to_string(), v.to_string())].into()),
            ..Default::default()
        };
        let keys = names.keys();
        assert!(!keys.is_ignored(&kube::api::ObjectMeta::default()));
        assert!(!keys.is_ignored(&set("example.com/ignore", "false")));
        assert!(keys.is_ignored(&set("example.com/ignore", "true")));
        assert!(!keys.is_ignored(&set("actorcile.dev/ignore", "true")));
        let upgraded = names.former_domain(LEGACY_DOMAIN).keys();
        assert!(upgraded.is_ignored(&set("actorcile.dev/ignore", "true")));
        assert!(upgraded.is_ignored(&set("example.com/ignore", "true")));
    }

    #[test]
    fn references_and_owner_marks_are_read_under_both_domains_and_written_under_the_current() {
        let keys = OperatorNames::new("op", "example.com")
            .former_domain(LEGACY_DOMAIN)
            .keys();
        let from = crate::references::Target::new("v1", "ConfigMap", Some("ns"), "a");
        let (key, former) = keys.reference_annotations(&from);
        assert!(key.starts_with("ref.example.com/"), "{key}");
        let former = former.expect("a former key");
        assert!(former.starts_with("ref.actorcile.dev/"), "{former}");
        assert_eq!(
            key["ref.example.com/".len()..],
            former["ref.actorcile.dev/".len()..]
        );
        assert!(keys.is_reference(&key) && keys.is_reference(&former));
        assert!(!keys.is_reference("other.example.com/x"));
        let value = serde_json::to_string(&from).unwrap();
        let both: std::collections::BTreeMap<String, String> =
            [(key, value.clone()), (former.clone(), value)].into();
        assert_eq!(
            crate::references::referrers_in(&keys, &both),
            vec![from.clone()]
        );

        assert_eq!(keys.owner(), "owner.example.com/uid");
        let marked = [("owner.actorcile.dev/uid".to_string(), "u1".to_string())].into();
        assert_eq!(keys.owner_in(&marked).map(String::as_str), Some("u1"));
        let current = OperatorNames::new("op", "example.com").keys();
        assert_eq!(current.owner_in(&marked), None);
        assert!(current.reference_annotations(&from).1.is_none());
        assert!(!current.is_reference(&former));
    }
}
