//! The webhook server's certificate: generated (a CA of the operator's own and a serving
//! certificate it signs, with rcgen), or read from files (a mounted Secret, as cert-manager
//! writes it: `tls.crt`, `tls.key`, `ca.crt`) and read again when they change.
//!
//! The server holds its certificate in a [`ServingCert`]: a new one takes effect on the next
//! TLS handshake, without a restart; connections already open keep theirs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// A certificate could not be made, read or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// rcgen could not make a key or a certificate.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The PEM holds no certificate, or no usable private key.
    #[error("{what}: {message}")]
    Pem {
        /// Which PEM.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// No rustls crypto provider: install one (`CryptoProvider::install_default`) or take the
    /// feature `ring` or `aws-lc-rs`.
    #[error("no rustls crypto provider is installed, and neither feature ring nor aws-lc-rs is on")]
    NoCryptoProvider,
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider ([`crate::tls::crypto_provider`]).
pub(crate) fn provider() -> Result<Arc<CryptoProvider>, TlsError> {
    crate::tls::crypto_provider().ok_or(TlsError::NoCryptoProvider)
}

/// A certificate chain and its key, in PEM.
#[derive(Clone)]
pub struct CertPem {
    /// The certificate chain, leaf first.
    pub cert: String,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
}

impl std::fmt::Debug for CertPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPem")
            .field("cert", &self.cert)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A certificate authority of the operator's own, for serving certificates it signs: for tests,
/// and for operators installed without cert-manager. Its certificate is the CA bundle the API
/// server is given.
pub struct GeneratedCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl std::fmt::Debug for GeneratedCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedCa").finish_non_exhaustive()
    }
}

/// A validity of `days` from today (rcgen's own date type, so that no second date-time library
/// is needed).
fn validity(params: &mut rcgen::CertificateParams, days: i64) {
    let today = jiff::Zoned::now().date();
    let start = today.yesterday().unwrap_or(today);
    let end = today
        .checked_add(jiff::Span::new().days(days))
        .unwrap_or(today);
    let ymd = |d: jiff::civil::Date| {
        rcgen::date_time_ymd(d.year().into(), d.month() as u8, d.day() as u8)
    };
    params.not_before = ymd(start);
    params.not_after = ymd(end);
}

