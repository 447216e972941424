//! The store's own cases: writes, conflicts, preconditions, dry runs.

use serde_json::{Value, json};

use super::super::testing::*;
use super::*;

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn create_sets_the_server_owned_metadata() {
    let mut s = store();
    let cm = configmaps(&s);
    let mut body = configmap(
        "a",
        json!({"uid": "mine", "generation": 7, "selfLink": "/x"}),
    );
    body["data"] = json!({"k": "v"});
    let created = create(&mut s, &cm, Some("default"), body);
    let m = &created["metadata"];
    assert_eq!(m["namespace"], "default");
    assert_ne!(m["uid"], "mine");
    assert_eq!(m["uid"].as_str().unwrap().len(), 36);
    assert!(m["creationTimestamp"].is_string());
    assert_eq!(rv(&created), s.revision());
    // ConfigMaps keep no generation; the client's selfLink is dropped.
    assert!(m.get("generation").is_none() && m.get("selfLink").is_none());
    assert_eq!(created["data"], json!({"k": "v"}));
    assert_eq!(get(&s, &cm, Some("default"), "a").unwrap(), created);
    assert_eq!(s.object_count(), 5);

    let err = s
        .create(&cm, Some("default"), configmap("a", json!({})), None)
        .unwrap_err();
    assert_eq!((err.code, err.reason), (409, "AlreadyExists"));
    let err = s
        .create(
            &cm,
            Some("default"),
            configmap("b", json!({"resourceVersion": "3"})),
            None,
        )
        .unwrap_err();
    assert_eq!(err.code, 500);
    assert_eq!(s.object_count(), 5);
}

#[test]
fn generate_name_and_uids_follow_the_seed() {
    let run = || {
        let mut s = store();
        let cm = configmaps(&s);
        let body = json!({"metadata": {"generateName": "cm-"}});
        let created = create(&mut s, &cm, Some("default"), body);
        (
            created["metadata"]["name"].clone(),
            created["metadata"]["uid"].clone(),
        )
    };
    let (name, uid) = run();
    let name = name.as_str().unwrap().to_string();
    assert!(name.starts_with("cm-") && name.len() == 8, "{name}");
    assert_eq!(run(), (json!(name), uid));

    let mut s = store();
    let err = s
        .create(
            &configmaps(&s),
            Some("default"),
            json!({"metadata": {}}),
            None,
        )
        .unwrap_err();
    assert_eq!(err.code, 422);
}

#[test]
fn a_write_with_a_stale_resource_version_conflicts() {
    let mut s = store();
    let cm = configmaps(&s);
    let first = create(&mut s, &cm, Some("default"), configmap("a", json!({})));
    let mut second = first.clone();
    second["data"] = json!({"k": "1"});
    let second = put(&mut s, &cm, Some("default"), second, false).unwrap();
    assert_eq!(rv(&second), rv(&first) + 1);

    let mut stale = first.clone();
    stale["data"] = json!({"k": "2"});
    let err = put(&mut s, &cm, Some("default"), stale, false).unwrap_err();
    assert_eq!((err.code, err.reason), (409, "Conflict"));
    assert_eq!(
        get(&s, &cm, Some("default"), "a").unwrap()["data"],
        json!({"k": "1"})
    );

    // Without a resourceVersion a PUT of a built-in kind is unconditional...
    let mut blind = configmap("a", json!({}));
    blind["data"] = json!({"k": "3"});
    assert_eq!(
        put(&mut s, &cm, Some("default"), blind, false).unwrap()["data"]["k"],
        "3"
    );
    // ...and one of a custom resource refused.
    let (mut s, widgets) = store_with_widgets();
    create(
        &mut s,
        &widgets,
        Some("default"),
        widget("w", json!({"size": 1})),
    );
    let err = put(
        &mut s,
        &widgets,
        Some("default"),
        widget("w", json!({"size": 2})),
        false,
    )
    .unwrap_err();
    assert_eq!((err.code, err.reason), (422, "Invalid"));
}

#[test]
fn a_write_naming_another_uid_or_object_is_refused() {
    let mut s = store();
    let cm = configmaps(&s);
    create(&mut s, &cm, Some("default"), configmap("a", json!({})));
    let err = put(
        &mut s,
        &cm,
        Some("default"),
        configmap("a", json!({"uid": "other"})),
        false,
    )
    .unwrap_err();
    assert_eq!(err.code, 409);
    let err = s
        .update(
            &cm,
            Some("default"),
            "a",
            configmap("b", json!({})),
            false,
            WriteKind::Put,
            false,
            Ownership::Kept,
        )
        .unwrap_err();
    assert_eq!(err.code, 400);
    let err = put(
        &mut s,
        &cm,
        Some("default"),
        configmap("missing", json!({})),
        false,
    )
    .unwrap_err();
    assert_eq!(err.code, 404);
}

