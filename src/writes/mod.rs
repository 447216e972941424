//! Every API write the actors make of their objects: the finalizer, the shard label, the status
//! subresource, and Events; through [`Io`], what a kind's writes go through (its clients, field
//! manager, event recorder, finalizer, write timeout and counters), and nothing else of the
//! actors.
//!
//! Writes that depend on what the reconcile saw are guarded (a JSON-patch `test` of the
//! resourceVersion or of the finalizer's index), so a stale reconcile fails here instead of
//! overwriting a newer object; the next event runs it again.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Patch;
use kube::runtime::events::EventType;
use serde_json::json;

use kube::Client;

use crate::ManagedResource;
use crate::counters::{KindMetrics, Metrics};
use crate::lenient::{Lenient, Undecodable};
use crate::object_api::ObjectApi;
use crate::object_api::bounded;
use crate::provisioners::ControllerParts;
use crate::provisioners::{InvalidReason, Outcome};
use crate::sharding::ShardScope;
use crate::status::{Phase, ReadyReason, ResourceStatus};

mod finalizers;
pub(crate) use finalizers::OwnFinalizers;

/// What a kind's writes go through.
pub(crate) struct Io<K> {
    /// Shared with every provisioner `Context` the actors build (no `Client` clone per context).
    pub(crate) client: Arc<Client>,
    /// With sharding: which objects this replica may run, and their fenced clients.
    pub(crate) shards: Option<ShardScope<K>>,
    /// What every provisioner context of this kind shares; also the runtime's field manager
    /// and event recorder for the actors' own writes.
    pub(crate) parts: Arc<ControllerParts>,
    pub(crate) metrics: Arc<Metrics>,
    /// This controller's own figures (runs by result, durations, Events).
    pub(crate) kind_metrics: Arc<KindMetrics>,
    /// The runtime's finalizer, and the former ones it still owns.
    pub(crate) finalizers: OwnFinalizers,
    /// The policy's `write_timeout`: a write of the runtime's own still unanswered then is
    /// abandoned.
    pub(crate) write_timeout: Option<Duration>,
}

impl<K: ManagedResource> Io<K> {
    /// The API for the object's namespace (or cluster scope), through the client of its
    /// shard ([`Io::client_for`]).
    pub(crate) fn api(&self, obj: &K) -> ObjectApi<K> {
        ObjectApi::new(
            Client::clone(self.client_for(obj)),
            obj.meta().namespace.as_deref(),
        )
    }

    /// The client a reconcile of `obj` talks through: with sharding, its shard's, which refuses
    /// writes once this replica does not hold the shard.
    pub(crate) fn client_for(&self, obj: &K) -> &Arc<Client> {
        self.client_where(|scope| scope.shard_of(obj))
    }

    /// The client of the shard `shard` names (with sharding; else the runtime's).
    pub(crate) fn client_where(&self, shard: impl FnOnce(&ShardScope<K>) -> u32) -> &Arc<Client> {
        match &self.shards {
            Some(scope) => &scope.clients[shard(scope) as usize],
            None => &self.client,
        }
    }

    /// Patch parameters of every write the actors make: the runtime's field manager.
    pub(crate) fn patch_params(&self) -> kube::api::PatchParams {
        crate::object_api::patch_params(&self.parts.field_manager)
    }
}

/// Patch the status subresource of `obj` to `status` and the steps' `fields`, with `obj`'s resourceVersion as a
/// precondition: the status is computed from `obj`, and writing it over a newer version would
/// drop what someone else wrote meanwhile (another step's condition, a guard's lock) — a
/// conflict instead, and the newer version's event runs the object again. Counts the write.
/// Returns the object as the server left it.
pub(crate) async fn patch_status<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
    status: &ResourceStatus,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> Result<K, kube::Error> {
    let mut patch = status.patch();
    // The steps' own status fields, in the same merge patch.
    for (k, v) in fields {
        patch["status"][k] = v.clone();
    }
    patch["metadata"] = json!({"resourceVersion": obj.meta().resource_version});
    let (api, params) = (io.api(obj), io.patch_params());
    let written = bounded_write(
        io,
        api.patch_status(&obj.name_any(), &params, &Patch::Merge(patch)),
    )
    .await?;
    Metrics::inc(&io.metrics.status_writes);
    Ok(written)
}

