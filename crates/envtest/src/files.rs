//! The working directory of a control plane: keys, tokens, kubeconfigs, logs.

use std::path::{Path, PathBuf};

use super::process::Component;
use super::{ADMIN_NAME, EnvtestError, USER_NAME};

/// The directory a control plane lives in, and the names of the files in it.
///
/// Removed on drop when it is a temporary directory we created (unless kept), or when
/// [`WorkDir::remove`] is called.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
    kubeconfig: PathBuf,
    user_kubeconfig: PathBuf,
    /// Remove the directory on drop.
    remove_on_drop: bool,
}

impl WorkDir {
    /// Uses `dir` (created if missing) or a fresh temporary directory.
    pub(crate) fn create(dir: Option<PathBuf>, keep: bool) -> Result<WorkDir, EnvtestError> {
        let path = match dir {
            Some(d) => {
                std::fs::create_dir_all(&d)
                    .map_err(|e| EnvtestError::io(format!("creating {}", d.display()), e))?;
                d
            }
            None => tempfile::Builder::new()
                .prefix("actorcile-envtest-")
                .tempdir()
                .map_err(|e| EnvtestError::io("creating a temporary directory", e))?
                .keep(),
        };
        let path = path
            .canonicalize()
            .map_err(|e| EnvtestError::io(format!("resolving {}", path.display()), e))?;
        Ok(WorkDir {
            kubeconfig: path.join("kubeconfig"),
            user_kubeconfig: path.join("kubeconfig-user"),
            path,
            remove_on_drop: !keep,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub(crate) fn user_kubeconfig_path(&self) -> &Path {
        &self.user_kubeconfig
    }

    pub(crate) fn log_path(&self, c: Component) -> PathBuf {
        self.path.join(format!("{}.log", c.name()))
    }

    pub(crate) fn etcd_data(&self) -> PathBuf {
        self.path.join("etcd")
    }

    pub(crate) fn cert_dir(&self) -> PathBuf {
        self.path.join("certs")
    }

    /// The apiserver's self-signed serving certificate chain (written by the apiserver itself).
    pub(crate) fn serving_cert(&self) -> PathBuf {
        self.cert_dir().join("apiserver.crt")
    }

    pub(crate) fn sa_key(&self) -> PathBuf {
        self.path.join("sa.key")
    }

    pub(crate) fn sa_pub(&self) -> PathBuf {
        self.path.join("sa.pub")
    }

    pub(crate) fn token_file(&self) -> PathBuf {
        self.path.join("tokens.csv")
    }

    pub(crate) fn set_remove_on_drop(&mut self, remove: bool) {
        self.remove_on_drop = remove;
    }

    /// Removes the directory now (best effort).
    pub(crate) fn remove(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        self.remove_on_drop = false;
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.remove_on_drop {
            self.remove();
        }
    }
}

/// Writes the service-account key pair, the token file and both kubeconfigs.
pub(crate) fn prepare(work: &WorkDir, apiserver_port: u16) -> Result<(), EnvtestError> {
    for d in [work.etcd_data(), work.cert_dir()] {
        std::fs::create_dir_all(&d)
            .map_err(|e| EnvtestError::io(format!("creating {}", d.display()), e))?;
    }
    generate_service_account_keys(&work.sa_key(), &work.sa_pub())?;

    let admin_token = random_token();
    let user_token = random_token();
    let csv = format!(
        "{admin_token},{ADMIN_NAME},{ADMIN_NAME}-uid,system:masters\n{user_token},{USER_NAME},{USER_NAME}-uid\n"
    );
    write_private(&work.token_file(), csv.as_bytes())?;

    let server = format!("https://127.0.0.1:{apiserver_port}");
    let ca = work.serving_cert();
    write_private(
        work.kubeconfig_path(),
        kubeconfig_yaml(&server, &ca, ADMIN_NAME, &admin_token)?.as_bytes(),
    )?;
    write_private(
        work.user_kubeconfig_path(),
        kubeconfig_yaml(&server, &ca, USER_NAME, &user_token)?.as_bytes(),
    )?;
    Ok(())
}

/// 40 random ASCII letters and digits.
///
/// The generator is seeded from the standard library's randomly keyed hasher, not from fastrand's
/// thread-local generator, so that a process that seeds fastrand (the simulator does, for
/// reproducible runs) still gets unpredictable tokens.
/// 40 characters from the operating system's cryptographic generator (through ring, which
/// kube's TLS already uses): the tokens authenticate to the API server.
fn random_token() -> String {
    use ring::rand::SecureRandom;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 40];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random generator");
    // 62 letters: a byte's value modulo 62 is close enough to uniform for a test token
    // (each letter's probability within 1/256 of the others').
    bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<(), EnvtestError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| EnvtestError::io(format!("writing {}", path.display()), e))?;
    f.write_all(data)
        .map_err(|e| EnvtestError::io(format!("writing {}", path.display()), e))
}

/// A kubeconfig for `user` with a bearer token, trusting the certificate file `ca`.
pub(crate) fn kubeconfig_yaml(
    server: &str,
    ca: &Path,
    user: &str,
    token: &str,
) -> Result<String, EnvtestError> {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "actorcile-envtest",
            "cluster": { "server": server, "certificate-authority": ca.to_string_lossy() },
        }],
        "users": [{ "name": user, "user": { "token": token } }],
        "contexts": [{
            "name": "actorcile-envtest",
            "context": { "cluster": "actorcile-envtest", "user": user, "namespace": "default" },
        }],
        "current-context": "actorcile-envtest",
    });
    serde_saphyr::to_string(&doc).map_err(|e| EnvtestError::KubeconfigYaml {
        source: Box::new(e),
    })
}

