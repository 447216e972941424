//! Sharding: the objects of every controller split across the operator's replicas by
//! `coordination.k8s.io/v1` Leases ([`RuntimeBuilder::sharding`](crate::runtime::RuntimeBuilder::sharding)).
//!
//! - Every object belongs to one of [`Sharding::shards`] shards: a stable hash of its key
//!   ([`shard_of`]; the key is `namespace/name`, or what
//!   [`Controller::shard_key`](crate::runtime::Controller::shard_key) returns, e.g. a tenant
//!   label so that a tenant's objects stay together).
//! - Each shard is a Lease, `<lease_prefix>-shard-<n>`. A replica runs the objects of the
//!   shards whose Lease it holds, and no other.
//! - Replicas find each other through their member Leases (`<lease_prefix>-member-<hash>`,
//!   renewed like a shard's). Each aims at its fair share, ⌈shards / replicas⌉: a replica
//!   that holds more gives the excess up (highest shard numbers first), one that holds fewer
//!   takes free or expired shards. A replica's first round only writes its member Lease, so
//!   replicas started together count each other before any takes shards. A replica that joins
//!   therefore gets its share within a few retry periods, and one that leaves (or dies) has
//!   its shards taken over once they are free (at once after a graceful release) or expired
//!   (`lease_duration` after its last renewal, as the others observed it). Replicas may count
//!   each other differently for a few rounds (one just died, another just started): a shard
//!   left without a holder is then taken past the fair share, two retry periods after it
//!   expired (or a lease duration after its release), and given up again once the counts
//!   agree.
//! - Each renewal round writes the member Lease and every held shard's at once, each request
//!   bounded by half the renew deadline, so that a request without an answer leaves time for
//!   another try. A renewal that conflicts (the Lease changed since it was listed: another
//!   replica took it, or a renewal of ours landed with its answer lost) is read again at the
//!   next round; only another holder or the fence ends the hold. A shard that is lost and
//!   then taken again by the same replica is written as a new acquisition (`acquireTime`,
//!   `leaseTransitions`).
//! - **Fencing.** A shard is the replica's only while it renewed its Lease within
//!   `lease_renew_deadline` of sending the renewal (the same rule as [`crate::leader`]): past
//!   that, or once it sees another holder, the replica stops every reconcile of the shard's
//!   objects (a reconcile in flight is abandoned), refuses their writes ([`ShardNotHeld`]),
//!   and starts no new one. Another replica cannot take the Lease before `lease_duration` after
//!   that renewal, so the two never run one object at the same time.
//! - **Giving a shard up** to rebalance drains it: no new reconcile of its objects starts,
//!   those in flight finish (until half the renew deadline after the round's renewals; one
//!   still running then is abandoned), and the Lease is released only once they have
//!   finished (otherwise it expires).
//! - **A shard key that changes** ([`Controller::shard_key`](crate::runtime::Controller::shard_key),
//!   e.g. a tenant label edited) moves its object to another shard, perhaps another replica's.
//!   The object carries the shard that last ran it, in the label
//!   `shard.<domain>/<lease_prefix>: <shard>-of-<shards>` (written with the finalizer, with
//!   a shard key or [`ShardWatch::HeldShards`]). An object whose label names another shard than
//!   its key's is run by nobody until the holder of the labelled shard, once its reconcile in
//!   flight has finished, writes the new shard into the label: then the new shard's replica
//!   runs it. The two replicas never reconcile the object at once.
//! - **What a replica watches** ([`ShardWatch`]). By default every replica watches and caches
//!   every object of its kinds (the others' shards too), so a takeover starts reconciling at
//!   once, and a waiter on an object of another replica's shard is woken by that object's
//!   watch event. With [`ShardWatch::HeldShards`] a replica watches only the objects of the
//!   shards it holds, and objects nobody has placed yet: the replica that holds an object's
//!   shard labels it `shard.<domain>/<lease_prefix>: <shard>-of-<shards>` in the same
//!   write that adds the finalizer, and every replica's watch selects
//!   `shard.<domain>/<lease_prefix> notin (<the shards it does not hold>)` (an object
//!   not placed yet, of a shard it does not hold, reaches its watch and is set aside, out of
//!   its cache, until it is labelled or the replica takes its shard). Watch traffic,
//!   decoding and the cache then split across replicas with the objects; the price is a relist
//!   of the held shards whenever the set of held shards changes (a takeover starts once that
//!   list is in), and readiness of objects in other replicas' shards is
//!   read from a watch of their kind that runs only while someone waits on such an object
//!   (as for kinds this runtime does not manage). With [`ShardWatch::ServerSide`] the API
//!   server selects (Kubernetes 1.36+, feature gate `ShardedListAndWatch`): an object's shard
//!   is the range of the hash space its uid's FNV-1a hash falls in ([`shard_of_uid`]), and
//!   each replica's lists and watches carry a `shardSelector` naming its shards' ranges, so
//!   an object reaches only the replica of its shard and no label is written; the same relist
//!   on a change of the held shards.
//! - **Children** ([`Controller::owns`](crate::runtime::Controller::owns)). With
//!   `HeldShards` or `ServerSide`, the runtime labels each child it writes with its owner's
//!   shard (`owner-shard.<domain>/<lease_prefix>: <shard>-of-<shards>`, in the child's
//!   own write: [`Sharding::owner_label_key`]), and each replica's watch of the children
//!   selects the children of the shards it holds and those without the label (written before,
//!   or by someone else): a replica receives and keeps its share of the children, as of the
//!   objects. The label selector is applied by every API server, with or without the
//!   `ShardedListAndWatch` gate. When the held shards change, the children's watch starts
//!   again with the new selector, as the objects' does; a child of a shard just acquired that
//!   someone changes after the takeover's reconcile wrote it and before that relist is in is
//!   repaired at its owner's next reconcile, not at once.
//!
//! The policy's `lease_duration`, `lease_renew_deadline` and `lease_retry_period` set the
//! timings (defaults 15 s / 10 s / 2 s, as client-go's leader election).
//!
//! **Names.** The Leases are `<lease_prefix>-…`, labelled `sharding.<domain>/group:
//! <lease_prefix>` and `sharding.<domain>/role: shard|member`; `<domain>` and, unless set,
//! `<lease_prefix>` (`<name>-shards`) are the operator's ([`OperatorNames`], given to
//! [`Sharding::named`], which [`RuntimeBuilder::sharding`](crate::runtime::RuntimeBuilder::sharding)
//! calls). For an operator upgraded from another domain ([`OperatorNames::former_domain`]),
//! the replicas also list the Leases labelled under the former domain and label those they
//! write under both, so replicas of both versions see each other's Leases during a rolling
//! upgrade; keep
//! the Lease prefix across an upgrade (replicas with different prefixes are different groups,
//! and both would run every object).
//!
//! ```no_run
//! use actorcile::sharding::Sharding;
//! # use actorcile::prelude::*;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
//! # struct AppSpec {}
//! # async fn run(client: kube::Client) -> Result<(), actorcile::Error> {
//! let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
//! let handle = Runtime::builder(client, OperatorNames::new("app-operator", "example.com"))
//!     .controller(Controller::<App>::new(tree))
//!     .sharding(Sharding::new(12, "operators").identity("replica-a"))
//!     .start()
//!     .await?;
//! println!("holding shards {:?}", handle.shards_held());
//! # Ok(()) }
//! ```