/// Patch the status subresource of an object the kind's type cannot hold ([`Undecodable`]) to
/// `status`, with its resourceVersion as a precondition, as [`patch_status`] does. Returns the
/// object as the server left it (decoded leniently: most likely still undecodable).
pub(crate) async fn patch_undecodable_status<K: ManagedResource>(
    io: &Io<K>,
    obj: &Undecodable,
    status: &ResourceStatus,
) -> Result<Lenient<K>, kube::Error> {
    let mut patch = status.patch();
    patch["metadata"] = json!({"resourceVersion": obj.meta.resource_version});
    let client = io.client_where(|scope| scope.shard_of_undecodable(&obj.meta));
    let api = crate::object_api::ObjectApi::<Lenient<K>>::new(
        kube::Client::clone(client),
        obj.meta.namespace.as_deref(),
    );
    let name = obj.meta.name.as_deref().unwrap_or_default();
    let written = bounded_write(
        io,
        api.patch_status(name, &io.patch_params(), &Patch::Merge(patch)),
    )
    .await?;
    Metrics::inc(&io.metrics.status_writes);
    Ok(written)
}

/// Publish the Warning Event `Undecodable` of an object the kind's type cannot hold.
pub(crate) async fn publish_undecodable<K: ManagedResource>(
    io: &Io<K>,
    obj: &Undecodable,
    message: String,
) {
    let obj = Lenient::<K>::Undecodable(Box::new(obj.clone()));
    let reason = ReadyReason::Undecodable.as_str();
    publish(io, &obj, EventType::Warning, reason, Some(message)).await;
}

/// `write` within the policy's `write_timeout`, an abandoned one counted ([`bounded`]).
async fn bounded_write<K: ManagedResource, T>(
    io: &Io<K>,
    write: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    bounded(io.write_timeout, &io.metrics.write_timeouts, write).await
}

/// What the runtime found out about the kind's status subresource, for the two mistakes in a
/// kind's set-up that would otherwise make every status write vanish without a word.
///
/// - No status subresource (a CRD without `subresources: {status: {}}`): every status write is
///   answered 404, as for a deleted object. Discovery tells the two apart; it is asked only on
///   such a 404, and a "no" is asked again after [`StatusChecks::RECHECK`] (the CRD may be
///   fixed while the runtime runs).
/// - A status schema without actorcile's fields (a status type that does not hold
///   [`ResourceStatus`]'s `conditions` and `phase`): the API server prunes them and answers the
///   write with a status that lacks them. The first status write of the kind is checked.
#[derive(Debug, Default)]
pub(crate) struct StatusChecks {
    served: std::sync::Mutex<Option<(bool, tokio::time::Instant)>>,
    kept_checked: std::sync::atomic::AtomicBool,
}

impl StatusChecks {
    /// How long a "not served" answer stands before discovery is asked again.
    const RECHECK: Duration = Duration::from_secs(30);

    /// Whether `K`'s status subresource is served (`true` if discovery cannot say: the 404 is
    /// then taken for the object being gone, as without this check).
    pub(crate) async fn served<K: ManagedResource>(&self, client: &kube::Client) -> bool {
        let now = tokio::time::Instant::now();
        let known = *self.served.lock().unwrap_or_else(|e| e.into_inner());
        match known {
            Some((true, _)) => return true,
            Some((false, at)) if now < at + Self::RECHECK => return false,
            _ => {}
        }
        match crate::object_api::serves_status::<K>(client).await {
            Ok(served) => {
                if !served {
                    tracing::error!(kind = %K::kind(&()), "{}", status_not_served::<K>());
                }
                *self.served.lock().unwrap_or_else(|e| e.into_inner()) = Some((served, now));
                served
            }
            Err(e) => {
                tracing::debug!(error = %e, "discovery failed; a status write's 404 is taken for a deleted object");
                true
            }
        }
    }

