//! Validation and normalization of what is written, as the real server does before storing: the body's
//! `apiVersion` and `kind`, its namespace (which must exist and not be terminating), object names (DNS
//! subdomains; DNS labels for namespaces), label syntax, string-valued labels and annotations, complete
//! `ownerReferences` with at most one controller, immutable ConfigMaps and Secrets, and a Secret's
//! `stringData` folded into `data`.

use serde_json::{Value, json};

use super::deletion::is_deleting;
use super::error::{ApiError, Subject};
use super::kinds::{Gr, Kind};
use super::store::{ObjRef, Store, meta, meta_mut, meta_str};

/// The body's declared apiVersion and kind must be those of the resource. Built-in kinds default missing
/// ones from the URL, as the real server's typed decoding does; custom resources require them.
pub(super) fn check_type(kind: &Kind, body: &mut Value) -> Result<(), ApiError> {
    let Some(obj) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized: the request body must be a JSON object",
        ));
    };
    let empty = |v: Option<&Value>| v.and_then(Value::as_str).is_none_or(str::is_empty);
    if !kind.custom {
        if empty(obj.get("kind")) {
            obj.insert("kind".into(), json!(kind.kind));
        }
        if empty(obj.get("apiVersion")) {
            obj.insert("apiVersion".into(), json!(kind.api_version));
        }
    }
    match obj.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            return Err(ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{body}'"
            )));
        }
        Some(k) if k != kind.kind => {
            return Err(ApiError::bad_request(format!(
                "{k} in version \"{}\" cannot be handled as a {}: the kind in the data ({k}) does \
                 not match the expected kind ({})",
                kind.version, kind.kind, kind.kind
            )));
        }
        _ => {}
    }
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == kind.api_version => Ok(()),
        v => Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            v.unwrap_or_default(),
            kind.api_version
        ))),
    }
}

/// The body's `metadata.namespace`: that of the URL for namespaced kinds (a different one is refused),
/// none for cluster-scoped ones.
pub(super) fn check_namespace_field(
    kind: &Kind,
    ns: Option<&str>,
    body: &mut Value,
) -> Result<(), ApiError> {
    let m = meta_mut(body);
    if kind.namespaced {
        let ns = ns.unwrap_or_default();
        match m.get("namespace").and_then(Value::as_str) {
            Some(bns) if !bns.is_empty() && bns != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                m.insert("namespace".into(), json!(ns));
            }
        }
    } else {
        m.remove("namespace");
    }
    Ok(())
}