mod fence;
pub(crate) mod follow;
mod held;
pub(crate) mod keeper;
mod scope;
pub(crate) mod server_side;

pub use fence::ShardNotHeld;
pub(crate) use fence::fenced_clients;
pub(crate) use held::Shards;
pub(crate) use scope::{ShardKey, ShardScope};
pub use server_side::shard_of_uid;

use crate::Error;
pub(crate) use crate::hash::fnv1a;
use crate::names::OperatorNames;
use crate::policy::SupervisorPolicy;

/// How a runtime's objects are split across replicas, and this replica's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharding {
    /// How many shards (Leases). Fix it for the operator's life: changing it moves most objects
    /// to another shard. A few per replica you may run at most is a good number (e.g. 12 for up
    /// to 4–6 replicas): a replica holds whole shards, so more shards split the work more evenly.
    pub shards: u32,
    /// The namespace of the Leases.
    pub namespace: String,
    /// The Leases' name prefix (`<prefix>-shard-<n>`, `<prefix>-member-<hash>`); `None`: the
    /// operator's [`shard_lease_prefix`](OperatorNames::shard_lease_prefix), set by
    /// [`Sharding::named`].
    pub lease_prefix: Option<String>,
    /// The domain of the labels (`sharding.<domain>/group`, `shard.<domain>/<prefix>`, …);
    /// `None`: the operator's, set by [`Sharding::named`].
    pub domain: Option<String>,
    /// The domain an earlier version labelled its Leases under, also read
    /// ([`OperatorNames::former_domain`], set by [`Sharding::named`]).
    pub former_domain: Option<String>,
    /// This replica's identity (the `holderIdentity` of the Leases it holds): unique among the
    /// replicas.
    pub identity: String,
    /// What each replica watches: every object, or only those of the shards it holds.
    pub watch: ShardWatch,
}

