//! The whole `actorcile bench` at a tiny size: parent + one child process per runtime, on the
//! in-process cluster, checking the JSON line the parent prints last.

mod common;

use std::time::Duration;

use common::{last_json_line, run_bounded};
use serde_json::Value;

fn bench_json(workload: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "bench",
        "--workload",
        workload,
        "--objects",
        "50",
        "--json",
        "--timeout-secs",
        "60",
    ];
    if !extra.contains(&"--repeat") {
        args.extend_from_slice(&["--repeat", "1"]);
    }
    args.extend_from_slice(extra);
    let (ok, out, err) = run_bounded(&args, Duration::from_secs(180));
    assert!(
        ok,
        "actorcile {args:?} failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    last_json_line(&out)
}

fn check_shape(v: &Value, workload: &str, min_runs_per_object: u64) {
    assert_eq!(v["workload"], workload);
    assert_eq!(v["objects"], 50);
    assert_eq!(v["backend"], "in-process");
    let runs = v["runs"].as_array().expect("runs array");
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r["runtime"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["actorcile", "kube-runtime"]);
    for r in runs {
        assert_eq!(r["objects"], 50);
        let n = r["runs"].as_u64().expect("runs");
        assert!(
            n >= 50 * min_runs_per_object,
            "{}: {n} runs for 50 objects",
            r["runtime"]
        );
        let secs = r["seconds"].as_f64().expect("seconds");
        assert!(secs > 0.0);
        let rps = r["runs_per_sec"].as_f64().expect("runs_per_sec");
        assert!(
            (rps - n as f64 / secs).abs() <= 1e-6 * rps.max(1.0),
            "runs_per_sec = runs / seconds"
        );
        assert!(r["p50_ms"].as_f64().expect("p50_ms") >= 0.0);
        assert!(r["p99_ms"].as_f64().expect("p99_ms") >= r["p50_ms"].as_f64().unwrap());
        assert!(
            r["api_requests"].as_u64().expect("api_requests") >= 1,
            "a runtime must at least list"
        );
        let peak = r["peak_rss_bytes"].as_u64().expect("peak_rss_bytes");
        assert!(peak > 1024 * 1024, "peak RSS {peak} looks wrong");
        assert_eq!(r["rss_per_object_bytes"].as_u64().unwrap(), peak / 50);
    }
    let ratio = v["ratio"].as_f64().expect("ratio");
    let expected =
        runs[0]["runs_per_sec"].as_f64().unwrap() / runs[1]["runs_per_sec"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9 * expected.max(1.0));
}

#[test]
fn noop_both_runtimes_in_process() {
    let v = bench_json("noop", &[]);
    check_shape(&v, "noop", 1);
}

#[test]
fn yield_both_runtimes_in_process() {
    let v = bench_json("yield", &["--yields", "3"]);
    // Each object runs once plus once per yield.
    check_shape(&v, "yield", 4);
}

#[test]
fn status_both_runtimes_in_process() {
    let v = bench_json("status", &[]);
    check_shape(&v, "status", 1);
}

#[test]
fn churn_both_runtimes_in_process() {
    let v = bench_json("churn", &["--churn-rate", "500", "--churn-updates", "2"]);
    // The first run plus at least the run that sees the last update.
    check_shape(&v, "churn", 2);
}

#[test]
fn chain_both_runtimes_in_process() {
    // 50 objects in chains of 7: seven chains of 7 and one of 1.
    let v = bench_json("chain", &["--chain-length", "7"]);
    // The run ends only once the observer saw every object Ready (else the child fails).
    check_shape(&v, "chain", 1);
    for r in v["runs"].as_array().unwrap() {
        assert_eq!(
            r["latency_samples"], 42,
            "{}: one hop sample per object with a dependency",
            r["runtime"]
        );
        // List + watch, and at least the Ready status of each of the 50 objects.
        let requests = r["api_requests"].as_u64().unwrap();
        assert!(requests >= 52, "{}: {requests} API requests", r["runtime"]);
    }
}

#[test]
fn table_is_the_default_output() {
    let (ok, out, err) = run_bounded(
        &[
            "bench",
            "--objects",
            "20",
            "--runtimes",
            "kube-runtime",
            "--timeout-secs",
            "60",
        ],
        Duration::from_secs(120),
    );
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("workload noop  objects 20  backend in-process"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("runtime") && lines[1].contains("runs/s"),
        "{out}"
    );
    assert!(lines[2].starts_with("kube-runtime"), "{out}");
    assert!(out.contains("n/a"), "no ratio with one runtime: {out}");
}

#[test]
fn bad_arguments_fail_cleanly() {
    let (ok, _out, err) = run_bounded(&["bench", "--objects", "0"], Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("--objects"), "{err}");
}

#[test]
fn repeat_reports_each_runtimes_median_run_and_every_runs_seconds() {
    let v = bench_json("noop", &["--repeat", "3"]);
    check_shape(&v, "noop", 1);
    for r in v["runs"].as_array().unwrap() {
        let mut all: Vec<f64> = r["seconds_per_repeat"]
            .as_array()
            .expect("seconds_per_repeat")
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect();
        assert_eq!(all.len(), 3, "{r}");
        all.sort_by(f64::total_cmp);
        assert_eq!(
            r["seconds"].as_f64().unwrap(),
            all[1],
            "the median run: {r}"
        );
    }
}
