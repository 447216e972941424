//! "Why is it not Ready?", answered from the runtime's own memory: what one object's actor
//! knows now — whether it is live or passive, why its last reconcile ran, what each step of it
//! returned and how long it took, its next wake-up and why, its error backoff, what it waits
//! on and what holds it, and which shard and replica run it. Not reconstructed from the status:
//! the status says what the last reconcile concluded; this says what the runtime is doing.
//!
//! Turned on with [`RuntimeBuilder::introspection`](crate::runtime::RuntimeBuilder::introspection),
//! which serves it on an address of its own, never the probes' (see [`crate::admin`]):
//!
//! - `GET /objects/<Kind>/<namespace>/<name>` (a cluster-scoped kind: `/objects/<Kind>/<name>`):
//!   the object's [`ObjectReport`] as JSON, or 404 if the runtime does not have it;
//! - `GET /objects`: the kinds it serves.
//!
//! `actorcile why --addr <addr> <Kind> <namespace>/<name>` prints a report as a tree
//! ([`ObjectReport::tree`]).
//!
//! Read-only and bounded: one object per request, at most [`MAX_STEPS`] steps and
//! [`MAX_TEXT`] bytes of any message. What it shows are names and the runtime's own figures;
//! a Secret's data never reaches it (a Secret appears only as the name of what triggered a
//! reconcile). Names of objects are shown to whoever reaches the address: keep it on loopback
//! or behind the same access as the operator's logs.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::provisioners::StepRun;
use crate::triggers::Trigger;

/// The most steps a report lists for one reconcile.
pub const MAX_STEPS: usize = crate::provisioners::step_log::StepLog::MAX;

/// The most bytes of any message a report carries (a longer one is cut, with `…`).
pub const MAX_TEXT: usize = 512;

/// What the runtime knows of one object now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectReport {
    /// The object's kind.
    pub kind: String,
    /// Its namespace (`None` when cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// `metadata.generation` of the cached object.
    pub generation: Option<i64>,
    /// Whether its deletion began.
    pub deleting: bool,
    /// `live` (an actor serves it now), `passive` (no actor; it is re-activated when something
    /// happens to it or its wake-up is due), or `undecodable` (its cached version does not fit
    /// the kind's type).
    pub actor: String,
    /// Its Ready condition as the cached status has it.
    pub ready: Option<ReadyReport>,
    /// The last reconcile this process ran of it (none since the runtime started, or since it
    /// was last activated here).
    pub last_reconcile: Option<ReconcileReport>,
    /// Its next wake-up, if one is armed.
    pub next_wake: Option<WakeReport>,
    /// Failures in a row (the error backoff's position; 0 after a success).
    pub error_attempts: u32,
    /// The reference targets it waits on to become Ready (`Kind namespace/name`).
    pub waits_on: Vec<String>,
    /// The targets its references hold (their deletion waits for it).
    pub holds: Vec<String>,
    /// The objects whose references hold it (its deletion waits for them).
    pub referrers: Vec<String>,
    /// With sharding: its shard, and whether this replica holds it.
    pub shard: Option<ShardReport>,
    /// This replica (the runtime's lock holder id: the Pod's name and a suffix).
    pub replica: String,
}

/// A Ready condition, in brief.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyReport {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The condition's reason.
    pub reason: String,
    /// Its message (at most [`MAX_TEXT`] bytes).
    pub message: String,
    /// The generation it was written for.
    pub observed_generation: Option<i64>,
}

/// One reconcile, as the runtime saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// Why it ran.
    pub trigger: Trigger,
    /// The object that caused it, when one did (`Secret shop/tls`).
    pub trigger_object: Option<String>,
    /// How it ended (`done`, `yield`, `waiting`, `failed`, `terminal`,
    /// `user_action_required`, `cancelled`; `skipped` when the ignore annotation stopped it).
    pub outcome: String,
    /// Whether it was a deprovision (the object being deleted).
    pub deprovision: bool,
    /// How long it took.
    #[serde(with = "humantime_serde")]
    pub took: Duration,
    /// How long ago it ended.
    #[serde(with = "humantime_serde")]
    pub ago: Duration,
    /// Each step that ran, in the order they ended (at most [`MAX_STEPS`]).
    pub steps: Vec<StepRun>,
}