/// What each replica watches (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardWatch {
    /// Every object of the runtime's kinds, whichever replica runs it: a takeover starts at
    /// once (warm), and every replica pays for every object's events and cache.
    #[default]
    Everything,
    /// Only the objects of the shards this replica holds, and objects not placed in a shard
    /// yet (selected by the shard label the holder writes): watch CPU and cache memory split
    /// across replicas; a takeover relists first (cold).
    HeldShards,
    /// Only the objects of the shards this replica holds, selected by the API server itself
    /// (Kubernetes 1.36+ with the `ShardedListAndWatch` feature gate): no label is written, and
    /// an object reaches only the replica that holds its shard, from its first version. An
    /// object's shard is then the range its uid's hash falls in ([`shard_of_uid`]), not the
    /// hash of its shard key, so every replica must use this mode, and
    /// [`Controller::shard_key`](crate::runtime::Controller::shard_key) cannot be combined
    /// with it. On a server without the option (it answers a sharded list unfiltered), the
    /// replica says so in its log and watches every object, as with
    /// [`ShardWatch::Everything`]. A takeover relists first (cold).
    ServerSide,
}

/// The Lease prefix of a [`Sharding`] never [named](Sharding::named): actorcile's former
/// default.
const UNNAMED_PREFIX: &str = "actorcile-shards";

impl Sharding {
    /// `shards` shards on Leases in `namespace`, identity `$POD_NAME` (else `$HOSTNAME`) and
    /// the process id; the Lease prefix and the labels' domain are the operator's
    /// ([`Sharding::named`]; until named, actorcile's former defaults, `actorcile-shards` and
    /// `actorcile.dev`).
    pub fn new(shards: u32, namespace: impl Into<String>) -> Self {
        Self {
            shards,
            namespace: namespace.into(),
            lease_prefix: None,
            domain: None,
            former_domain: None,
            identity: crate::names::replica_identity(),
            watch: ShardWatch::Everything,
        }
    }

    /// Takes what is not set from the operator's names: the Lease prefix
    /// ([`OperatorNames::shard_lease_prefix`]), the labels' domain and the former domain.
    /// [`RuntimeBuilder::sharding`](crate::runtime::RuntimeBuilder::sharding) does it with the
    /// runtime's names; a program that labels objects for a runtime's shards does it with the
    /// same names.
    ///
    /// ```
    /// use actorcile::names::OperatorNames;
    /// use actorcile::sharding::Sharding;
    ///
    /// let names = OperatorNames::new("bucket-operator", "buckets.example.com");
    /// let sharding = Sharding::new(12, "operators").named(&names);
    /// assert_eq!(sharding.shard_lease_name(0), "bucket-operator-shards-shard-0");
    /// assert_eq!(sharding.label_key(), "shard.buckets.example.com/bucket-operator-shards");
    /// ```
    pub fn named(mut self, names: &OperatorNames) -> Self {
        self.lease_prefix
            .get_or_insert_with(|| names.shard_lease_prefix());
        self.domain
            .get_or_insert_with(|| names.domain().to_string());
        if self.former_domain.is_none() {
            self.former_domain = names.former().map(str::to_string);
        }
        self
    }

