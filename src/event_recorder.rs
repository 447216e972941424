//! The Kubernetes Events of one controller: kube-runtime's [`Recorder`], split by object, with
//! each object's Event budget ([`EventBudget`]) and notes that are bounded and sanitised.
//!
//! Every Event of a controller goes through here, the runtime's and a step's
//! ([`Context::event`](crate::provisioners::Context::event)) alike: it takes one of the object's
//! budget (a flapping object cannot flood the API server), and its note is cut to what the API
//! server accepts. Text the runtime did not write itself (error chains, panic messages, a step's
//! note) is [sanitised](sanitise) by the caller first: quoted text (where serde and the API
//! server put the values they could not take, so a Secret's content could otherwise reach an
//! Event) and control characters are masked. The raw error chain goes to the logs only.
//!
//! A [`Recorder`] keeps every Event it published in the last six minutes, so that a repeat
//! (same object, type, reason and action) patches the first one's `series` count instead
//! of creating another Event; and on every publish it drops the expired entries by walking its
//! whole cache. kube-runtime means a recorder to live for one reconcile, where that cache holds
//! a few entries. A runtime keeps one per controller for its whole life (a repeat must find the
//! earlier Event whatever reconcile published it), so one recorder's cache would hold an entry per
//! object with an Event in the last six minutes, and each publish would walk all of them:
//! quadratic in the objects (at 10 000 objects, about a fifth of a replica's CPU in the
//! example operator).
//!
//! Not written anew, as kube-runtime's recorder is what makes the Events (names, series,
//! reporting fields) and is maintained with the Events API; only its cache is split:
//! [`SHARDS`] recorders, every object's Events through the same one (so its repeats still make
//! a series), each publish walking one recorder's entries only.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use tokio::time::Instant;

use crate::event_budget::EventBudget;

/// An Event's note holds at most 1 KiB (bytes, not characters).
pub(crate) const MAX_EVENT_NOTE: usize = 1024;

/// How many recorders a controller's Events are split across. At a million objects with an
/// Event each in six minutes, a publish walks about 4 000 entries.
pub(crate) const SHARDS: usize = 256;

/// How long a [`Recorder`] keeps an Event to count its repeats (kube-runtime's `CACHE_TTL`).
const KEPT: Duration = Duration::from_secs(6 * 60);

/// How often recorders that published nothing for [`KEPT`] are emptied.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Publishes a controller's Events (see the [module docs](self)).
///
/// A recorder drops expired Events only when it publishes, so one that went quiet (an
/// operator idle after a burst of objects turning Ready) would hold its last six minutes of
/// Events (a whole Event and its key each) for good. A task replaces every recorder that
/// published nothing for [`KEPT`] with an empty one (all its Events had expired); it ends with
/// the `EventRecorder`.
pub(crate) struct EventRecorder {
    shards: Arc<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    /// Each object's Event budget, by namespace and name.
    budget: EventBudget<(Option<String>, String)>,
}

struct Shard {
    recorder: Recorder,
    /// When it last published; `None` when it holds no Event.
    last: Option<Instant>,
}

impl EventRecorder {
    /// Must be called inside a tokio runtime (it spawns the sweeping task).
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        let fresh = move || Recorder::new(client.clone(), reporter.clone());
        let shards: Arc<[Mutex<Shard>]> = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    recorder: fresh(),
                    last: None,
                })
            })
            .collect();
        tokio::spawn(sweep(Arc::downgrade(&shards), fresh));
        Self {
            shards,
            hasher: ahash::RandomState::new(),
            budget: EventBudget::default(),
        }
    }

    fn budget_key(regarding: &ObjectReference) -> (Option<String>, String) {
        (
            regarding.namespace.clone(),
            regarding.name.clone().unwrap_or_default(),
        )
    }

    /// Take one Event of the budget of the object `regarding` refers to: `false` when it has
    /// none left now (publish nothing then).
    pub(crate) fn admit(&self, regarding: &ObjectReference) -> bool {
        self.budget
            .take(&Self::budget_key(regarding), Instant::now())
    }

    /// The object is gone: its budget starts full if it comes back.
    pub(crate) fn forget(&self, regarding: &ObjectReference) {
        self.budget.forget(&Self::budget_key(regarding));
    }

    /// The recorder of the object `regarding` refers to.
    fn shard(&self, regarding: &ObjectReference) -> usize {
        let key = (regarding.namespace.as_deref(), regarding.name.as_deref());
        (self.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    /// Publish `ev` about the object `regarding` refers to ([`Recorder::publish`]), its note
    /// cut to [`MAX_EVENT_NOTE`] bytes. The budget is the caller's to check first
    /// ([`EventRecorder::admit`]), and text the runtime did not write its to [`sanitise`].
    pub(crate) async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let clean;
        let ev = match &ev.note {
            Some(note) if note.len() > MAX_EVENT_NOTE => {
                clean = Event {
                    type_: ev.type_,
                    reason: ev.reason.clone(),
                    note: Some(crate::status::prefix_within(note, MAX_EVENT_NOTE).to_string()),
                    action: ev.action.clone(),
                    secondary: ev.secondary.clone(),
                };
                &clean
            }
            _ => ev,
        };
        let recorder = {
            let mut shard = lock(&self.shards[self.shard(regarding)]);
            shard.last = Some(Instant::now());
            shard.recorder.clone()
        };
        recorder.publish(ev, regarding).await
    }
}

