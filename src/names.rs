//! The Kubernetes name rules the runtime checks before it writes a name: DNS subdomains and
//! qualified names (finalizers, condition types). The API server enforces the same rules; the
//! runtime checks first so a bad name is a typed error at start-up, not a failed write later.
//! Also the name this replica goes by, the base of the ids a runtime gives itself.

/// Whether `s` is a DNS subdomain (RFC 1123): at most 253 characters, lowercase alphanumeric
/// labels of at most 63 characters joined by `.`, each label starting and ending alphanumeric
/// (`-` inside).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

pub(crate) fn is_dns_label(l: &str) -> bool {
    let b = l.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a qualified name with a prefix, `prefix/name`, as the API server requires of
/// a finalizer that is not one of Kubernetes' own: the prefix a DNS subdomain, the name at most
/// 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
///
/// ```
/// use actorcile::names::is_prefixed_qualified_name;
/// assert!(is_prefixed_qualified_name("example.com/cleanup"));
/// assert!(!is_prefixed_qualified_name("cleanup"));
/// assert!(!is_prefixed_qualified_name("Example.com/cleanup"));
/// assert!(!is_prefixed_qualified_name("example.com/clean up"));
/// ```
pub fn is_prefixed_qualified_name(s: &str) -> bool {
    let Some((prefix, name)) = s.split_once('/') else {
        return false;
    };
    let b = name.as_bytes();
    is_dns_subdomain(prefix)
        && !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// This replica's name: `POD_NAME` (set it from the Pod's name with the downward API), else
/// `HOSTNAME`, else `actorcile`. The base of the ids a runtime gives itself (guard lock
/// holders, leader election identities), which add a suffix so two processes differ.
pub(crate) fn replica_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "actorcile".into())
}

/// This process's identity among the replicas (leader election, sharding): [`replica_name`]
/// and the process id, so two processes on one machine differ.
pub(crate) fn replica_identity() -> String {
    format!("{}-{}", replica_name(), std::process::id())
}
