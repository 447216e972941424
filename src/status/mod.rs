//! The status actorcile manages: one `Ready` condition with typed reasons, a phase and
//! `observedGeneration`, patched only when something changed.
//!
//! Put [`ResourceStatus`] in your custom resource's status (as the status type, or flattened
//! into yours) so the CRD schema has the fields; a real API server prunes fields its schema
//! lacks (the runtime checks the answer to a kind's first status write, and reports a schema
//! that pruned its fields with a `StatusPruned` Warning Event and an error log). The CRD needs
//! a status subresource too (`#[kube(status = …)]` gives it one; without it every status write
//! is refused, reported as `StatusNotServed`):
//!
//! ```
//! use actorcile::status::ResourceStatus;
//! #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "AppStatus")]
//! struct AppSpec { replicas: i32 }
//!
//! #[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! struct AppStatus {
//!     #[serde(flatten)]
//!     base: ResourceStatus,
//!     endpoint: Option<String>,
//! }
//! ```
//!
//! The status a provision reconcile leaves (`ResourceStatus::after_provision`) is defined beside
//! [`Outcome`](crate::provisioners::Outcome), in `provisioners/outcome.rs`, so that this module
//! depends on nothing else of the crate but the name rules of [`crate::names`].

use std::fmt;

use kube::Resource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod field;

/// The condition type actorcile owns.
pub const READY: &str = "Ready";

/// The lifecycle phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub enum Phase {
    /// Provisioned and Ready.
    Ready,
    /// Being provisioned (yielding, waiting on a dependency, or retrying after an error).
    Progressing,
    /// Being deleted.
    Terminating,
    /// Stopped: a terminal error, a required user action, or quarantined by the supervisor.
    Failed,
}

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl ConditionStatus {
    /// `True`, `False` or `Unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Typed reasons of the `Ready` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub enum ReadyReason {
    /// Every provisioner is done.
    Provisioned,
    /// A provisioner yielded; provisioning goes on.
    Provisioning,
    /// Deprovisioning is in progress.
    Deprovisioning,
    /// Deprovisioning is done and the runtime's finalizer released; other finalizers still
    /// hold the object.
    Deprovisioned,
    /// Waiting for another resource to become Ready.
    DependencyNotReady,
    /// Waiting on another resource that is being deleted.
    DependencyDeleting,
    /// Waiting on another resource (or external dependency) that does not exist.
    DependencyNotFound,
    /// Another resource (or external dependency) this one needs has failed; the phase is
    /// Failed while it is.
    DependencyFailed,
    /// Deletion waits for referrers to release this resource.
    InUse,
    /// A transient error; retried with backoff.
    Errored,
    /// A user error that retrying will not fix.
    Terminal,
    /// The user must act.
    UserActionRequired,
    /// The supervisor stopped restarting this resource's actor (restart intensity exceeded).
    Quarantined,
    /// The object holds a value the operator's type for its kind cannot hold (the CRD's schema
    /// allows it, or the object was stored under another schema); it is not reconciled until
    /// it changes. The message names the field, never its value.
    Undecodable,
    /// A guarded step waits for a lock another holder has (see
    /// [`Context::guard`](crate::provisioners::Context::guard)).
    Locked,
    /// The object changed while a reconcile ran; it runs again on the newest version.
    Conflict,
    /// The controller's provider config does not exist; provisioning waits for it.
    ConfigMissing,
    /// A reconcile ran past the policy's `reconcile_timeout` and was stopped; retried with backoff.
    ReconcileTimeout,
}