/// An armed wake-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeReport {
    /// How long until it is due.
    #[serde(with = "humantime_serde")]
    pub due_in: Duration,
    /// What it is for: `yield`, `requeue`, `poll`, `backoff` or `again`.
    pub trigger: Trigger,
}

/// An object's shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    /// The shard.
    pub shard: u32,
    /// Whether this replica holds it (runs its objects).
    pub held_here: bool,
}

impl ObjectReport {
    /// The report as a tree for a terminal, e.g.:
    ///
    /// ```text
    /// Cluster team-a/web (generation 3)
    /// ├─ actor: live on replica op-0-3fa2c1d0
    /// ├─ ready: False Provisioning "waiting for Network team-a/net"
    /// ├─ last reconcile: waiting after 12ms, 2.0s ago (trigger: spec)
    /// │  ├─ network: waiting Waiting 1ms
    /// │  └─ nodes: done 10ms
    /// ├─ next wake-up: in 28.0s (requeue)
    /// └─ waits on: Network team-a/net
    /// ```
    pub fn tree(&self) -> String {
        let mut lines: Vec<(String, Vec<String>)> = Vec::new();
        let actor = format!("{} on replica {}", self.actor, self.replica);
        lines.push((format!("actor: {actor}"), Vec::new()));
        if let Some(r) = &self.ready {
            lines.push((
                format!("ready: {} {} {:?}", r.status, r.reason, r.message),
                Vec::new(),
            ));
        }
        match &self.last_reconcile {
            Some(r) => {
                let what = if r.deprovision {
                    "last deprovision"
                } else {
                    "last reconcile"
                };
                let cause = match &r.trigger_object {
                    Some(o) => format!("{} {o}", r.trigger),
                    None => r.trigger.to_string(),
                };
                let steps = r
                    .steps
                    .iter()
                    .map(|s| {
                        let reason = s
                            .reason
                            .as_deref()
                            .map(|r| format!(" {r}"))
                            .unwrap_or_default();
                        format!("{}: {}{reason} {}", s.name, s.outcome, short(s.took))
                    })
                    .collect();
                lines.push((
                    format!(
                        "{what}: {} after {}, {} ago (trigger: {cause})",
                        r.outcome,
                        short(r.took),
                        short(r.ago)
                    ),
                    steps,
                ));
            }
            None => lines.push(("last reconcile: none here yet".into(), Vec::new())),
        }
        if let Some(w) = &self.next_wake {
            lines.push((
                format!("next wake-up: in {} ({})", short(w.due_in), w.trigger),
                Vec::new(),
            ));
        }
        if self.error_attempts > 0 {
            lines.push((
                format!("error backoff: {} failures in a row", self.error_attempts),
                Vec::new(),
            ));
        }
        for (label, list) in [
            ("waits on", &self.waits_on),
            ("holds", &self.holds),
            ("held by", &self.referrers),
        ] {
            if !list.is_empty() {
                lines.push((format!("{label}: {}", list.join(", ")), Vec::new()));
            }
        }
        if let Some(s) = &self.shard {
            let here = if s.held_here {
                "held here"
            } else {
                "not held here"
            };
            lines.push((format!("shard: {} ({here})", s.shard), Vec::new()));
        }
        let mut out = match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        };
        if let Some(g) = self.generation {
            out.push_str(&format!(" (generation {g})"));
        }
        if self.deleting {
            out.push_str(" (being deleted)");
        }
        out.push('\n');
        let n = lines.len();
        for (i, (line, children)) in lines.into_iter().enumerate() {
            let last = i + 1 == n;
            out.push_str(if last { "└─ " } else { "├─ " });
            out.push_str(&line);
            out.push('\n');
            let m = children.len();
            for (j, child) in children.into_iter().enumerate() {
                out.push_str(if last { "   " } else { "│  " });
                out.push_str(if j + 1 == m { "└─ " } else { "├─ " });
                out.push_str(&child);
                out.push('\n');
            }
        }
        out
    }
}

