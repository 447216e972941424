//! What the Argo CD driver reads of an Application: Argo CD writes its status and anyone who
//! can edit the Application writes the rest, so any Application gives a health, never a panic;
//! `Healthy` only when Argo CD compared the current spec and says Synced and Healthy;
//! `Deleting` exactly when the Application is being deleted.

#![no_main]

use actorcile::fuzzing::argocd_health;
use actorcile::provisioners::cd::AppHealth;
use arbitrary::Arbitrary;
use kube::core::DynamicObject;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// Where a value is written into the Application.
#[derive(Arbitrary, Debug)]
enum Field {
    Spec,
    SpecSource,
    SpecDestination,
    Status,
    Sync,
    SyncStatus,
    ComparedTo,
    ComparedSource,
    ComparedDestination,
    Health,
    HealthStatus,
    HealthMessage,
}

impl Field {
    fn pointer(&self) -> &'static [&'static str] {
        match self {
            Field::Spec => &["spec"],
            Field::SpecSource => &["spec", "source"],
            Field::SpecDestination => &["spec", "destination"],
            Field::Status => &["status"],
            Field::Sync => &["status", "sync"],
            Field::SyncStatus => &["status", "sync", "status"],
            Field::ComparedTo => &["status", "sync", "comparedTo"],
            Field::ComparedSource => &["status", "sync", "comparedTo", "source"],
            Field::ComparedDestination => &["status", "sync", "comparedTo", "destination"],
            Field::Health => &["status", "health"],
            Field::HealthStatus => &["status", "health", "status"],
            Field::HealthMessage => &["status", "health", "message"],
        }
    }
}

/// A value: one of the words Argo CD writes, or anything else.
#[derive(Arbitrary, Debug)]
enum Val {
    Word(u8),
    Text(String),
    Number(i64),
    Bool(bool),
    Null,
    Object(Vec<(String, String)>),
    List(Vec<String>),
}

const WORDS: &[&str] = &[
    "Synced",
    "OutOfSync",
    "Healthy",
    "Degraded",
    "Progressing",
    "Missing",
    "Unknown",
    "",
];

impl Val {
    fn json(&self) -> Value {
        match self {
            Val::Word(i) => json!(WORDS[usize::from(*i) % WORDS.len()]),
            Val::Text(s) => json!(s),
            Val::Number(n) => json!(n),
            Val::Bool(b) => json!(b),
            Val::Null => Value::Null,
            Val::Object(kv) => Value::Object(kv.iter().map(|(k, v)| (k.clone(), json!(v))).collect()),
            Val::List(l) => json!(l),
        }
    }
}

/// Writes `value` at `path`, making (or replacing with) objects on the way.
fn set(root: &mut Value, path: &[&str], value: Value) {
    let mut at = root;
    for key in &path[..path.len() - 1] {
        if !at.is_object() {
            *at = json!({});
        }
        at = at
            .as_object_mut()
            .expect("an object")
            .entry(key.to_string())
            .or_insert_with(|| json!({}));
    }
    if !at.is_object() {
        *at = json!({});
    }
    at.as_object_mut()
        .expect("an object")
        .insert(path[path.len() - 1].to_string(), value);
}

fuzz_target!(|input: (bool, Vec<(Field, Val)>)| {
    let (deleting, fields) = input;
    let mut app = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": "app", "namespace": "argocd"},
    });
    if deleting {
        app["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    for (field, value) in &fields {
        set(&mut app, field.pointer(), value.json());
    }
    let Ok(app) = serde_json::from_value::<DynamicObject>(app) else {
        return;
    };
    let health = argocd_health(&app);
    assert_eq!(deleting, health == AppHealth::Deleting, "{health:?}");
    if health == AppHealth::Healthy {
        let status = &app.data["status"];
        assert_eq!(status["sync"]["status"], "Synced");
        assert_eq!(status["health"]["status"], "Healthy");
        let compared = &status["sync"]["comparedTo"];
        assert_eq!(compared["source"], app.data["spec"]["source"]);
        assert_eq!(compared["destination"], app.data["spec"]["destination"]);
    }
});
