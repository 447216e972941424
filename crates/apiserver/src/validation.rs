//! Validation and normalization of what is written, as the real server does before storing: the body's
//! `apiVersion` and `kind`, its namespace (which must exist and not be terminating), object names (DNS
//! subdomains; DNS labels for namespaces), label syntax, string-valued labels and annotations, complete
//! `ownerReferences` with at most one controller, immutable ConfigMaps and Secrets, and a Secret's
//! `stringData` folded into `data`.

use serde_json::{Value, json};

use super::deletion::is_deleting;
use super::error::{ApiError, Subject};
use super::kinds::{Gr, Kind};
use super::object::{ObjRef, meta, meta_mut, meta_str};
use super::store::Store;

/// The label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

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
/// label syntax, string-valued labels and annotations, a Secret's `stringData` folded into `data`,
/// a namespace's `kubernetes.io/metadata.name` label.
pub(super) fn normalize(kind: &Kind, name: &str, v: &mut Value) -> Result<(), ApiError> {
    use base64::Engine as _;
    if kind.gr.plural == "namespaces" && kind.gr.group.is_empty() {
        // Since v1.21 every namespace carries `kubernetes.io/metadata.name: <its name>`, set
        // on each write whatever the write said.
        let labels = meta_mut(v).entry("labels").or_insert_with(|| json!({}));
        if labels.is_null() {
            *labels = json!({});
        }
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(NAMESPACE_NAME_LABEL.into(), json!(name));
        }
    }
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::deletion::DeleteOpts;
    use super::super::testing::*;
    use super::*;

    fn field_of(err: &ApiError) -> Value {
        err.details.as_ref().unwrap()["causes"][0]["field"].clone()
    }

    #[test]
    fn builtin_kinds_take_a_missing_type_from_the_url_and_refuse_another() {
        let s = store();
        let cm = configmaps(&s);
        let mut body = json!({"metadata": {"name": "a"}});
        check_type(&cm, &mut body).unwrap();
        assert_eq!(
            (&body["apiVersion"], &body["kind"]),
            (&json!("v1"), &json!("ConfigMap"))
        );
        for mut wrong in [
            json!({"apiVersion": "v1", "kind": "Secret"}),
            json!({"apiVersion": "v2", "kind": "ConfigMap"}),
            json!(["not", "an", "object"]),
        ] {
            let err = check_type(&cm, &mut wrong).unwrap_err();
            assert_eq!((err.code, err.reason), (400, "BadRequest"), "{wrong}");
        }
    }

    #[test]
    fn custom_resources_must_declare_their_type() {
        let (_s, widgets) = store_with_widgets();
        let mut no_kind = json!({"apiVersion": "example.com/v1", "metadata": {"name": "w"}});
        let err = check_type(&widgets, &mut no_kind).unwrap_err();
        assert!(
            err.message.starts_with("Object 'Kind' is missing"),
            "{}",
            err.message
        );
        let mut no_version = json!({"kind": "Widget"});
        let err = check_type(&widgets, &mut no_version).unwrap_err();
        assert_eq!(
            err.message,
            "the API version in the data () does not match the expected API version (example.com/v1)"
        );
        let mut ok = widget("w", json!({}));
        check_type(&widgets, &mut ok).unwrap();
    }

    #[test]
    fn the_namespace_comes_from_the_url_and_must_agree_with_the_body() {
        let s = store();
        let cm = configmaps(&s);
        let mut body = json!({"metadata": {"name": "a"}});
        check_namespace_field(&cm, Some("team"), &mut body).unwrap();
        assert_eq!(body["metadata"]["namespace"], "team");
        let mut other = json!({"metadata": {"name": "a", "namespace": "other"}});
        let err = check_namespace_field(&cm, Some("team"), &mut other).unwrap_err();
        assert_eq!(err.code, 400);
        // Cluster-scoped kinds drop it.
        let nodes = kind(&s, "", "v1", "nodes");
        let mut node = json!({"metadata": {"name": "n", "namespace": "team"}});
        check_namespace_field(&nodes, Some("team"), &mut node).unwrap();
        assert!(node["metadata"].get("namespace").is_none());
    }

    #[test]
    fn names_are_dns_subdomains_and_namespace_names_dns_labels() {
        let s = store();
        let cm = configmaps(&s);
        let namespaces = kind(&s, "", "v1", "namespaces");
        for ok in ["a", "a.b-c", "0x1", &"a".repeat(63)] {
            check_name(&cm, ok).unwrap();
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a_b",
            "a..b",
            &"a".repeat(64),
            &"a.".repeat(127),
        ] {
            let err = check_name(&cm, bad).unwrap_err();
            assert_eq!(
                (err.code, field_of(&err)),
                (422, json!("metadata.name")),
                "{bad:?}"
            );
        }
        check_name(&namespaces, "team-1").unwrap();
        assert_eq!(check_name(&namespaces, "a.b").unwrap_err().code, 422);
    }

    #[test]
    fn labels_annotations_and_owner_references_are_checked() {
        let s = store();
        let cm = configmaps(&s);
        let check = |metadata: Value| normalize(&cm, "a", &mut configmap("a", metadata));
        check(
            json!({"labels": {"app.kubernetes.io/name": "x"}, "annotations": {"note": "any text"}}),
        )
        .unwrap();
        check(json!({"labels": null, "ownerReferences": null})).unwrap();
        let err = check(json!({"labels": {"bad key!": "x"}})).unwrap_err();
        assert_eq!((err.code, field_of(&err)), (422, json!("metadata.labels")));
        assert_eq!(check(json!({"labels": {"a": 1}})).unwrap_err().code, 400);
        assert_eq!(
            check(json!({"annotations": {"a": true}})).unwrap_err().code,
            400
        );
        assert_eq!(check(json!({"annotations": ["a"]})).unwrap_err().code, 400);
        assert_eq!(check(json!({"ownerReferences": {}})).unwrap_err().code, 400);

        let owner = |uid: &str, controller: bool| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": uid, "controller": controller});
        check(json!({"ownerReferences": [owner("u1", true), owner("u2", false)]})).unwrap();
        let err =
            check(json!({"ownerReferences": [owner("u1", false), owner("", false)]})).unwrap_err();
        assert_eq!(
            (err.code, field_of(&err)),
            (422, json!("metadata.ownerReferences[1].uid"))
        );
        let err =
            check(json!({"ownerReferences": [owner("u1", true), owner("u2", true)]})).unwrap_err();
        assert_eq!(
            (err.code, field_of(&err)),
            (422, json!("metadata.ownerReferences"))
        );
    }

    #[test]
    fn a_secrets_string_data_is_folded_into_base64_data() {
        let s = store();
        let secrets = kind(&s, "", "v1", "secrets");
        let mut secret = json!({"metadata": {"name": "s"}, "data": {"a": "eA=="},
            "stringData": {"b": "hello"}});
        normalize(&secrets, "s", &mut secret).unwrap();
        assert_eq!(
            secret,
            json!({"metadata": {"name": "s"}, "data": {"a": "eA==", "b": "aGVsbG8="}})
        );
        let mut not_text = json!({"metadata": {"name": "s"}, "stringData": {"b": 1}});
        assert_eq!(
            normalize(&secrets, "s", &mut not_text).unwrap_err().code,
            400
        );
        // Other kinds keep a field of that name as it is.
        let mut cm = configmap("c", json!({}));
        cm["stringData"] = json!({"b": "hello"});
        normalize(&configmaps(&s), "c", &mut cm).unwrap();
        assert_eq!(cm["stringData"], json!({"b": "hello"}));
    }

    #[test]
    fn immutable_configmaps_refuse_changes_to_their_data() {
        let mut s = store();
        let cm = configmaps(&s);
        let mut body = configmap("c", json!({}));
        body["data"] = json!({"a": "1"});
        body["immutable"] = json!(true);
        let stored = create(&mut s, &cm, Some("default"), body);

        let mut changed = stored.clone();
        changed["data"]["a"] = json!("2");
        let err = put(&mut s, &cm, Some("default"), changed, false).unwrap_err();
        assert_eq!((err.code, field_of(&err)), (422, json!("data")));
        let mut mutable = stored.clone();
        mutable["immutable"] = json!(false);
        let err = put(&mut s, &cm, Some("default"), mutable, false).unwrap_err();
        assert_eq!((err.code, field_of(&err)), (422, json!("immutable")));

        let mut labelled = stored.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        let updated = put(&mut s, &cm, Some("default"), labelled, false).unwrap();
        assert_eq!(updated["metadata"]["labels"], json!({"a": "b"}));
        assert_eq!(
            get(&s, &cm, Some("default"), "c").unwrap()["data"],
            json!({"a": "1"})
        );
    }

    #[test]
    fn objects_are_created_only_in_existing_active_namespaces() {
        let mut s = store();
        let cm = configmaps(&s);
        let err = s
            .create(&cm, Some("nowhere"), configmap("a", json!({})), None)
            .unwrap_err();
        assert_eq!((err.code, err.reason), (404, "NotFound"));
        assert_eq!(err.details.unwrap()["kind"], "namespaces");

        let namespaces = kind(&s, "", "v1", "namespaces");
        namespace(&mut s, "team");
        create(
            &mut s,
            &cm,
            Some("team"),
            configmap("held", json!({"finalizers": ["x.io/hold"]})),
        );
        s.delete(&namespaces, None, "team", &DeleteOpts::default())
            .unwrap();
        let err = s
            .create(&cm, Some("team"), configmap("late", json!({})), None)
            .unwrap_err();
        assert_eq!((err.code, err.reason), (403, "Forbidden"));
        assert_eq!(
            err.details.unwrap()["causes"][0]["reason"],
            "NamespaceTerminating"
        );
    }
}