/// `text` as an Event may carry it: every quoted span (`"…"`, `'…'`, `` `…` ``) masked as `"…"`,
/// control characters as spaces, and at most [`MAX_EVENT_NOTE`] bytes (cut on a character
/// boundary). serde's errors quote the value they could not decode, and the API server's the
/// value it refused: in an Event, readable by everyone who can read the object's namespace, that
/// value could be a Secret's. The names the runtime's own messages quote are masked too; the
/// logs keep the whole text.
pub(crate) fn sanitise(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_EVENT_NOTE));
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for c in text.chars() {
        match quote {
            Some(q) if c == q => {
                quote = None;
                out.push_str("\"…\"");
            }
            Some(_) => {}
            // A quote opens a span only at a word's start: "don't" keeps its apostrophe.
            None if matches!(c, '"' | '`') || (c == '\'' && !prev.is_alphanumeric()) => {
                quote = Some(c);
            }
            None if c.is_control() => out.push(' '),
            None => out.push(c),
        }
        prev = c;
        if out.len() >= MAX_EVENT_NOTE {
            break;
        }
    }
    if quote.is_some() {
        out.push_str("\"…");
    }
    crate::status::prefix_within(&out, MAX_EVENT_NOTE).to_string()
}

fn lock(shard: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    // A panic while holding it leaves nothing half-written (two plain assignments).
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every [`SWEEP_EVERY`], empty the recorders that published nothing for [`KEPT`]; ends when
/// the [`EventRecorder`] is dropped.
async fn sweep(shards: Weak<[Mutex<Shard>]>, fresh: impl Fn() -> Recorder) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shards) = shards.upgrade() else {
            return;
        };
        for shard in shards.iter() {
            let mut shard = lock(shard);
            if shard.last.is_some_and(|t| t.elapsed() > KEPT) {
                shard.recorder = fresh();
                shard.last = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_and_control_characters_are_masked_and_notes_bounded() {
        let serde = serde_json::from_str::<i32>("\"s3cr3t\"")
            .unwrap_err()
            .to_string();
        assert!(serde.contains("s3cr3t"), "serde quotes the value: {serde}");
        let clean = sanitise(&format!("decoding failed: {serde}"));
        assert!(!clean.contains("s3cr3t"), "{clean}");
        assert!(
            clean.starts_with("decoding failed: invalid type: string"),
            "{clean}"
        );
        assert_eq!(sanitise("a `b` and 'c' here"), "a \"…\" and \"…\" here");
        assert_eq!(sanitise("don't\nstop"), "don't stop");
        assert_eq!(sanitise("open \"tail"), "open \"…");
        let long = sanitise(&"é".repeat(2000));
        assert!(long.len() <= MAX_EVENT_NOTE && long.len() > MAX_EVENT_NOTE - 2);
    }
    use crate::cluster::ApiServer;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::EventType;

    fn regarding(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn provisioned() -> Event {
        Event {
            type_: EventType::Normal,
            reason: "Provisioned".into(),
            note: Some("ready".into()),
            action: "Provision".into(),
            secondary: None,
        }
    }

    #[tokio::test]
    async fn objects_spread_over_the_recorders_and_each_keeps_one() {
        let cluster = ApiServer::new();
        let recorder = EventRecorder::new(cluster.client(), Reporter::from("test".to_string()));
        let used: std::collections::HashSet<usize> = (0..4096)
            .map(|i| recorder.shard(&regarding(&format!("o{i}"))))
            .collect();
        // 4 096 keys over 256 recorders: all but a handful used (a constant or a poor hash
        // would use a few).
        assert!(used.len() > 240, "{} recorders used", used.len());
        let one = regarding("o1");
        assert_eq!(recorder.shard(&one), recorder.shard(&one.clone()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorder_quiet_for_longer_than_it_keeps_events_is_emptied() {
        let cluster = ApiServer::new();
        let recorder = EventRecorder::new(cluster.client(), Reporter::from("test".to_string()));
        let ev = provisioned();
        let old = regarding("old");
        let new = (0..)
            .map(|i| regarding(&format!("new{i}")))
            .find(|r| recorder.shard(r) != recorder.shard(&old))
            .unwrap();
        let holds = |r: &ObjectReference| lock(&recorder.shards[recorder.shard(r)]).last.is_some();
        recorder.publish(&ev, &old).await.unwrap();
        tokio::time::sleep(KEPT - SWEEP_EVERY).await;
        recorder.publish(&ev, &new).await.unwrap();
        // Sweeps ran meanwhile; `old` is past KEPT only after the next ones.
        assert!(holds(&old) && holds(&new));
        tokio::time::sleep(SWEEP_EVERY * 2 + Duration::from_secs(1)).await;
        assert!(!holds(&old), "the quiet recorder is emptied");
        assert!(
            holds(&new),
            "the recorder that published within KEPT keeps its Events"
        );
    }

    #[tokio::test]
    async fn a_repeat_is_a_series_and_other_objects_get_their_own_events() {
        let cluster = ApiServer::new();
        let client = cluster.client();
        let recorder = EventRecorder::new(client.clone(), Reporter::from("test".to_string()));
        let ev = provisioned();
        for name in ["a", "b", "c"] {
            recorder.publish(&ev, &regarding(name)).await.unwrap();
        }
        recorder.publish(&ev, &regarding("a")).await.unwrap();
        let events: kube::Api<K8sEvent> = kube::Api::namespaced(client, "default");
        let mut seen: Vec<(String, i32)> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|e| {
                let name = e.regarding.as_ref().and_then(|r| r.name.clone());
                (name.unwrap(), e.series.as_ref().map_or(1, |s| s.count))
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            [("a".into(), 2), ("b".into(), 1), ("c".into(), 1)],
            "one Event per object; the repeat counted in the first one's series"
        );
    }
}
