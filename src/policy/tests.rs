//! The tests of `policy/mod.rs`.

use super::*;

#[test]
fn optional_durations_accept_none() {
    let p = SupervisorPolicy::from_toml("idle_timeout = \"none\"\npoll_interval = \"5m\"").unwrap();
    assert_eq!(p.kind.idle_timeout, None);
    assert_eq!(p.kind.poll_interval, Some(Duration::from_secs(300)));
    let e = SupervisorPolicy::from_toml("idle_timeout = \"sometimes\"").unwrap_err();
    assert!(e.to_string().contains("idle_timeout"), "{e}");
}

#[test]
fn absurd_numbers_from_a_policy_file_are_typed_errors_naming_the_field() {
    for (text, field) in [
        ("yield_delay = \"300000000000y\"", "yield_delay"),
        ("poll_interval = \"2y\"", "poll_interval"),
        ("lock_expiry = \"100000y\"", "lock_expiry"),
        ("lease_duration = \"400d\"", "lease_duration"),
        ("yield_delay = \"0s\"", "yield_delay"),
        ("dependency_poll = \"0s\"", "dependency_poll"),
        (
            "max_concurrent_reconciles = 9223372036854775807",
            "max_concurrent_reconciles",
        ),
        ("[error_backoff]\nmin = \"0s\"", "error_backoff.min"),
        ("[restart.backoff]\nmax = \"5000y\"", "restart.backoff.max"),
    ] {
        match SupervisorPolicy::from_toml(text) {
            Err(PolicyError::Invalid { field: f, reason }) => {
                assert_eq!(f, field, "{text}: {reason}");
            }
            other => panic!("{text}: expected an invalid {field}, got {other:?}"),
        }
    }
    // The bound itself is accepted.
    let mut p = SupervisorPolicy {
        kind: crate::policy::KindPolicy {
            lock_expiry: MAX_DURATION,
            ..Default::default()
        },
        ..Default::default()
    };
    p.validate().unwrap();
    p.kind.lock_expiry = MAX_DURATION + Duration::from_nanos(1);
    assert!(p.validate().is_err());
}

#[test]
fn a_kinds_section_takes_what_it_does_not_set_from_the_top_level() {
    let p = SupervisorPolicy::from_toml(
        r#"
            yield_delay = "2s"
            idle_timeout = "none"
            [restart]
            max_restarts = 3
            [kinds.Database]
            yield_delay = "9s"
            [kinds.Database.restart]
            window = "2m"
            [kinds.Cache]
            "#,
    )
    .unwrap();
    let db = &p.kinds["Database"];
    assert_eq!(db.yield_delay, Duration::from_secs(9));
    assert_eq!(db.idle_timeout, None);
    assert_eq!(
        db.restart.max_restarts, 3,
        "a nested table is overlaid key by key"
    );
    assert_eq!(db.restart.window, Duration::from_secs(120));
    assert_eq!(
        p.kinds["Cache"],
        p.kind.clone(),
        "an empty section is the top level"
    );
    assert_eq!(
        p.kind.yield_delay,
        Duration::from_secs(2),
        "the top level keeps its own"
    );
}

#[test]
fn a_kinds_section_refuses_runtime_wide_knobs_and_bad_values_by_name() {
    let err =
        SupervisorPolicy::from_toml("[kinds.Database]\nshutdown_timeout = \"1s\"").unwrap_err();
    let m = err.to_string();
    assert!(
        m.contains("[kinds.Database]") && m.contains("shutdown_timeout"),
        "{m}"
    );
    let err = SupervisorPolicy::from_toml("[kinds.Database]\nyield_delay = \"0s\"").unwrap_err();
    assert!(
        matches!(&err, PolicyError::Invalid { field, .. } if field == "kinds.Database.yield_delay"),
        "{err}"
    );
    assert!(SupervisorPolicy::from_toml("kinds = 3").is_err());
    assert!(SupervisorPolicy::from_toml("kinds.Database = 3").is_err());
}