/// A duration as a person reads it: `850µs`, `12ms`, `3.2s`, `4m10s`.
fn short(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{}µs", d.as_micros())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}m{}s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

/// `text`, cut to at most [`MAX_TEXT`] bytes on a character boundary.
pub(crate) fn bounded(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_string();
    }
    let mut end = MAX_TEXT - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Reports one kind's objects: `(namespace, name)` to the report, `None` if it is not cached.
pub(crate) type KindReporter =
    Box<dyn Fn(Option<&str>, &str) -> Option<ObjectReport> + Send + Sync>;

/// The runtime's introspection: each controller's reporter, by kind.
#[derive(Default)]
pub struct Introspection {
    kinds: RwLock<Vec<(String, KindReporter)>>,
}

impl std::fmt::Debug for Introspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Introspection")
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl Introspection {
    /// No kinds yet: each controller adds its own as it starts.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub(crate) fn add(&self, kind: &str, reporter: KindReporter) {
        let mut kinds = self.kinds.write().unwrap_or_else(|e| e.into_inner());
        kinds.retain(|(k, _)| k != kind);
        kinds.push((kind.to_string(), reporter));
    }

    /// The kinds it reports on.
    pub fn kinds(&self) -> Vec<String> {
        let kinds = self.kinds.read().unwrap_or_else(|e| e.into_inner());
        kinds.iter().map(|(k, _)| k.clone()).collect()
    }

    /// The report of one object of `kind` (its `Kind`, in any case), if the runtime has it.
    pub fn object(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<ObjectReport> {
        let kinds = self.kinds.read().unwrap_or_else(|e| e.into_inner());
        let (_, reporter) = kinds.iter().find(|(k, _)| k.eq_ignore_ascii_case(kind))?;
        reporter(namespace, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_TEXT && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn a_report_prints_as_a_tree() {
        let report = ObjectReport {
            kind: "Cluster".into(),
            namespace: Some("team-a".into()),
            name: "web".into(),
            generation: Some(3),
            deleting: false,
            actor: "live".into(),
            ready: Some(ReadyReport {
                status: "False".into(),
                reason: "Provisioning".into(),
                message: "waiting for Network team-a/net".into(),
                observed_generation: Some(3),
            }),
            last_reconcile: Some(ReconcileReport {
                trigger: Trigger::Spec,
                trigger_object: None,
                outcome: "waiting".into(),
                deprovision: false,
                took: Duration::from_millis(12),
                ago: Duration::from_secs(2),
                steps: vec![
                    StepRun {
                        name: "network".into(),
                        outcome: "waiting".into(),
                        reason: Some("Waiting".into()),
                        took: Duration::from_millis(1),
                    },
                    StepRun {
                        name: "nodes".into(),
                        outcome: "done".into(),
                        reason: None,
                        took: Duration::from_millis(10),
                    },
                ],
            }),
            next_wake: Some(WakeReport {
                due_in: Duration::from_secs(28),
                trigger: Trigger::Requeue,
            }),
            error_attempts: 0,
            waits_on: vec!["Network team-a/net".into()],
            holds: vec![],
            referrers: vec![],
            shard: None,
            replica: "op-0-3fa2c1d0".into(),
        };
        let expected = "\
Cluster team-a/web (generation 3)
├─ actor: live on replica op-0-3fa2c1d0
├─ ready: False Provisioning \"waiting for Network team-a/net\"
├─ last reconcile: waiting after 12ms, 2.0s ago (trigger: spec)
│  ├─ network: waiting Waiting 1ms
│  └─ nodes: done 10ms
├─ next wake-up: in 28.0s (requeue)
└─ waits on: Network team-a/net
";
        assert_eq!(report.tree(), expected);
        let json = serde_json::to_string(&report).unwrap();
        let back: ObjectReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report, "the CLI reads back what the endpoint writes");
    }
}