impl Store {
    /// A namespaced object may be created only in a namespace that exists (404) and is not being
    /// terminated (403).
    pub(super) fn check_namespace_accepts(
        &self,
        kind: &Kind,
        ns: Option<&str>,
        body: &Value,
    ) -> Result<(), ApiError> {
        if kind.namespaced {
            let ns = ns.unwrap_or_default();
            let nsr = ObjRef {
                gr: Gr {
                    group: String::new(),
                    plural: "namespaces".into(),
                },
                ns: String::new(),
                name: ns.into(),
            };
            match self.lookup(&nsr) {
                None => {
                    return Err(ApiError::not_found(Subject {
                        group: "",
                        plural: "namespaces",
                        name: ns,
                    }));
                }
                Some(o) if is_deleting(&o.value) => {
                    let obj_name = meta_str(body, "name").unwrap_or_default();
                    let mut e = ApiError::forbidden(format!(
                        "{} \"{obj_name}\" is forbidden: unable to create new content in namespace {ns} \
                         because it is being terminated",
                        kind.gr.plural,
                    ));
                    let mut details = json!({"name": obj_name, "kind": kind.gr.plural, "causes": [{
                        "reason": "NamespaceTerminating",
                        "message": format!("namespace {ns} is being terminated"),
                        "field": "metadata.namespace"}]});
                    if !kind.gr.group.is_empty() {
                        details["group"] = json!(kind.gr.group);
                    }
                    e.details = Some(details);
                    return Err(e);
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// An object's name must be a DNS subdomain; a namespace's a DNS label.
pub(super) fn check_name(kind: &Kind, name: &str) -> Result<(), ApiError> {
    let invalid_name = |n: &str, why: &str| {
        ApiError::invalid(
            &kind.gr.group,
            &kind.kind,
            n,
            "metadata.name",
            format!("Invalid value: {n:?}: {why}"),
        )
    };
    if kind.gr.plural == "namespaces" {
        if !is_dns_label(name) {
            return Err(invalid_name(
                name,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ));
        }
    } else if !is_dns_subdomain(name) {
        return Err(invalid_name(
            name,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    }
    Ok(())
}

/// Checks and normalizes what the real server checks and normalizes on every write of the main resource:
/// label syntax, string-valued labels and annotations, a Secret's `stringData` folded into `data`.
pub(super) fn normalize(kind: &Kind, name: &str, v: &mut Value) -> Result<(), ApiError> {
    use base64::Engine as _;
    for field in ["labels", "annotations"] {
        let Some(map) = meta(v).and_then(|m| m.get(field)) else {
            continue;
        };
        if map.is_null() {
            continue;
        }
        let Some(map) = map.as_object() else {
            return Err(ApiError::bad_request(format!(
                "metadata.{field} must be a map of strings"
            )));
        };
        for (k, val) in map {
            let Some(val) = val.as_str() else {
                return Err(ApiError::bad_request(format!(
                    "metadata.{field}[{k:?}] must be a string"
                )));
            };
            if field == "labels"
                && !(super::selector::valid_key(k) && super::selector::valid_value(val))
            {
                return Err(ApiError::invalid(
                    &kind.gr.group,
                    &kind.kind,
                    name,
                    "metadata.labels",
                    format!("Invalid value: {k:?}: {val:?}: not a valid label"),
                ));
            }
        }
    }
    if let Some(refs) = meta(v)
        .and_then(|m| m.get("ownerReferences"))
        .filter(|r| !r.is_null())
    {
        let Some(refs) = refs.as_array() else {
            return Err(ApiError::bad_request(
                "metadata.ownerReferences must be a list",
            ));
        };
        let mut controllers = 0;
        for (i, r) in refs.iter().enumerate() {
            for field in ["apiVersion", "kind", "name", "uid"] {
                if r.get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(ApiError::invalid(
                        &kind.gr.group,
                        &kind.kind,
                        name,
                        &format!("metadata.ownerReferences[{i}].{field}"),
                        format!("Invalid value: \"\": {field} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            return Err(ApiError::invalid(
                &kind.gr.group,
                &kind.kind,
                name,
                "metadata.ownerReferences",
                "Invalid value: only one reference can have Controller set to true".into(),
            ));
        }
    }
    if kind.gr.group.is_empty()
        && kind.gr.plural == "secrets"
        && let Some(Value::Object(sd)) = v.as_object_mut().and_then(|o| o.remove("stringData"))
    {
        if !v.get("data").is_some_and(Value::is_object) {
            v["data"] = json!({});
        }
        for (k, val) in sd {
            let text = val
                .as_str()
                .ok_or_else(|| ApiError::bad_request("stringData values must be strings"))?;
            v["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
    Ok(())
}

/// ConfigMaps and Secrets marked `immutable` refuse any change to their data (and to `immutable`).
pub(super) fn check_immutable(
    kind: &Kind,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    if kind.gr.group.is_empty()
        && (kind.gr.plural == "configmaps" || kind.gr.plural == "secrets")
        && old.get("immutable").and_then(Value::as_bool) == Some(true)
    {
        for field in ["data", "binaryData", "stringData", "immutable"] {
            let (before, after) = (old.get(field), new.get(field));
            let unchanged = match field {
                // stringData is folded into data; it changes data only if it differs.
                "stringData" => after.is_none(),
                _ => before == after,
            };
            if !unchanged {
                return Err(ApiError::invalid(
                    &kind.gr.group,
                    &kind.kind,
                    name,
                    field,
                    "Forbidden: field is immutable when `immutable` is set".into(),
                ));
            }
        }
    }
    Ok(())
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}
