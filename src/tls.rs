//! The rustls crypto provider shared by the runtime's own TLS endpoints (the webhook server, the
//! OTLP exporter): the process's default when the binary installed one, else the provider of
//! the feature `aws-lc-rs` or `ring`, as kube picks its own.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The process's default provider, else the one the features bring; `None` without either.
pub(crate) fn crypto_provider() -> Option<Arc<CryptoProvider>> {
    if let Some(provider) = CryptoProvider::get_default() {
        return Some(provider.clone());
    }
    #[cfg(feature = "aws-lc-rs")]
    return Some(Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Some(Arc::new(rustls::crypto::ring::default_provider()));
    #[cfg(not(any(feature = "ring", feature = "aws-lc-rs")))]
    None
}
