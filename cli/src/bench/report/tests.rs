//! The tests of `bench/report.rs`.

use super::*;

fn run(runtime: RuntimeKind, rps: f64) -> RunResult {
    RunResult {
        runtime,
        objects: 10,
        runs: 20,
        seconds: 20.0 / rps,
        runs_per_sec: rps,
        cpu_seconds: 0.25,
        server_cpu_seconds: None,
        p50_ms: Some(1.5),
        p99_ms: None,
        latency_samples: 10,
        api_requests: 3,
        peak_rss_bytes: 10 * 1024 * 1024,
        baseline_rss_bytes: 5 * 1024 * 1024,
        rss_per_object_bytes: 1024 * 1024,
        rss_before_objects_bytes: 1024 * 1024,
        idle_rss_bytes: Some(6 * 1024 * 1024),
        status_writes: 0,
        status_write_seconds: None,
        operator: None,
        restart: None,
        seconds_per_repeat: Vec::new(),
    }
}

fn timed(runtime: RuntimeKind, seconds: f64) -> RunResult {
    RunResult {
        seconds,
        runs_per_sec: 20.0 / seconds,
        ..run(runtime, 1.0)
    }
}

/// An in-process report of 10 objects: `actorcile`, and kube-runtime at `kube_seconds`.
fn both(workload: Workload, actorcile: RunResult, kube_seconds: f64) -> BenchReport {
    let kube = timed(RuntimeKind::KubeRuntime, kube_seconds);
    BenchReport::new(workload, 10, "in-process", 64, vec![actorcile, kube])
}

#[test]
fn the_floor_gets_its_own_line_and_ratios_only_where_it_ran() {
    let floor = RunResult {
        operator: Some(OperatorPhases {
            ready_seconds: 0.5,
            deleted_seconds: 0.25,
            objects_left: 0,
            children_left: 0,
        }),
        ..timed(RuntimeKind::Floor, 1.0)
    };
    let report = BenchReport::new(
        Workload::Operator,
        10,
        "in-process",
        64,
        vec![
            timed(RuntimeKind::Actorcile, 1.5),
            timed(RuntimeKind::KubeRuntime, 2.0),
            floor,
        ],
    );
    assert_eq!(report.speedup_floor, Some(2.0));
    assert_eq!(report.actorcile_over_floor, Some(1.5));
    assert_eq!(report.speedup_converge, Some(2.0 / 1.5));
    let table = report.to_table();
    assert!(
        table.contains(
            "floor (actorcile's requests, no runtime): 1.000 s (to all Ready 0.500, to all \
             deleted 0.250); actorcile took 1.50× its time; kube-runtime seconds ÷ floor \
             seconds 2.00"
        ),
        "{table}"
    );
    let json = report.to_json_line();
    assert!(json.contains("\"speedup_floor\":2.0"), "{json}");
    let without = both(Workload::Operator, timed(RuntimeKind::Actorcile, 1.0), 2.0);
    assert_eq!(without.floor_line(), None);
    let json = without.to_json_line();
    assert!(
        !json.contains("floor"),
        "no floor fields without the floor: {json}"
    );
}

#[test]
fn median_run_picks_the_middle_by_seconds_and_keeps_every_run() {
    let runs = vec![
        run(RuntimeKind::Actorcile, 10.0),
        run(RuntimeKind::Actorcile, 40.0),
        run(RuntimeKind::Actorcile, 20.0),
    ];
    let m = median_run(runs).unwrap();
    assert_eq!(m.runs_per_sec, 20.0);
    assert_eq!(m.seconds_per_repeat, vec![2.0, 0.5, 1.0]);
    assert_eq!(m.spread(), Some((0.5, 2.0)));
    let one = median_run(vec![run(RuntimeKind::KubeRuntime, 5.0)]).unwrap();
    assert!(
        one.seconds_per_repeat.is_empty(),
        "a single run lists no repeats"
    );
    assert_eq!(one.spread(), None);
    assert!(median_run(Vec::new()).is_none());
    let report = BenchReport::new(Workload::Noop, 10, "in-process", 64, vec![m, one]);
    let table = report.to_table();
    assert!(table.contains("actorcile seconds per repeat: 2.000, 0.500, 1.000"));
    assert!(table.contains("0.500–2.000"), "{table}");
    assert!(
        report
            .to_json_line()
            .contains("\"seconds_per_repeat\":[2.0,0.5,1.0]")
    );
    assert!(
        report.speedup_converge_per_repeat.is_empty(),
        "kube-runtime ran once: no rounds to pair"
    );
}

