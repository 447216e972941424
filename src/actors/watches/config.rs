//! The provider config's watch: the config as the reconciles read it, kept across a restart of the
//! watch, and every object re-run when it changes.

use super::*;

/// A controller's provider config as its reconciles see it (the config's type erased).
pub(crate) trait ConfigView: Send + Sync {
    /// The config object now (`None`: it does not exist).
    fn current(&self) -> Option<Arc<dyn Any + Send + Sync>>;
    /// The poll interval the config gives, if it gives one.
    fn poll_interval(&self) -> Option<Duration>;
    /// `namespace/name` of the config, for status messages.
    fn describe(&self) -> &str;
    /// The field at which the config could not be decoded as its type, while it cannot (then
    /// [`ConfigView::current`] is `None`: provisioning waits as for a missing config).
    fn unreadable(&self) -> Option<String>;
}

/// The config as the reconciles read it, and what its watch decides by. It outlives the watch:
/// a watch that is started again (after a panic) goes on from it, so the config does not read
/// as missing meanwhile and a change made while no watch ran still re-runs every object.
struct ConfigState<C: Resource<DynamicType = ()> + 'static> {
    /// The config object as last listed or watched. One object by name, so a slot rather than a
    /// reflector's store: a store has one writer, which a watch task that panicked takes with
    /// it.
    slot: std::sync::RwLock<Option<Arc<C>>>,
    /// What the last list or event showed (its version and unreadable field): a list after a
    /// restart that shows something else re-runs every object. `None` until the first list.
    last: std::sync::Mutex<Option<ConfigSeen>>,
    key: ObjectRef<C>,
    poll_from: Option<PollFrom<C>>,
    described: String,
    /// The last out-of-range poll interval the config gave that was logged.
    warned: std::sync::Mutex<Option<Duration>>,
    /// Set while the config's newest version cannot be decoded as `C`: the field the decoder
    /// named ([`Undecodable::field`](crate::lenient::Undecodable)).
    unreadable: std::sync::Mutex<Option<String>>,
}

/// A config's version ([`config_version`], `None` without one) and the field at which it could
/// not be decoded.
type ConfigSeen = (Option<(Option<String>, Option<String>)>, Option<String>);

impl<C: Resource<DynamicType = ()> + 'static> ConfigState<C> {
    fn get(&self) -> Option<Arc<C>> {
        self.slot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, config: Option<C>) {
        *self.slot.write().unwrap_or_else(|e| e.into_inner()) = config.map(Arc::new);
    }
}

/// The shortest poll interval a config object may give: shorter ones (`pollSeconds: 0`) would
/// re-run every object without pause.
pub(crate) const MIN_CONFIG_POLL: Duration = Duration::from_secs(1);

