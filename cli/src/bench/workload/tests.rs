//! The tests of `bench/workload.rs`.

use super::*;
use http::{Request, Response};
use kube::client::Body;
use std::convert::Infallible;

fn obj(name: &str) -> BenchObject {
    let mut o = BenchObject::new(name, BenchObjectSpec::default());
    o.metadata.namespace = Some("ns".into());
    o.metadata.generation = Some(1);
    o
}

fn config(workload: Workload, objects: u32) -> WorkloadConfig {
    WorkloadConfig {
        workload,
        objects,
        yields: 3,
        yield_interval: Duration::from_millis(1),
    }
}

/// A client whose every request fails the test (for workloads that must do no I/O).
fn no_io_client() -> Client {
    Client::new(
        tower::service_fn(|req: Request<Body>| async move {
            panic!("unexpected request {} {}", req.method(), req.uri());
            #[allow(unreachable_code)]
            Ok::<Response<Body>, Infallible>(Response::new(Body::empty()))
        }),
        "ns",
    )
}

#[tokio::test]
async fn noop_is_done_on_first_run() {
    let counter = RequestCounter::new();
    let rec = Recorder::start(config(Workload::Noop, 2), counter);
    let client = no_io_client();
    assert_eq!(
        rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
            .await
            .unwrap(),
        Step::Done
    );
    assert!(rec.finished().is_none());
    assert_eq!(
        rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
            .await
            .unwrap(),
        Step::Done
    );
    assert!(
        rec.finished().is_none(),
        "a second run of one object is not a second object"
    );
    rec.reconcile(&obj("b"), &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    let snap = tokio::time::timeout(Duration::from_secs(5), rec.wait_done())
        .await
        .unwrap();
    assert_eq!(snap.runs, 3);
    assert_eq!(rec.done_count(), 2);
    assert_eq!(
        rec.latencies().len(),
        2,
        "one start→first-run sample per object"
    );
    // Runs after done still count in the live total but not in the snapshot.
    rec.reconcile(&obj("b"), &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    assert_eq!(rec.runs(), 4);
    assert_eq!(rec.finished().unwrap().runs, 3);
}

#[tokio::test]
async fn yield_yields_k_times_then_done() {
    let rec = Recorder::start(config(Workload::Yield, 1), RequestCounter::new());
    let client = no_io_client();
    for _ in 0..3 {
        assert_eq!(
            rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
                .await
                .unwrap(),
            Step::YieldAfter(Duration::from_millis(1))
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(rec.finished().is_none());
    assert_eq!(
        rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
            .await
            .unwrap(),
        Step::Done
    );
    let snap = rec.finished().unwrap();
    assert_eq!(snap.runs, 4);
    let lat = rec.latencies();
    assert_eq!(lat.len(), 3, "one lateness sample per run after a yield");
    assert!(
        lat.iter().all(|d| *d >= Duration::from_millis(1)),
        "slept 2 ms per 1 ms yield: {lat:?}"
    );
}

#[tokio::test]
async fn churn_measures_stamp_to_run_and_finishes_on_last_update() {
    let rec = Recorder::start(config(Workload::Churn, 1), RequestCounter::new());
    let client = no_io_client();
    let mut o = obj("a");
    rec.reconcile(&o, &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), rec.wait_all_seen())
        .await
        .unwrap();
    assert!(rec.latencies().is_empty(), "no stamp, no sample");
    o.spec.stamp_micros = Some(wall_micros() - 5_000);
    rec.reconcile(&o, &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    rec.reconcile(&o, &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    assert_eq!(rec.latencies().len(), 1, "a stamp is measured once");
    assert!(rec.latencies()[0] >= Duration::from_millis(5));
    assert!(rec.finished().is_none());
    o.spec.stamp_micros = Some(wall_micros());
    o.spec.last_update = true;
    rec.reconcile(&o, &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    assert_eq!(rec.finished().unwrap().runs, 4);
    assert_eq!(rec.latencies().len(), 2);
}

#[tokio::test]
async fn status_is_patched_only_when_changed() {
    let (client, patches) = status_patch_client();
    let counter = RequestCounter::new();
    let rec = Recorder::start(config(Workload::Status, 2), counter);
    let mut o = obj("a");
    rec.reconcile(&o, &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    {
        let p = patches.lock().unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].0,
            "/apis/bench.actorcile.dev/v1/namespaces/ns/benchobjects/a/status"
        );
        let patch = &p[0].1;
        assert_eq!(patch["status"]["phase"], "Ready");
        assert_eq!(patch["status"]["observedGeneration"], 1);
        assert_eq!(patch["status"]["conditions"][0]["type"], "Ready");
    }
    // Under a runtime that writes status itself, the reconcile writes nothing.
    rec.reconcile(&o, &client, StatusWriter::Runtime)
        .await
        .unwrap();
    assert_eq!(patches.lock().unwrap().len(), 1);
    // Done only once the observer sees the Ready status.
    rec.observe(&o);
    assert_eq!(rec.done_count(), 0);
    o.status = Some(ResourceStatus::default().with_ready(
        Phase::Ready,
        true,
        ReadyReason::Provisioned,
        "provisioned",
        Some(1),
    ));
    assert!(status_is_current(&o));
    rec.reconcile(&o, &client, StatusWriter::Reconcile)
        .await
        .unwrap();
    assert_eq!(
        patches.lock().unwrap().len(),
        1,
        "the echo run writes nothing"
    );
    rec.observe(&o);
    rec.observe(&o);
    assert_eq!(rec.done_count(), 1);
    assert_eq!(rec.latencies().len(), 1);
    assert!(rec.finished().is_none());
    let mut b = o.clone();
    b.metadata.name = Some("b".into());
    rec.observe(&b);
    assert_eq!(rec.finished().unwrap().runs, 3);
    o.metadata.generation = Some(2);
    assert!(!status_is_current(&o));
}

/// Status patches a test client received: (path, body).
type Patches = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

/// A client that records every status patch it gets (path, body) and answers with the object;
/// every request must be a merge patch.
fn status_patch_client() -> (Client, Patches) {
    let patches = Arc::new(Mutex::new(Vec::new()));
    let seen = patches.clone();
    let client = Client::new(
        tower::service_fn(move |req: Request<Body>| {
            let seen = seen.clone();
            async move {
                assert_eq!(req.method(), http::Method::PATCH);
                assert_eq!(
                    req.headers()["content-type"],
                    "application/merge-patch+json"
                );
                let path = req.uri().path().to_string();
                let body = http_body_util::BodyExt::collect(req.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let name = path.rsplit('/').nth(1).unwrap().to_string();
                let mut o = obj(&name);
                o.status = serde_json::from_value(patch["status"].clone()).unwrap();
                seen.lock().unwrap().push((path, patch));
                Ok::<_, Infallible>(Response::new(Body::from(serde_json::to_vec(&o).unwrap())))
            }
        }),
        "ns",
    );
    (client, patches)
}

fn link(name: &str, depends_on: Option<&str>) -> BenchObject {
    let mut o = obj(name);
    o.spec.depends_on = depends_on.map(str::to_string);
    o
}

fn ready(mut o: BenchObject) -> BenchObject {
    o.status = Some(ResourceStatus::default().after_provision(&Outcome::Done, Some(1)));
    o
}

#[test]
fn chain_layout_is_dependents_first() {
    // 25 objects in chains of 10: 0..=9, 10..=19, 20..=24; i depends on i+1 in its chain.
    let deps: Vec<Option<u32>> = (0..25).map(|i| chain_dependency(i, 25, 10)).collect();
    for i in [0, 1, 8, 10, 18, 20, 23] {
        assert_eq!(deps[i as usize], Some(i + 1), "object {i}");
    }
    for head in [9, 19, 24] {
        assert_eq!(deps[head as usize], None, "object {head} heads its chain");
    }
    assert_eq!(
        deps.iter().filter(|d| d.is_none()).count(),
        3,
        "three chains"
    );
    // Length 1: no dependencies at all; one chain longer than the objects: one chain.
    assert!((0..5).all(|i| chain_dependency(i, 5, 1).is_none()));
    assert_eq!(
        (0..5)
            .filter(|&i| chain_dependency(i, 5, 100).is_none())
            .count(),
        1
    );
    assert_eq!(chain_dependency(u32::MAX, u32::MAX, 10), None);
    assert_eq!(chain_dependency(3, 10, 0), None, "no panic on length 0");

    let spec = chain_spec(8, 25, 10);
    assert_eq!(spec.depends_on.as_deref(), Some("bench-000009"));
    assert_eq!(chain_spec(9, 25, 10).depends_on, None);
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(json, serde_json::json!({"dependsOn": "bench-000009"}));
    assert_eq!(
        serde_json::to_value(BenchObjectSpec::default()).unwrap(),
        serde_json::json!({}),
        "other workloads' objects are unchanged"
    );
}

#[tokio::test]
async fn chain_writes_waiting_then_ready() {
    let (client, patches) = status_patch_client();
    let rec = Recorder::start(config(Workload::Chain, 2), RequestCounter::new());
    let mut b = link("b", Some("a"));

    // Dependency not Ready: the status says so, once.
    let step = rec
        .reconcile_chain(&b, &client, StatusWriter::Reconcile, false)
        .await
        .unwrap();
    assert_eq!(step, Step::WaitForDependency);
    {
        let p = patches.lock().unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].0,
            "/apis/bench.actorcile.dev/v1/namespaces/ns/benchobjects/b/status"
        );
        let st = &p[0].1["status"];
        assert_eq!(st["phase"], "Progressing");
        assert_eq!(st["observedGeneration"], 1);
        assert_eq!(st["conditions"][0]["status"], "False");
        assert_eq!(st["conditions"][0]["reason"], "DependencyNotReady");
        assert!(
            st["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("BenchObject ns/a"),
            "{st}"
        );
        b.status = serde_json::from_value(st.clone()).unwrap();
    }
    let step = rec
        .reconcile_chain(&b, &client, StatusWriter::Reconcile, false)
        .await
        .unwrap();
    assert_eq!(step, Step::WaitForDependency);
    assert_eq!(
        patches.lock().unwrap().len(),
        1,
        "unchanged status: no write"
    );

    // Under actorcile the runtime writes; the reconcile only answers.
    let step = rec
        .reconcile_chain(&link("c", Some("b")), &client, StatusWriter::Runtime, false)
        .await
        .unwrap();
    assert_eq!(step, Step::WaitForDependency);
    assert_eq!(patches.lock().unwrap().len(), 1);

    // Dependency Ready: Ready for the generation.
    let step = rec
        .reconcile_chain(&b, &client, StatusWriter::Reconcile, true)
        .await
        .unwrap();
    assert_eq!(step, Step::Done);
    {
        let p = patches.lock().unwrap();
        assert_eq!(p.len(), 2);
        let st = &p[1].1["status"];
        assert_eq!(st["phase"], "Ready");
        assert_eq!(st["conditions"][0]["status"], "True");
        b.status = serde_json::from_value(st.clone()).unwrap();
    }
    assert!(status_is_current(&b));
    rec.reconcile_chain(&b, &client, StatusWriter::Reconcile, true)
        .await
        .unwrap();
    assert_eq!(
        patches.lock().unwrap().len(),
        2,
        "the echo run writes nothing"
    );

    // A head needs no dependency; `reconcile` without a check lets only heads proceed.
    let head = link("a", None);
    assert_eq!(
        rec.reconcile(&head, &client, StatusWriter::Runtime)
            .await
            .unwrap(),
        Step::Done
    );
    assert_eq!(
        rec.reconcile(&b, &client, StatusWriter::Runtime)
            .await
            .unwrap(),
        Step::WaitForDependency
    );
    assert_eq!(rec.runs(), 7);
    assert_eq!(
        rec.done_count(),
        0,
        "only the observer makes an object done"
    );
}

#[tokio::test]
async fn chain_observer_measures_hops() {
    let rec = Recorder::start(config(Workload::Chain, 3), RequestCounter::new());
    let (a, b, c) = (link("a", None), link("b", Some("a")), link("c", Some("b")));
    // Not Ready yet: nothing.
    rec.observe(&a);
    rec.observe(&b);
    assert_eq!(rec.done_count(), 0);

    rec.observe(&ready(a.clone()));
    assert_eq!(rec.done_count(), 1);
    assert!(rec.latencies().is_empty(), "a head is no hop");
    tokio::time::sleep(Duration::from_millis(20)).await;
    rec.observe(&ready(b.clone()));
    rec.observe(&ready(b.clone()));
    assert_eq!(rec.done_count(), 2, "seen twice, done once");
    let lat = rec.latencies();
    assert_eq!(lat.len(), 1);
    assert!(lat[0] >= Duration::from_millis(20), "{lat:?}");
    assert!(rec.finished().is_none());

    // Ready for an older generation does not count.
    let mut stale = ready(c.clone());
    stale.metadata.generation = Some(2);
    rec.observe(&stale);
    assert_eq!(rec.done_count(), 2);
    rec.observe(&ready(c.clone()));
    let snap = rec.finished().expect("all three done");
    assert_eq!(snap.runs, 0);
    let all = rec.latencies();
    assert_eq!(all.len(), 2);
    assert!(
        all.iter().any(|d| *d < lat[0]),
        "c's hop starts at b's Ready, not a's: {all:?}"
    );
}

#[test]
fn chain_observer_without_the_dependency_seen_takes_no_sample() {
    let rec = Recorder::start(config(Workload::Chain, 2), RequestCounter::new());
    rec.observe(&ready(link("b", Some("a"))));
    assert_eq!(rec.done_count(), 1);
    assert!(rec.latencies().is_empty());
    rec.observe(&ready(link("a", None)));
    assert!(rec.finished().is_some());
    assert!(rec.latencies().is_empty());
}

#[test]
fn dependency_readiness() {
    let a = link("a", None);
    assert!(!is_ready_dependency(&a));
    assert!(is_ready_dependency(&ready(a.clone())));
    let mut deleting = ready(a.clone());
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    assert!(!is_ready_dependency(&deleting));
    let t = dependency_target(&link("b", Some("a"))).unwrap();
    assert_eq!(t, Target::for_kind::<BenchObject>(Some("ns"), "a"));
    assert_eq!(t.kind, "BenchObject");
    assert_eq!(dependency_target(&a), None);
    match waiting_outcome(t.clone()) {
        Outcome::Waiting { target, reason } => {
            assert_eq!(target, t);
            assert_eq!(reason.code(), "DependencyNotReady");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn crd_shape() {
    let crd = bench_crd();
    let text = serde_json::to_string(&crd).unwrap();
    assert!(
        !text.contains(r#""default":"""#),
        "no empty-string defaults: {text}"
    );
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    let cond =
        &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]["items"];
    assert_eq!(cond["properties"]["reason"]["type"], "string");
    assert_eq!(crd.spec.group, "bench.actorcile.dev");
    assert_eq!(crd.spec.names.plural, "benchobjects");
    assert_eq!(crd.spec.scope, "Namespaced");
    let v = &crd.spec.versions[0];
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let depends_on = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["dependsOn"];
    assert_eq!(depends_on["type"], "string", "{depends_on}");
}
