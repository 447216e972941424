//! Admission for a managed kind: a [`Validator`] (accept with warnings, or deny) and a
//! [`Defaulter`] (change the object before it is stored), and how the runtime answers an
//! `AdmissionReview` with them.
//!
//! The runtime decodes the review, decodes the object into `K` (a field that does not decode
//! denies the write, naming the field), calls the handler within a deadline, catches its panic,
//! and answers: a denial with the handler's message (HTTP 403 `Forbidden` in the review's
//! status, as controller-runtime's `admission.Denied`), warnings, or the JSON patch from the
//! object as it arrived to the object as the defaulter left it.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::FutureExt;
use kube::Resource;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Warnings the API server passes on to the client that made the write (`kubectl` prints
/// them), for a write that is allowed.
pub type Warnings = Vec<String>;

/// Why a handler refused a write: the message the client sees, after the API server's
/// `admission webhook "<name>" denied the request: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    message: String,
    code: u16,
    reason: String,
}

impl Denial {
    /// A denial with `message`, answered as 403 `Forbidden`.
    pub fn new(message: impl Into<String>) -> Self {
        Denial {
            message: message.into(),
            code: 403,
            reason: "Forbidden".into(),
        }
    }

    /// A denial of an object that is not valid: 422 `Invalid` (the code the API server gives
    /// its own validation's refusals).
    pub fn invalid(message: impl Into<String>) -> Self {
        Denial {
            message: message.into(),
            code: 422,
            reason: "Invalid".into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status code the API server answers the client with.
    pub fn code(&self) -> u16 {
        self.code
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Denial {}

/// What a handler is told about the write besides the objects.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Request {
    /// `Create`, `Update` (or `Delete`, for a validator registered for deletions).
    pub operation: Operation,
    /// The write is a dry run (`kubectl --dry-run=server`): a handler must not act on it
    /// outside its answer. Webhooks are registered with `sideEffects: None`, so a handler must
    /// have none in any case; this says whether the write will be stored.
    pub dry_run: bool,
    /// The object's namespace (`None` for a cluster-scoped kind).
    pub namespace: Option<String>,
    /// The object's name (empty on a create with `generateName`).
    pub name: String,
    /// Who makes the write.
    pub username: Option<String>,
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Validates writes of `K`: accept (with warnings, possibly none) or deny.
///
/// ```
/// use actorcile::webhooks::{Denial, Request, Validator, Warnings};
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
/// # struct AppSpec { replicas: u32 }
///
/// struct ReplicasBounded;
///
/// impl Validator<App> for ReplicasBounded {
///     async fn validate(&self, new: &App, old: Option<&App>, _: &Request) -> Result<Warnings, Denial> {
///         if new.spec.replicas > 100 {
///             return Err(Denial::invalid("spec.replicas: at most 100"));
///         }
///         let mut warnings = Warnings::new();
///         if old.is_some_and(|old| old.spec.replicas > new.spec.replicas) {
///             warnings.push("scaling down drops the removed replicas' data".into());
///         }
///         Ok(warnings)
///     }
/// }
/// ```
pub trait Validator<K>: Send + Sync + 'static {
    /// Judge `new` (on an update, `old` is the stored object it replaces; on a deletion,
    /// `new` is the stored object).
    fn validate(
        &self,
        new: &K,
        old: Option<&K>,
        request: &Request,
    ) -> impl Future<Output = Result<Warnings, Denial>> + Send;
}

/// Fills in defaults of `K` before it is stored (a mutating webhook).
///
/// ```
/// use actorcile::webhooks::{Defaulter, Denial, Request};
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
/// # struct AppSpec { image: Option<String> }
///
/// struct DefaultImage;
///
/// impl Defaulter<App> for DefaultImage {
///     async fn default(&self, app: &mut App, _: &Request) -> Result<(), Denial> {
///         app.spec.image.get_or_insert_with(|| "registry.example.com/app:1".into());
///         Ok(())
///     }
/// }
/// ```
pub trait Defaulter<K>: Send + Sync + 'static {
    /// Change `object` as it should be stored (or deny the write).
    fn default(
        &self,
        object: &mut K,
        request: &Request,
    ) -> impl Future<Output = Result<(), Denial>> + Send;
}

/// An admission handler with its kind erased: an `AdmissionReview`'s bytes in, the answering
/// review out.
pub(crate) type ErasedReview =
    Arc<dyn Fn(Vec<u8>, Duration) -> BoxFuture<'static, Value> + Send + Sync>;

/// The erased handler of a validator.
pub(crate) fn erase_validator<K, V>(validator: V) -> ErasedReview
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
    V: Validator<K>,
{
    let validator = Arc::new(validator);
    Arc::new(move |body, deadline| {
        let validator = validator.clone();
        Box::pin(async move {
            let (request, response) = match decode(&body) {
                Ok(decoded) => decoded,
                Err(answer) => return answer,
            };
            let info = info(&request);
            let (new, old) = match (&request.object, &request.old_object) {
                (Some(new), old) => (
                    typed::<K>(new, "object"),
                    old.as_ref().map(|o| typed::<K>(o, "oldObject")),
                ),
                (None, Some(old)) => (typed::<K>(old, "oldObject"), None),
                (None, None) => {
                    return answer(response.deny("the review has neither object nor oldObject"));
                }
            };
            let (new, old) = match (new, old.transpose()) {
                (Ok(new), Ok(old)) => (new, old),
                (Err(denial), _) | (_, Err(denial)) => return answer(deny(response, denial)),
            };
            let verdict = guarded(deadline, validator.validate(&new, old.as_ref(), &info)).await;
            match verdict {
                Ok(warnings) => {
                    let mut response = response;
                    if !warnings.is_empty() {
                        response.warnings = Some(warnings);
                    }
                    answer(response)
                }
                Err(denial) => answer(deny(response, denial)),
            }
        })
    })
}

/// The erased handler of a defaulter.
pub(crate) fn erase_defaulter<K, D>(defaulter: D) -> ErasedReview
where
    K: Resource + DeserializeOwned + Serialize + Send + Sync + 'static,
    D: Defaulter<K>,
{
    let defaulter = Arc::new(defaulter);
    Arc::new(move |body, deadline| {
        let defaulter = defaulter.clone();
        Box::pin(async move {
            let (request, response) = match decode(&body) {
                Ok(decoded) => decoded,
                Err(answer) => return answer,
            };
            let info = info(&request);
            let Some(object) = &request.object else {
                return answer(response);
            };
            let raw = match serde_json::to_value(object) {
                Ok(raw) => raw,
                Err(e) => return answer(response.deny(format!("cannot encode the object: {e}"))),
            };
            let mut typed_object = match typed::<K>(object, "object") {
                Ok(typed_object) => typed_object,
                Err(denial) => return answer(deny(response, denial)),
            };
            let before = serde_json::to_value(&typed_object).unwrap_or(Value::Null);
            let outcome = guarded(deadline, async {
                defaulter.default(&mut typed_object, &info).await?;
                Ok(typed_object)
            })
            .await;
            let after = match outcome {
                Ok(after) => serde_json::to_value(&after).unwrap_or(Value::Null),
                Err(denial) => return answer(deny(response, denial)),
            };
            let patch = defaulting_patch(&raw, &before, &after);
            if patch.0.is_empty() {
                return answer(response);
            }
            match response.clone().with_patch(patch) {
                Ok(patched) => answer(patched),
                Err(e) => answer(response.deny(format!("cannot encode the patch: {e}"))),
            }
        })
    })
}

/// The JSON patch from the object as it arrived (`raw`) to the object with the defaulter's
/// changes. The changes are the difference between the typed object before and after the
/// defaulter ran, so that fields `K` serializes differently (a `null` for an absent option)
/// are not written back; they are applied to `raw`, and the patch is taken against `raw`, so
/// every operation applies to the object the API server holds. (Where the typed change does not
/// apply to `raw`, the typed object after defaulting is the target.)
pub(crate) fn defaulting_patch(raw: &Value, before: &Value, after: &Value) -> json_patch::Patch {
    let change = json_patch::diff(before, after);
    let mut target = raw.clone();
    if json_patch::patch(&mut target, &change).is_err() {
        target = after.clone();
    }
    json_patch::diff(raw, &target)
}

/// The review's request, and the response that answers it; or the answer to a review that
/// does not decode.
#[allow(clippy::result_large_err)]
fn decode(body: &[u8]) -> Result<(AdmissionRequest<DynamicObject>, AdmissionResponse), Value> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| {
        answer(AdmissionResponse::invalid(format!(
            "the AdmissionReview does not decode: {e}"
        )))
    })?;
    let request: AdmissionRequest<DynamicObject> = review.try_into().map_err(|_| {
        answer(AdmissionResponse::invalid(
            "the AdmissionReview has no request",
        ))
    })?;
    let response = AdmissionResponse::from(&request);
    Ok((request, response))
}