impl ReadyReason {
    /// The reason as the condition carries it (the variant's name).
    pub fn as_str(self) -> &'static str {
        match self {
            ReadyReason::Provisioned => "Provisioned",
            ReadyReason::Provisioning => "Provisioning",
            ReadyReason::Deprovisioning => "Deprovisioning",
            ReadyReason::Deprovisioned => "Deprovisioned",
            ReadyReason::DependencyNotReady => "DependencyNotReady",
            ReadyReason::DependencyDeleting => "DependencyDeleting",
            ReadyReason::DependencyNotFound => "DependencyNotFound",
            ReadyReason::DependencyFailed => "DependencyFailed",
            ReadyReason::InUse => "InUse",
            ReadyReason::Errored => "Errored",
            ReadyReason::Terminal => "Terminal",
            ReadyReason::UserActionRequired => "UserActionRequired",
            ReadyReason::Quarantined => "Quarantined",
            ReadyReason::Undecodable => "Undecodable",
            ReadyReason::Locked => "Locked",
            ReadyReason::Conflict => "Conflict",
            ReadyReason::ConfigMissing => "ConfigMissing",
            ReadyReason::ReconcileTimeout => "ReconcileTimeout",
        }
    }
}

impl fmt::Display for ReadyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest condition reason Kubernetes accepts.
pub const MAX_REASON_LEN: usize = 1024;