    /// Whether the status the server answered a write with (`kept`) still holds what was written
    /// (`written`): checked on the kind's first successful status write only (`true` after).
    /// Logs the problem when it does not.
    pub(crate) fn kept<K: ManagedResource>(&self, written: &ResourceStatus, kept: &K) -> bool {
        use std::sync::atomic::Ordering;
        // A load first: after the first write this is read on every write, by every actor.
        if self.kept_checked.load(Ordering::Relaxed)
            || self.kept_checked.swap(true, Ordering::Relaxed)
        {
            return true;
        }
        let kept = ResourceStatus::of(kept);
        let ready = |s: &ResourceStatus| s.ready().map(|c| (c.status.clone(), c.reason.clone()));
        if ready(&kept) == ready(written) && kept.phase == written.phase {
            return true;
        }
        tracing::error!(kind = %K::kind(&()), "{}", status_pruned::<K>());
        false
    }
}

/// What to do about a status schema that drops actorcile's fields (logged, and in a Warning
/// Event).
fn status_pruned<K: ManagedResource>() -> String {
    format!(
        "the API server dropped the runtime's status fields (conditions, phase) from {} {}: \
         the CRD's status schema does not declare them. Make the status type hold \
         actorcile's ResourceStatus (or declare `conditions`, `phase` and \
         `observedGeneration`), or run the controller without_status()",
        K::api_version(&()),
        K::plural(&()),
    )
}

/// Publish `StatusPruned` (Warning): the object's status write was answered without what was
/// written.
pub(crate) async fn publish_status_pruned<K: ManagedResource>(io: &Io<K>, obj: &K) {
    let note = Some(status_pruned::<K>());
    publish(io, obj, EventType::Warning, "StatusPruned", note).await;
}

/// What to do about a kind without a status subresource (logged, and in a Warning Event).
fn status_not_served<K: ManagedResource>() -> String {
    format!(
        "the API server serves no status subresource for {} {}: the runtime cannot write \
         status. Add `subresources: {{status: {{}}}}` to the CRD's version {} (kube's derive: \
         `#[kube(status = \"ResourceStatus\")]`), or run the controller without_status()",
        K::api_version(&()),
        K::plural(&()),
        K::version(&()),
    )
}

/// Publish `StatusNotServed` (Warning): the object's status write failed because the kind has
/// no status subresource.
pub(crate) async fn publish_status_not_served<K: ManagedResource>(io: &Io<K>, obj: &K) {
    let note = Some(status_not_served::<K>());
    publish(io, obj, EventType::Warning, "StatusNotServed", note).await;
}

/// The API server refused a status write as invalid (`422`): a CRD validation rule
/// (`x-kubernetes-validations`, CEL) or the schema rejects what the runtime wrote. The write is
/// retried with the error backoff, never at once; this says why, in the log (ERROR: it needs the
/// operator author, not the object's owner) and in a Warning Event `StatusRejected` on the object
/// that carries the server's message (which names the rule's message).
pub(crate) async fn publish_status_rejected<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
    message: &str,
) {
    tracing::error!(
        object = %obj.name_any(),
        kind = %K::kind(&()),
        message,
        "the API server refused the status write as invalid (a CRD validation rule or the \
         schema); retrying with backoff"
    );
    let note = format!("status write refused by the API server: {message}");
    publish(io, obj, EventType::Warning, "StatusRejected", Some(note)).await;
}

/// Write phase Failed / reason Quarantined (best effort, off the manager's mailbox).
pub(crate) fn quarantine_status<K: ManagedResource>(io: Arc<Io<K>>, obj: Arc<K>, message: String) {
    tokio::spawn(async move {
        let status = ResourceStatus::of(obj.as_ref()).with_ready(
            Phase::Failed,
            false,
            ReadyReason::Quarantined,
            message.clone(),
            obj.meta().generation,
        );
        if let Err(e) = patch_status(&io, obj.as_ref(), &status, &Default::default()).await {
            tracing::warn!(error = %e, "could not write quarantine status");
        }
        let reason = ReadyReason::Quarantined.as_str();
        publish(&io, obj.as_ref(), EventType::Warning, reason, Some(message)).await;
    });
}

