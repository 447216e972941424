//! Looking up the control-plane binaries, the cache directory, and the version a
//! `kube-apiserver` binary reports.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::EnvtestError;

/// The variable controller-runtime's envtest reads: a folder holding `kube-apiserver` and `etcd`
/// (and, optionally, `kube-controller-manager`). `setup-envtest use -p path` prints one.
pub const KUBEBUILDER_ASSETS: &str = "KUBEBUILDER_ASSETS";
/// actorcile's own variable, read when [`KUBEBUILDER_ASSETS`] is unset: a folder of the same layout.
pub const ACTORCILE_KUBE_ASSETS: &str = "ACTORCILE_KUBE_ASSETS";

/// Paths of the binaries a control plane runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// The `etcd` server.
    pub etcd: PathBuf,
    /// The `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// The `kube-controller-manager`, when the folder has one: needed only by
    /// [`EnvtestBuilder::controller_manager`](super::EnvtestBuilder::controller_manager).
    pub kube_controller_manager: Option<PathBuf>,
}

impl Binaries {
    /// The binaries in one folder of controller-runtime's `KUBEBUILDER_ASSETS` layout:
    /// `kube-apiserver` and `etcd` are required, `kube-controller-manager` is taken when present.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Binaries, EnvtestError> {
        let dir = dir.as_ref();
        let required = |name: &'static str| {
            let p = dir.join(name);
            if is_executable(&p) {
                Ok(p)
            } else {
                Err(EnvtestError::BinaryNotFound {
                    name,
                    looked: format!("{} is not an executable file", p.display()),
                })
            }
        };
        let kube_controller_manager =
            Some(dir.join("kube-controller-manager")).filter(|p| is_executable(p));
        Ok(Binaries {
            etcd: required("etcd")?,
            kube_apiserver: required("kube-apiserver")?,
            kube_controller_manager,
        })
    }
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

/// Finds the control-plane binaries, in this order:
///
/// 1. the folder in `$KUBEBUILDER_ASSETS` (controller-runtime's envtest layout, so binaries that
///    `setup-envtest` downloaded work as they are);
/// 2. the folder in `$ACTORCILE_KUBE_ASSETS`;
/// 3. the cache that `scripts/install-test-deps.sh` fills: `<cache>/k8s/<version>/bin`, the
///    version named in `<cache>/k8s/newest` (see [`cache_dir`]);
/// 4. the newest release in setup-envtest's own store ([`setup_envtest_store`]: what
///    `setup-envtest use` downloaded without `--bin-dir`) for this system and processor.
///
/// A variable that is set wins even when its folder is incomplete (the error says so), so a
/// mistyped path never silently falls back to another server.
pub fn binaries() -> Result<Binaries, EnvtestError> {
    resolve_binaries(
        std::env::var_os(KUBEBUILDER_ASSETS),
        std::env::var_os(ACTORCILE_KUBE_ASSETS),
        cache_dir(),
        setup_envtest_store(),
    )
}

/// setup-envtest's store of downloaded releases, one folder per release
/// (`<version>-<os>-<arch>`, e.g. `1.34.1-linux-amd64`), where `setup-envtest use` puts them by
/// default: `$XDG_DATA_HOME/kubebuilder-envtest/k8s` (else `~/.local/share/...`), on macOS
/// `~/Library/Application Support/io.kubebuilder.envtest/k8s`. `None` without `$HOME`.
pub fn setup_envtest_store() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    if cfg!(target_os = "macos") {
        return home.map(|h| h.join("Library/Application Support/io.kubebuilder.envtest/k8s"));
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".local/share")))?;
    Some(data.join("kubebuilder-envtest/k8s"))
}

/// This system and processor as setup-envtest names its releases' folders: `-<os>-<arch>`, in
/// Go's names (`linux`, `darwin`; `amd64`, `arm64`).
fn platform_suffix() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("-{os}-{arch}")
}

/// The folder of the newest release in setup-envtest's `store` for this system and processor.
fn newest_in_store(store: &Path) -> Option<PathBuf> {
    let suffix = platform_suffix();
    std::fs::read_dir(store)
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let version = KubeVersion::parse(name.strip_suffix(&suffix)?)?;
            Some((version, store.join(name)))
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, dir)| dir)
}