fn info(request: &AdmissionRequest<DynamicObject>) -> Request {
    Request {
        operation: request.operation.clone(),
        dry_run: request.dry_run,
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        username: request.user_info.username.clone(),
    }
}

/// `object` as `K`; a field that does not decode is an invalid object, named by its path.
fn typed<K: DeserializeOwned>(object: &DynamicObject, which: &str) -> Result<K, Denial> {
    let value = serde_json::to_value(object)
        .map_err(|e| Denial::invalid(format!("{which} does not encode: {e}")))?;
    serde_path_to_error::deserialize(value)
        .map_err(|e| Denial::invalid(format!("{which} at {}: {}", e.path(), e.inner())))
}

/// The handler's future, within `deadline`, its panic caught: each is a denial.
async fn guarded<T>(
    deadline: Duration,
    call: impl Future<Output = Result<T, Denial>> + Send,
) -> Result<T, Denial> {
    match tokio::time::timeout(deadline, AssertUnwindSafe(call).catch_unwind()).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => {
            let what = panic_message(&*panic);
            tracing::error!(
                panic = what,
                "admission handler panicked; the write is denied"
            );
            Err(Denial {
                message: format!("the admission handler failed: {what}"),
                code: 500,
                reason: "InternalError".into(),
            })
        }
        Err(_) => {
            tracing::warn!(
                ?deadline,
                "admission handler did not answer in time; the write is denied"
            );
            Err(Denial {
                message: format!("the admission handler did not answer within {deadline:?}"),
                code: 504,
                reason: "Timeout".into(),
            })
        }
    }
}