/// Publish the Event of a status transition to `outcome` (when the runtime has a recorder),
/// with `reason`, the reason the `Ready` condition now carries (the Event's reason too):
/// Ready (`Provisioned`), a failure, `Terminal`, `UserActionRequired`, and while deleting
/// `Deprovisioning` and `InUse`. Progress while provisioning (a yield, a wait) publishes
/// none. A transient failure's note names its errors (Events are for operators; status never
/// carries them).
pub(crate) async fn publish_transition<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
    outcome: &Outcome,
    reason: &str,
    message: Option<&str>,
) {
    let deleting = obj.meta().deletion_timestamp.is_some();
    let (type_, note) = match outcome {
        Outcome::Done if !deleting => (EventType::Normal, message.map(str::to_string)),
        Outcome::Failed { reason, errors } => (
            EventType::Warning,
            Some(format!(
                "{reason}; {}",
                // The errors' own text may quote what they could not take: sanitised.
                crate::event_recorder::sanitise(
                    &errors
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            )),
        ),
        Outcome::Terminal(r) | Outcome::UserActionRequired(r) => {
            (EventType::Warning, Some(r.to_string()))
        }
        _ if deleting && reason == ReadyReason::InUse.as_str() => {
            (EventType::Warning, message.map(str::to_string))
        }
        _ if deleting && reason == ReadyReason::Deprovisioning.as_str() => {
            (EventType::Normal, message.map(str::to_string))
        }
        _ => return,
    };
    publish(io, obj, type_, reason, note).await;
}

/// The object is deprovisioned and its finalizer removed: publish `Released`, and forget its
/// Event budget.
pub(crate) async fn publish_released<K: ManagedResource>(io: &Io<K>, obj: &K) {
    let note = "deprovisioned; the finalizer is removed".to_string();
    publish(io, obj, EventType::Normal, "Released", Some(note)).await;
    if let Some(recorder) = &io.parts.recorder {
        recorder.forget(&obj.object_ref(&()));
    }
}

/// The object's actor failed and restarts (`Restarted`), or will not be restarted any more
/// (`Quarantined`, from [`quarantine_status`]).
pub(crate) async fn publish_restarted<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
    failures: usize,
    error: &str,
) {
    // A panic's message is whatever the panicking code wrote: sanitised.
    let error = crate::event_recorder::sanitise(error);
    let note =
        format!("the resource's actor failed ({failures} in the window): {error}; restarting");
    publish(io, obj, EventType::Warning, "Restarted", Some(note)).await;
}

/// A provisioner gave a reason code that is not a valid condition reason: the runtime wrote its
/// own reason instead. Logged, and published as a Warning Event for the object's owner.
pub(crate) async fn publish_invalid_reason<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
    code: &str,
    written: &str,
) {
    let error = InvalidReason {
        code: code.to_string(),
    };
    tracing::warn!(object = %obj.name_any(), %error, written, "a provisioner gave an invalid condition reason");
    let note = format!("{error}; the Ready condition says {written} instead");
    publish(io, obj, EventType::Warning, "InvalidReason", Some(note)).await;
}

