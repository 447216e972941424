//! `actorcile chaos` in its bounded form: one round on a real etcd + kube-apiserver (installed
//! by scripts/install-test-deps.sh) with every kind of fault, and every invariant at 0.

use crate::common;

use std::time::Duration;

use common::{last_json_line, run_bounded};

#[test]
fn a_chaos_round_injects_every_fault_and_breaks_no_invariant() {
    let (ok, out, err) = run_bounded(
        &["chaos", "--objects", "30", "--seed", "7", "--json"],
        Duration::from_secs(200),
    );
    assert!(ok, "chaos failed:\n{out}\n{err}");
    let v = last_json_line(&out);
    assert_eq!(v["rounds"], 1, "{v}");
    assert_eq!(v["objects"], 30, "{v}");
    let faults = &v["faults"];
    assert_eq!(faults["operator_kills"], 2, "{v}");
    assert_eq!(faults["apiserver_restarts"], 2, "{v}");
    assert_eq!(faults["etcd_restarts"], 1, "{v}");
    // Each incarnation ran on its own clock: on time, 2 s ahead, 2 s behind.
    assert_eq!(faults["clock_skew_seconds"], 2, "{v}");
    let injected = |kind: &str| faults["injected"][kind].as_u64().unwrap_or(0);
    for kind in ["panic", "api-500", "api-409", "api-429", "lost-answer"] {
        assert!(injected(kind) > 0, "no {kind} injected: {v}");
    }
    // Few watches are made in one round: one kind of break at least.
    assert!(
        injected("watch-cut") + injected("watch-expired") + injected("watch-stalled") > 0,
        "no watch broken: {v}"
    );
    let violations = v["violations"].as_object().expect("violations");
    assert!(violations.len() >= 12, "{v}");
    for (name, n) in violations {
        assert_eq!(n, 0, "{name}: {v}");
    }
    // Every item was provisioned once per generation and deprovisioned once.
    assert!(v["effects"].as_u64().unwrap() >= 60, "{v}");
}

/// Replicas under fire: every invariant at 0, unexplained repeated side effects included. How
/// long a shard stood without a holder is printed, not required: that bound is wall-clock time
/// (twice a 3 s lease) a loaded 2-core machine running three operators, etcd and kube-apiserver
/// can miss; the long runs in RELIABILITY.md report it.
#[test]
fn a_chaos_round_with_three_sharded_replicas_one_killed_one_paused() {
    let (_, out, err) = run_bounded(
        &[
            "chaos",
            "--objects",
            "30",
            "--seed",
            "5",
            "--replicas",
            "3",
            "--json",
        ],
        Duration::from_secs(220),
    );
    let v = last_json_line(&out);
    assert_eq!(v["replicas"], 3, "{v}\n{err}");
    let faults = &v["faults"];
    assert_eq!(faults["operator_kills"], 2, "{v}");
    assert_eq!(faults["replicas_paused"], 1, "{v}");
    // The replicas ran on clocks 2 s apart.
    assert_eq!(faults["clock_skew_seconds"], 2, "{v}");
    // The killed and the paused replicas' shards moved to the others.
    assert!(v["hand_overs"]["count"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(
        v["hand_overs"]["longest_gap_seconds"].as_f64().is_some(),
        "{v}"
    );
    let violations = v["violations"].as_object().expect("violations");
    assert!(violations.len() >= 12, "{v}");
    for (name, n) in violations {
        if name == "unowned_shards" {
            eprintln!(
                "shard hand-overs longer than twice the lease: {n}; the longest {} s",
                v["hand_overs"]["longest_gap_seconds"]
            );
        } else {
            assert_eq!(n, 0, "{name}: {v}");
        }
    }
}

#[test]
fn a_load_run_with_a_graceful_restart_loses_nothing() {
    let (ok, out, err) = run_bounded(
        &[
            "chaos",
            "--load",
            "--objects",
            "200",
            "--seed",
            "3",
            "--json",
        ],
        Duration::from_secs(200),
    );
    assert!(ok, "chaos --load failed:\n{out}\n{err}");
    let v = last_json_line(&out);
    assert_eq!(v["objects"], 200, "{v}");
    let load = &v["load"];
    let at = |k: &str| load[k].as_f64().unwrap_or_else(|| panic!("no {k}: {v}"));
    assert!(at("sigterm_at_seconds") > 0.0, "{v}");
    assert!(at("ready_seconds") > at("sigterm_at_seconds"), "{v}");
    assert!(at("deleted_seconds") > 0.0, "{v}");
    assert!(at("operator_peak_rss_bytes") > (8 << 20) as f64, "{v}");
    // No fault but the SIGTERM: nothing injected, and no side effect runs twice.
    assert_eq!(v["faults"]["operator_kills"], 0, "{v}");
    assert!(
        v["faults"]["injected"]
            .as_object()
            .is_none_or(|m| m.values().all(|n| n == 0)),
        "{v}"
    );
    let violations = v["violations"].as_object().expect("violations");
    for (name, n) in violations {
        assert_eq!(n, 0, "{name}: {v}");
    }
    // Every item provisioned once and deprovisioned once, its tree run to the end once.
    assert_eq!(v["effects"], 400, "{v}");
    assert_eq!(v["teardowns"], 200, "{v}");
}

#[test]
fn chaos_refuses_rates_outside_zero_to_one() {
    let (ok, _, err) = run_bounded(&["chaos", "--panic-rate", "1.5"], Duration::from_secs(20));
    assert!(!ok);
    assert!(err.contains("panic-rate"), "{err}");
}
