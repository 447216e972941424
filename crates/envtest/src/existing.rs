//! An existing cluster instead of a started control plane: controller-runtime's
//! `USE_EXISTING_CLUSTER` ([`EnvtestBuilder::use_existing_cluster`](super::EnvtestBuilder::use_existing_cluster)).
//!
//! The cluster is the one a kubeconfig names (the builder's, else `$KUBECONFIG`, else
//! `~/.kube/config`, its current context). Its admin is whoever that kubeconfig authenticates;
//! the non-admin user [`USER_NAME`] is that identity impersonating it (the kubeconfig's `as`),
//! so RBAC tests that bind roles to [`Envtest::user_name`](super::Envtest::user_name) work
//! when the kubeconfig's identity may impersonate users (a cluster admin may). Both kubeconfigs
//! are written into the working directory, self-contained (the current context only), for
//! tools and child processes.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{EnvtestError, KubeVersion, USER_NAME, files};

/// The environment variable that makes [`Envtest::start`](super::Envtest::start) and
/// [`Envtest::shared`](super::Envtest::shared) use the existing cluster, as in
/// controller-runtime: `true`, `1`, `t` and their capitalisations turn it on (Go's
/// `strconv.ParseBool`).
pub const USE_EXISTING_CLUSTER: &str = "USE_EXISTING_CLUSTER";

/// Whether `$USE_EXISTING_CLUSTER` asks for the existing cluster.
pub(crate) fn asked_by_env() -> bool {
    std::env::var(USE_EXISTING_CLUSTER).is_ok_and(|v| parse_bool(&v))
}

/// Go's `strconv.ParseBool` true values (anything else is false, as controller-runtime treats
/// a value it cannot parse).
fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// What an existing cluster gives an [`Envtest`](super::Envtest).
pub(crate) struct Existing {
    pub(crate) work: files::WorkDir,
    pub(crate) config: kube::Config,
    pub(crate) user_config: kube::Config,
    pub(crate) version: KubeVersion,
}

/// Connects to the cluster of `kubeconfig` (`None`: kube's default, `$KUBECONFIG` or
/// `~/.kube/config`): writes its current context's kubeconfig, and the impersonating user's,
/// into a working directory, and reads the server's version.
pub(crate) async fn connect(
    kubeconfig: Option<&Path>,
    dir: Option<PathBuf>,
    keep: bool,
) -> Result<Existing, EnvtestError> {
    let source = kubeconfig.map_or_else(
        || PathBuf::from("$KUBECONFIG or ~/.kube/config"),
        Path::to_path_buf,
    );
    let invalid = |source_err| EnvtestError::Kubeconfig {
        path: source.clone(),
        source: source_err,
    };
    let kc = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(invalid)?;
    let admin = current_context_only(kc).map_err(invalid)?;
    let mut user = admin.clone();
    for a in &mut user.auth_infos {
        if let Some(info) = a.auth_info.as_mut() {
            info.impersonate = Some(USER_NAME.to_string());
            info.impersonate_groups = None;
            info.impersonate_uid = None;
            info.impersonate_user_extra = None;
        }
    }
    let work = files::WorkDir::create(dir, keep)?;
    for (kc, path) in [
        (&admin, work.kubeconfig_path()),
        (&user, work.user_kubeconfig_path()),
    ] {
        let text = serde_json::to_string_pretty(kc).map_err(|e| EnvtestError::KubeconfigYaml {
            source: Box::new(e),
        })?;
        files::write_private(path, text.as_bytes())?;
    }
    let options = KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(admin, &options)
        .await
        .map_err(invalid)?;
    let user_config = kube::Config::from_custom_kubeconfig(user, &options)
        .await
        .map_err(invalid)?;
    let client = kube::Client::try_from(config.clone())?;
    let info = client.apiserver_version().await?;
    let version = KubeVersion::parse(&info.git_version).ok_or_else(|| EnvtestError::Startup {
        component: "kube-apiserver",
        reason: format!(
            "the existing cluster's /version answered {:?}, not a version",
            info.git_version
        ),
        log_tail: String::new(),
    })?;
    Ok(Existing {
        work,
        config,
        user_config,
        version,
    })
}

/// `kc` with its current context, and that context's cluster and user, only.
fn current_context_only(kc: Kubeconfig) -> Result<Kubeconfig, kube::config::KubeconfigError> {
    use kube::config::KubeconfigError;
    let current = kc
        .current_context
        .clone()
        .ok_or(KubeconfigError::CurrentContextNotSet)?;
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .cloned()
        .ok_or_else(|| KubeconfigError::LoadContext(current.clone()))?;
    let (cluster, user) = context
        .context
        .as_ref()
        .map(|c| (c.cluster.clone(), c.user.clone()))
        .unwrap_or_default();
    Ok(Kubeconfig {
        clusters: kc
            .clusters
            .into_iter()
            .filter(|c| c.name == cluster)
            .collect(),
        auth_infos: kc
            .auth_infos
            .into_iter()
            .filter(|a| Some(&a.name) == user.as_ref())
            .collect(),
        contexts: vec![context],
        current_context: Some(current),
        ..Kubeconfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_reads_as_go_reads_a_bool() {
        for v in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(parse_bool(v), "{v}");
        }
        for v in ["", "0", "false", "yes", "on", " true"] {
            assert!(!parse_bool(v), "{v}");
        }
    }
}