/// Loads a client configuration from a kubeconfig file (reads the CA file it names).
pub(crate) async fn client_config(kubeconfig: &Path) -> Result<kube::Config, EnvtestError> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let invalid = |source| EnvtestError::Kubeconfig {
        path: kubeconfig.to_path_buf(),
        source,
    };
    let kc = Kubeconfig::read_from(kubeconfig).map_err(invalid)?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(invalid)
}

/// Generates the key pair that signs and verifies service-account tokens: ECDSA P-256 (ES256),
/// the private key as PKCS#8 PEM and the public key as SubjectPublicKeyInfo PEM, both of which
/// kube-apiserver reads.
fn generate_service_account_keys(key: &Path, public: &Path) -> Result<(), EnvtestError> {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| {
        EnvtestError::ServiceAccountKey {
            source: Box::new(e),
        }
    })?;
    write_private(key, pair.serialize_pem().as_bytes())?;
    write_private(public, pair.public_key_pem().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_is_readable_by_kube() {
        let yaml = kubeconfig_yaml(
            "https://127.0.0.1:6443",
            Path::new("/x/ca.crt"),
            "bob",
            "tok",
        )
        .unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("actorcile-envtest"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority.as_deref(), Some("/x/ca.crt"));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(kc.auth_infos[0].name, "bob");
        // The token is a secret string; its serialized form shows it.
        let user = serde_json::to_value(user).unwrap();
        assert_eq!(user["token"], "tok");
    }

    #[test]
    fn prepare_writes_keys_tokens_and_kubeconfigs() {
        let mut work = WorkDir::create(None, false).unwrap();
        prepare(&work, 1234).unwrap();
        let csv = std::fs::read_to_string(work.token_file()).unwrap();
        let lines: Vec<_> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].ends_with(",actorcile-admin,actorcile-admin-uid,system:masters"),
            "{csv}"
        );
        assert!(
            lines[1].ends_with(",actorcile-user,actorcile-user-uid"),
            "{csv}"
        );
        let admin_token = lines[0].split(',').next().unwrap();
        let user_token = lines[1].split(',').next().unwrap();
        assert_eq!(admin_token.len(), 40);
        assert_ne!(admin_token, user_token);
        let key = std::fs::read_to_string(work.sa_key()).unwrap();
        assert!(key.contains("PRIVATE KEY"), "{key}");
        let public = std::fs::read_to_string(work.sa_pub()).unwrap();
        assert!(public.contains("BEGIN PUBLIC KEY"), "{public}");
        let kc = std::fs::read_to_string(work.kubeconfig_path()).unwrap();
        assert!(
            kc.contains(admin_token) && kc.contains("https://127.0.0.1:1234"),
            "{kc}"
        );
        let path = work.path().to_path_buf();
        work.remove();
        assert!(!path.exists());
    }
}