impl<C> ConfigView for ConfigState<C>
where
    C: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn current(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        if self.unreadable().is_some() {
            return None;
        }
        self.get().map(|c| c as Arc<dyn Any + Send + Sync>)
    }
    fn poll_interval(&self) -> Option<Duration> {
        let f = self.poll_from.as_ref()?;
        let given = f(self.get()?.as_ref())?;
        let bounded = given.clamp(MIN_CONFIG_POLL, crate::policy::MAX_DURATION);
        if bounded != given {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            if *warned != Some(given) {
                *warned = Some(given);
                tracing::warn!(
                    config = %self.described,
                    given = ?given,
                    used = ?bounded,
                    "the config's poll interval is out of range (1 s to 1 year); using the nearest bound"
                );
            }
        }
        Some(bounded)
    }
    fn describe(&self) -> &str {
        &self.described
    }
    fn unreadable(&self) -> Option<String> {
        self.unreadable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Starts the config watch once the manager exists (again, after a panic, from where the last
/// left off): `broadcast` re-runs every object, `listed` is set once a first list is in.
pub(crate) type StartConfigWatch =
    Box<dyn Fn(Arc<dyn Fn() + Send + Sync>, Arc<watch::Sender<bool>>) -> JoinHandle<()> + Send>;

impl crate::actors::ConfigSpec {
    /// The view of the config `cref` names, and what starts its watch
    /// ([`Controller::config`](crate::runtime::Controller::config)).
    pub(crate) fn trigger<C: ManagedResource>(
        client: &Client,
        cref: ConfigRef<C>,
    ) -> (Arc<dyn ConfigView>, StartConfigWatch) {
        config_trigger(client, cref)
    }
}

/// The view of the config `cref` names, and what starts its watch.
pub(crate) fn config_trigger<C>(
    client: &Client,
    cref: ConfigRef<C>,
) -> (Arc<dyn ConfigView>, StartConfigWatch)
where
    C: ManagedResource,
{
    let key = match &cref.namespace {
        Some(ns) => ObjectRef::new(&cref.name).within(ns),
        None => ObjectRef::new(&cref.name),
    };
    let view = Arc::new(ConfigState {
        slot: Default::default(),
        last: Default::default(),
        key: key.clone(),
        poll_from: cref.poll_from.clone(),
        described: cref.describe(),
        warned: Default::default(),
        unreadable: Default::default(),
    });
    // By name in its namespace: what RBAC can grant by `resourceNames`.
    let fields = format!("metadata.name={}", cref.name);
    let api: Api<Lenient<C>> =
        crate::object_api::kind_api(client.clone(), cref.namespace.as_deref());
    let config = watcher::Config::default().fields(&fields);
    let secrets = cref.secrets_from.clone().map(|refs| {
        let api: Api<PartialObjectMeta<Secret>> = match &cref.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        (api, refs)
    });
    let state = view.clone();
    let start: StartConfigWatch = Box::new(move |broadcast, listed| {
        let (api, config, state, secrets, key) = (
            api.clone(),
            config.clone(),
            state.clone(),
            secrets.clone(),
            key.clone(),
        );
        tokio::spawn(async move {
            let config_watch = watch_config(api, config, state.clone(), broadcast.clone(), listed);
            match secrets {
                None => config_watch.await,
                Some((api, refs)) => {
                    // A Secret the config names now: every object runs again.
                    let changed = move |secret: &ObjectRef<Secret>, _: &kube::api::ObjectMeta| {
                        if state
                            .get()
                            .is_some_and(|c| refs(c.as_ref()).contains(secret))
                        {
                            tracing::info!(config = %key, secret = %secret, "a Secret of the provider config changed; re-running every object");
                            broadcast();
                        }
                    };
                    tokio::join!(
                        config_watch,
                        super::secrets::watch_secret_changes(api, changed)
                    );
                }
            }
        })
    });
    (view, start)
}

/// What identifies a version of the config that its users would act on: its uid and its
/// generation (its resourceVersion for kinds without one, such as ConfigMaps), so that a
/// config's own status updates do not re-run every object.
fn config_version<C: Resource>(c: &C) -> (Option<String>, Option<String>) {
    let m = c.meta();
    let version = m
        .generation
        .map(|g| g.to_string())
        .or_else(|| m.resource_version.clone());
    (m.uid.clone(), version)
}

async fn watch_config<C>(
    api: Api<Lenient<C>>,
    config: watcher::Config,
    state: Arc<ConfigState<C>>,
    broadcast: Arc<dyn Fn() + Send + Sync>,
    listed: Arc<watch::Sender<bool>>,
) where
    C: ManagedResource,
{
    let events = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(events);
    // The config a list in progress found (`None` outside a list).
    let mut listing: Option<Option<C>> = None;
    let key = &state.key;
    let set_unreadable = |field: Option<String>| {
        *state.unreadable.lock().unwrap_or_else(|e| e.into_inner()) = field;
    };
    let undecodable = |u: &crate::lenient::Undecodable| {
        tracing::error!(config = %key, field = %u.field, "the provider config cannot be decoded as its type; provisioning waits until it can");
        set_unreadable(Some(u.field.clone()));
    };
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            // The store keeps the config it had: a transient error drops nothing.
            Err(e) => {
                tracing::warn!(error = %e, config = %key, "config watch error; retrying with backoff");
                continue;
            }
        };
        // A version the type cannot hold reads as no config (provisioning waits, and its
        // status says why) until a version it can hold comes.
        match event {
            Event::Init => {
                set_unreadable(None);
                listing = Some(None);
                continue;
            }
            Event::InitApply(Lenient::Decoded(c)) => {
                set_unreadable(None);
                listing = Some(Some(c));
                continue;
            }
            Event::InitApply(Lenient::Undecodable(u)) => {
                undecodable(&u);
                listing = Some(None);
                continue;
            }
            Event::InitDone => state.set(listing.take().flatten()),
            Event::Apply(Lenient::Decoded(c)) => {
                set_unreadable(None);
                state.set(Some(c));
            }
            Event::Apply(Lenient::Undecodable(u)) => {
                undecodable(&u);
            }
            Event::Delete(_) => {
                set_unreadable(None);
                state.set(None);
            }
        }
        let now = (
            state.get().map(|c| config_version(c.as_ref())),
            state.unreadable(),
        );
        let before = state
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(now.clone());
        listed.send_replace(true);
        // The first list ever only tells what there is; after it, a list or event that shows
        // another version (a change meanwhile, when the watch started again) re-runs every
        // object.
        if before.is_some_and(|before| before != now) {
            tracing::info!(config = %key, "provider config changed; re-running every object");
            broadcast();
        }
    }
}
