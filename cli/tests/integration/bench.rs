//! The whole `actorcile bench` at a tiny size: parent + one child process per runtime, on the
//! in-process cluster, checking the JSON line the parent prints last.

use crate::common;

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
        "--timeout",
        "60s",
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
        assert!(
            r["server_cpu_seconds"].is_null(),
            "in process the server's CPU is in cpu_seconds: {r}"
        );
    }
    assert!(v.get("ratio").is_none(), "no runs/s ratio: {v}");
    let speedup = v["speedup_converge"].as_f64().expect("speedup_converge");
    let expected = runs[1]["seconds"].as_f64().unwrap() / runs[0]["seconds"].as_f64().unwrap();
    assert!(
        (speedup - expected).abs() < 1e-9 * expected.max(1.0),
        "speedup = kube-runtime seconds / actorcile seconds: {v}"
    );
    let cpu_ratio = v["cpu_ratio"].as_f64().expect("cpu_ratio");
    let expected =
        runs[1]["cpu_seconds"].as_f64().unwrap() / runs[0]["cpu_seconds"].as_f64().unwrap();
    assert!((cpu_ratio - expected).abs() < 1e-9 * expected.max(1.0));
}

/// Status writes were made and timed: a window no longer than the whole run.
fn check_status_writes(r: &Value, at_least: u64) {
    let writes = r["status_writes"].as_u64().expect("status_writes");
    assert!(
        writes >= at_least,
        "{}: {writes} status writes",
        r["runtime"]
    );
    let window = r["status_write_seconds"]
        .as_f64()
        .expect("status_write_seconds");
    assert!(
        window > 0.0 && window <= r["seconds"].as_f64().unwrap(),
        "{}: status writes over {window} s",
        r["runtime"]
    );
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
    for r in v["runs"].as_array().unwrap() {
        check_status_writes(r, 50);
    }
}

#[test]
fn noop_makes_no_status_writes() {
    let v = bench_json("noop", &[]);
    for r in v["runs"].as_array().unwrap() {
        assert_eq!(r["status_writes"], 0, "{r}");
        assert!(r["status_write_seconds"].is_null(), "{r}");
        assert!(r["operator"].is_null(), "{r}");
    }
    assert!(v["speedup_ready"].is_null() && v["speedup_deleted"].is_null());
}

