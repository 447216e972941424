//! The tests of `routing.rs`: every path shape the real server serves, and the ones it answers
//! 404 to, each as the real server does; the verb of each method; and the options of lists
//! and deletes.

use std::collections::HashMap;

use bytes::Bytes;
use http::Method;

use super::super::deletion::Propagation;
use super::super::testing::*;
use super::*;

/// The route `path` names; panics on a document or an error.
fn resource(s: &Store, path: &str) -> Route {
    match route(s, path) {
        Ok(Target::Resource(r)) => r,
        Ok(Target::Document(d)) => panic!("{path}: a document: {d}"),
        Err(e) => panic!("{path}: {e:?}"),
    }
}

/// The document `path` names; panics on a route or an error.
fn document(s: &Store, path: &str) -> Value {
    match route(s, path) {
        Ok(Target::Document(d)) => d,
        Ok(Target::Resource(r)) => panic!("{path}: the route of {}", r.kind.kind),
        Err(e) => panic!("{path}: {e:?}"),
    }
}

/// The error `path` is answered with: `(code, plain text)`; panics if it is served.
fn refused(s: &Store, path: &str) -> (u16, bool) {
    match route(s, path) {
        Err(e) => (e.code, e.plain),
        Ok(_) => panic!("{path} is served"),
    }
}

/// A store that also serves `widgets.example.com` (v1 with status, v2 without).
fn with_widgets() -> Store {
    let mut s = store();
    s.install_crd(widget_crd(&[
        ("v1", true, true, true),
        ("v2", true, false, false),
    ]))
    .unwrap();
    s
}

#[test]
fn discovery_documents_name_what_is_served() {
    let s = with_widgets();
    assert_eq!(document(&s, "/version")["major"], "1");
    assert_eq!(document(&s, "/api")["versions"], json!(["v1"]));
    let groups = document(&s, "/apis");
    let widgets = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "example.com")
        .expect("the CRD's group is listed");
    assert_eq!(widgets["versions"].as_array().unwrap().len(), 2);
    assert!(
        !groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == ""),
        "the core group is /api's, not /apis's"
    );

    let core = document(&s, "/api/v1");
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"configmaps") && names.contains(&"namespaces/status"));
    assert!(
        !names.contains(&"configmaps/status"),
        "ConfigMaps have no status"
    );
    assert_eq!(core["groupVersion"], "v1");

    let v1 = document(&s, "/apis/example.com/v1");
    assert_eq!(v1["groupVersion"], "example.com/v1");
    let v1: Vec<&str> = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(v1, ["widgets", "widgets/status"]);
    let v2 = document(&s, "/apis/example.com/v2");
    assert_eq!(v2["resources"].as_array().unwrap().len(), 1, "{v2}");
    // A version nobody serves is the mux's plain 404, as is an unknown path.
    assert_eq!(refused(&s, "/apis/example.com/v9"), (404, true));
    assert_eq!(refused(&s, "/healthz/etcd"), (404, true));
}

#[test]
fn resource_paths_name_kind_namespace_object_and_status() {
    let s = with_widgets();
    let r = resource(&s, "/api/v1/namespaces/default/configmaps");
    assert_eq!(
        (
            r.kind.kind.as_str(),
            r.ns.as_deref(),
            r.name.as_deref(),
            r.status
        ),
        ("ConfigMap", Some("default"), None, false)
    );
    let r = resource(&s, "/api/v1/configmaps");
    assert_eq!((r.ns.as_deref(), r.name.as_deref()), (None, None));
    let r = resource(&s, "/apis/example.com/v1/namespaces/a/widgets/w/status");
    assert_eq!(
        (
            r.kind.kind.as_str(),
            r.ns.as_deref(),
            r.name.as_deref(),
            r.status
        ),
        ("Widget", Some("a"), Some("w"), true)
    );
    // A namespace's own status and finalize paths look like a namespaced collection but are not.
    let r = resource(&s, "/api/v1/namespaces/team-a/status");
    assert_eq!(
        (
            r.kind.kind.as_str(),
            r.ns.as_deref(),
            r.name.as_deref(),
            r.status
        ),
        ("Namespace", None, Some("team-a"), true)
    );
    let r = resource(&s, "/api/v1/namespaces/team-a");
    assert_eq!(
        (r.kind.kind.as_str(), r.name.as_deref()),
        ("Namespace", Some("team-a"))
    );
    // Query strings are not part of the path.
    assert_eq!(
        query_map(
            &"/api/v1/configmaps?labelSelector=a%3Db&limit=5&limit=6"
                .parse()
                .unwrap()
        ),
        HashMap::from([
            ("labelSelector".to_string(), "a=b".to_string()),
            ("limit".to_string(), "6".to_string()),
        ])
    );
}