/// Longest condition message the runtime writes (Kubernetes accepts 32 KiB); longer messages
/// are cut at a character boundary.
pub const MAX_MESSAGE_LEN: usize = 32 * 1024;

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary
/// (Kubernetes counts its limits on text in bytes).
pub(crate) fn prefix_within(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether `reason` is a valid condition reason by the Kubernetes rule
/// (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most [`MAX_REASON_LEN`] characters). An API
/// server rejects a whole status patch with an invalid one.
///
/// ```
/// use actorcile::status::is_valid_reason;
/// assert!(is_valid_reason("SecretMissing"));
/// assert!(is_valid_reason("a:b,c_1"));
/// assert!(!is_valid_reason("Secret missing"));
/// assert!(!is_valid_reason("Trailing:"));
/// assert!(!is_valid_reason(""));
/// ```
pub fn is_valid_reason(reason: &str) -> bool {
    let b = reason.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    b.len() <= MAX_REASON_LEN
        && first.is_ascii_alphabetic()
        && (last.is_ascii_alphanumeric() || *last == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
}

/// Whether `type_` is a valid condition type by the Kubernetes rule for `metav1.Condition`: an
/// optional DNS-subdomain prefix and `/`, then a name of alphanumerics, `-`, `_` and `.` that
/// starts and ends alphanumeric (at most 316 characters in all).
///
/// ```
/// use actorcile::status::is_valid_condition_type;
/// assert!(is_valid_condition_type("DnsRecord"));
/// assert!(is_valid_condition_type("example.com/Volume.Attached"));
/// assert!(!is_valid_condition_type("Dns Record"));
/// assert!(!is_valid_condition_type("-Leading"));
/// ```
pub fn is_valid_condition_type(type_: &str) -> bool {
    let (prefix, name) = match type_.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, type_),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 316
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    name_ok && type_.len() <= 316 && prefix.is_none_or(crate::names::is_dns_subdomain)
}

/// A status condition (the Kubernetes `metav1.Condition` shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = drop_empty_string_defaults)]
pub struct Condition {
    /// Condition type, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason.
    #[serde(default)]
    pub reason: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The generation this condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Drop the `default: ""` schemars derives from `#[serde(default)]` on string properties:
/// kube-apiserver 1.20 reads an empty-string default as null and rejects the whole CRD.
fn drop_empty_string_defaults(schema: &mut schemars::Schema) {
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for prop in props.values_mut() {
            if let Some(p) = prop.as_object_mut()
                && p.get("default").is_some_and(|d| d.as_str() == Some(""))
            {
                p.remove("default");
            }
        }
    }
}

/// The fields actorcile writes under `.status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Conditions; actorcile owns the `Ready` one and keeps the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl ResourceStatus {
    /// Read actorcile's part of `obj`'s status (missing or foreign fields are ignored).
    pub fn of<K: Serialize>(obj: &K) -> Self {
        // Only the `status` field is serialized (the spec and metadata are skipped unwritten).
        field::top_level_field(obj, "status")
            .and_then(|status| serde_json::from_value(status).ok())
            .unwrap_or_default()
    }

    /// The `Ready` condition, if any.
    pub fn ready(&self) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == READY)
    }

    /// `true` when the `Ready` condition is `True` (at whatever generation it was observed:
    /// compare [`Condition::observed_generation`] with the object's to know it is current).
    pub fn is_ready(&self) -> bool {
        self.ready().is_some_and(|c| c.status == "True")
    }

    /// This status with the `Ready` condition replaced, keeping `lastTransitionTime` when the
    /// condition's status did not change, and the phase and observed generation set.
    ///
    /// `reason` is a [`ReadyReason`] of the runtime, or a provisioner's own code (a string):
    /// it must be a valid condition reason ([`is_valid_reason`]); callers check that first.
    pub fn with_ready(
        &self,
        phase: Phase,
        ready: bool,
        reason: impl fmt::Display,
        message: impl Into<String>,
        generation: Option<i64>,
    ) -> Self {
        let status = if ready { "True" } else { "False" };
        let previous = self.ready();
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Some(now_rfc3339()),
        };
        let cond = Condition {
            type_: READY.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.into(),
            last_transition_time,
            observed_generation: generation,
        };
        let mut conditions: Vec<Condition> = self
            .conditions
            .iter()
            .filter(|c| c.type_ != READY)
            .cloned()
            .collect();
        conditions.insert(0, cond);
        Self {
            phase: Some(phase),
            conditions,
            observed_generation: generation,
        }
    }

    /// The condition of type `type_`, if any.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// This status with the condition of type `type_` set (added, or replaced in place so the
    /// order of the others stays), keeping `lastTransitionTime` when its status did not change.
    /// `None` when the condition already says exactly this (a change-only write has nothing to
    /// do). `reason` must be a valid condition reason ([`is_valid_reason`]). An empty
    /// `message` is written as the reason: some API servers (kube-apiserver 1.20) store an empty
    /// string in a custom resource as null, which the condition's schema then refuses.
    pub fn with_condition(
        &self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        generation: Option<i64>,
    ) -> Option<Self> {
        let message = if message.is_empty() { reason } else { message };
        let previous = self.condition(type_);
        if previous.is_some_and(|c| {
            c.status == status.as_str()
                && c.reason == reason
                && c.message == message
                && c.observed_generation == generation
        }) {
            return None;
        }
        let last_transition_time = match previous {
            Some(p) if p.status == status.as_str() => p.last_transition_time.clone(),
            _ => Some(now_rfc3339()),
        };
        let cond = Condition {
            type_: type_.to_string(),
            status: status.as_str().to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time,
            observed_generation: generation,
        };
        let mut next = self.clone();
        match next.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => *c = cond,
            None => next.conditions.push(cond),
        }
        Some(next)
    }

    /// The status a deprovision reconcile that is not done yet should leave.
    pub fn while_deprovisioning(
        &self,
        reason: impl fmt::Display,
        message: impl Into<String>,
        generation: Option<i64>,
    ) -> Self {
        self.with_ready(Phase::Terminating, false, reason, message, generation)
    }

    /// The merge patch body that writes this status (`{"status": {...}}`).
    pub fn patch(&self) -> serde_json::Value {
        serde_json::json!({ "status": self })
    }
}

/// `obj`'s whole status as JSON (`None` without one).
pub(crate) fn status_json<K: Serialize>(obj: &K) -> Option<serde_json::Value> {
    field::top_level_field(obj, "status")
}

/// The status fields the runtime writes itself; a step cannot set them
/// ([`Context::set_status_field`](crate::provisioners::Context::set_status_field)).
pub const RUNTIME_STATUS_FIELDS: [&str; 3] = ["phase", "conditions", "observedGeneration"];

