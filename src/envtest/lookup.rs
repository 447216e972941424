//! Looking up the `etcd` and `kube-apiserver` binaries and the cache directory.

use std::path::{Path, PathBuf};

use super::EnvtestError;

/// Paths of the two binaries a control plane needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// The `etcd` server.
    pub etcd: PathBuf,
    /// The `kube-apiserver`.
    pub kube_apiserver: PathBuf,
}

/// The directory where actorcile caches built binaries and state: `$ACTORCILE_CACHE_DIR`, else
/// `$HOME/.cache/actorcile`. `None` when neither variable is set.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ACTORCILE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("actorcile"))
}

/// Finds `etcd` (on `PATH`) and `kube-apiserver` (`$ACTORCILE_KUBE_APISERVER`, else
/// `~/.cache/actorcile/bin/kube-apiserver`, see [`cache_dir`]).
///
/// The error names what is missing and says to run `scripts/install-test-deps.sh`.
pub fn binaries() -> Result<Binaries, EnvtestError> {
    resolve_binaries(
        std::env::var_os("PATH"),
        std::env::var_os("ACTORCILE_KUBE_APISERVER"),
        cache_dir(),
    )
}

fn resolve_binaries(
    path: Option<std::ffi::OsString>,
    apiserver_override: Option<std::ffi::OsString>,
    cache: Option<PathBuf>,
) -> Result<Binaries, EnvtestError> {
    let etcd = path
        .as_ref()
        .and_then(|p| find_on_path(p, "etcd"))
        .ok_or_else(|| EnvtestError::BinaryNotFound {
            name: "etcd",
            looked: format!(
                "searched PATH={}",
                path.as_deref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
        })?;
    let (kube_apiserver, looked) = match apiserver_override.filter(|v| !v.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            let looked = format!("$ACTORCILE_KUBE_APISERVER={}", p.display());
            (p, looked)
        }
        None => match cache {
            Some(dir) => {
                let p = dir.join("bin").join("kube-apiserver");
                let looked = format!(
                    "{} (set $ACTORCILE_KUBE_APISERVER to use another)",
                    p.display()
                );
                (p, looked)
            }
            None => {
                return Err(EnvtestError::BinaryNotFound {
                    name: "kube-apiserver",
                    looked: "neither $ACTORCILE_KUBE_APISERVER nor $HOME is set".into(),
                });
            }
        },
    };
    if !is_executable(&kube_apiserver) {
        return Err(EnvtestError::BinaryNotFound {
            name: "kube-apiserver",
            looked,
        });
    }
    Ok(Binaries {
        etcd,
        kube_apiserver,
    })
}

fn find_on_path(path: &std::ffi::OsStr, name: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_executable(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn binaries_are_found_on_path_and_in_the_cache() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let etcd = fake_executable(bin.path(), "etcd");
        std::fs::create_dir(cache.path().join("bin")).unwrap();
        let api = fake_executable(&cache.path().join("bin"), "kube-apiserver");
        let path = std::env::join_paths(["/nonexistent-dir".as_ref(), bin.path()]).unwrap();
        let b = resolve_binaries(Some(path.clone()), None, Some(cache.path().into())).unwrap();
        assert_eq!(
            b,
            Binaries {
                etcd: etcd.clone(),
                kube_apiserver: api
            }
        );
        // The override wins over the cache.
        let other = fake_executable(bin.path(), "my-apiserver");
        let b = resolve_binaries(
            Some(path),
            Some(other.clone().into()),
            Some(cache.path().into()),
        )
        .unwrap();
        assert_eq!(b.kube_apiserver, other);
    }

    #[test]
    fn missing_binaries_name_the_installer() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let err =
            resolve_binaries(Some(bin.path().into()), None, Some(cache.path().into())).unwrap_err();
        assert!(
            matches!(err, EnvtestError::BinaryNotFound { name: "etcd", .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("scripts/install-test-deps.sh"),
            "{err}"
        );

        fake_executable(bin.path(), "etcd");
        // A non-executable file does not count.
        std::fs::create_dir(cache.path().join("bin")).unwrap();
        std::fs::write(cache.path().join("bin/kube-apiserver"), "x").unwrap();
        let err =
            resolve_binaries(Some(bin.path().into()), None, Some(cache.path().into())).unwrap_err();
        assert!(
            matches!(
                err,
                EnvtestError::BinaryNotFound {
                    name: "kube-apiserver",
                    ..
                }
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("scripts/install-test-deps.sh") && msg.contains("kube-apiserver"),
            "{msg}"
        );
    }
}
