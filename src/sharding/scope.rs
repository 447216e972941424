//! A controller's view of the shards: which objects this replica may reconcile, by which shard
//! and through which fenced client, and the shard labels that record where an object last ran.

use std::sync::Arc;

use kube::Client;
use kube::runtime::reflector::ObjectRef;

use super::Shards;
use crate::ManagedResource;

/// A controller's shard key function ([`Controller::shard_key`](crate::runtime::Controller::shard_key)).
pub(crate) type ShardKey<K> = Arc<dyn Fn(&K) -> String + Send + Sync>;

/// A sharded controller's view of the shards: which are held, a fenced client per shard, and
/// the key function (`None`: `namespace/name`).
pub(crate) struct ShardScope<K> {
    pub shards: Arc<Shards>,
    pub clients: Arc<[Arc<Client>]>,
    pub key: Option<ShardKey<K>>,
    /// The shard label's key, when objects carry the shard that runs them: when this replica
    /// watches only its shards ([`crate::sharding::ShardWatch::HeldShards`]), and when a shard
    /// key function can move an object to another shard (so that the replica of its new shard
    /// waits for the old one to let it go: [`ShardScope::runnable_shard`]).
    pub label: Option<Arc<str>>,
    /// Whether this replica's watches select by `label` (`HeldShards`).
    pub selects_by_label: bool,
    /// When objects are placed by their uid and the API server selects them
    /// ([`crate::sharding::ShardWatch::ServerSide`]): the shard Leases' collection, whose list
    /// answer tells whether the server applies shard selectors (its answers for custom
    /// resources do not say).
    pub server_side_leases: Option<Arc<str>>,
    /// With `server_side_leases`: whether the server applies the shard selector (its list
    /// answers say so), so that this replica's view holds only the objects of its shards. Set
    /// by the feeder.
    pub server_selects: std::sync::atomic::AtomicBool,
    /// The owner shard label's key, when the children's watches select by it
    /// ([`crate::sharding::Sharding::owner_label_key`]).
    pub child_label: Option<Arc<str>>,
    /// How long after this replica gave shards up its watches narrow their selector to the
    /// shards it still holds: twice the Lease duration (a shard lost and soon taken again, as
    /// when renewals run late, costs no relist).
    pub narrow_after: std::time::Duration,
}

impl<K: ManagedResource> ShardScope<K> {
    /// The shard of `obj`.
    pub(crate) fn shard_of(&self, obj: &K) -> u32 {
        let n = self.shards.count();
        if self.server_side_leases.is_some() {
            return crate::sharding::shard_of_uid(obj.meta().uid.as_deref().unwrap_or(""), n);
        }
        match &self.key {
            Some(f) => crate::sharding::shard_of(&f(obj), n),
            None => crate::sharding::shard_of(
                &crate::sharding::object_key(
                    obj.meta().namespace.as_deref(),
                    obj.meta().name.as_deref().unwrap_or(""),
                ),
                n,
            ),
        }
    }

    /// The shard of the object at `key`, when it can be told without the object (the default
    /// shard key); else from `obj` if given.
    pub(crate) fn shard_of_key(&self, key: &ObjectRef<K>, obj: Option<&K>) -> Option<u32> {
        if self.server_side_leases.is_some() {
            return obj.map(|o| self.shard_of(o));
        }
        match (&self.key, obj) {
            (None, _) => Some(crate::sharding::shard_of(
                &crate::sharding::object_key(key.namespace.as_deref(), &key.name),
                self.shards.count(),
            )),
            (Some(_), Some(obj)) => Some(self.shard_of(obj)),
            (Some(_), None) => None,
        }
    }

    /// The shard whose holder may reconcile `obj`: its shard, unless its shard label names
    /// another (its shard key changed since it last ran): then none, until the holder of the
    /// labelled shard moves it ([`ShardScope::misplaced`]). That holder does so once it no
    /// longer runs the object (a reconcile in flight finishes first), so the replicas of the
    /// old and the new shard never reconcile the object at once.
    pub(crate) fn runnable_shard(&self, obj: &K) -> Option<u32> {
        let shard = self.shard_of(obj);
        match self.labelled_shard(obj) {
            Some(labelled) if labelled != shard => None,
            _ => Some(shard),
        }
    }