#[test]
fn generation_bumps_only_when_the_spec_changes() {
    let mut s = store();
    let deployments = kind(&s, "apps", "v1", "deployments");
    let body = json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}, "status": {"x": 1}});
    let created = create(&mut s, &deployments, Some("default"), body);
    assert_eq!(created["metadata"]["generation"], 1);
    // Create drops the status of a kind with a status subresource.
    assert!(created.get("status").is_none());

    let mut labelled = created.clone();
    labelled["metadata"]["labels"] = json!({"a": "b"});
    labelled["metadata"]["generation"] = json!(40);
    let labelled = put(&mut s, &deployments, Some("default"), labelled, false).unwrap();
    assert_eq!(labelled["metadata"]["generation"], 1);

    let mut status = labelled.clone();
    status["status"] = json!({"ready": 1});
    let status = put(&mut s, &deployments, Some("default"), status, true).unwrap();
    assert_eq!(status["metadata"]["generation"], 1);
    assert_eq!(status["status"], json!({"ready": 1}));

    let mut scaled = status.clone();
    scaled["spec"]["replicas"] = json!(3);
    let scaled = put(&mut s, &deployments, Some("default"), scaled, false).unwrap();
    assert_eq!(scaled["metadata"]["generation"], 2);
}

#[test]
fn the_status_subresource_and_the_main_resource_change_only_their_part() {
    let (mut s, widgets) = store_with_widgets();
    let created = create(
        &mut s,
        &widgets,
        Some("default"),
        widget("w", json!({"size": 1})),
    );
    // A status write changes only status.
    let mut status = created.clone();
    status["spec"] = json!({"size": 9});
    status["metadata"]["labels"] = json!({"a": "b"});
    status["status"] = json!({"ready": true});
    let status = put(&mut s, &widgets, Some("default"), status, true).unwrap();
    assert_eq!(status["spec"], json!({"size": 1}));
    assert!(status["metadata"].get("labels").is_none());
    assert_eq!(status["status"], json!({"ready": true}));
    // A main write keeps the stored status.
    let mut main = status.clone();
    main["spec"] = json!({"size": 2});
    main["status"] = json!({"ready": false});
    let main = put(&mut s, &widgets, Some("default"), main, false).unwrap();
    assert_eq!(main["spec"], json!({"size": 2}));
    assert_eq!(main["status"], json!({"ready": true}));
    assert_eq!(main["metadata"]["generation"], 2);
}

#[test]
fn a_write_that_changes_nothing_stores_nothing() {
    let mut s = store();
    let cm = configmaps(&s);
    let created = create(&mut s, &cm, Some("default"), configmap("a", json!({})));
    let mut rx = watch_all(&mut s, &cm);
    let rev = s.revision();
    let same = put(&mut s, &cm, Some("default"), created.clone(), false).unwrap();
    assert_eq!(same, created);
    assert_eq!(s.revision(), rev);
    assert!(rx.try_recv().is_err());
}

#[test]
fn injected_conflicts_and_dry_runs_store_nothing() {
    let mut s = store();
    let cm = configmaps(&s);
    let created = create(&mut s, &cm, Some("default"), configmap("a", json!({})));
    let rev = s.revision();
    let mut changed = created.clone();
    changed["data"] = json!({"k": "v"});
    let err = s
        .update(
            &cm,
            Some("default"),
            "a",
            changed.clone(),
            false,
            WriteKind::Put,
            true,
            Ownership::Kept,
        )
        .unwrap_err();
    assert_eq!((err.code, s.injected_conflicts), (409, 1));

    s.dry_run = true;
    let answer = put(&mut s, &cm, Some("default"), changed, false).unwrap();
    let made = create(&mut s, &cm, Some("default"), configmap("b", json!({})));
    s.dry_run = false;
    assert_eq!(answer["data"], json!({"k": "v"}));
    assert_eq!(made["metadata"]["name"], "b");
    assert_eq!(s.revision(), rev);
    assert_eq!(get(&s, &cm, Some("default"), "a").unwrap(), created);
    assert!(get(&s, &cm, Some("default"), "b").is_none());
}
