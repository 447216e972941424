//! `actorcile bench` against a real etcd + kube-apiserver (installed by
//! scripts/install-test-deps.sh): the `--envtest` backend, and the `--kubeconfig` backend with its
//! namespace and clean-up.

use crate::common;

use std::time::Duration;

use actorcile::envtest::Envtest;
use common::{last_json_line, run_bounded};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, ListParams},
    discovery::ApiResource,
};
use serde_json::Value;

fn check_runs(v: &Value, backend: &str, objects: u64) {
    assert_eq!(v["backend"], backend);
    assert_eq!(v["objects"], objects);
    let runs = v["runs"].as_array().expect("runs");
    assert!(runs.len() >= 2, "both runtimes ran: {v}");
    assert_eq!(
        runs[..2].iter().map(|r| &r["runtime"]).collect::<Vec<_>>(),
        ["actorcile", "kube-runtime"]
    );
    for r in runs {
        assert!(r["runs"].as_u64().unwrap() >= objects, "{r}");
        assert!(r["api_requests"].as_u64().unwrap() >= 1, "{r}");
        assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
        // The control plane's CPU is read where the bench started it, not from a kubeconfig.
        let server_cpu = r["server_cpu_seconds"].as_f64();
        if backend == "envtest" {
            assert!(server_cpu.is_some_and(|s| s > 0.0), "{r}");
        } else {
            assert_eq!(server_cpu, None, "{r}");
        }
    }
    let speedup = v["speedup_converge"].as_f64().expect("speedup_converge");
    let expected = runs[1]["seconds"].as_f64().unwrap() / runs[0]["seconds"].as_f64().unwrap();
    assert!((speedup - expected).abs() < 1e-9 * expected.max(1.0), "{v}");
}

/// `actorcile bench --envtest` with 20 objects and one run per runtime, plus `extra`: its JSON
/// line, with the shape of both runs checked.
fn envtest_bench(workload: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "bench",
        "--envtest",
        "--objects",
        "20",
        "--workload",
        workload,
        "--json",
        "--timeout",
        "60s",
        "--repeat",
        "1",
    ];
    args.extend_from_slice(extra);
    // Each child starts its own control plane: up to three of them, one after the other.
    let (ok, out, err) = run_bounded(&args, Duration::from_secs(300));
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let v = last_json_line(&out);
    check_runs(&v, "envtest", 20);
    v
}

#[test]
fn envtest_backend_both_runtimes() {
    let v = envtest_bench("status", &[]);
    // Each runtime wrote a status per object, so at least one request per object beyond list+watch.
    for r in v["runs"].as_array().unwrap() {
        assert!(r["api_requests"].as_u64().unwrap() >= 20, "{r}");
        assert!(r["status_writes"].as_u64().unwrap() >= 20, "{r}");
        let window = r["status_write_seconds"].as_f64().unwrap();
        assert!(
            window > 0.0 && window < r["seconds"].as_f64().unwrap(),
            "{r}"
        );
    }
}