    /// The Leases' name prefix.
    pub fn prefix(&self) -> &str {
        self.lease_prefix.as_deref().unwrap_or(UNNAMED_PREFIX)
    }

    /// The labels' domain.
    fn label_domain(&self) -> &str {
        self.domain
            .as_deref()
            .unwrap_or(crate::names::LEGACY_DOMAIN)
    }

    /// The key of the label naming a Lease's group (its value the Lease prefix):
    /// `sharding.<domain>/group`.
    pub fn group_label_key(&self) -> String {
        format!("sharding.{}/group", self.label_domain())
    }

    /// The key of the label saying what a Lease is (`shard` or `member`):
    /// `sharding.<domain>/role`.
    pub fn role_label_key(&self) -> String {
        format!("sharding.{}/role", self.label_domain())
    }

    /// The group and role label keys under the former domain, if one is named.
    pub(crate) fn former_lease_label_keys(&self) -> Option<(String, String)> {
        self.former_domain
            .as_ref()
            .map(|d| (format!("sharding.{d}/group"), format!("sharding.{d}/role")))
    }

    /// What each replica watches.
    pub fn watch(mut self, watch: ShardWatch) -> Self {
        self.watch = watch;
        self
    }

    /// The key of the label that places an object in its shard
    /// ([`ShardWatch::HeldShards`]): `shard.<domain>/<lease_prefix>`.
    pub fn label_key(&self) -> String {
        format!("shard.{}/{}", self.label_domain(), self.prefix())
    }

    /// The key of the label that names the shard of a child's owner:
    /// `owner-shard.<domain>/<lease_prefix>`.
    ///
    /// When replicas watch only their shards ([`ShardWatch::HeldShards`] or
    /// [`ShardWatch::ServerSide`]), the runtime writes this label, `<shard>-of-<shards>` of the
    /// owner, on every child it writes in its own cluster with an owner reference
    /// ([`resource`](crate::provisioners::resource()),
    /// [`Context::create_owned`](crate::provisioners::Context::create_owned)), in the same
    /// write; and the watch of the children
    /// ([`Controller::owns`](crate::runtime::Controller::owns)) selects the children of the
    /// shards the replica holds, and children without the label. So each replica receives its
    /// share of the children's events, with no write of its own for it.
    ///
    /// ```
    /// use actorcile::sharding::Sharding;
    /// use actorcile::names::OperatorNames;
    /// let names = OperatorNames::new("bucket-operator", "buckets.example.com");
    /// let key = Sharding::new(12, "operators").named(&names).owner_label_key();
    /// assert_eq!(key, "owner-shard.buckets.example.com/bucket-operator-shards");
    /// ```
    pub fn owner_label_key(&self) -> String {
        format!("owner-shard.{}/{}", self.label_domain(), self.prefix())
    }

    /// Whether the objects' watches split across replicas, so that the children's watches do
    /// too (by [`Sharding::owner_label_key`]).
    pub(crate) fn splits_watches(&self) -> bool {
        self.watch != ShardWatch::Everything
    }

    /// The shard label (key, value) of an object whose shard key is `shard_key` ([`object_key`]
    /// by default): what the holder of its shard writes when it places the object
    /// ([`ShardWatch::HeldShards`]).
    ///
    /// A program that creates many objects (a parent operator, an import job) can set it in the
    /// object it creates. Such an object is placed from its first version, so it reaches only
    /// the replica that holds its shard; an object created without it reaches every replica's
    /// watch (the others decode it and set it aside, out of their caches), and reaches them
    /// again when its holder labels it and it leaves their watches.
    ///
    /// ```
    /// use actorcile::names::OperatorNames;
    /// use actorcile::sharding::{Sharding, object_key};
    /// let names = OperatorNames::new("bucket-operator", "buckets.example.com");
    /// let sharding = Sharding::new(12, "operators").named(&names);
    /// let (key, value) = sharding.label(&object_key(Some("team-a"), "web"));
    /// assert_eq!(key, "shard.buckets.example.com/bucket-operator-shards");
    /// assert!(value.ends_with("-of-12"));
    /// ```
    pub fn label(&self, shard_key: &str) -> (String, String) {
        (
            self.label_key(),
            label_value(shard_of(shard_key, self.shards), self.shards),
        )
    }

