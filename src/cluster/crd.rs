//! CustomResourceDefinitions: checking a CRD enough to serve it, setting its status (`NamesAccepted` and
//! `Established` at once), serving its kind in every served version, and, once the CRD is gone, no longer
//! serving the kind and deleting its objects.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::error::ApiError;
use super::kinds::{Gr, Kind};
use super::store::{ObjRef, Store, WriteKind, meta_str};

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
        // Another CRD must not serve the same group/plural.
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
            });
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
        if let Some(mut cur) = self.current(&kind, None, &name) {
            cur["spec"] = crd.get("spec").cloned().unwrap_or(Value::Null);
            self.update(
                &kind,
                None,
                &name,
                cur,
                false,
                WriteKind::Patch,
                false,
                None,
            )?;
        } else {
            self.create(&kind, None, crd, None)?;
        }
        Ok(())
    }
}