impl GeneratedCa {
    /// A new CA named `name`, valid for ten years.
    pub fn new(name: &str) -> Result<Self, TlsError> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} webhook CA"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, 3650);
        let key = rcgen::KeyPair::generate()?;
        Ok(GeneratedCa {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key)?,
        })
    }

    /// The CA's certificate (the `caBundle`), in PEM.
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`),
    /// signed by this CA, valid for a year.
    pub fn issue(&self, names: &[&str]) -> Result<CertPem, TlsError> {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, *first);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params, 365);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The certificate the server presents; [`set`](Self::set) replaces it for the next
/// handshake.
#[derive(Clone, Debug)]
pub struct ServingCert {
    current: Arc<RwLock<Arc<CertifiedKey>>>,
}

impl ServingCert {
    /// Serves `pem`.
    pub fn new(pem: &CertPem) -> Result<Self, TlsError> {
        Ok(ServingCert {
            current: Arc::new(RwLock::new(Arc::new(certified(pem)?))),
        })
    }

    /// Serves `pem` from the next handshake on. A PEM that does not parse is an error, and the
    /// certificate served stays the one before.
    pub fn set(&self, pem: &CertPem) -> Result<(), TlsError> {
        let key = Arc::new(certified(pem)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = key;
        Ok(())
    }

    /// The leaf certificate served now (DER).
    pub fn leaf(&self) -> CertificateDer<'static> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).cert[0].clone()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

fn certified(pem: &CertPem) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            what: "the certificate".into(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "the certificate".into(),
            message: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).map_err(|e| TlsError::Pem {
        what: "the private key".into(),
        message: e.to_string(),
    })?;
    let signer = provider()?.key_provider.load_private_key(key)?;
    Ok(CertifiedKey::new(chain, signer))
}

/// The files of a mounted TLS Secret (`kubernetes.io/tls`, as cert-manager writes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain (`<dir>/tls.crt`).
    pub cert: PathBuf,
    /// The private key (`<dir>/tls.key`).
    pub key: PathBuf,
    /// The CA that signed it, if the Secret has one (`<dir>/ca.crt`): the runtime writes it
    /// into the webhook configurations and the CRDs' conversion.
    pub ca: Option<PathBuf>,
}

impl CertFiles {
    /// `tls.crt`, `tls.key` and `ca.crt` in `dir` (a Secret's mount).
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: Some(dir.join("ca.crt")),
        }
    }

    /// The certificate and key now.
    pub fn read(&self) -> Result<CertPem, TlsError> {
        Ok(CertPem {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
        })
    }

    /// The CA now (`None` without a CA file, or when it does not exist).
    pub fn read_ca(&self) -> Result<Option<String>, TlsError> {
        match &self.ca {
            Some(path) if path.exists() => read(path).map(Some),
            _ => Ok(None),
        }
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Where the server's certificate comes from.
#[derive(Debug)]
#[non_exhaustive]
pub enum Certificates {
    /// Files, read at start and again every `reload` when they changed (a Secret's mount
    /// changes all its files at once, by a symlink swap; a read between two writes of a
    /// non-Secret directory that gives a key not matching the certificate is refused, and the
    /// next read retries).
    Files {
        /// The files.
        files: CertFiles,
        /// How often they are checked (controller-runtime's certwatcher: 10 s).
        reload: Duration,
    },
    /// A certificate signed by a CA of the runtime's own, made at start for `names`.
    Generated {
        /// The CA.
        ca: Arc<GeneratedCa>,
        /// The names the certificate is for.
        names: Vec<String>,
    },
}

impl Certificates {
    /// The files of the Secret mounted at `dir`, checked for changes every 10 s.
    pub fn from_dir(dir: impl AsRef<Path>) -> Self {
        Certificates::Files {
            files: CertFiles::in_dir(dir),
            reload: Duration::from_secs(10),
        }
    }

    /// A certificate for `names` from a new CA of the runtime's own.
    pub fn generated(operator: &str, names: &[&str]) -> Result<Self, TlsError> {
        Ok(Certificates::Generated {
            ca: Arc::new(GeneratedCa::new(operator)?),
            names: names.iter().map(|n| n.to_string()).collect(),
        })
    }
}

/// The certificate and key now, and the CA bundle (if known).
pub(crate) fn load(source: &Certificates) -> Result<(CertPem, Option<String>), TlsError> {
    match source {
        Certificates::Files { files, .. } => Ok((files.read()?, files.read_ca()?)),
        Certificates::Generated { ca, names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            Ok((ca.issue(&names)?, Some(ca.ca_pem())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_is_served_and_replaced() {
        let ca = GeneratedCa::new("test").unwrap();
        assert!(ca.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let first = ca.issue(&["127.0.0.1", "webhook.ns.svc"]).unwrap();
        let serving = ServingCert::new(&first).unwrap();
        let leaf = serving.leaf();
        let second = ca.issue(&["127.0.0.1"]).unwrap();
        serving.set(&second).unwrap();
        assert_ne!(serving.leaf(), leaf);
        let broken = CertPem {
            cert: "not a certificate".into(),
            key: second.key.clone(),
        };
        assert!(serving.set(&broken).is_err());
        assert_ne!(
            serving.leaf(),
            leaf,
            "a broken PEM leaves the certificate served as it was"
        );
    }

    #[test]
    fn a_key_is_never_printed() {
        let pem = CertPem {
            cert: "c".into(),
            key: "secret".into(),
        };
        assert!(!format!("{pem:?}").contains("secret"));
    }
}