    /// This replica's identity.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// The Leases' name prefix (instead of the operator's `<name>-shards`).
    pub fn lease_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.lease_prefix = Some(prefix.into());
        self
    }

    /// Check the shard count, the names and that the policy's lease timings fit together.
    pub fn validate(&self, policy: &SupervisorPolicy) -> Result<(), Error> {
        let invalid = |option: &'static str, problem: String| Error::Invalid {
            field: crate::runtime::Setting::Sharding { option },
            problem,
        };
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(invalid(
                "shards",
                format!("{} is not between 1 and {MAX_SHARDS}", self.shards),
            ));
        }
        // The longest name: `<prefix>-member-<16 hex digits>`.
        let longest = format!("{}-member-{:016x}", self.prefix(), 0);
        if !crate::names::is_dns_subdomain(&longest) {
            return Err(invalid(
                "lease_prefix",
                format!(
                    "{:?} does not make valid Lease names (e.g. {longest:?})",
                    self.prefix()
                ),
            ));
        }
        for d in self.domain.iter().chain(&self.former_domain) {
            if !crate::names::is_dns_subdomain(d) {
                return Err(invalid("domain", format!("{d:?} is not a DNS subdomain")));
            }
        }
        if !crate::names::is_dns_subdomain(&self.namespace) {
            return Err(invalid(
                "namespace",
                format!("{:?} is not a valid namespace", self.namespace),
            ));
        }
        if self.identity.is_empty() {
            return Err(invalid("identity", "must not be empty".into()));
        }
        let keys = match self.watch {
            ShardWatch::Everything => vec![],
            ShardWatch::HeldShards => vec![self.label_key(), self.owner_label_key()],
            ShardWatch::ServerSide => vec![self.owner_label_key()],
        };
        if let Some(key) = keys
            .iter()
            .find(|k| !crate::names::is_prefixed_qualified_name(k))
        {
            return Err(invalid(
                "lease_prefix",
                format!(
                    "{:?} does not make a valid label key ({key:?}; at most 63 characters after the /)",
                    self.prefix(),
                ),
            ));
        }
        policy.lease.check_timings().map_err(|(f, p)| invalid(f, p))
    }

    /// The path of the Leases' collection (what [`ShardWatch::ServerSide`] lists to learn
    /// whether the server applies shard selectors).
    pub(crate) fn leases_url(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            self.namespace
        )
    }

    /// The name of shard `shard`'s Lease, in the namespace given to [`Sharding::new`].
    ///
    /// ```
    /// use actorcile::sharding::Sharding;
    /// let sharding = Sharding::new(4, "ops").lease_prefix("buckets");
    /// assert_eq!(sharding.shard_lease_name(3), "buckets-shard-3");
    /// ```
    pub fn shard_lease_name(&self, shard: u32) -> String {
        format!("{}-shard-{shard}", self.prefix())
    }

    /// The label selectors of this group's Leases of `role` (`None`: every role): under the
    /// domain, and under the former domain if one is named.
    pub(crate) fn lease_selectors(&self, role: Option<&str>) -> Vec<String> {
        let of = |group: String, role_key: String| match role {
            Some(r) => format!("{role_key}={r},{group}={}", self.prefix()),
            None => format!("{group}={}", self.prefix()),
        };
        let mut selectors = vec![of(self.group_label_key(), self.role_label_key())];
        if let Some((group, role_key)) = self.former_lease_label_keys() {
            selectors.push(of(group, role_key));
        }
        selectors
    }

    /// The Leases of this group (of `role`, if named): those under the domain and, if one is
    /// named, under the former domain, each once.
    pub(crate) async fn list_leases(
        &self,
        api: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
        role: Option<&str>,
    ) -> Result<Vec<k8s_openapi::api::coordination::v1::Lease>, kube::Error> {
        let mut leases = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for selector in self.lease_selectors(role) {
            let list = api
                .list(&kube::api::ListParams::default().labels(&selector))
                .await?;
            for l in list.items {
                if seen.insert(l.metadata.name.clone().unwrap_or_default()) {
                    leases.push(l);
                }
            }
        }
        Ok(leases)
    }

    /// The holder each shard's Lease names now, by shard; a shard whose Lease is missing or
    /// released is absent. What the Leases say, read once: a holder that stopped renewing is
    /// named until another replica takes its Lease (after the lease duration). For tests,
    /// dashboards and tools; a runtime's own shards are
    /// [`RuntimeHandle::shards_held`](crate::runtime::RuntimeHandle::shards_held).
    ///
    /// # Errors
    ///
    /// The list's error (the caller needs `list` on Leases in the namespace).
    pub async fn holders(
        &self,
        client: &kube::Client,
    ) -> Result<std::collections::BTreeMap<u32, String>, kube::Error> {
        use k8s_openapi::api::coordination::v1::Lease;
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &self.namespace);
        let list = self.list_leases(&leases, Some("shard")).await?;
        let shards: std::collections::HashMap<String, u32> = (0..self.shards)
            .map(|s| (self.shard_lease_name(s), s))
            .collect();
        Ok(list
            .into_iter()
            .filter_map(|l| {
                let shard = *shards.get(l.metadata.name.as_deref()?)?;
                let holder = l.spec?.holder_identity.filter(|h| !h.is_empty())?;
                Some((shard, holder))
            })
            .collect())
    }

    pub(crate) fn member_lease(&self) -> String {
        format!("{}-member-{:016x}", self.prefix(), fnv1a(&self.identity))
    }
}