#[test]
fn operator_both_runtimes_in_process() {
    let v = bench_json("operator", &["--repeat", "2"]);
    // Every object runs at least once to become Ready and once to be cleaned up.
    check_shape(&v, "operator", 2);
    let runs = v["runs"].as_array().unwrap();
    for r in runs {
        let phases = &r["operator"];
        assert_eq!(phases["objects_left"], 0, "{r}");
        assert_eq!(phases["children_left"], 0, "{r}");
        let ready = phases["ready_seconds"].as_f64().expect("ready_seconds");
        let deleted = phases["deleted_seconds"].as_f64().expect("deleted_seconds");
        let seconds = r["seconds"].as_f64().unwrap();
        assert!(ready > 0.0 && deleted > 0.0, "{r}");
        assert!(
            ready + deleted <= seconds + 1e-9,
            "both phases lie within the measured window: {r}"
        );
        // The Ready status of every object (one latency sample each).
        check_status_writes(r, 50);
        assert_eq!(r["latency_samples"], 50, "{r}");
        // Per object at least: the finalizer, the child, the status, the child's deletion and
        // the finalizer's removal; plus the watch (whose streaming list is the same request).
        let requests = r["api_requests"].as_u64().unwrap();
        assert!(
            requests > 5 * 50,
            "{}: {requests} API requests",
            r["runtime"]
        );
        assert_eq!(r["seconds_per_repeat"].as_array().unwrap().len(), 2, "{r}");
    }
    let ratio = |key: &str, f: &dyn Fn(&Value) -> f64| {
        let expected = f(&runs[1]) / f(&runs[0]);
        let got = v[key].as_f64().unwrap_or_else(|| panic!("{key}: {v}"));
        assert!(
            (got - expected).abs() < 1e-9 * expected.max(1.0),
            "{key} = kube-runtime / actorcile: {got} vs {expected}"
        );
    };
    ratio("speedup_ready", &|r| {
        r["operator"]["ready_seconds"].as_f64().unwrap()
    });
    ratio("speedup_deleted", &|r| {
        r["operator"]["deleted_seconds"].as_f64().unwrap()
    });
    // One speedup per round, each kube-runtime's run over actorcile's run of that round.
    let per_round: Vec<f64> = v["speedup_converge_per_repeat"]
        .as_array()
        .expect("speedup_converge_per_repeat")
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    let secs = |r: &Value| -> Vec<f64> {
        r["seconds_per_repeat"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect()
    };
    let (ac, kr) = (secs(&runs[0]), secs(&runs[1]));
    assert_eq!(per_round.len(), 2);
    for i in 0..2 {
        assert!((per_round[i] - kr[i] / ac[i]).abs() < 1e-9 * per_round[i].max(1.0));
    }
}

#[test]
fn the_floor_sends_the_operator_requests_with_no_runtime_and_frames_both_runtimes() {
    let v = bench_json("operator", &["--runtimes", "actorcile,kube-runtime,floor"]);
    let runs = v["runs"].as_array().unwrap();
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r["runtime"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["actorcile", "kube-runtime", "floor"]);
    let floor = &runs[2];
    assert_eq!(floor["operator"]["objects_left"], 0, "{floor}");
    assert_eq!(floor["operator"]["children_left"], 0, "{floor}");
    // One reconcile to Ready and one to gone per object, and every object's Ready status.
    assert!(floor["runs"].as_u64().unwrap() >= 100, "{floor}");
    check_status_writes(floor, 50);
    // actorcile's requests: finalizer, child, status, child's deletion, finalizer's removal;
    // plus list and watch.
    assert!(
        floor["api_requests"].as_u64().unwrap() >= 5 * 50 + 2,
        "{floor}"
    );
    let secs = |r: &Value| r["seconds"].as_f64().unwrap();
    let close = |got: &Value, expected: f64| {
        let got = got.as_f64().unwrap_or_else(|| panic!("{v}"));
        assert!(
            (got - expected).abs() < 1e-9 * expected.max(1.0),
            "{got} vs {expected}"
        );
    };
    close(&v["speedup_floor"], secs(&runs[1]) / secs(floor));
    close(&v["actorcile_over_floor"], secs(&runs[0]) / secs(floor));
    // The headline is still actorcile against kube-runtime.
    close(&v["speedup_converge"], secs(&runs[1]) / secs(&runs[0]));
}

#[test]
fn the_floor_writes_the_status_workload_and_refuses_what_it_cannot_mirror() {
    let v = bench_json("status", &["--runtimes", "floor"]);
    let floor = &v["runs"][0];
    assert_eq!(floor["runtime"], "floor");
    check_status_writes(floor, 50);
    assert!(
        v["speedup_converge"].is_null() && v.get("speedup_floor").is_none(),
        "{v}"
    );
    let (ok, _out, err) = run_bounded(
        &["bench", "--workload", "noop", "--runtimes", "floor"],
        Duration::from_secs(30),
    );
    assert!(!ok);
    assert!(err.contains("operator and status workloads only"), "{err}");
    let (ok, _out, err) = run_bounded(
        &[
            "bench",
            "--runtimes",
            "actorcile,floor",
            "--actorcile-defaults",
        ],
        Duration::from_secs(30),
    );
    assert!(!ok);
    assert!(err.contains("not those of --actorcile-defaults"), "{err}");
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
            "--timeout",
            "60s",
            "--repeat",
            "1",
        ],
        Duration::from_secs(120),
    );
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("workload operator  objects 20  backend in-process"),
        "the default workload: {out}"
    );
    assert!(
        lines[1].starts_with("runtime")
            && lines[1].contains("runs/s")
            && lines[1].contains("deleted s"),
        "{out}"
    );
    assert!(lines[2].starts_with("kube-runtime"), "{out}");
    assert!(
        lines[3].starts_with("speedup") && lines[3].contains("n/a"),
        "no speedup with one runtime: {out}"
    );
    assert!(
        out.contains("API reqs   HTTP requests"),
        "the legend follows the table: {out}"
    );
}