/// A panic's message, where it is a string.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}

fn deny(response: AdmissionResponse, denial: Denial) -> AdmissionResponse {
    let mut response = response.deny(denial.message);
    response.result.code = denial.code;
    response.result.reason = denial.reason;
    response
}

/// The review that carries `response`, as JSON.
fn answer(response: AdmissionResponse) -> Value {
    let mut review = serde_json::to_value(response.into_review()).unwrap_or(Value::Null);
    // An `AdmissionResponse::invalid` (no request) names the version it answers in: v1.
    if let Some(types) = review.as_object_mut() {
        types.insert("apiVersion".into(), "admission.k8s.io/v1".into());
        types.insert("kind".into(), "AdmissionReview".into());
    }
    // kube encodes the patch as an array of byte values; the API server reads that too, but
    // base64 is the form every Kubernetes client writes, so the answer carries that.
    if let Some(patch) = review.pointer_mut("/response/patch")
        && let Some(bytes) = patch.as_array().and_then(|values| {
            values
                .iter()
                .map(|v| v.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Option<Vec<u8>>>()
        })
    {
        *patch = base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .into();
    }
    review
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_default_is_patched_onto_the_raw_object_without_the_typed_nulls() {
        let raw = json!({"spec": {"replicas": 1}});
        let before = json!({"spec": {"replicas": 1, "image": null}});
        let after = json!({"spec": {"replicas": 1, "image": "app:1"}});
        let patch = defaulting_patch(&raw, &before, &after);
        let mut patched = raw.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(patched, json!({"spec": {"replicas": 1, "image": "app:1"}}));
    }

    #[test]
    fn a_default_under_an_absent_parent_still_applies() {
        let raw = json!({"spec": {}});
        let before = json!({"spec": {"tls": null}});
        let after = json!({"spec": {"tls": {"enabled": true}}});
        let patch = defaulting_patch(&raw, &before, &after);
        let mut patched = raw.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(patched["spec"]["tls"], json!({"enabled": true}));
    }

    #[test]
    fn no_change_no_patch() {
        let raw = json!({"spec": {"a": 1}});
        let typed = json!({"spec": {"a": 1, "b": null}});
        assert!(defaulting_patch(&raw, &typed, &typed).0.is_empty());
    }
}