#[test]
fn paths_the_real_server_refuses_are_its_404s() {
    let s = with_widgets();
    for path in [
        // A subresource the kind does not have, or none at all.
        "/api/v1/namespaces/default/configmaps/c/status",
        "/apis/example.com/v2/namespaces/a/widgets/w/status",
        "/api/v1/namespaces/default/configmaps/c/scale",
        // Too deep.
        "/api/v1/namespaces/default/configmaps/c/status/more",
        "/api/v1/configmaps/c/status/more",
        // A cluster-scoped kind under a namespace.
        "/api/v1/namespaces/default/namespaces/x",
        // An unknown kind of a built-in group answers a Status.
        "/api/v1/widgets",
        "/apis/apiextensions.k8s.io/v1/widgets",
    ] {
        assert_eq!(refused(&s, path), (404, false), "{path}");
    }
    // An unknown kind of a custom group, and an unknown group, are the mux's plain 404.
    assert_eq!(refused(&s, "/apis/example.com/v1/gadgets"), (404, true));
    assert_eq!(refused(&s, "/apis/nowhere.example/v1/gadgets"), (404, true));
}

#[test]
fn a_requests_verb_follows_its_method_its_name_and_watch() {
    for (method, named, watch, verb) in [
        (Method::GET, true, false, Verb::Get),
        (Method::GET, true, true, Verb::Get),
        (Method::GET, false, true, Verb::Watch),
        (Method::GET, false, false, Verb::List),
        (Method::POST, false, false, Verb::Create),
        (Method::POST, true, false, Verb::Other),
        (Method::PUT, true, false, Verb::Update),
        (Method::PUT, false, false, Verb::Other),
        (Method::PATCH, true, false, Verb::Patch),
        (Method::PATCH, false, false, Verb::Other),
        (Method::DELETE, true, false, Verb::Delete),
        (Method::DELETE, false, false, Verb::Delete),
        (Method::HEAD, true, false, Verb::Other),
    ] {
        assert_eq!(
            Verb::of(&method, named, watch),
            verb,
            "{method} {named} {watch}"
        );
    }
}

#[test]
fn delete_options_come_from_the_body_over_the_query() {
    let none = HashMap::new();
    let q = |p: &str| HashMap::from([("propagationPolicy".to_string(), p.to_string())]);
    let opts =
        |q: &HashMap<String, String>, body: &str| delete_opts(q, &Bytes::from(body.to_string()));
    assert_eq!(
        opts(&none, "").unwrap().propagation,
        Propagation::Background
    );
    assert_eq!(
        opts(&q("Foreground"), " \n").unwrap().propagation,
        Propagation::Foreground
    );
    assert_eq!(
        opts(&q("Foreground"), r#"{"propagationPolicy":"Orphan"}"#)
            .unwrap()
            .propagation,
        Propagation::Orphan
    );
    assert_eq!(
        opts(&none, r#"{"orphanDependents":true}"#)
            .unwrap()
            .propagation,
        Propagation::Orphan
    );
    let pre = opts(
        &none,
        r#"{"preconditions":{"uid":"u-1","resourceVersion":"7"}}"#,
    )
    .unwrap();
    assert_eq!(
        (pre.uid.as_deref(), pre.resource_version.as_deref()),
        (Some("u-1"), Some("7"))
    );
    assert_eq!(opts(&q("Sometimes"), "").unwrap_err().code, 422);
    assert_eq!(opts(&none, "[1]").unwrap_err().code, 400);
    assert_eq!(opts(&none, "{").unwrap_err().code, 400);
}

#[test]
fn list_options_parse_or_are_a_bad_request() {
    let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let o = list_opts(&q(&[("limit", "3"), ("continue", "")])).unwrap();
    assert_eq!((o.limit, o.cont), (Some(3), None));
    let o = list_opts(&q(&[("continue", "abc")])).unwrap();
    assert_eq!(o.cont.as_deref(), Some("abc"));
    assert_eq!(list_opts(&q(&[("limit", "many")])).unwrap_err().code, 400);
    assert!(list_opts(&q(&[("labelSelector", "a in (")])).is_err());
    assert!(list_opts(&q(&[("fieldSelector", "metadata.name=x")])).is_ok());
}