    /// When `obj` is labelled for a shard this replica holds but belongs to another (its shard
    /// key changed): that shard, and the label value it must carry. Only the holder of the
    /// labelled shard moves it.
    pub(crate) fn misplaced(&self, obj: &K) -> Option<(u32, Arc<str>, String)> {
        let key = self.label.as_ref()?;
        let shard = self.labelled_shard(obj)?;
        let right = self.shard_of(obj);
        (shard != right && self.shards.holds(shard)).then(|| {
            let value = crate::sharding::label_value(right, self.shards.count());
            (shard, key.clone(), value)
        })
    }

    /// Whether an object's shard can be told only from the object (not from its key).
    pub(crate) fn needs_object(&self) -> bool {
        self.server_side_leases.is_some() || self.key.is_some()
    }

    /// Whether this replica's watches select only the objects of its shards (by label, or by
    /// the server).
    pub(crate) fn selective(&self) -> bool {
        self.selects_by_label
            || self
                .server_selects
                .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The shard `obj`'s shard label names, when it carries one written under this shard
    /// count (`None` without labels, or for a label of another count: not placed).
    pub(crate) fn labelled_shard(&self, obj: &K) -> Option<u32> {
        self.labelled_shard_of(obj.meta())
    }

    /// [`ShardScope::labelled_shard`] of an object's metadata.
    pub(crate) fn labelled_shard_of(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Option<u32> {
        let labelled = meta.labels.as_ref()?.get(&**self.label.as_ref()?)?;
        crate::sharding::parse_label_value(labelled, self.shards.count())
    }

    /// The shard of an object as a watch received it. One that the kind's type cannot hold
    /// has no `K` for a shard key function: it is placed by its shard label if it has one, else
    /// by `namespace/name` (as without a key function), so that one replica answers for it.
    pub(crate) fn shard_of_lenient(&self, obj: &crate::lenient::Lenient<K>) -> u32 {
        match obj {
            crate::lenient::Lenient::Decoded(obj) => self.shard_of(obj),
            crate::lenient::Lenient::Undecodable(u) => self.shard_of_undecodable(&u.meta),
        }
    }

    /// The shard of an object the kind's type cannot hold (see [`ShardScope::shard_of_lenient`]).
    pub(crate) fn shard_of_undecodable(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> u32 {
        let n = self.shards.count();
        if self.server_side_leases.is_some() {
            return crate::sharding::shard_of_uid(meta.uid.as_deref().unwrap_or(""), n);
        }
        if self.key.is_some()
            && let Some(labelled) = self.labelled_shard_of(meta)
        {
            return labelled;
        }
        crate::sharding::shard_of(
            &crate::sharding::object_key(
                meta.namespace.as_deref(),
                meta.name.as_deref().unwrap_or(""),
            ),
            n,
        )
    }

    /// The owner shard label (key, value) the children of `obj` carry, when the children's
    /// watches select by it ([`crate::sharding::Sharding::owner_label_key`]).
    pub(crate) fn child_label_of(&self, obj: &K) -> Option<(Arc<str>, String)> {
        let key = self.child_label.clone()?;
        let value = crate::sharding::label_value(self.shard_of(obj), self.shards.count());
        Some((key, value))
    }

    /// The shard label `obj` must carry and does not yet (key, value), when objects are labelled
    /// ([`ShardScope::label`]); `None` when it carries it, or labels are not used.
    pub(crate) fn missing_label(&self, obj: &K) -> Option<(Arc<str>, String)> {
        let key = self.label.as_ref()?;
        let value = crate::sharding::label_value(self.shard_of(obj), self.shards.count());
        let has = obj.meta().labels.as_ref().and_then(|l| l.get(&**key));
        (has != Some(&value)).then(|| (key.clone(), value))
    }
}
