//! The Kubernetes Events of one controller: kube-runtime's [`Recorder`], split by object.
//!
//! A [`Recorder`] keeps every Event it published in the last six minutes, so that a repeat
//! (same object, reason, action, type and note) patches the first one's `series` count instead
//! of creating another Event; and on every publish it drops the expired entries by walking its
//! whole cache. kube-runtime means a recorder to live for one reconcile, where that cache holds
//! a few entries. A runtime keeps one per controller for its whole life (a repeat must find the
//! earlier Event whatever pass published it), so one recorder's cache would hold an entry per
//! object with an Event in the last six minutes, and each publish would walk all of them:
//! quadratic in the objects (measured at 10 000 objects: about a tenth of a replica's CPU).
//!
//! Not written anew, as kube-runtime's recorder is what makes the Events (names, series,
//! reporting fields) and is maintained with the Events API; only its cache is split:
//! [`SHARDS`] recorders, every object's Events through the same one (so its repeats still make
//! a series), each publish walking one recorder's entries only.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

/// How many recorders a controller's Events are split across. At a million objects with an
/// Event each in six minutes, a publish walks about 4 000 entries.
pub(crate) const SHARDS: usize = 256;

/// Publishes a controller's Events (see the [module docs](self)).
pub(crate) struct EventRecorder {
    recorders: Box<[Recorder]>,
    hasher: ahash::RandomState,
}

impl EventRecorder {
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            recorders: (0..SHARDS)
                .map(|_| Recorder::new(client.clone(), reporter.clone()))
                .collect(),
            hasher: ahash::RandomState::new(),
        }
    }

    /// The recorder of the object `regarding` refers to.
    fn shard(&self, regarding: &ObjectReference) -> usize {
        let key = (regarding.namespace.as_deref(), regarding.name.as_deref());
        (self.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    /// Publish `ev` about the object `regarding` refers to ([`Recorder::publish`]).
    pub(crate) async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.recorders[self.shard(regarding)]
            .publish(ev, regarding)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[tokio::test]
    async fn a_repeat_is_a_series_and_other_objects_get_their_own_events() {
        let cluster = ApiServer::new();
        let client = cluster.client();
        let recorder = EventRecorder::new(client.clone(), Reporter::from("test".to_string()));
        let ev = Event {
            type_: EventType::Normal,
            reason: "Provisioned".into(),
            note: Some("ready".into()),
            action: "Provision".into(),
            secondary: None,
        };
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