#[test]
fn envtest_backend_operator_with_the_floor_and_controller_runtime() {
    let v = envtest_bench(
        "operator",
        &[
            "--runtimes",
            "actorcile,kube-runtime,floor,controller-runtime",
        ],
    );
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{v}");
    assert_eq!(runs[2]["runtime"], "floor");
    assert_eq!(runs[3]["runtime"], "controller-runtime");
    // The Go process's own memory and CPU, read by itself.
    assert!(runs[3]["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{v}");
    assert!(runs[3]["cpu_seconds"].as_f64().unwrap() > 0.0, "{v}");
    for r in runs {
        // No garbage collector runs in envtest: the children are gone because the runtime
        // deleted them.
        assert_eq!(r["operator"]["objects_left"], 0, "{r}");
        assert_eq!(r["operator"]["children_left"], 0, "{r}");
        assert!(
            r["operator"]["ready_seconds"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(
            r["operator"]["deleted_seconds"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(r["runs"].as_u64().unwrap() >= 40, "{r}");
        assert!(r["status_writes"].as_u64().unwrap() >= 20, "{r}");
        assert!(r["api_requests"].as_u64().unwrap() >= 5 * 20, "{r}");
    }
    assert!(v["speedup_ready"].as_f64().is_some(), "{v}");
    assert!(v["speedup_deleted"].as_f64().is_some(), "{v}");
    assert!(v["speedup_floor"].as_f64().is_some(), "{v}");
    assert!(v["actorcile_over_floor"].as_f64().is_some(), "{v}");
    let speedup = v["speedup_controller_runtime"].as_f64().expect("speedup");
    let expected = runs[3]["seconds"].as_f64().unwrap() / runs[0]["seconds"].as_f64().unwrap();
    assert!((speedup - expected).abs() < 1e-9 * expected.max(1.0), "{v}");
    assert!(v["memory_vs_controller_runtime"].as_f64().is_some(), "{v}");
}

#[test]
fn controller_runtime_refuses_the_in_process_cluster_and_says_why() {
    let (ok, _out, err) = run_bounded(
        &[
            "bench",
            "--runtimes",
            "actorcile,controller-runtime",
            "--objects",
            "5",
        ],
        Duration::from_secs(60),
    );
    assert!(!ok);
    assert!(err.contains("--envtest"), "{err}");
}

#[test]
fn envtest_backend_chain() {
    let v = envtest_bench("chain", &["--chain-length", "5"]);
    for r in v["runs"].as_array().unwrap() {
        // Four chains of five: one hop sample per link after a chain's head.
        assert_eq!(r["latency_samples"], 16, "{r}");
        // A Ready status per object, beyond list + watch.
        assert!(r["api_requests"].as_u64().unwrap() >= 22, "{r}");
    }
}

#[tokio::test]
async fn kubeconfig_backend_uses_and_removes_its_own_namespaces() {
    tokio::time::timeout(Duration::from_secs(220), async {
        let env = Envtest::start().await.expect("start envtest");
        let kubeconfig = env.kubeconfig_path().to_string_lossy().into_owned();
        let (ok, out, err) = tokio::task::spawn_blocking(move || {
            run_bounded(
                &[
                    "bench",
                    "--kubeconfig",
                    &kubeconfig,
                    "--objects",
                    "20",
                    "--workload",
                    "yield",
                    "--yields",
                    "2",
                    "--json",
                    "--timeout",
                    "60s",
                    "--repeat",
                    "1",
                ],
                Duration::from_secs(180),
            )
        })
        .await
        .unwrap();
        assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
        let v = last_json_line(&out);
        check_runs(&v, "kubeconfig", 20);

        // Each child made its own namespace and deleted it (there is no namespace controller in
        // envtest, so it stays Terminating), after deleting its objects, finalizers first.
        let client = env.client();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ours: Vec<Namespace> = namespaces
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|ns| ns.name_any().starts_with("actorcile-bench-"))
            .collect();
        let names: Vec<String> = ours.iter().map(|n| n.name_any()).collect();
        assert_eq!(ours.len(), 2, "one namespace per runtime: {names:?}");
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("actorcile-bench-actorcile-"))
        );
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("actorcile-bench-kube-runtime-"))
        );
        for ns in &ours {
            assert!(
                ns.metadata.deletion_timestamp.is_some(),
                "{} not deleted",
                ns.name_any()
            );
        }
        let ar = ApiResource {
            group: "bench.actorcile.dev".into(),
            version: "v1".into(),
            api_version: "bench.actorcile.dev/v1".into(),
            kind: "BenchObject".into(),
            plural: "benchobjects".into(),
        };
        let objects: Api<DynamicObject> = Api::all_with(client, &ar);
        let left = objects.list(&ListParams::default()).await.unwrap().items;
        assert!(
            left.is_empty(),
            "objects left behind: {:?}",
            left.iter().map(|o| o.name_any()).collect::<Vec<_>>()
        );
        env.stop().await;
    })
    .await
    .expect("bounded");
}
