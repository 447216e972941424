//! The supervisor policies a simulation compares: built-in names or TOML files.
//!
//! Files are read with [`SupervisorPolicy::from_file`], so a bad file fails with the library's
//! error naming the field. Built-ins: `default` ([`SupervisorPolicy::default`]), and the files in
//! `cli/policies/` (compiled in): `aggressive` (short backoffs, high concurrency),
//! `conservative` (long backoffs, low concurrency, strict restart intensity) and `fail-fast`
//! (quarantine on the first failure) and `polling` (re-run Ready resources every minute).

use std::path::Path;

use actorcile::policy::{PolicyError, SupervisorPolicy};

/// Built-in policies in TOML (`default` is the library's default and has no text).
pub const BUILT_INS: &[(&str, &str)] = &[
    ("default", ""),
    ("aggressive", include_str!("../../policies/aggressive.toml")),
    (
        "conservative",
        include_str!("../../policies/conservative.toml"),
    ),
    ("fail-fast", include_str!("../../policies/fail-fast.toml")),
    ("polling", include_str!("../../policies/polling.toml")),
];

/// The policies compared when none is given.
pub const DEFAULT_SET: &[&str] = &["default", "aggressive", "conservative"];

/// A policy with the name it is reported under.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedPolicy {
    /// A built-in name or the file's stem (made unique within one comparison).
    pub name: String,
    /// The policy.
    pub policy: SupervisorPolicy,
}

/// A policy that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicySpecError {
    /// The file is unreadable or invalid (the message names the field).
    #[error("policy `{spec}`: {error}")]
    Invalid {
        /// What was asked for.
        spec: String,
        /// The library's error.
        error: PolicyError,
    },
    /// Neither a built-in name nor an existing file.
    #[error("unknown policy `{0}`: not a built-in ({built_ins}) and no such file", built_ins = super::built_in_names(BUILT_INS))]
    Unknown(String),
}

/// A built-in policy by name.
pub fn built_in(name: &str) -> Option<SupervisorPolicy> {
    BUILT_INS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| SupervisorPolicy::from_toml(text).expect("built-in policies are valid"))
}

/// Resolve one `--policy` value: a built-in name, else a TOML file.
pub fn resolve(spec: &str) -> Result<NamedPolicy, PolicySpecError> {
    if let Some(policy) = built_in(spec) {
        return Ok(NamedPolicy {
            name: spec.to_string(),
            policy,
        });
    }
    let path = Path::new(spec);
    if path.exists() || spec.ends_with(".toml") || spec.contains(std::path::MAIN_SEPARATOR) {
        let policy =
            SupervisorPolicy::from_file(path).map_err(|error| PolicySpecError::Invalid {
                spec: spec.to_string(),
                error,
            })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.to_string());
        return Ok(NamedPolicy { name, policy });
    }
    Err(PolicySpecError::Unknown(spec.to_string()))
}

/// Resolve every `--policy` value (the [`DEFAULT_SET`] when empty); duplicate names get a
/// `#2`, `#3`, … suffix.
pub fn resolve_all(specs: &[String]) -> Result<Vec<NamedPolicy>, PolicySpecError> {
    let specs: Vec<String> = if specs.is_empty() {
        DEFAULT_SET.iter().map(|s| s.to_string()).collect()
    } else {
        specs.to_vec()
    };
    let mut out: Vec<NamedPolicy> = Vec::with_capacity(specs.len());
    for spec in &specs {
        let mut p = resolve(spec)?;
        let base = p.name.clone();
        let mut n = 1;
        while out.iter().any(|o| o.name == p.name) {
            n += 1;
            p.name = format!("{base}#{n}");
        }
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actorcile::policy::Exhausted;

    #[test]
    fn built_ins_differ_as_documented() {
        let d = built_in("default").unwrap();
        assert_eq!(d, SupervisorPolicy::default());
        let a = built_in("aggressive").unwrap();
        let c = built_in("conservative").unwrap();
        assert!(a.runtime.max_concurrent_reconciles > d.runtime.max_concurrent_reconciles);
        assert!(c.runtime.max_concurrent_reconciles < d.runtime.max_concurrent_reconciles);
        assert!(a.kind.restart.backoff.min < d.kind.restart.backoff.min);
        assert!(c.kind.restart.backoff.min > d.kind.restart.backoff.min);
        assert_eq!(built_in("fail-fast").unwrap().kind.restart.max_restarts, 0);
        assert_eq!(
            built_in("fail-fast").unwrap().kind.restart.on_exhausted,
            Exhausted::Quarantine
        );
        let p = built_in("polling").unwrap();
        assert_eq!(
            p.kind.poll_interval,
            Some(std::time::Duration::from_secs(60))
        );
        assert!(p.kind.idle_timeout > p.kind.poll_interval);
    }

    #[test]
    fn bad_policy_file_names_the_field() {
        let dir = std::env::temp_dir().join(format!("actorcile-sim-pol-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("broken.toml");
        std::fs::write(&p, "[restart]\nmax_restartz = 3").unwrap();
        let e = resolve(p.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("max_restartz"), "{e}");
        std::fs::write(&p, "max_concurrent_reconciles = 0").unwrap();
        let e = resolve(p.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("max_concurrent_reconciles"), "{e}");
        std::fs::write(&p, "[error_backoff]\nfactor = 0.5").unwrap();
        let e = resolve(p.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("error_backoff.factor"), "{e}");
        std::fs::write(&p, "yield_delay = \"3s\"").unwrap();
        let ok = resolve(p.to_str().unwrap()).unwrap();
        assert_eq!(ok.name, "broken");
        assert_eq!(
            ok.policy.kind.yield_delay,
            std::time::Duration::from_secs(3)
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let e = resolve("nonexistent").unwrap_err();
        assert!(
            e.to_string().contains("aggressive"),
            "lists the built-ins: {e}"
        );
    }

    #[test]
    fn defaults_and_duplicates() {
        let all = resolve_all(&[]).unwrap();
        let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, DEFAULT_SET);
        let dup = resolve_all(&["default".into(), "default".into()]).unwrap();
        assert_eq!(dup[1].name, "default#2");
    }
}
