//! CustomResourceDefinitions: checking a CRD enough to serve it, setting its status (`NamesAccepted` and
//! `Established` at once), serving its kind in every served version, and, once the CRD is gone, no longer
//! serving the kind and deleting its objects.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::apply::Ownership;
use super::conversion::Converter;
use super::error::ApiError;
use super::kinds::{Gr, Kind};
use super::object::{ObjRef, meta_str};
use super::store::{Store, WriteKind};

impl Store {
    /// Validates a CRD's spec enough to serve it, and sets its status (Established at once).
    pub(super) fn prepare_crd(&mut self, crd: &mut Value, name: &str) -> Result<(), ApiError> {
        let inv = |field: &str, why: &str| {
            ApiError::invalid(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                name,
                field,
                why.to_string(),
            )
        };
        let spec = crd
            .get("spec")
            .ok_or_else(|| inv("spec", "Required value"))?;
        let group = spec
            .get("group")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let plural = spec
            .pointer("/names/plural")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = spec
            .pointer("/names/kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if group.is_empty() || !group.contains('.') {
            return Err(inv(
                "spec.group",
                "Invalid value: should be a domain with at least one dot",
            ));
        }
        if plural.is_empty() || kind.is_empty() {
            return Err(inv(
                "spec.names",
                "Required value: plural and kind are required",
            ));
        }
        if name != format!("{plural}.{group}") {
            return Err(inv(
                "metadata.name",
                "Invalid value: must be spec.names.plural+\".\"+spec.group",
            ));
        }
        match spec.get("scope").and_then(Value::as_str) {
            Some("Namespaced") | Some("Cluster") => {}
            _ => {
                return Err(inv(
                    "spec.scope",
                    "Unsupported value: supported values: \"Cluster\", \"Namespaced\"",
                ));
            }
        }
        let versions = spec
            .get("versions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if versions.is_empty()
            || versions.iter().any(|v| {
                v.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            })
        {
            return Err(inv(
                "spec.versions",
                "Invalid value: must have at least one named version",
            ));
        }
        if versions
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count()
            != 1
        {
            return Err(inv(
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            ));
        }
        // A built-in kind's group/plural cannot be served by a CRD.
        if let Some(existing) = self
            .routes
            .values()
            .find(|k| k.gr.group == group && k.gr.plural == plural)
            && !existing.custom
        {
            return Err(inv(
                "spec.names.plural",
                "Invalid value: already served by a built-in resource",
            ));
        }
        let storage = versions
            .iter()
            .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .and_then(|v| v.get("name").cloned())
            .unwrap_or(Value::Null);
        let mut names = spec.get("names").cloned().unwrap_or(json!({}));
        if names.get("singular").is_none() {
            names["singular"] = json!(kind.to_lowercase());
        }
        if names.get("listKind").is_none() {
            names["listKind"] = json!(format!("{kind}List"));
        }
        let mut now = self.clock.now();
        if let Some(t) = crd
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "Established"))
            .and_then(|c| c["lastTransitionTime"].as_str())
        {
            now = t.to_string();
        }
        crd["status"] = json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "acceptedNames": names,
            "storedVersions": [storage],
        });
        Ok(())
    }

    /// Serves a (validated) CRD's versions.
    pub(super) fn register_crd(&mut self, crd: &Value) {
        let spec = &crd["spec"];
        let group = spec["group"].as_str().unwrap_or_default().to_string();
        let plural = spec["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = spec["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let list_kind = spec["names"]["listKind"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{kind}List"));
        let namespaced = spec["scope"].as_str() == Some("Namespaced");
        let storage = spec["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .and_then(|v| v["name"].as_str());
        let conversion = match (
            storage,
            self.conversion_hooks.get(&(group.clone(), kind.clone())),
        ) {
            (Some(storage), Some(hook)) => Some(Converter {
                storage: format!("{group}/{storage}"),
                hook: hook.clone(),
            }),
            _ => None,
        };
        self.routes
            .retain(|(g, _, p), _| !(g == &group && p == &plural));
        for v in spec["versions"].as_array().into_iter().flatten() {
            if v.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let version = v["name"].as_str().unwrap_or_default().to_string();
            self.add_route(Kind {
                gr: Gr {
                    group: group.clone(),
                    plural: plural.clone(),
                },
                api_version: format!("{group}/{version}"),
                version,
                kind: kind.clone(),
                list_kind: list_kind.clone(),
                namespaced,
                status: v.pointer("/subresources/status").is_some(),
                generation: true,
                custom: true,
                // Gone at once → a success Status (real 1.20 servers do not answer the object here).
                delete_returns_object: false,
                schema: v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new),
                conversion: conversion.clone(),
            });
        }
    }

    /// Calls `hook` to convert the objects of `group`'s `kind` from now on, serving its CRD again
    /// if it is installed.
    pub(crate) fn register_conversion(
        &mut self,
        group: &str,
        kind: &str,
        hook: Arc<dyn super::conversion::ConversionHook>,
    ) {
        self.conversion_hooks.insert(group, kind, hook);
        let crds = Gr {
            group: "apiextensions.k8s.io".into(),
            plural: "customresourcedefinitions".into(),
        };
        let installed = self.tables.get(&crds).and_then(|t| {
            t.objects
                .values()
                .find(|o| {
                    o.value.pointer("/spec/group").and_then(Value::as_str) == Some(group)
                        && o.value.pointer("/spec/names/kind").and_then(Value::as_str) == Some(kind)
                })
                .map(|o| o.value.clone())
        });
        if let Some(crd) = installed {
            self.register_crd(&crd);
        }
    }

    /// Stops serving a CRD's kind once the CRD is gone, deleting its objects (their watches end).
    pub(super) fn unregister_removed_crds(&mut self) {
        let crds = Gr {
            group: "apiextensions.k8s.io".into(),
            plural: "customresourcedefinitions".into(),
        };
        let live: HashSet<String> = self
            .tables
            .get(&crds)
            .map(|t| t.objects.keys().map(|k| k.1.clone()).collect())
            .unwrap_or_default();
        let dead: BTreeSet<Gr> = self
            .routes
            .values()
            .filter(|k| k.custom && !live.contains(&format!("{}.{}", k.gr.plural, k.gr.group)))
            .map(|k| k.gr.clone())
            .collect();
        for gr in dead {
            self.routes
                .retain(|(g, _, p), _| !(g == &gr.group && p == &gr.plural));
            if let Some(t) = self.tables.get(&gr) {
                let keys: Vec<(String, String)> = t.objects.keys().cloned().collect();
                for (ns, name) in keys {
                    let r = ObjRef {
                        gr: gr.clone(),
                        ns,
                        name,
                    };
                    if let Some(o) = self.lookup(&r) {
                        let v = (*o.value).clone();
                        self.remove(&r, v);
                    }
                }
            }
            self.tables.remove(&gr);
        }
    }

    /// Installs a CRD given as JSON: create, or replace the spec of an existing one.
    pub(crate) fn install_crd(&mut self, mut crd: Value) -> Result<(), ApiError> {
        let kind = self
            .resolve("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .ok_or_else(ApiError::no_route)?;
        crd["apiVersion"] = json!("apiextensions.k8s.io/v1");
        crd["kind"] = json!("CustomResourceDefinition");
        let name = meta_str(&crd, "name").unwrap_or_default().to_string();
        if let Some(mut cur) = self.current(&kind, None, &name)? {
            cur["spec"] = crd.get("spec").cloned().unwrap_or(Value::Null);
            self.update(
                &kind,
                None,
                &name,
                cur,
                false,
                WriteKind::Patch,
                false,
                Ownership::Kept,
            )?;
        } else {
            self.create(&kind, None, crd, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::deletion::DeleteOpts;
    use super::super::testing::*;
    use super::super::watch::EvType;

    #[test]
    fn a_crd_serves_its_kind_at_once_in_every_served_version() {
        let mut s = store();
        s.install_crd(widget_crd(&[
            ("v1", true, true, true),
            ("v2", true, false, false),
            ("v3", false, false, false),
        ]))
        .unwrap();
        let v1 = kind(&s, "example.com", "v1", "widgets");
        assert_eq!(
            (
                v1.api_version.as_str(),
                v1.kind.as_str(),
                v1.list_kind.as_str()
            ),
            ("example.com/v1", "Widget", "WidgetList")
        );
        assert!(v1.custom && v1.generation && v1.namespaced && v1.status);
        assert!(!v1.delete_returns_object);
        assert!(v1.schema.is_some());
        assert!(!kind(&s, "example.com", "v2", "widgets").status);
        assert!(s.resolve("example.com", "v3", "widgets").is_none());
        // A custom group is not a built-in one.
        assert!(!s.serves_builtin_group("example.com"));

        let crds = crds(&s);
        let crd = get(&s, &crds, None, "widgets.example.com").unwrap();
        let conditions: Vec<_> = crd["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["type"].clone(), c["status"].clone()))
            .collect();
        assert_eq!(
            conditions,
            [
                (json!("NamesAccepted"), json!("True")),
                (json!("Established"), json!("True"))
            ]
        );
        assert_eq!(crd["status"]["acceptedNames"]["singular"], "widget");
        assert_eq!(crd["status"]["acceptedNames"]["listKind"], "WidgetList");
        assert_eq!(crd["status"]["storedVersions"], json!(["v1"]));
    }

    #[test]
    fn versions_share_one_storage_and_only_apiversion_is_rewritten() {
        let (mut s, v1, v2) = store_with_two_widget_versions();
        let created = create(
            &mut s,
            &v1,
            Some("default"),
            widget("w", json!({"size": 3})),
        );
        let through_v2 = get(&s, &v2, Some("default"), "w").unwrap();
        assert_eq!(through_v2["apiVersion"], "example.com/v2");
        assert_eq!(through_v2["metadata"], created["metadata"]);
        assert_eq!(through_v2["spec"], json!({"size": 3}));
    }

    #[test]
    fn invalid_crds_are_refused_and_serve_nothing() {
        let mut s = store();
        let count = s.object_count();
        let mut wrong_name = widget_crd(&[("v1", true, true, false)]);
        wrong_name["metadata"]["name"] = json!("gadgets.example.com");
        let mut no_dot = widget_crd(&[("v1", true, true, false)]);
        no_dot["spec"]["group"] = json!("example");
        no_dot["metadata"]["name"] = json!("widgets.example");
        let mut no_scope = widget_crd(&[("v1", true, true, false)]);
        no_scope["spec"]["scope"] = json!("Everywhere");
        let two_storage = widget_crd(&[("v1", true, true, false), ("v2", true, true, false)]);
        let no_storage = widget_crd(&[("v1", true, false, false)]);
        let mut builtin = widget_crd(&[("v1", true, true, false)]);
        builtin["spec"]["group"] = json!("coordination.k8s.io");
        builtin["spec"]["names"] = json!({"plural": "leases", "kind": "Lease"});
        builtin["metadata"]["name"] = json!("leases.coordination.k8s.io");
        for (crd, field) in [
            (wrong_name, "metadata.name"),
            (no_dot, "spec.group"),
            (no_scope, "spec.scope"),
            (two_storage, "spec.versions"),
            (no_storage, "spec.versions"),
            (builtin, "spec.names.plural"),
        ] {
            let err = s.install_crd(crd).unwrap_err();
            assert_eq!((err.code, err.reason), (422, "Invalid"), "{}", err.message);
            assert_eq!(err.details.unwrap()["causes"][0]["field"], field);
        }
        assert!(s.resolve("example.com", "v1", "widgets").is_none());
        assert!(!kind(&s, "coordination.k8s.io", "v1", "leases").custom);
        assert_eq!(s.object_count(), count);
    }

    #[test]
    fn deleting_a_crd_stops_serving_its_kind_and_deletes_its_objects() {
        let (mut s, widgets) = store_with_widgets();
        let count = s.object_count();
        create(&mut s, &widgets, Some("default"), widget("w", json!({})));
        let mut rx = watch_all(&mut s, &widgets);
        let crds = crds(&s);
        s.delete(&crds, None, "widgets.example.com", &DeleteOpts::default())
            .unwrap();
        assert!(s.resolve("example.com", "v1", "widgets").is_none());
        assert_eq!(s.object_count(), count - 1);
        let (ty, obj) = rx.try_recv().unwrap();
        assert_eq!(ty, EvType::Deleted);
        assert_eq!(parse(&obj)["metadata"]["name"], "w");
    }

    #[test]
    fn installing_again_replaces_the_spec_and_keeps_the_established_time() {
        let mut s = store();
        s.install_crd(widget_crd(&[("v1", true, true, false)]))
            .unwrap();
        let crds = crds(&s);
        let before = get(&s, &crds, None, "widgets.example.com").unwrap();
        s.install_crd(widget_crd(&[
            ("v1", true, true, false),
            ("v2", true, false, false),
        ]))
        .unwrap();
        assert!(s.resolve("example.com", "v2", "widgets").is_some());
        let after = get(&s, &crds, None, "widgets.example.com").unwrap();
        assert_eq!(before["metadata"]["generation"], 1);
        assert_eq!(after["metadata"]["generation"], 2);
        assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
        assert_eq!(
            after["status"]["conditions"][1]["lastTransitionTime"],
            before["status"]["conditions"][1]["lastTransitionTime"]
        );
    }
}
