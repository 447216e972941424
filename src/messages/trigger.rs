//! Why a reconcile runs: a [`Trigger`] (a few fixed values, a metric label) and the [`Cause`]
//! that carries it with the object it names, if any (a related object, a Secret, a reference).

use std::sync::Arc;

/// Why a reconcile ran, as its span's `trigger` attribute and the `trigger` label of
/// `actorcile_reconcile_triggers_total`. When several things make one reconcile due before it
/// starts, the first is the one recorded (the rest coalesce into the same run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Trigger {
    /// The object is new to this process: its first event since the runtime started.
    Created,
    /// The object was in a list: the start-up list, or a relist after the watch lost its place.
    Listed,
    /// A new generation: someone changed the spec.
    Spec,
    /// The deletion began (`deletionTimestamp` set).
    Deletion,
    /// Someone else changed the object without a new generation (labels, annotations, status,
    /// finalizers).
    Changed,
    /// An owned child or a related object changed or went
    /// ([`Controller::owns`](crate::runtime::Controller::owns),
    /// [`Controller::watches`](crate::runtime::Controller::watches)); the cause names it.
    Related,
    /// A Secret the object references changed
    /// ([`Controller::secrets`](crate::runtime::Controller::secrets)); the cause names it.
    Secret,
    /// The controller's provider config changed, appeared or went
    /// ([`Controller::config`](crate::runtime::Controller::config)).
    Config,
    /// A reference target became Ready, or a referrer released the object; the cause names
    /// the other object.
    Reference,
    /// [`RuntimeHandle::reconcile`](crate::runtime::RuntimeHandle::reconcile) asked for it.
    External,
    /// The wake-up of a yield (a step asked to be run again later).
    Yield,
    /// The wake-up of a step's requeue or a wait on something outside the cluster.
    Requeue,
    /// The poll interval of a Ready object elapsed.
    Poll,
    /// The error backoff after a failed reconcile or status write elapsed.
    Backoff,
    /// The object's actor was restarted after a failure, once its restart backoff elapsed.
    Restart,
    /// This replica acquired the object's shard ([`crate::sharding`]).
    Shard,
    /// The last reconcile asked for another: a step met someone else's write, or the reconcile
    /// was cut because its object moved on.
    Again,
}

impl Trigger {
    /// Every trigger, in label order.
    pub const ALL: [Trigger; 17] = [
        Trigger::Created,
        Trigger::Listed,
        Trigger::Spec,
        Trigger::Deletion,
        Trigger::Changed,
        Trigger::Related,
        Trigger::Secret,
        Trigger::Config,
        Trigger::Reference,
        Trigger::External,
        Trigger::Yield,
        Trigger::Requeue,
        Trigger::Poll,
        Trigger::Backoff,
        Trigger::Restart,
        Trigger::Shard,
        Trigger::Again,
    ];

    /// The label value: `created`, `listed`, `spec`, `deletion`, `changed`, `related`,
    /// `secret`, `config`, `reference`, `external`, `yield`, `requeue`, `poll`, `backoff`,
    /// `restart`, `shard`, `again`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Created => "created",
            Trigger::Listed => "listed",
            Trigger::Spec => "spec",
            Trigger::Deletion => "deletion",
            Trigger::Changed => "changed",
            Trigger::Related => "related",
            Trigger::Secret => "secret",
            Trigger::Config => "config",
            Trigger::Reference => "reference",
            Trigger::External => "external",
            Trigger::Yield => "yield",
            Trigger::Requeue => "requeue",
            Trigger::Poll => "poll",
            Trigger::Backoff => "backoff",
            Trigger::Restart => "restart",
            Trigger::Shard => "shard",
            Trigger::Again => "again",
        }
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A [`Trigger`] with the object it names: `ConfigMap shop/settings` for a related object,
/// `Secret shop/tls` for a Secret (its name, never its data), `Database shop/db` for a
/// reference. The span's `trigger_object` attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// Why.
    pub trigger: Trigger,
    /// The other object, as `Kind namespace/name` (`Kind name` when cluster-scoped).
    pub object: Option<Arc<str>>,
}

impl Cause {
    /// A cause that names no other object.
    pub const fn of(trigger: Trigger) -> Self {
        Cause {
            trigger,
            object: None,
        }
    }

    /// A cause naming the object `kind namespace/name`.
    pub fn about(trigger: Trigger, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        let object = match namespace {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        };
        Cause {
            trigger,
            object: Some(object.into()),
        }
    }
}

impl From<Trigger> for Cause {
    fn from(trigger: Trigger) -> Self {
        Cause::of(trigger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_and_in_order() {
        let labels: Vec<&str> = Trigger::ALL.iter().map(|t| t.as_str()).collect();
        let mut unique = labels.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), labels.len());
        for (i, t) in Trigger::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i, "{t} is not at its index");
        }
    }

    #[test]
    fn a_cause_names_its_object_by_kind_and_key() {
        let c = Cause::about(Trigger::Secret, "Secret", Some("shop"), "tls");
        assert_eq!(c.object.as_deref(), Some("Secret shop/tls"));
        let c = Cause::about(Trigger::Related, "Node", None, "n1");
        assert_eq!(c.object.as_deref(), Some("Node n1"));
        assert_eq!(Cause::from(Trigger::Poll).object, None);
    }
}