#[test]
fn help_explains_the_columns() {
    let (ok, out, err) = run_bounded(&["bench", "--help"], Duration::from_secs(30));
    assert!(ok, "{err}");
    for column in ["RSS added", "API reqs", "writes s", "deleted s", "speedup"] {
        assert!(out.contains(column), "--help lacks {column}: {out}");
    }
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

#[test]
fn restart_measures_changes_during_the_list_for_both_runtimes() {
    let (ok, out, err) = run_bounded(
        &[
            "bench",
            "--workload",
            "restart",
            "--objects",
            "2000",
            "--churn-rate",
            "20000",
            "--repeat",
            "1",
            "--json",
            "--timeout",
            "60s",
        ],
        Duration::from_secs(180),
    );
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let v = last_json_line(&out);
    assert_eq!(v["workload"], "restart");
    for r in v["runs"].as_array().unwrap() {
        let restart = &r["restart"];
        let changes = restart["changes"].as_u64().expect("changes");
        assert!(changes >= 1, "{}: no change was written: {r}", r["runtime"]);
        assert_eq!(
            r["latency_samples"].as_u64(),
            Some(changes),
            "every change was seen by a run: {r}"
        );
        assert!(
            r["runs"].as_u64().unwrap() >= 2000,
            "every listed object ran: {r}"
        );
        assert!(restart["list_alone_seconds"].as_f64().unwrap() > 0.0);
        assert!(
            restart["all_changes_seconds"].as_f64().unwrap() >= r["seconds"].as_f64().unwrap(),
            "the changes are waited for after the list: {r}"
        );
        let watching = restart["watching_changes"].as_u64().unwrap();
        assert!(watching <= changes, "{r}");
        assert!(r["p99_ms"].as_f64().unwrap() >= r["p50_ms"].as_f64().unwrap());
    }
}

#[test]
fn a_sweep_reports_every_size_and_draws_the_plot() {
    let dir = std::env::temp_dir().join(format!("actorcile-bench-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("sweep.svg");
    let plot_arg = plot.to_string_lossy().into_owned();
    let args = [
        "bench",
        "--workload",
        "noop",
        "--objects",
        "20,40",
        "--repeat",
        "1",
        "--timeout",
        "60s",
        "--plot",
        &plot_arg,
    ];
    let (ok, out, err) = run_bounded(&args, Duration::from_secs(180));
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("sweep: workload noop"), "{out}");
    assert!(
        out.contains("CPU µs/run") && out.contains("idle/obj"),
        "{out}"
    );
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(svg.contains("kube-runtime") && svg.contains("actorcile idle"));

    let mut json_args = args.to_vec();
    json_args.truncate(args.len() - 2);
    json_args.push("--json");
    let (ok, out, err) = run_bounded(&json_args, Duration::from_secs(180));
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let v = last_json_line(&out);
    let sizes = v["sizes"].as_array().expect("one report per size");
    let objects: Vec<u64> = sizes
        .iter()
        .map(|s| s["objects"].as_u64().unwrap())
        .collect();
    assert_eq!(objects, [20, 40]);
    for size in sizes {
        for r in size["runs"].as_array().unwrap() {
            assert!(r["idle_rss_bytes"].as_u64().unwrap() > 1024 * 1024, "{r}");
            assert!(r["rss_before_objects_bytes"].as_u64().unwrap() > 0, "{r}");
        }
    }
    let (ok, _, err) = run_bounded(&["bench", "--plot", "x.svg"], Duration::from_secs(30));
    assert!(!ok && err.contains("several sizes"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
