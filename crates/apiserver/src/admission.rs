//! Admission webhooks called in process: before a create, update or patch of a resource a
//! webhook is registered for is stored, the server sends each mutating webhook an
//! `AdmissionReview` (as JSON, as the real server does, but by a call instead of HTTPS),
//! applies the JSON patch it answers, then asks each validating webhook, and refuses the write
//! with the first denial, as `admission webhook "<name>" denied the request: <message>`.
//!
//! A patch is admitted on the object it makes: the server makes it by a dry run, asks the
//! webhooks, and stores it as the patch made it when no webhook changed it, or as the webhooks
//! left it (an update with the dry run's `resourceVersion`, made again on a conflict) when
//! one did. Deletions and the status subresource are not sent to webhooks.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::error::ApiError;

/// What a webhook answers: the `AdmissionReview` with its `response`, as JSON.
pub type ReviewFuture = Pin<Box<dyn Future<Output = Value> + Send>>;

/// An admission webhook the server calls in process, with an `AdmissionReview`'s JSON.
pub trait AdmissionHook: Send + Sync + 'static {
    /// The answer to `review`.
    fn review(&self, review: Vec<u8>) -> ReviewFuture;
}

impl<F> AdmissionHook for F
where
    F: Fn(Vec<u8>) -> ReviewFuture + Send + Sync + 'static,
{
    fn review(&self, review: Vec<u8>) -> ReviewFuture {
        self(review)
    }
}

/// An admission webhook registered with [`ApiServer::register_webhook`].
///
/// [`ApiServer::register_webhook`]: crate::ApiServer::register_webhook
#[derive(Clone)]
pub struct Webhook {
    /// Its name, as in a webhook configuration (it appears in a denial's message).
    pub name: String,
    /// Mutating (its patches are applied, before every validating webhook) or validating.
    pub mutating: bool,
    /// The API group of the resource it is called for.
    pub group: String,
    /// The resource (plural) it is called for, in every version.
    pub resource: String,
    /// The version it reads (`matchPolicy: Equivalent`): a write through another version is
    /// converted to it for the call, by the kind's conversion hook, and back; `None`: the
    /// version written.
    pub version: Option<String>,
    /// The operations it is called for: `CREATE`, `UPDATE`.
    pub operations: Vec<String>,
    /// How long it is waited for; past it, the write fails (failure policy `Fail`) or goes on
    /// (`Ignore`).
    pub timeout: Duration,
    /// Whether a webhook that does not answer in time, or answers nonsense, refuses the write
    /// (`Fail`, true) or is skipped (`Ignore`).
    pub fail_closed: bool,
    /// The call.
    pub hook: Arc<dyn AdmissionHook>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("name", &self.name)
            .field("mutating", &self.mutating)
            .field("group", &self.group)
            .field("resource", &self.resource)
            .field("version", &self.version)
            .field("operations", &self.operations)
            .finish_non_exhaustive()
    }
}

/// One review's subject.
pub(crate) struct Subject<'a> {
    pub(crate) group: &'a str,
    pub(crate) version: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: &'a str,
    pub(crate) operation: &'a str,
    pub(crate) dry_run: bool,
}

static UIDS: AtomicU64 = AtomicU64::new(1);

/// The static reason of a denial (a `Status` reason the server knows), else none.
fn reason(reason: &str) -> &'static str {
    match reason {
        "Forbidden" => "Forbidden",
        "Invalid" => "Invalid",
        "BadRequest" => "BadRequest",
        "InternalError" => "InternalError",
        "Timeout" => "Timeout",
        "Conflict" => "Conflict",
        _ => "",
    }
}

/// The real server's message and code for a denial (`webhookerrors.ToStatusErr`).
fn denied(webhook: &str, status: &Value) -> ApiError {
    let code = status.get("code").and_then(Value::as_u64).unwrap_or(0);
    let code = if code < 400 { 400 } else { code as u16 };
    let message = status.get("message").and_then(Value::as_str).unwrap_or("");
    let why = status.get("reason").and_then(Value::as_str).unwrap_or("");
    let prefix = format!("admission webhook {webhook:?} denied the request");
    let message = match (message.is_empty(), why.is_empty()) {
        (false, _) => format!("{prefix}: {message}"),
        (true, false) => format!("{prefix}: {why}"),
        (true, true) => format!("{prefix} without explanation"),
    };
    ApiError {
        plain: false,
        code,
        reason: reason(why),
        message,
        details: None,
    }
}