/// Whether the status of `obj` already holds each of `fields` (a `null` is a field that is
/// absent).
pub(crate) fn holds_fields<K: Serialize>(
    obj: &K,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    // Most reconciles set no field: the status is not read for them.
    if fields.is_empty() {
        return true;
    }
    let status = status_json(obj);
    fields.iter().all(|(k, v)| {
        let current = status.as_ref().and_then(|s| s.get(k));
        match v {
            serde_json::Value::Null => current.is_none_or(serde_json::Value::is_null),
            v => current == Some(v),
        }
    })
}

/// Whether `obj`'s Ready condition is True.
pub fn is_ready<K: Resource + Serialize>(obj: &K) -> bool {
    ResourceStatus::of(obj).is_ready()
}

fn now_rfc3339() -> String {
    format!("{:.0}", jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_cut_in_bytes_at_a_character_boundary() {
        assert_eq!(prefix_within("abc", 5), "abc");
        assert_eq!(prefix_within("abc", 2), "ab");
        // "é" is two bytes: 1 024 bytes hold 512 of them, 1 023 only 511.
        let e = "é".repeat(600);
        assert_eq!(prefix_within(&e, 1024).len(), 1024);
        assert_eq!(prefix_within(&e, 1023).len(), 1022);
        assert_eq!(prefix_within("€", 2), "");
    }

    #[test]
    fn of_reads_only_our_part_of_the_status() {
        let obj = serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"status": "not this one"},
            "status": {
                "phase": "Ready",
                "observedGeneration": 3,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Provisioned",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "userField": {"nested": [1, 2]},
            },
        });
        let s = ResourceStatus::of(&obj);
        assert_eq!(s.phase, Some(Phase::Ready));
        assert_eq!(s.observed_generation, Some(3));
        assert!(s.is_ready());
        // no status, or one that is not ours in shape: the empty status, no panic
        assert_eq!(
            ResourceStatus::of(&serde_json::json!({"metadata": {}})),
            ResourceStatus::default()
        );
        let foreign = serde_json::json!({"status": {"conditions": "not a list"}});
        assert_eq!(ResourceStatus::of(&foreign), ResourceStatus::default());
    }

    #[test]
    fn of_reads_the_status_of_a_typed_resource_with_a_flattened_status() {
        #[derive(kube::CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
        #[kube(
            group = "example.com",
            version = "v1",
            kind = "App",
            namespaced,
            status = "AppStatus"
        )]
        struct AppSpec {
            status: String, // a spec field of the same name is not the status
        }
        #[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
        struct AppStatus {
            #[serde(flatten)]
            base: ResourceStatus,
            endpoint: Option<String>,
        }
        let mut app = App::new(
            "a",
            AppSpec {
                status: "spec".into(),
            },
        );
        assert_eq!(ResourceStatus::of(&app), ResourceStatus::default());
        let base = ResourceStatus::default().with_ready(
            Phase::Ready,
            true,
            ReadyReason::Provisioned,
            "",
            Some(2),
        );
        app.status = Some(AppStatus {
            base: base.clone(),
            endpoint: Some("http://a".into()),
        });
        assert_eq!(ResourceStatus::of(&app), base);
    }

    #[test]
    fn the_status_schema_has_no_empty_string_defaults() {
        let schema = serde_json::to_string(&schemars::schema_for!(ResourceStatus)).unwrap();
        assert!(!schema.contains("\"default\":\"\""), "{schema}");
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let s = ResourceStatus::default().with_ready(
            Phase::Progressing,
            false,
            ReadyReason::Provisioning,
            "a",
            Some(1),
        );
        let t = s.ready().unwrap().last_transition_time.clone();
        let s2 = s.with_ready(
            Phase::Progressing,
            false,
            ReadyReason::Errored,
            "b",
            Some(1),
        );
        assert_eq!(s2.ready().unwrap().last_transition_time, t);
        assert_eq!(s2.ready().unwrap().reason, "Errored");
    }
}