#[test]
fn speedup_is_kube_runtime_seconds_over_actorcile_seconds() {
    let ac = RunResult {
        cpu_seconds: 0.5,
        seconds_per_repeat: vec![1.0, 2.0, 1.5],
        ..timed(RuntimeKind::Actorcile, 1.5)
    };
    let kr = RunResult {
        cpu_seconds: 1.0,
        seconds_per_repeat: vec![3.0, 3.0, 6.0],
        ..timed(RuntimeKind::KubeRuntime, 3.0)
    };
    let report = BenchReport::new(Workload::Status, 10, "in-process", 64, vec![ac, kr]);
    assert_eq!(report.speedup_converge, Some(2.0));
    assert_eq!(report.speedup_converge_per_repeat, vec![3.0, 1.5, 4.0]);
    assert_eq!(report.cpu_ratio, Some(2.0));
    assert_eq!(report.speedup_ready, None, "not an operator run");
    let headline = report.headline();
    assert!(headline.contains(": 2.00 (rounds 1.50–4.00)"), "{headline}");
    assert!(
        headline.contains("actorcile 1.500 s, 0.500 CPU s"),
        "{headline}"
    );
    // Runs/s says the opposite when kube-runtime runs more per object: not the headline.
    assert!(report.runs[0].runs_per_sec > report.runs[1].runs_per_sec);
}

#[test]
fn operator_phases_have_their_own_speedups() {
    let phases = |ready_seconds, deleted_seconds| {
        Some(OperatorPhases {
            ready_seconds,
            deleted_seconds,
            objects_left: 0,
            children_left: 0,
        })
    };
    let ac = RunResult {
        operator: phases(1.0, 0.5),
        status_writes: 10,
        status_write_seconds: Some(0.8),
        ..timed(RuntimeKind::Actorcile, 1.5)
    };
    let kr = RunResult {
        operator: phases(3.0, 2.0),
        ..timed(RuntimeKind::KubeRuntime, 5.0)
    };
    let report = BenchReport::new(Workload::Operator, 10, "in-process", 64, vec![ac, kr]);
    assert_eq!(report.speedup_ready, Some(3.0));
    assert_eq!(report.speedup_deleted, Some(4.0));
    let table = report.to_table();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[1].contains("ready s") && lines[1].contains("deleted s"));
    assert!(lines[1].contains("writes s"), "{table}");
    assert!(lines[2].contains("0.800"), "{table}");
    assert!(
        table.contains("to all Ready 3.00, to all deleted 4.00"),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_str(&report.to_json_line()).unwrap();
    assert_eq!(v["runs"][0]["operator"]["ready_seconds"], 1.0);
    assert_eq!(v["runs"][1]["operator"]["children_left"], 0);
    assert_eq!(v["speedup_deleted"], 4.0);
}

#[test]
fn the_server_cpu_shows_only_where_it_was_read() {
    let ac = RunResult {
        server_cpu_seconds: Some(1.5),
        ..timed(RuntimeKind::Actorcile, 1.0)
    };
    let kr = RunResult {
        server_cpu_seconds: Some(3.0),
        ..timed(RuntimeKind::KubeRuntime, 1.0)
    };
    let report = BenchReport::new(Workload::Status, 10, "envtest", 64, vec![ac, kr]);
    assert_eq!(report.server_cpu_ratio, Some(2.0));
    let table = report.to_table();
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[1].contains("CPU s  server CPU s  API reqs"),
        "{table}"
    );
    assert!(
        lines[2].contains("1.500") && lines[3].contains("3.000"),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_str(&report.to_json_line()).unwrap();
    assert_eq!(v["runs"][0]["server_cpu_seconds"], 1.5);
    assert_eq!(v["server_cpu_ratio"], 2.0);
    assert!(
        table.contains("API server CPU s: actorcile 1.500, kube-runtime 3.000"),
        "{table}"
    );

    let in_process = both(Workload::Status, timed(RuntimeKind::Actorcile, 1.0), 1.0);
    assert_eq!(in_process.server_cpu_ratio, None);
    let table = in_process.to_table();
    assert!(
        !table.lines().nth(1).unwrap().contains("server CPU"),
        "{table}"
    );
    assert!(!in_process.headline().contains("server CPU"), "{table}");
}