#[test]
fn older_files_read_as_before() {
    // The keys' names before reconcile became the one word.
    let p = SupervisorPolicy::from_toml(
        "max_concurrent_runs = 7\nrun_timeout = \"1m\"\n[kinds.Database]\nrun_timeout = \"2m\"",
    )
    .unwrap();
    assert_eq!(p.runtime.max_concurrent_reconciles, 7);
    assert_eq!(p.kind.reconcile_timeout, Some(Duration::from_secs(60)));
    assert_eq!(
        p.kinds["Database"].reconcile_timeout,
        Some(Duration::from_secs(120))
    );
    for file in ["aggressive", "conservative"] {
        let path = format!("{}/cli/policies/{file}.toml", env!("CARGO_MANIFEST_DIR"));
        SupervisorPolicy::from_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

#[test]
fn defaults_round_trip_through_toml() {
    let p = SupervisorPolicy::default();
    let text = toml::to_string(&p).unwrap();
    assert_eq!(SupervisorPolicy::from_toml(&text).unwrap(), p);
}

#[test]
fn errors_name_the_field() {
    let e = SupervisorPolicy::from_toml("max_concurrent_reconciles = 0").unwrap_err();
    assert!(e.to_string().contains("max_concurrent_reconciles"), "{e}");
    let e = SupervisorPolicy::from_toml("max_live_actors = 0").unwrap_err();
    assert!(e.to_string().contains("max_live_actors"), "{e}");
    let capped = SupervisorPolicy::from_toml("max_live_actors = 2048").unwrap();
    assert_eq!(capped.kind.max_live_actors, Some(2048));
    let e = SupervisorPolicy::from_toml("[restart.backoff]\nfactor = 0.5").unwrap_err();
    assert!(e.to_string().contains("restart.backoff.factor"), "{e}");
    let e = SupervisorPolicy::from_toml("write_timeout = \"0s\"").unwrap_err();
    assert!(e.to_string().contains("write_timeout"), "{e}");
    let unbounded = SupervisorPolicy::from_toml("write_timeout = \"none\"").unwrap();
    assert_eq!(unbounded.kind.write_timeout, None);
    let e = SupervisorPolicy::from_toml("bogus_knob = 1").unwrap_err();
    assert!(e.to_string().contains("bogus_knob"), "{e}");
    let e = SupervisorPolicy::from_toml("[restart]\nmax_restarts = \"many\"").unwrap_err();
    assert!(e.to_string().contains("max_restarts"), "{e}");
    let e = SupervisorPolicy::from_toml("[restart]\non_exhausted = \"explode\"").unwrap_err();
    assert!(
        e.to_string().contains("on_exhausted") || e.to_string().contains("explode"),
        "{e}"
    );
}

#[test]
fn backoff_grows_to_max_and_is_reproducible_with_a_seed() {
    let b = BackoffPolicy {
        min: Duration::from_millis(100),
        max: Duration::from_secs(1),
        factor: 2.0,
        jitter: false,
        reset_after: Duration::from_secs(10),
    };
    // backon computes in f32: compare at millisecond resolution
    let d: Vec<u128> = b.sequence(None).take(6).map(|d| d.as_millis()).collect();
    assert_eq!(d, vec![100, 200, 400, 800, 1000, 1000]);
    let j = BackoffPolicy { jitter: true, ..b };
    let a: Vec<Duration> = j.sequence(Some(7)).take(5).collect();
    let c: Vec<Duration> = j.sequence(Some(7)).take(5).collect();
    assert_eq!(a, c);
}

#[test]
fn unknown_keys_are_refused_by_name_at_the_top_level_in_sections_and_in_kind_files() {
    for (text, key) in [
        ("yeld_delay = \"2s\"", "yeld_delay"),
        ("[kinds.Database]\nidle_timeot = \"1s\"", "idle_timeot"),
        ("[restart]\nmax_restart = 3", "max_restart"),
    ] {
        let err = SupervisorPolicy::from_toml(text).unwrap_err().to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    // serde alone (a policy embedded in a file of the operator's own) refuses them too.
    let err = toml::from_str::<SupervisorPolicy>("lease_duraton = \"15s\"").unwrap_err();
    assert!(err.to_string().contains("lease_duraton"), "{err}");
    let err = toml::from_str::<SupervisorPolicy>("[kinds.Database]\nshutdown_timeout = \"1s\"")
        .unwrap_err();
    assert!(err.to_string().contains("shutdown_timeout"), "{err}");
    let err = KindPolicy::from_toml("seeed = 1").unwrap_err();
    assert!(err.to_string().contains("seeed"), "{err}");
}

#[test]
fn the_three_parts_read_and_write_the_same_flat_file() {
    let text = "yield_delay = \"2s\"\nmax_concurrent_reconciles = 7\nlease_duration = \"30s\"\n";
    let p = SupervisorPolicy::from_toml(text).unwrap();
    assert_eq!(p.kind.yield_delay, Duration::from_secs(2));
    assert_eq!(p.runtime.max_concurrent_reconciles, 7);
    assert_eq!(p.lease.duration, Duration::from_secs(30));
    let written = toml::to_string(&p).unwrap();
    assert!(
        written.contains("lease_duration = \"30s\"") && !written.contains("[kind"),
        "{written}"
    );
    assert_eq!(SupervisorPolicy::from_toml(&written).unwrap(), p);
    assert_eq!(p.for_kind("Database"), &p.kind);
}