async fn publish<K: ManagedResource, R: kube::Resource<DynamicType = ()>>(
    io: &Io<K>,
    obj: &R,
    type_: EventType,
    reason: &str,
    note: Option<String>,
) {
    let Some(recorder) = &io.parts.recorder else {
        return;
    };
    let key = kube::runtime::reflector::ObjectRef::from_obj(obj);
    let regarding = obj.object_ref(&());
    if !recorder.admit(&regarding) {
        Metrics::inc(&io.kind_metrics.events_dropped);
        tracing::debug!(object = %key, reason, "Event budget spent; not published");
        return;
    }
    Metrics::inc(&io.kind_metrics.events);
    let action = if obj.meta().deletion_timestamp.is_some() {
        "Deprovision"
    } else {
        "Provision"
    };
    let ev = kube::runtime::events::Event {
        type_,
        reason: reason.into(),
        // Cut and sanitised by the recorder.
        note,
        action: action.into(),
        secondary: None,
    };
    let published = recorder.publish(&ev, &regarding);
    if let Err(e) = bounded_write(io, published).await {
        // Not retried: the status already says what the Event would. Refused Events are worth
        // an operator's look (RBAC, or a name too long for an Event's `<name>.<time>`).
        let key = kube::runtime::reflector::ObjectRef::from_obj(obj);
        tracing::warn!(object = %key, reason = %ev.reason, error = %e, "could not publish Event");
    }
}

/// Add the runtime finalizer (when `finalizer`; a former finalizer is replaced by it, see
/// [`OwnFinalizers`]) and set the shard label (when `label` is given: key, value), in
/// one write guarded by the resourceVersion the reconcile saw.
pub(crate) async fn claim<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
    finalizer: bool,
    label: Option<(&str, &str)>,
) -> Result<K, kube::Error> {
    let (api, params) = (io.api(obj), io.patch_params());
    let rv = obj.meta().resource_version.clone().unwrap_or_default();
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv})];
    ops.extend(
        io.finalizers
            .claim_ops(obj.meta().finalizers.as_deref(), finalizer),
    );
    if let Some((key, value)) = label {
        ops.push(if obj.meta().labels.is_none() {
            json!({"op": "add", "path": "/metadata/labels", "value": {key: value}})
        } else {
            // `add` replaces a member that exists. JSON Pointer escapes `~` and `/`.
            let member = key.replace('~', "~0").replace('/', "~1");
            json!({"op": "add", "path": format!("/metadata/labels/{member}"), "value": value})
        });
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).expect("static JSON patch shape");
    bounded_write(
        io,
        api.patch(&obj.name_any(), &params, &Patch::Json::<()>(patch)),
    )
    .await
}

/// Move `obj` to the shard its label must name (`label` = `value`): a merge patch guarded by
/// the resourceVersion seen. A conflict or a refusal is left to the next event of the object.
pub(crate) async fn relabel<K: ManagedResource>(
    client: kube::Client,
    params: kube::api::PatchParams,
    limit: Option<Duration>,
    metrics: Arc<Metrics>,
    obj: std::sync::Arc<K>,
    label: std::sync::Arc<str>,
    value: String,
) {
    let api = crate::object_api::ObjectApi::<K>::new(client, obj.meta().namespace.as_deref());
    let patch = json!({"metadata": {
        "resourceVersion": obj.meta().resource_version,
        "labels": {&*label: value},
    }});
    match bounded(
        limit,
        &metrics.write_timeouts,
        api.patch(&obj.name_any(), &params, &Patch::Merge(patch)),
    )
    .await
    {
        Ok(_) => tracing::debug!(object = %obj.name_any(), "moved to the shard of its key"),
        Err(e) => {
            tracing::debug!(object = %obj.name_any(), error = %e, "could not move to the shard of its key")
        }
    }
}

/// Remove the runtime finalizer (and any former one) by index, each guarded by a `test` of
/// that index. Returns the object as the server left it (`None` if it is gone).
pub(crate) async fn remove_finalizer<K: ManagedResource>(
    io: &Io<K>,
    obj: &K,
) -> Result<Option<K>, kube::Error> {
    let (api, params) = (io.api(obj), io.patch_params());
    let ops = io.finalizers.remove_ops(obj.finalizers());
    if ops.is_empty() {
        return Ok(None);
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).expect("static JSON patch shape");
    match bounded_write(
        io,
        api.patch(&obj.name_any(), &params, &Patch::Json::<()>(patch)),
    )
    .await
    {
        Ok(o) => Ok(Some(o)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}