/// The most shards a runtime may have.
pub const MAX_SHARDS: u32 = 1024;

/// The shard of an object whose shard key is `key`, of `shards` shards: 64-bit FNV-1a of the
/// key's bytes, modulo `shards`. Stable across processes, machines and versions of actorcile
/// (replicas of different builds must agree during a rolling update).
///
/// ```
/// use actorcile::sharding::{object_key, shard_of};
/// assert_eq!(shard_of(&object_key(Some("default"), "web"), 12), shard_of("default/web", 12));
/// assert!(shard_of("default/web", 12) < 12);
/// ```
pub fn shard_of(key: &str, shards: u32) -> u32 {
    (fnv1a(key) % u64::from(shards.max(1))) as u32
}

/// The default shard key of an object: `namespace/name`, or `name` for a cluster-scoped one.
pub fn object_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// The shard label's value for `shard` of `shards`: `<shard>-of-<shards>` (the count is in it so
/// that a label written under another shard count is seen as not placed).
pub(crate) fn label_value(shard: u32, shards: u32) -> String {
    format!("{shard}-of-{shards}")
}

/// The shard a shard label's value names (`<shard>-of-<shards>`), when it was written for
/// `shards` shards.
pub(crate) fn parse_label_value(value: &str, shards: u32) -> Option<u32> {
    let (shard, of) = value.split_once("-of-")?;
    let (shard, of) = (shard.parse::<u32>().ok()?, of.parse::<u32>().ok()?);
    (of == shards && shard < shards).then_some(shard)
}

/// The label selector of the objects a replica holding `held` (of `shards`) watches with
/// [`ShardWatch::HeldShards`]: those not labelled for a shard it does not hold. `None` when it
/// holds every shard.
pub(crate) fn held_selector(key: &str, held: &[u32], shards: u32) -> Option<String> {
    let others: Vec<String> = (0..shards)
        .filter(|s| !held.contains(s))
        .map(|s| label_value(s, shards))
        .collect();
    (!others.is_empty()).then(|| format!("{key} notin ({})", others.join(",")))
}

#[cfg(test)]
mod tests;
