//! Where a request goes: the path parsed into a discovery document or a resource route, the
//! verb, and the options of lists and deletes. Plain functions of the store's kinds, tested in
//! `routing/tests.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

use super::deletion::{DeleteOpts, Propagation};
use super::error::ApiError;
use super::kinds::Kind;
use super::list::ListOpts;
use super::selector::{FieldSelector, LabelSelector};
use super::store::Store;

/// Request verbs as counted by [`ApiServerStats`](super::ApiServerStats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    Other,
}

impl Verb {
    /// The verb of a request: its method, whether its path names an object, and whether it asks
    /// to watch.
    pub(crate) fn of(method: &Method, named: bool, watch: bool) -> Verb {
        match (method, named) {
            (&Method::GET, true) => Verb::Get,
            (&Method::GET, false) if watch => Verb::Watch,
            (&Method::GET, false) => Verb::List,
            (&Method::POST, false) => Verb::Create,
            (&Method::PUT, true) => Verb::Update,
            (&Method::PATCH, true) => Verb::Patch,
            (&Method::DELETE, _) => Verb::Delete,
            _ => Verb::Other,
        }
    }
}

/// A parsed resource path.
pub(crate) struct Route {
    pub(crate) kind: Arc<Kind>,
    pub(crate) ns: Option<String>,
    pub(crate) name: Option<String>,
    /// The status subresource.
    pub(crate) status: bool,
}

/// What a path names: a resource, or a discovery document answered as it is.
pub(crate) enum Target {
    Resource(Route),
    Document(Value),
}

/// The query string as a map (a key given twice keeps its last value).
pub(crate) fn query_map(uri: &http::Uri) -> HashMap<String, String> {
    uri.query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

/// What `path` names in `store`: a discovery document, or a kind's collection, object or status;
/// a path the real server does not serve is its 404 (a `Status`, or the mux's plain text for
/// groups nobody serves).
pub(crate) fn route(store: &Store, path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => {
            return Ok(Target::Document(json!({
                "major": "1", "minor": "37", "gitVersion": "v1.37.0-actorcile", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z", "goVersion": "n/a",
                "compiler": "rustc", "platform": "in-process"})));
        }
        ["api"] => {
            return Ok(Target::Document(
                json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "in-process"}]}),
            ));
        }
        ["apis"] => {
            let mut groups: Vec<(String, Vec<String>)> = Vec::new();
            for k in store.kinds() {
                if k.gr.group.is_empty() {
                    continue;
                }
                match groups.iter_mut().find(|g| g.0 == k.gr.group) {
                    Some(g) if !g.1.contains(&k.version) => g.1.push(k.version.clone()),
                    Some(_) => {}
                    None => groups.push((k.gr.group.clone(), vec![k.version.clone()])),
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(g, vs)| {
                    let versions: Vec<Value> = vs
                        .iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
                })
                .collect();
            return Ok(Target::Document(
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            ));
        }
        ["api", "v1"] => return Ok(Target::Document(resource_list(&store.kinds(), "", "v1"))),
        ["apis", g, v] => {
            let kinds = store.kinds();
            if !kinds.iter().any(|k| k.gr.group == *g && k.version == *v) {
                return Err(ApiError::page_not_found());
            }
            return Ok(Target::Document(resource_list(&kinds, g, v)));
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (g, v, rest),
        _ => return Err(ApiError::page_not_found()),
    };
    let (ns, plural, name, sub) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty()
                && tail.is_empty()
                && (*plural == "status" || *plural == "finalize")) =>
        {
            if tail.len() > 2 {
                return Err(ApiError::no_route());
            }
            (
                Some(*ns),
                *plural,
                tail.first().copied(),
                tail.get(1).copied(),
            )
        }
        [plural, tail @ ..] => {
            if tail.len() > 2 {
                return Err(ApiError::no_route());
            }
            (None, *plural, tail.first().copied(), tail.get(1).copied())
        }
        [] => return Err(ApiError::no_route()),
    };
    let kind = store.resolve(group, version, plural).ok_or_else(|| {
        // Built-in groups answer a Status; anything else falls through to the mux's plain 404.
        if store.serves_builtin_group(group) {
            ApiError::no_route()
        } else {
            ApiError::page_not_found()
        }
    })?;
    if ns.is_some() && !kind.namespaced {
        return Err(ApiError::no_route());
    }
    let status = match sub {
        None => false,
        Some("status") if kind.status => true,
        Some(_) => return Err(ApiError::no_route()),
    };
    Ok(Target::Resource(Route {
        kind,
        ns: ns.map(str::to_string),
        name: name.map(str::to_string),
        status,
    }))
}

/// The `APIResourceList` of one group version.
fn resource_list(kinds: &[Arc<Kind>], group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for k in kinds
        .iter()
        .filter(|k| k.gr.group == group && k.version == version)
    {
        resources.push(json!({"name": k.gr.plural, "singularName": k.kind.to_lowercase(), "namespaced": k.namespaced,
            "kind": k.kind, "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}));
        if k.status {
            resources.push(json!({"name": format!("{}/status", k.gr.plural), "singularName": "", "namespaced": k.namespaced,
                "kind": k.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// A request body as JSON, or the server's 400.
pub(crate) fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

/// A delete's options, from its query and its `DeleteOptions` body (which wins).
pub(crate) fn delete_opts(
    q: &HashMap<String, String>,
    body: &Bytes,
) -> Result<DeleteOpts, ApiError> {
    let mut opts = DeleteOpts::default();
    let mut policy = q.get("propagationPolicy").cloned();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v = parse_json(body)?;
        if !v.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_string());
        }
        if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) && policy.is_none() {
            policy = Some("Orphan".into());
        }
        opts.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    opts.propagation = match policy.as_deref() {
        None | Some("Background") => Propagation::Background,
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "DeleteOptions",
                "",
                "propagationPolicy",
                format!(
                    "Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                ),
            ));
        }
    };
    Ok(opts)
}

/// A list's or watch's selectors, limit and continue token.
pub(crate) fn list_opts(q: &HashMap<String, String>) -> Result<ListOpts, ApiError> {
    Ok(ListOpts {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))?,
        limit: match q.get("limit") {
            None => None,
            Some(l) => Some(
                l.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
            ),
        },
        cont: q.get("continue").filter(|c| !c.is_empty()).cloned(),
    })
}

#[cfg(test)]
mod tests;
