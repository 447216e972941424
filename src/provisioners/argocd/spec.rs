//! An [`AppSpec`] as the `spec` of an Argo CD `Application`.

use serde_json::{Map, Value, json};

use super::IN_CLUSTER_SERVER;
use crate::provisioners::cd::{AppSource, AppSpec, Destination, IgnoreDifference};

/// The `spec` of the Application of `app` in `project`:
///
/// - `source`: a chart (`repoURL`, `chart`, `targetRevision`: the chart's version) or a git
///   folder (`repoURL`, `path`, `targetRevision`: the branch, tag or commit). The `helm` block
///   (release name, parameters, values) goes with a chart always, and with a git folder when
///   parameters or values are given (Argo CD then renders the folder as a chart; without them
///   it detects what the folder holds).
/// - `syncPolicy`: automated with prune and self-heal; `syncOptions` `CreateNamespace=true`
///   and `ServerSideApply=true` as the spec asks; `managedNamespaceMetadata` with the
///   namespace's labels and annotations.
/// - `ignoreDifferences`: one entry per [`IgnoreDifference`].
pub(super) fn application_spec(app: &AppSpec, project: &str) -> Value {
    let destination = match &app.destination {
        Destination::InCluster => json!({
            "server": IN_CLUSTER_SERVER,
            "namespace": app.namespace,
        }),
        Destination::Registered(id) => json!({
            "name": id,
            "namespace": app.namespace,
        }),
    };
    let mut helm = json!({ "releaseName": app.release });
    if !app.parameters.is_empty() {
        helm["parameters"] = app
            .parameters
            .iter()
            .map(|(name, value)| json!({ "name": name, "value": value }))
            .collect();
    }
    if let Some(values) = &app.values {
        helm["valuesObject"] = values.clone();
    }
    let helm_given = !app.parameters.is_empty() || app.values.is_some();
    let source = match &app.source {
        AppSource::Helm {
            repo,
            chart,
            version,
        } => json!({
            "repoURL": repo,
            "chart": chart,
            "targetRevision": version,
            "helm": helm,
        }),
        AppSource::Git {
            repo,
            path,
            revision,
        } => {
            let mut s = json!({ "repoURL": repo, "path": path, "targetRevision": revision });
            if helm_given {
                s["helm"] = helm;
            }
            s
        }
    };
    let mut options = Vec::new();
    if app.create_namespace {
        options.push("CreateNamespace=true");
    }
    if app.server_side_apply {
        options.push("ServerSideApply=true");
    }
    let mut sync = json!({
        "automated": { "prune": true, "selfHeal": true },
        "syncOptions": options,
    });
    let mut metadata = Map::new();
    if !app.namespace_labels.is_empty() {
        metadata.insert("labels".into(), json!(app.namespace_labels));
    }
    if !app.namespace_annotations.is_empty() {
        metadata.insert("annotations".into(), json!(app.namespace_annotations));
    }
    if !metadata.is_empty() {
        sync["managedNamespaceMetadata"] = Value::Object(metadata);
    }
    let mut spec = json!({
        "project": project,
        "source": source,
        "destination": destination,
        "syncPolicy": sync,
    });
    if !app.ignore_differences.is_empty() {
        spec["ignoreDifferences"] = app
            .ignore_differences
            .iter()
            .map(ignore_difference)
            .collect();
    }
    spec
}

/// One `ignoreDifferences` entry, with the fields it sets only.
fn ignore_difference(d: &IgnoreDifference) -> Value {
    let mut v = json!({ "group": d.group, "kind": d.kind });
    if let Some(name) = &d.name {
        v["name"] = json!(name);
    }
    if let Some(ns) = &d.namespace {
        v["namespace"] = json!(ns);
    }
    for (key, list) in [
        ("jsonPointers", &d.json_pointers),
        ("jqPathExpressions", &d.jq_path_expressions),
        ("managedFieldsManagers", &d.managed_fields_managers),
    ] {
        if !list.is_empty() {
            v[key] = json!(list);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::names::OperatorNames;
    use crate::provisioners::cd::AppIdentity;

    fn app(source: AppSource) -> AppSpec {
        let names = OperatorNames::new("op", "ops.example.com");
        AppSpec {
            identity: AppIdentity::new(&names, "Cluster", Some("t"), "c", "cni", None),
            source,
            release: "cni".into(),
            namespace: "kube-system".into(),
            create_namespace: true,
            namespace_labels: BTreeMap::new(),
            namespace_annotations: BTreeMap::new(),
            server_side_apply: false,
            ignore_differences: Vec::new(),
            parameters: BTreeMap::new(),
            values: None,
            destination: Destination::Registered("edge".into()),
            allow_degraded: false,
        }
    }

    #[test]
    fn a_chart_has_its_helm_block_and_creates_its_namespace_by_default() {
        let spec = application_spec(
            &app(AppSource::helm(
                "https://charts.example.com",
                "web",
                "1.2.0",
            )),
            "platform",
        );
        assert_eq!(
            spec["source"],
            json!({ "repoURL": "https://charts.example.com", "chart": "web",
                    "targetRevision": "1.2.0", "helm": { "releaseName": "cni" } })
        );
        assert_eq!(
            spec["syncPolicy"]["syncOptions"],
            json!(["CreateNamespace=true"])
        );
        assert_eq!(
            spec["destination"],
            json!({ "name": "edge", "namespace": "kube-system" })
        );
        assert_eq!(spec["project"], "platform");
        assert!(spec.get("ignoreDifferences").is_none());
        assert!(spec["syncPolicy"].get("managedNamespaceMetadata").is_none());
    }

    #[test]
    fn a_git_folder_with_every_option_is_written_as_argo_cd_reads_it() {
        let mut a = app(AppSource::git(
            "https://git.example.com/platform.git",
            "charts/cni",
            "v1.16.0",
        ));
        a.create_namespace = false;
        a.server_side_apply = true;
        a.namespace_labels = [("team".to_string(), "net".to_string())].into();
        a.namespace_annotations = [("owner".to_string(), "net@example.com".to_string())].into();
        a.ignore_differences = vec![IgnoreDifference {
            group: "apps".into(),
            kind: "Deployment".into(),
            name: Some("cni".into()),
            json_pointers: vec!["/spec/replicas".into()],
            managed_fields_managers: vec!["kube-controller-manager".into()],
            ..Default::default()
        }];
        let spec = application_spec(&a, "default");
        // No parameters or values: Argo CD detects what the folder holds.
        assert_eq!(
            spec["source"],
            json!({ "repoURL": "https://git.example.com/platform.git", "path": "charts/cni",
                    "targetRevision": "v1.16.0" })
        );
        assert_eq!(
            spec["syncPolicy"]["syncOptions"],
            json!(["ServerSideApply=true"])
        );
        assert_eq!(
            spec["syncPolicy"]["managedNamespaceMetadata"],
            json!({ "labels": { "team": "net" }, "annotations": { "owner": "net@example.com" } })
        );
        assert_eq!(
            spec["ignoreDifferences"],
            json!([{ "group": "apps", "kind": "Deployment", "name": "cni",
                     "jsonPointers": ["/spec/replicas"],
                     "managedFieldsManagers": ["kube-controller-manager"] }])
        );
        // With parameters, the folder is rendered as a chart.
        a.parameters = [("mtu".to_string(), "1450".to_string())].into();
        let spec = application_spec(&a, "default");
        assert_eq!(
            spec["source"]["helm"],
            json!({ "releaseName": "cni", "parameters": [{ "name": "mtu", "value": "1450" }] })
        );
    }
}
