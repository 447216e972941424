//! Installing CustomResourceDefinitions and reading them from YAML.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use kube::api::{Api, Patch, PatchParams};

use super::EnvtestError;

/// The field manager of the CRDs [`install_crds`] applies.
pub const FIELD_MANAGER: &str = "actorcile-envtest";

/// Creates or updates (server-side apply, field manager [`FIELD_MANAGER`]) each CRD with
/// `client`, then waits up to `timeout` until the API server serves each: discovery lists its
/// resource in every served version (as controller-runtime's envtest waits, since a CRD can be
/// Established a moment before its resource is served). Works against any cluster.
pub async fn install_crds(
    client: kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<(), EnvtestError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd
            .metadata
            .name
            .as_deref()
            .ok_or(EnvtestError::CrdWithoutName)?;
        let mut body = crd.clone();
        body.metadata.resource_version = None;
        body.metadata.managed_fields = None;
        body.status = None;
        api.patch(name, &params, &Patch::Apply(&body)).await?;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    for crd in crds {
        let plural = &crd.spec.names.plural;
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let group_version = format!("{}/{}", crd.spec.group, version.name);
            loop {
                match client.list_api_group_resources(&group_version).await {
                    Ok(list) if list.resources.iter().any(|r| &r.name == plural) => break,
                    Ok(_) => {}
                    // The group is not served yet.
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(EnvtestError::CrdNotEstablished {
                        name: crd.metadata.name.clone().unwrap_or_default(),
                        timeout,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Ok(())
}

/// Waits up to `timeout` until the API server's OpenAPI document (`GET /openapi/v2`) lists the
/// paths of every served version of each CRD. Works against any cluster.
///
/// After a CRD is Established, kube-apiserver rebuilds and merges its OpenAPI document in the
/// background, about half a CPU-second on a 2-core machine. Benchmarks and tests that measure
/// the API server wait for it first, so that work does not overlap what they measure.
///
/// ```no_run
/// # async fn demo(env: &actorcile_envtest::Envtest,
/// #     crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition)
/// #     -> Result<(), actorcile_envtest::EnvtestError> {
/// use std::time::Duration;
///
/// env.install_crds(&[crd.clone()]).await?;
/// actorcile_envtest::wait_for_openapi(env.client(), &[crd], Duration::from_secs(30)).await?;
/// # Ok(())
/// # }
/// ```
pub async fn wait_for_openapi(
    client: kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<(), EnvtestError> {
    let mut paths = Vec::new();
    for crd in crds {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or(EnvtestError::CrdWithoutName)?;
        paths.extend(openapi_paths(crd).into_iter().map(|p| (name.clone(), p)));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let request = http::Request::get("/openapi/v2")
            .body(Vec::new())
            .expect("a static GET request");
        let document = client.request_text(request).await?;
        let Some((name, _)) = paths.iter().find(|(_, p)| !document.contains(p.as_str())) else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(EnvtestError::CrdOpenApiNotPublished {
                name: name.clone(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The OpenAPI path of each served version of `crd`'s collection, as a JSON key (quoted).
fn openapi_paths(crd: &CustomResourceDefinition) -> Vec<String> {
    let spec = &crd.spec;
    let scope = if spec.scope == "Namespaced" {
        "namespaces/{namespace}/"
    } else {
        ""
    };
    spec.versions
        .iter()
        .filter(|v| v.served)
        .map(|v| {
            format!(
                "\"/apis/{}/{}/{scope}{}\"",
                spec.group, v.name, spec.names.plural
            )
        })
        .collect()
}

/// Reads CustomResourceDefinitions from YAML text holding one or more documents (separated by
/// `---`); empty documents are skipped (and not counted in an error's document number).
pub fn crds_from_yaml(text: &str) -> Result<Vec<CustomResourceDefinition>, EnvtestError> {
    let mut out = Vec::new();
    let mut reader = text.as_bytes();
    let docs = serde_saphyr::read::<_, serde_json::Value>(&mut reader);
    for (index, doc) in docs.enumerate() {
        let invalid = |source: Box<dyn std::error::Error + Send + Sync>| EnvtestError::Yaml {
            document: index + 1,
            source,
        };
        let value = doc.map_err(|e| invalid(Box::new(e)))?;
        if value.is_null() {
            continue;
        }
        let crd: CustomResourceDefinition =
            serde_json::from_value(value).map_err(|e| invalid(Box::new(e)))?;
        out.push(crd);
    }
    Ok(out)
}

/// Reads the CustomResourceDefinitions of every `.yaml`, `.yml` and `.json` file in `dir` (not
/// its subfolders), in the order of the files' names; other files are skipped. A file that
/// holds anything else is an [`EnvtestError::CrdFile`] naming it.
pub fn crds_from_dir(
    dir: impl AsRef<std::path::Path>,
) -> Result<Vec<CustomResourceDefinition>, EnvtestError> {
    let dir = dir.as_ref();
    let reading = |e| EnvtestError::io(format!("reading CRD folder {}", dir.display()), e);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(reading)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| EnvtestError::io(format!("reading {}", file.display()), e))?;
        out.extend(crds_from_yaml(&text).map_err(|e| EnvtestError::CrdFile {
            path: file.clone(),
            source: Box::new(e),
        })?);
    }
    Ok(out)
}

/// The widgets CRD of the envtest module's tests.
#[cfg(test)]
pub(super) const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// The widgets CRD and, after an empty document, a cluster-scoped one.
    fn crd_yaml() -> String {
        format!(
            "{WIDGET_CRD}---\n---\n{}",
            r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets}
  scope: Cluster
  versions: []
"#
        )
    }

    #[test]
    fn crds_from_yaml_reads_every_document() {
        let crds = crds_from_yaml(&crd_yaml()).unwrap();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["widgets.example.com", "gadgets.example.com"]);
        assert_eq!(crds[1].spec.scope, "Cluster");
    }

    #[test]
    fn openapi_paths_name_each_served_version_in_its_scope() {
        let mut crds = crds_from_yaml(&crd_yaml()).unwrap();
        assert_eq!(
            openapi_paths(&crds[0]),
            ["\"/apis/example.com/v1/namespaces/{namespace}/widgets\""]
        );
        let mut v1 = crds[0].spec.versions[0].clone();
        let mut v2 = v1.clone();
        v2.name = "v2".into();
        v1.served = false;
        crds[1].spec.versions = vec![v1, v2];
        assert_eq!(
            openapi_paths(&crds[1]),
            ["\"/apis/example.com/v2/gadgets\""]
        );
    }

    #[test]
    fn a_crd_folder_gives_the_crds_of_its_yaml_and_json_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let widget = crds_from_yaml(WIDGET_CRD).unwrap().remove(0);
        let mut gadget = widget.clone();
        gadget.metadata.name = Some("gadgets.example.com".into());
        std::fs::write(dir.path().join("b-widget.yaml"), WIDGET_CRD).unwrap();
        std::fs::write(
            dir.path().join("a-gadget.json"),
            serde_json::to_string(&gadget).unwrap(),
        )
        .unwrap();
        // Neither another file nor a subfolder is read.
        std::fs::write(dir.path().join("notes.txt"), "not: [yaml").unwrap();
        std::fs::create_dir(dir.path().join("old")).unwrap();
        std::fs::write(dir.path().join("old/broken.yaml"), "not: [yaml").unwrap();
        let names: Vec<_> = crds_from_dir(dir.path())
            .unwrap()
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["gadgets.example.com", "widgets.example.com"]);
        std::fs::write(dir.path().join("c.yml"), "metadata: 7").unwrap();
        let err = crds_from_dir(dir.path()).unwrap_err();
        assert!(
            matches!(&err, EnvtestError::CrdFile { path, source }
                if path.ends_with("c.yml") && matches!(**source, EnvtestError::Yaml { document: 1, .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("c.yml"), "{err}");
        assert!(matches!(
            crds_from_dir(dir.path().join("missing")),
            Err(EnvtestError::Io { .. })
        ));
    }

    #[test]
    fn crds_from_yaml_rejects_garbage() {
        let err = crds_from_yaml("apiVersion: v1\nkind: [unclosed").unwrap_err();
        assert!(
            matches!(err, EnvtestError::Yaml { document: 1, .. }),
            "{err:?}"
        );
        let err = crds_from_yaml("metadata: 7").unwrap_err();
        assert!(
            matches!(err, EnvtestError::Yaml { document: 1, .. }),
            "{err:?}"
        );
        // Empty documents do not count, and the cause is the source.
        let err =
            crds_from_yaml(&format!("---\n---\n{WIDGET_CRD}\n---\nmetadata: 7\n")).unwrap_err();
        assert!(
            matches!(err, EnvtestError::Yaml { document: 2, .. }),
            "{err:?}"
        );
        let source = std::error::Error::source(&err).expect("a YAML error");
        assert!(err.to_string().ends_with(&source.to_string()), "{err}");
    }
}