fn resolve_binaries(
    kubebuilder_assets: Option<OsString>,
    actorcile_assets: Option<OsString>,
    cache: Option<PathBuf>,
    store: Option<PathBuf>,
) -> Result<Binaries, EnvtestError> {
    let named = [
        (KUBEBUILDER_ASSETS, kubebuilder_assets),
        (ACTORCILE_KUBE_ASSETS, actorcile_assets),
    ];
    for (var, value) in named {
        if let Some(dir) = value.filter(|v| !v.is_empty()) {
            return Binaries::from_dir(&dir).map_err(|e| match e {
                EnvtestError::BinaryNotFound { name, looked } => EnvtestError::BinaryNotFound {
                    name,
                    looked: format!("${var}: {looked}"),
                },
                other => other,
            });
        }
    }
    // The repository's cache: the build it recorded as the newest (a name that would leave the
    // cache is refused).
    let recorded = cache.as_ref().and_then(|c| {
        let k8s = c.join("k8s");
        let newest = std::fs::read_to_string(k8s.join("newest")).ok()?;
        let newest = newest.trim();
        (!newest.is_empty() && !newest.contains('/')).then(|| k8s.join(newest).join("bin"))
    });
    if let Some(bin) = recorded {
        return Binaries::from_dir(bin);
    }
    if let Some(dir) = store.as_deref().and_then(newest_in_store) {
        return Binaries::from_dir(dir);
    }
    let looked = match &cache {
        None => format!("neither ${KUBEBUILDER_ASSETS}, ${ACTORCILE_KUBE_ASSETS} nor $HOME is set"),
        Some(c) => format!(
            "no build recorded in {} and no release in setup-envtest's store{} (set ${KUBEBUILDER_ASSETS} to use other binaries)",
            c.join("k8s/newest").display(),
            store
                .map(|s| format!(" {}", s.display()))
                .unwrap_or_default(),
        ),
    };
    Err(EnvtestError::BinaryNotFound {
        name: "kube-apiserver",
        looked,
    })
}

/// A Kubernetes release as a binary reports it (`Kubernetes v1.37.2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version (37 for v1.37.2).
    pub minor: u32,
    /// Patch version (2 for v1.37.2).
    pub patch: u32,
}

impl KubeVersion {
    /// Parses `v1.37.2`, `1.37.2`, `Kubernetes v1.37.2` or `v1.37.2-rc.0+abc` (the last word of
    /// the text is read; anything after the patch number is ignored).
    pub fn parse(text: &str) -> Option<KubeVersion> {
        let word = text.split_whitespace().last()?;
        let word = word.strip_prefix('v').unwrap_or(word);
        let mut parts = word.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch_text = parts.next()?;
        let digits = patch_text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(patch_text.len());
        let patch = patch_text[..digits].parse().ok()?;
        Some(KubeVersion {
            major,
            minor,
            patch,
        })
    }