#[test]
fn json_shape() {
    let report = both(Workload::Yield, run(RuntimeKind::Actorcile, 300.0), 0.2);
    let line = report.to_json_line();
    assert!(!line.contains('\n'));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["workload"], "yield");
    assert_eq!(v["objects"], 10);
    assert_eq!(v["backend"], "in-process");
    assert!(v.get("ratio").is_none(), "the runs/s ratio is gone");
    let speedup = v["speedup_converge"].as_f64().unwrap();
    assert!((speedup - 3.0).abs() < 1e-12, "{speedup}");
    assert!(v["speedup_ready"].is_null());
    assert_eq!(v["cpu_ratio"], 1.0);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs[0]["runtime"], "actorcile");
    assert_eq!(runs[1]["runtime"], "kube-runtime");
    for key in [
        "objects",
        "runs",
        "seconds",
        "runs_per_sec",
        "cpu_seconds",
        "p50_ms",
        "p99_ms",
        "api_requests",
        "peak_rss_bytes",
        "rss_per_object_bytes",
        "status_writes",
        "status_write_seconds",
        "operator",
    ] {
        assert!(runs[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(runs[0]["p50_ms"], 1.5);
    assert!(runs[0]["p99_ms"].is_null());
    // And it reads back.
    let back: BenchReport = serde_json::from_str(&line).unwrap();
    assert_eq!(back, report);
}

#[test]
fn speedup_needs_both_runtimes() {
    let one = BenchReport::new(
        Workload::Noop,
        10,
        "envtest",
        4,
        vec![run(RuntimeKind::KubeRuntime, 5.0)],
    );
    assert_eq!(one.speedup_converge, None);
    assert!(
        serde_json::from_str::<serde_json::Value>(&one.to_json_line()).unwrap()["speedup_converge"]
            .is_null()
    );
    assert!(one.to_table().contains("n/a"));
    let zero = BenchReport::new(
        Workload::Noop,
        10,
        "envtest",
        4,
        vec![
            timed(RuntimeKind::KubeRuntime, 1.0),
            timed(RuntimeKind::Actorcile, 0.0),
        ],
    );
    assert_eq!(zero.speedup_converge, None);
}

#[test]
fn table_lists_each_runtime_then_the_headline_and_the_legend() {
    let report = BenchReport::new(
        Workload::Noop,
        10,
        "in-process",
        64,
        vec![
            run(RuntimeKind::Actorcile, 200.0),
            run(RuntimeKind::KubeRuntime, 100.0),
        ],
    );
    let table = report.to_table();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].contains("workload noop"));
    assert!(lines[1].starts_with("runtime"));
    assert!(!lines[1].contains("ready s"), "operator columns only there");
    assert!(
        !lines[1].contains("writes s"),
        "no status writes: no column"
    );
    assert!(lines[2].starts_with("actorcile") && lines[2].contains("200"));
    assert!(lines[3].starts_with("kube-runtime") && lines[3].contains("10.0 MiB"));
    assert!(
        lines[3].trim_end().ends_with("5.0 MiB"),
        "RSS added = peak - baseline: {}",
        lines[3]
    );
    assert!(
        lines[4].starts_with("speedup to converge") && lines[4].ends_with("2.00"),
        "{}",
        lines[4]
    );
    assert!(table.ends_with(LEGEND));
    for column in lines[1]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
    {
        let word = column.split(' ').next().unwrap();
        assert!(
            column == "runtime" || LEGEND.contains(word),
            "column {column} is not in the legend"
        );
    }
}

#[test]
fn human_bytes_units() {
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(2048), "2.0 KiB");
    assert_eq!(human_bytes(3 * 1024 * 1024 + 512 * 1024), "3.5 MiB");
}
