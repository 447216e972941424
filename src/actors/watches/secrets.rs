//! The Secrets objects reference: watched as metadata only, each change re-running the objects
//! that reference it.

use super::*;

/// Watch the Secrets (metadata only: their data is never held) and re-run the objects that
/// reference one when it changes, appears or goes. Nothing re-runs for the first list (every
/// object runs at start-up anyway); a re-list compares each Secret's resourceVersion with the
/// last one seen, so changes made while the watch was down are not missed.
pub(crate) async fn watch_secrets<K: ManagedResource>(
    shared: Arc<Shared<K>>,
    api: Api<PartialObjectMeta<Secret>>,
    manager: Mailbox<ManagerMsg<K>>,
) {
    let Some(trigger) = shared.secrets.as_ref() else {
        return;
    };
    let changed = |secret: &ObjectRef<Secret>, meta: &kube::api::ObjectMeta| {
        let referrers = trigger.referrers(&shared, secret, meta);
        if referrers.is_empty() {
            return;
        }
        // The Secret's name, never anything of its data.
        let cause = Cause::about(
            Trigger::Secret,
            "Secret",
            secret.namespace.as_deref(),
            &secret.name,
        );
        for key in referrers {
            notify(&shared, &manager, key, cause.clone());
        }
    };
    watch_secret_changes(api, changed).await;
}

/// Calls `changed` with each Secret `api` watches that changes, appears or goes, and its
/// metadata (without managed fields; the last seen for one gone): not for the first list; a
/// re-list compares each Secret's resourceVersion with the last one seen, so changes made
/// while the watch was down are not missed.
pub(super) async fn watch_secret_changes(
    api: Api<PartialObjectMeta<Secret>>,
    changed: impl Fn(&ObjectRef<Secret>, &kube::api::ObjectMeta),
) {
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(events);
    let mut known: FastMap<ObjectRef<Secret>, kube::api::ObjectMeta> = FastMap::default();
    let mut first = true;
    let mut seen: Option<HashSet<ObjectRef<Secret>, ahash::RandomState>> = None;
    while let Some(event) = events.next().await {
        let (meta, listing) = match event {
            Ok(Event::Init) => {
                seen = Some(HashSet::default());
                continue;
            }
            Ok(Event::InitApply(m)) => (m, true),
            Ok(Event::Apply(m)) => (m, false),
            Ok(Event::Delete(m)) => {
                let key = secret_key(&m.metadata);
                known.remove(&key);
                changed(&key, &m.metadata);
                continue;
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = seen.take()
                    && !first
                {
                    let gone: Vec<_> = known
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        if let Some(meta) = known.remove(&key) {
                            changed(&key, &meta);
                        }
                    }
                }
                first = false;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "secret watch error; retrying with backoff");
                continue;
            }
        };
        let key = secret_key(&meta.metadata);
        if listing && let Some(seen) = &mut seen {
            seen.insert(key.clone());
        }
        let mut metadata = meta.metadata;
        metadata.managed_fields = None;
        let rv = metadata.resource_version.clone();
        let before = known.insert(key.clone(), metadata);
        if !(listing && first)
            && before.map(|b| b.resource_version) != Some(rv)
            && let Some(m) = known.get(&key)
        {
            changed(&key, m);
        }
    }
}

fn secret_key(meta: &kube::api::ObjectMeta) -> ObjectRef<Secret> {
    let r = ObjectRef::<Secret>::new(meta.name.as_deref().unwrap_or_default());
    match &meta.namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// The Secrets trigger of a controller: which Secrets an object references (the user's
/// function, and the index of it the feeder keeps current), or the user's predicate.
pub(crate) struct SecretTrigger<K: ManagedResource> {
    by: SecretsBy<K>,
    index: std::sync::Mutex<SecretIndex<K>>,
}

impl<K: ManagedResource> SecretTrigger<K> {
    pub(crate) fn new(by: SecretsBy<K>) -> Self {
        Self {
            by,
            index: std::sync::Mutex::default(),
        }
    }

    /// The objects Secret `secret` (of metadata `meta`) re-runs: its indexed referrers, or the
    /// objects of its namespace the predicate chooses.
    fn referrers(
        &self,
        shared: &Shared<K>,
        secret: &ObjectRef<Secret>,
        meta: &kube::api::ObjectMeta,
    ) -> Vec<ObjectRef<K>> {
        match &self.by {
            SecretsBy::Refs(_) => self.index().referrers(secret),
            SecretsBy::Matching(referenced) => shared
                .store
                .state()
                .into_iter()
                .filter(|o| o.meta().namespace.is_none() || o.meta().namespace == secret.namespace)
                .filter(|o| referenced(o, meta))
                .map(|o| ObjectRef::from_obj(o.as_ref()))
                .collect(),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, SecretIndex<K>> {
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A version of the object came in: index what it references now.
    pub(crate) fn observed(&self, key: &ObjectRef<K>, obj: &K) {
        if let SecretsBy::Refs(refs) = &self.by {
            let secrets = refs(obj);
            self.index().set(key, secrets);
        }
    }

    /// The object is gone.
    pub(crate) fn forget(&self, key: &ObjectRef<K>) {
        self.index().remove(key);
    }

    /// After a re-list of `namespace` (`None`: of every namespace): forget every object of it
    /// that the list did not hold.
    pub(crate) fn retain(
        &self,
        existing: &HashSet<ObjectRef<K>, ahash::RandomState>,
        namespace: Option<&str>,
    ) {
        self.index().retain(|k| {
            existing.contains(k) || namespace.is_some_and(|ns| k.namespace.as_deref() != Some(ns))
        });
    }
}