    /// Runs `<kube_apiserver> --version` and parses its answer.
    pub fn of_binary(kube_apiserver: &Path) -> Result<KubeVersion, EnvtestError> {
        let out = std::process::Command::new(kube_apiserver)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| {
                EnvtestError::io(format!("running {} --version", kube_apiserver.display()), e)
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        KubeVersion::parse(text.trim()).ok_or_else(|| EnvtestError::Startup {
            component: "kube-apiserver",
            reason: format!(
                "{} --version answered {:?}, not a version",
                kube_apiserver.display(),
                text.trim()
            ),
            log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Whether this release is at least `major.minor`.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
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
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\necho Kubernetes v1.37.2\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn kubebuilder_assets_then_our_variable_then_the_cache() {
        let assets = tempfile::tempdir().unwrap();
        let ours = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        for dir in [assets.path(), ours.path()] {
            fake_executable(dir, "etcd");
            fake_executable(dir, "kube-apiserver");
        }
        let cached = cache.path().join("k8s/v1.37.2/bin");
        fake_executable(&cached, "etcd");
        fake_executable(&cached, "kube-apiserver");
        fake_executable(&cached, "kube-controller-manager");
        std::fs::write(cache.path().join("k8s/newest"), "v1.37.2\n").unwrap();

        let all = resolve_binaries(
            Some(assets.path().into()),
            Some(ours.path().into()),
            Some(cache.path().into()),
            None,
        )
        .unwrap();
        assert_eq!(all.kube_apiserver, assets.path().join("kube-apiserver"));
        assert_eq!(all.kube_controller_manager, None);

        let no_kubebuilder = resolve_binaries(
            None,
            Some(ours.path().into()),
            Some(cache.path().into()),
            None,
        )
        .unwrap();
        assert_eq!(no_kubebuilder.etcd, ours.path().join("etcd"));

        let cache_only = resolve_binaries(None, None, Some(cache.path().into()), None).unwrap();
        assert_eq!(
            cache_only,
            Binaries {
                etcd: cached.join("etcd"),
                kube_apiserver: cached.join("kube-apiserver"),
                kube_controller_manager: Some(cached.join("kube-controller-manager")),
            }
        );
    }

    #[test]
    fn a_set_variable_with_an_incomplete_folder_is_an_error_not_a_fallback() {
        let assets = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        fake_executable(assets.path(), "kube-apiserver");
        // etcd present but not executable: does not count.
        std::fs::write(assets.path().join("etcd"), "x").unwrap();
        let err = resolve_binaries(
            Some(assets.path().into()),
            None,
            Some(cache.path().into()),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(err, EnvtestError::BinaryNotFound { name: "etcd", .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("$KUBEBUILDER_ASSETS"), "{msg}");
        assert!(msg.contains("scripts/install-test-deps.sh"), "{msg}");
    }

    #[test]
    fn an_empty_cache_names_the_installer() {
        let cache = tempfile::tempdir().unwrap();
        let err = resolve_binaries(None, None, Some(cache.path().into()), None).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("scripts/install-test-deps.sh") && msg.contains("kube-apiserver"),
            "{msg}"
        );
        // A recorded name that would leave the cache is refused.
        std::fs::create_dir_all(cache.path().join("k8s")).unwrap();
        std::fs::write(cache.path().join("k8s/newest"), "../../bin").unwrap();
        assert!(resolve_binaries(None, None, Some(cache.path().into()), None).is_err());
    }

    #[test]
    fn without_a_cached_build_the_newest_release_in_setup_envtests_store_serves() {
        let cache = tempfile::tempdir().unwrap();
        let store = tempfile::tempdir().unwrap();
        let here = |v: &str| store.path().join(format!("{v}{}", platform_suffix()));
        for dir in [
            here("1.33.0"),
            here("1.34.1"),
            here("1.9.0"),
            store.path().join("1.99.0-plan9-mips"),
        ] {
            fake_executable(&dir, "etcd");
            fake_executable(&dir, "kube-apiserver");
        }
        let resolve = || {
            resolve_binaries(
                None,
                None,
                Some(cache.path().into()),
                Some(store.path().into()),
            )
            .unwrap()
            .kube_apiserver
        };
        assert_eq!(resolve(), here("1.34.1").join("kube-apiserver"));
        // A build in the cache comes first.
        let cached = cache.path().join("k8s/v1.37.2/bin");
        fake_executable(&cached, "etcd");
        fake_executable(&cached, "kube-apiserver");
        std::fs::write(cache.path().join("k8s/newest"), "v1.37.2\n").unwrap();
        assert_eq!(resolve(), cached.join("kube-apiserver"));
    }

    #[test]
    fn versions_parse_as_binaries_print_them() {
        let v = KubeVersion::parse("Kubernetes v1.37.2").unwrap();
        assert_eq!((v.major, v.minor, v.patch), (1, 37, 2));
        assert_eq!(v.to_string(), "v1.37.2");
        assert_eq!(
            KubeVersion::parse("v1.20.5-rc.0+abcdef"),
            Some(KubeVersion {
                major: 1,
                minor: 20,
                patch: 5
            })
        );
        assert!(KubeVersion::parse("Kubernetes v0.0.0-master+$Format:%H$").is_some());
        assert_eq!(KubeVersion::parse("Kubernetes"), None);
        assert_eq!(KubeVersion::parse(""), None);
        assert!(v.at_least(1, 24) && !v.at_least(1, 38) && !v.at_least(2, 0));
    }

    #[test]
    fn the_version_of_a_binary_is_read_from_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = fake_executable(dir.path(), "kube-apiserver");
        assert_eq!(
            KubeVersion::of_binary(&p).unwrap(),
            KubeVersion::parse("v1.37.2").unwrap()
        );
        std::fs::write(&p, "#!/bin/sh\necho nonsense\n").unwrap();
        assert!(KubeVersion::of_binary(&p).is_err());
    }
}
