//! Writes sent to the admission webhooks before they are executed: the object each webhook is
//! asked about (a patch's result by a dry run), the webhooks' changes stored, and their warnings
//! answered as `Warning` headers.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::Value;

use super::super::Inner;
use super::super::admission;
use super::super::conversion;
use super::super::error::ApiError;
use super::super::routing::{Route, Verb, parse_json};
use super::{ApiBody, BodyInner, execute};

/// The JSON of a full (not a watch) response.
fn response_json(response: Response<ApiBody>) -> Result<Value, ApiError> {
    match response.into_body().inner {
        BodyInner::Full(Some(bytes)) => parse_json(&bytes),
        _ => Err(ApiError::internal("a write answered no object")),
    }
}

/// A write sent to the admission webhooks first (see [`crate::admission`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn admit_and_execute(
    inner: &Arc<Inner>,
    parts: &http::request::Parts,
    q: &HashMap<String, String>,
    body: &Bytes,
    route: &Route,
    verb: Verb,
    inject_conflict: bool,
    webhooks: &[admission::Webhook],
) -> Result<Response<ApiBody>, ApiError> {
    let kind = &route.kind;
    let ns = route.ns.as_deref();
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    // A patch made again when the object changed between its dry run and its write.
    for _ in 0..8 {
        let old = match (verb, route.name.as_deref()) {
            (Verb::Create, _) | (_, None) => None,
            (_, Some(name)) => inner
                .store
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .current(kind, ns, name)?,
        };
        let candidate = if verb == Verb::Patch {
            let mut dry = q.clone();
            dry.insert("dryRun".into(), "All".into());
            response_json(execute(inner, parts, &dry, body, route, verb, false)?)?
        } else {
            let mut object = parse_json(body)?;
            if let (Some(ns), Some(meta)) = (
                ns,
                object.get_mut("metadata").and_then(Value::as_object_mut),
            ) {
                meta.entry("namespace").or_insert_with(|| ns.into());
            }
            object
        };
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        let called: Vec<admission::Webhook> = webhooks
            .iter()
            .filter(|w| w.operations.iter().any(|o| o == operation))
            .cloned()
            .collect();
        let name = candidate
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .or(route.name.as_deref())
            .unwrap_or_default()
            .to_owned();
        let subject = admission::Subject {
            group: &kind.gr.group,
            version: &kind.version,
            kind: &kind.kind,
            resource: &kind.gr.plural,
            namespace: ns,
            name: &name,
            operation,
            dry_run,
        };
        let convert = |object: &Value, version: &str| {
            let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
            match store.resolve(&kind.gr.group, version, &kind.gr.plural) {
                Some(to) => Ok(conversion::view(&to, object)?.into_owned()),
                None => Err(ApiError::internal(format!(
                    "{}/{version} {} is not served",
                    kind.gr.group, kind.gr.plural
                ))),
            }
        };
        let (object, warnings) =
            admission::admit(&called, &subject, candidate.clone(), old.as_ref(), &convert).await?;
        let written = if verb != Verb::Patch {
            let bytes = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
            execute(inner, parts, q, &bytes, route, verb, inject_conflict)
        } else if object == candidate {
            execute(inner, parts, q, body, route, verb, inject_conflict)
        } else {
            // The webhooks changed what the patch makes: that is stored, if the object is
            // still the one the dry run patched.
            let mut object = object;
            let rv = old
                .as_ref()
                .and_then(|o| o.pointer("/metadata/resourceVersion"))
                .cloned();
            let write = match (
                rv,
                object.get_mut("metadata").and_then(Value::as_object_mut),
            ) {
                (Some(rv), Some(meta)) => {
                    meta.insert("resourceVersion".into(), rv);
                    Verb::Update
                }
                _ => Verb::Create,
            };
            let bytes = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
            match execute(inner, parts, q, &bytes, route, write, inject_conflict) {
                Err(e) if e.code == 409 && !inject_conflict => continue,
                other => other,
            }
        };
        let mut response = written?;
        for warning in warnings {
            let quoted = format!("299 - {:?}", warning.replace(['\r', '\n'], " "));
            if let Ok(value) = http::HeaderValue::from_str(&quoted) {
                response.headers_mut().append(http::header::WARNING, value);
            }
        }
        return Ok(response);
    }
    Err(ApiError::internal(
        "the object kept changing while its patch was admitted",
    ))
}