/// Converts an object to a version of its kind (`convert(object, version)`).
pub(crate) type Convert<'a> = &'a (dyn Fn(&Value, &str) -> Result<Value, ApiError> + Sync);

/// Runs `webhooks` (mutating first, then validating) on `object`; answers the object as the
/// mutating ones left it, and the warnings, or the first denial. A webhook that reads another
/// version than the one written is called with `object` (and `old`) converted by `convert`.
pub(crate) async fn admit(
    webhooks: &[Webhook],
    subject: &Subject<'_>,
    mut object: Value,
    old: Option<&Value>,
    convert: Convert<'_>,
) -> Result<(Value, Vec<String>), ApiError> {
    let mut warnings = Vec::new();
    let ordered = webhooks
        .iter()
        .filter(|w| w.mutating)
        .chain(webhooks.iter().filter(|w| !w.mutating));
    for webhook in ordered {
        let uid = format!("in-process-{}", UIDS.fetch_add(1, Ordering::Relaxed));
        let version = webhook.version.as_deref().filter(|v| *v != subject.version);
        // What the webhook is asked about: borrowed unless converted to its version.
        let (seen, seen_old): (Cow<'_, Value>, Option<Cow<'_, Value>>) = match version {
            Some(v) => (
                Cow::Owned(convert(&object, v)?),
                old.map(|o| convert(o, v).map(Cow::Owned)).transpose()?,
            ),
            None => (Cow::Borrowed(&object), old.map(Cow::Borrowed)),
        };
        let version = version.unwrap_or(subject.version);
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": subject.group, "version": version, "kind": subject.kind},
                "resource": {"group": subject.group, "version": version, "resource": subject.resource},
                "requestKind": {"group": subject.group, "version": subject.version, "kind": subject.kind},
                "requestResource": {"group": subject.group, "version": subject.version, "resource": subject.resource},
                "name": subject.name,
                "namespace": subject.namespace,
                "operation": subject.operation,
                "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
                "object": seen,
                "oldObject": seen_old,
                "dryRun": subject.dry_run,
            }
        });
        let failed = |why: String| -> Result<(), ApiError> {
            if webhook.fail_closed {
                Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook {:?}: {why}",
                    webhook.name
                )))
            } else {
                Ok(())
            }
        };
        let call = webhook
            .hook
            .review(serde_json::to_vec(&review).unwrap_or_default());
        let answer = match tokio::time::timeout(webhook.timeout, call).await {
            Ok(answer) => answer,
            Err(_) => {
                failed(format!("no answer within {:?}", webhook.timeout))?;
                continue;
            }
        };
        let Some(response) = answer
            .get("response")
            .filter(|r| r.get("uid") == Some(&json!(uid)))
        else {
            failed("the answer has no response for the request's uid".into())?;
            continue;
        };
        if let Some(more) = response.get("warnings").and_then(Value::as_array) {
            warnings.extend(more.iter().filter_map(Value::as_str).map(String::from));
        }
        if response.get("allowed") != Some(&json!(true)) {
            return Err(denied(
                &webhook.name,
                response.get("status").unwrap_or(&Value::Null),
            ));
        }
        let Some(patch) = response.get("patch").filter(|p| !p.is_null()) else {
            continue;
        };
        if !webhook.mutating {
            failed("a validating webhook answered a patch".into())?;
            continue;
        }
        let patch = patch_bytes(patch).and_then(|bytes| {
            serde_json::from_slice::<json_patch::Patch>(&bytes).map_err(|e| e.to_string())
        });
        let mut seen = seen.into_owned();
        match patch {
            Ok(patch) => match json_patch::patch(&mut seen, &patch) {
                Ok(()) if version == subject.version => object = seen,
                Ok(()) => object = convert(&seen, subject.version)?,
                Err(e) => failed(format!("its patch does not apply: {e}"))?,
            },
            Err(e) => failed(format!("its patch does not decode: {e}"))?,
        }
    }
    Ok((object, warnings))
}

/// A response's `patch` bytes. The field is Go's `[]byte`, which the API server decodes from
/// a base64 string or from an array of byte values, so both are read here.
fn patch_bytes(patch: &Value) -> Result<Vec<u8>, String> {
    match patch {
        Value::String(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| e.to_string()),
        Value::Array(values) => values
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .ok_or_else(|| format!("{v} is not a byte"))
            })
            .collect(),
        other => Err(format!("{other} is neither base64 nor bytes")),
    }
}
