//! What the runtime's health probes answer: [`Health`], read by the admin server's
//! `/healthz` and `/readyz` ([`crate::admin`], feature `operator`) and by
//! [`RuntimeHandle::health`](crate::runtime::RuntimeHandle::health).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::sharding::Shards;

/// What the probes answer from: set by the runtime as it starts and stops.
///
/// Live: the root supervisor and every controller's manager run, and none escalated. Ready:
/// started, every controller's first list is in its cache, not shutting down.
#[derive(Debug, Default)]
pub struct Health {
    /// Each controller's kind, whether its first list is in, and why the API server refuses
    /// its watch, if it does.
    kinds: Mutex<Vec<(String, Arc<AtomicBool>, WatchRefusal)>>,
    /// The supervisors: root first, then each manager.
    supervisors: Mutex<Vec<ractor::ActorCell>>,
    /// Tasks every reconcile depends on (each kind's timers), by name, and whether each runs.
    tasks: Mutex<Vec<(String, TaskCheck)>>,
    started: AtomicBool,
    /// A candidate waiting for the leader's Lease: ready (it holds what it should: nothing).
    standby: AtomicBool,
    stopping: AtomicBool,
    failed: AtomicBool,
    /// With sharding, the shards this replica holds.
    shards: OnceLock<Arc<Shards>>,
    /// Watch tasks that stopped and wait for their restart ([`crate::watch_tasks`]), by name,
    /// with why they stopped.
    watches_down: Mutex<std::collections::BTreeMap<String, String>>,
}

/// Whether a task runs ([`Health::add_task`]).
pub(crate) struct TaskCheck(pub(crate) Box<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for TaskCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if (self.0)() { "running" } else { "stopped" })
    }
}

/// Why the API server refuses a kind's list or watch (its answer's message, which names the
/// missing permission), while it does.
pub(crate) type WatchRefusal = Arc<Mutex<Option<String>>>;

/// A probe's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Whether the probe passes.
    pub ok: bool,
    /// What it found (the body of the answer).
    pub detail: String,
}

impl Health {
    pub(crate) fn add_supervisor(&self, cell: ractor::ActorCell) {
        self.supervisors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cell);
    }

    /// A task the runtime cannot work without: `/healthz` fails once it has stopped.
    pub(crate) fn add_task(&self, name: &str, alive: TaskCheck) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), alive));
    }

    /// The watch task `name` stopped (`why`): `/readyz` fails until [`Health::watch_up`].
    pub(crate) fn watch_down(&self, name: &str, why: &str) {
        self.watches_down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), why.to_string());
    }

    /// The watch task `name` runs again.
    pub(crate) fn watch_up(&self, name: &str) {
        self.watches_down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    pub(crate) fn add_kind(&self, kind: &str, synced: Arc<AtomicBool>, refused: WatchRefusal) {
        self.kinds.lock().unwrap_or_else(|e| e.into_inner()).push((
            kind.to_string(),
            synced,
            refused,
        ));
    }

    /// Each kind, and whether its first list is in the cache (for the metrics) (`false` while it lists, or while
    /// the API server refuses its list or watch).
    #[cfg(feature = "metrics")]
    pub(crate) fn kinds_synced(&self) -> Vec<(String, bool)> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds
            .iter()
            .map(|(k, synced, refused)| {
                let refused = refused.lock().unwrap_or_else(|e| e.into_inner()).is_some();
                (k.clone(), synced.load(Ordering::Acquire) && !refused)
            })
            .collect()
    }

    /// How many watch tasks stopped and wait for their restart (for the metrics).
    #[cfg(feature = "metrics")]
    pub(crate) fn watches_down(&self) -> usize {
        self.watches_down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub(crate) fn set_shards(&self, shards: Arc<Shards>) {
        let _ = self.shards.set(shards);
    }

    /// With sharding, the shards this replica holds now (empty without).
    pub fn shards_held(&self) -> Vec<u32> {
        self.shards.get().map(|s| s.held()).unwrap_or_default()
    }

    /// With sharding, how many shards there are (`None` without).
    pub fn shard_count(&self) -> Option<u32> {
        self.shards.get().map(|s| s.count())
    }

    pub(crate) fn set_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    pub(crate) fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Release);
    }

    /// Whether this replica waits for the leader's Lease.
    pub fn standby(&self) -> bool {
        self.standby.load(Ordering::Acquire)
    }

    /// Whether this replica runs the controllers now: started, not standing by, not stopping.
    pub fn leading(&self) -> bool {
        self.started.load(Ordering::Acquire)
            && !self.standby()
            && !self.stopping.load(Ordering::Acquire)
    }

    pub(crate) fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    pub(crate) fn set_failed(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// `/healthz`: the supervisors are alive.
    pub fn live(&self) -> Probe {
        if self.failed.load(Ordering::Acquire) {
            return Probe {
                ok: false,
                detail: "a manager escalated".into(),
            };
        }
        let supervisors = self.supervisors.lock().unwrap_or_else(|e| e.into_inner());
        let stopping = self.stopping.load(Ordering::Acquire);
        for s in supervisors.iter() {
            let status = s.get_status();
            if !stopping && status != ractor::ActorStatus::Running {
                return Probe {
                    ok: false,
                    detail: format!(
                        "supervisor {} is {status:?}",
                        s.get_name().unwrap_or_else(|| s.get_id().to_string())
                    ),
                };
            }
        }
        if !stopping {
            let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((name, _)) = tasks.iter().find(|(_, alive)| !(alive.0)()) {
                return Probe {
                    ok: false,
                    detail: format!("{name} stopped"),
                };
            }
        }
        Probe {
            ok: true,
            detail: "ok".into(),
        }
    }

    /// `/readyz`: started, every kind listed, no watch task down, not shutting down.
    pub fn ready(&self) -> Probe {
        if self.stopping.load(Ordering::Acquire) {
            return Probe {
                ok: false,
                detail: "shutting down".into(),
            };
        }
        if self.standby() {
            return Probe {
                ok: true,
                detail: "standby: another replica leads".into(),
            };
        }
        if !self.started.load(Ordering::Acquire) {
            return Probe {
                ok: false,
                detail: "starting".into(),
            };
        }
        {
            let down = self.watches_down.lock().unwrap_or_else(|e| e.into_inner());
            if !down.is_empty() {
                let list: Vec<String> =
                    down.iter().map(|(n, why)| format!("{n} ({why})")).collect();
                return Probe {
                    ok: false,
                    detail: format!("watch tasks restarting: {}", list.join(", ")),
                };
            }
        }
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let listing: Vec<String> = kinds
            .iter()
            .filter_map(|(k, synced, refused)| {
                // Refused after its first list too: a kind whose CRD was deleted, or whose
                // permission was revoked, is not watched now.
                match refused.lock().unwrap_or_else(|e| e.into_inner()).as_deref() {
                    Some(why) => Some(format!("{k} (refused: {why})")),
                    None => (!synced.load(Ordering::Acquire)).then(|| k.clone()),
                }
            })
            .collect();
        if listing.is_empty() {
            let detail = match self.shard_count() {
                // A replica holding no shard is ready too: it takes shards as others leave.
                Some(n) => {
                    let held = self.shards_held();
                    let list: Vec<String> = held.iter().map(u32::to_string).collect();
                    format!(
                        "ok; shards held: {} of {n} [{}]",
                        held.len(),
                        list.join(",")
                    )
                }
                None => "ok".into(),
            };
            Probe { ok: true, detail }
        } else {
            Probe {
                ok: false,
                detail: format!("kinds not listed: {}", listing.join(", ")),
            }
        }
    }
}
