//! The runtime on a real etcd + kube-apiserver (v1.20, `actorcile::envtest`): lifecycle with
//! status and finalizer, operator restart, apiserver restart, schema and semantic validation,
//! kinds whose status cannot hold the runtime's, and the runtime's RBAC with a non-admin identity
//! (sufficient, and minimal: every permission it grants is used by the lifecycle).
//!
//! Run with `cargo test --release --features envtest --test integration real_runtime::` (needs
//! `scripts/install-test-deps.sh`). Tests share one control plane (`Envtest::shared`) with a
//! namespace each, and a runtime restricted to that namespace; the apiserver-restart test starts
//! its own. Real time: short policy delays, every test bounded.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::real;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::FINALIZER as DEFAULT_FINALIZER;
use actorcile::prelude::*;
use actorcile::rbac::{MissingPermission, missing_scoped_permissions};
use common::{Widget, eventually};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use real::*;

fn name_of(cx: &Context<Widget>) -> String {
    cx.object().name_any()
}

/// The sample operator: negative sizes are Terminal; provisioning yields until the object has
/// had `reconciles_needed` reconciles; deprovision is logged as `-name`.
fn sample_tree(
    reconciles: Reconciles,
    deprovisions: Log,
    reconciles_needed: impl Fn(&str) -> u32 + Send + Sync + 'static,
) -> impl Provisioner<Widget> {
    let reconciles_needed = Arc::new(reconciles_needed);
    serial![
        step("validate", |cx: Context<Widget>| async move {
            if cx.object().spec.size < 0 {
                Outcome::Terminal(Reason::new("InvalidSize", "spec.size must not be negative"))
            } else {
                Outcome::Done
            }
        }),
        step("build", move |cx: Context<Widget>| {
            let (reconciles, needed) = (reconciles.clone(), reconciles_needed.clone());
            async move {
                let name = name_of(&cx);
                let n = reconciles.bump(&name);
                if n < needed(&name) {
                    Outcome::yield_after(
                        Duration::from_millis(150),
                        Reason::new("Building", format!("reconcile {n}")),
                    )
                } else {
                    Outcome::Done
                }
            }
        })
        .on_delete(move |cx: Context<Widget>| {
            let log = deprovisions.clone();
            async move {
                log.push(format!("-{}", name_of(&cx)));
                Outcome::Done
            }
        }),
    ]
}

async fn start(
    client: &Client,
    ns: &str,
    tree: impl Provisioner<Widget> + 'static,
) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(real_policy())
        .controller(Controller::<Widget>::new(tree).namespace(ns))
        .start()
        .await
        .expect("start the runtime")
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The full provisioned state of a widget: Ready True / Provisioned, phase Ready,
/// observedGeneration = generation (status and condition), exactly our finalizer.
fn assert_provisioned(w: &Widget) {
    let s = w.status.clone().unwrap_or_default();
    let c = s
        .ready()
        .unwrap_or_else(|| panic!("{}: no Ready condition: {s:?}", w.name_any()));
    assert_eq!(c.status, "True", "{}: {s:?}", w.name_any());
    assert_eq!(c.reason, "Provisioned", "{}: {s:?}", w.name_any());
    assert_eq!(s.phase, Some(Phase::Ready), "{}: {s:?}", w.name_any());
    assert_eq!(
        s.observed_generation,
        w.metadata.generation,
        "{}",
        w.name_any()
    );
    assert_eq!(
        c.observed_generation,
        w.metadata.generation,
        "{}",
        w.name_any()
    );
    assert_eq!(
        w.finalizers(),
        [DEFAULT_FINALIZER.to_string()],
        "{}: exactly the runtime's finalizer",
        w.name_any()
    );
}

/// Delete every named widget and wait until the namespace is empty.
async fn delete_all_and_wait(api: &Ns, all: &[String]) {
    for n in all {
        api.delete(n).await;
    }
    for n in all {
        api.wait_gone(n).await;
    }
    assert_eq!(
        api.names().await,
        Vec::<String>::new(),
        "nothing left behind"
    );
}

#[tokio::test]
async fn lifecycle_on_a_real_apiserver_status_finalizer_and_clean_deletion() {
    bounded("lifecycle", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-lifecycle").await;
        let (reconciles, deprovisions) = (Reconciles::default(), Log::default());
        let rt = start(
            &api.client,
            &api.ns,
            sample_tree(reconciles.clone(), deprovisions.clone(), |_| 3),
        )
        .await;
        let all = names("w", 5);
        for n in &all {
            api.create_widget(n, 1).await;
        }
        // While yielding: Progressing, with the provisioner's typed reason and message.
        let s = api.wait_reason("w4", "Building").await;
        assert_eq!(s.phase, Some(Phase::Progressing), "{s:?}");
        let c = s.ready().unwrap();
        assert_eq!(c.status, "False");
        assert!(c.message.starts_with("reconcile "), "{c:?}");

        api.wait_all_ready(&all).await;
        for n in &all {
            let w = api.get(n).await.unwrap();
            assert_provisioned(&w);
            assert_eq!(w.metadata.generation, Some(1));
        }
        for n in &all {
            assert_eq!(
                reconciles.of(n),
                3,
                "{n}: two yields and one done reconcile"
            );
        }

        // A spec change: a new generation is provisioned and observed. It is also the barrier
        // for counting echo runs: the watch delivers the echo of a widget's Ready status write
        // before the change (written after that status was read back), and its actor takes
        // both in that order, so a run for the echo would have started before the change's.
        for n in &all {
            api.patch_spec(n, serde_json::json!({"note": "changed"}))
                .await;
        }
        for n in &all {
            let w = api.wait_ready_at(n, 2).await;
            assert_eq!(w.metadata.generation, Some(2));
            assert_provisioned(&w);
            assert_eq!(
                reconciles.of(n),
                4,
                "{n}: one reconcile for the change, none for the echoes of its own writes"
            );
        }

        // Deletion goes through the runtime's finalizer: deprovision once each, then gone.
        delete_all_and_wait(&api, &all).await;
        let mut log = deprovisions.entries();
        log.sort();
        assert_eq!(log, all.iter().map(|n| format!("-{n}")).collect::<Vec<_>>());
        eventually("every actor stopped", CONVERGE, || async {
            (rt.metrics().live_actors == 0).then_some(())
        })
        .await;
        rt.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn operator_restart_mid_provisioning_converges_without_reprovisioning_ready_objects() {
    bounded("operator restart", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-operator-restart").await;
        let (reconciles, deprovisions) = (Reconciles::default(), Log::default());
        // `slow*` objects cannot finish before the restart: they yield until `allow` is set.
        let allow = Arc::new(AtomicBool::new(false));
        // Reconciles a runtime's tree runs once its `stopped` flag is set go to `late`.
        let late = Log::default();
        let tree = |allow: Arc<AtomicBool>, stopped: Arc<AtomicBool>| {
            let late = late.clone();
            sample_tree(reconciles.clone(), deprovisions.clone(), move |name| {
                if stopped.load(Ordering::SeqCst) {
                    late.push(name);
                }
                if name.starts_with("early") {
                    1
                } else if allow.load(Ordering::SeqCst) {
                    3
                } else {
                    u32::MAX
                }
            })
        };
        let stopped = Arc::new(AtomicBool::new(false));
        let rt = start(&api.client, &api.ns, tree(allow.clone(), stopped.clone())).await;
        let early = names("early", 3);
        let slow = names("slow", 4);
        for n in &early {
            api.create_widget(n, 1).await;
        }
        api.wait_all_ready(&early).await;
        for n in &slow {
            api.create_widget(n, 1).await;
        }
        for n in &slow {
            eventually(&format!("{n} yielded twice"), CONVERGE, || async {
                (reconciles.of(n) >= 2).then_some(())
            })
            .await;
            api.wait_reason(n, "Building").await;
        }
        rt.shutdown().await;
        stopped.store(true, Ordering::SeqCst);
        let before = reconciles.snapshot();
        for n in &slow {
            let s = api.status_of(n).await.unwrap();
            assert!(
                !s.is_ready(),
                "{n} was still provisioning at the restart: {s:?}"
            );
        }

        // A new operator process: nothing in memory, everything from the API server.
        allow.store(true, Ordering::SeqCst);
        let rt = start(&api.client, &api.ns, tree(allow.clone(), Arc::default())).await;
        // Barrier for the old runtime: every wake-up it had armed was due at most 150 ms after
        // its shutdown returned. A widget new to the new runtime yields twice, 150 ms apart,
        // before it is Ready: by then the old runtime would have run its reconciles.
        api.create_widget(CLOCK, 1).await;
        api.wait_ready(CLOCK).await;
        assert_eq!(reconciles.of(CLOCK), 3);
        assert_eq!(
            late.entries(),
            Vec::<String>::new(),
            "no reconcile of the old runtime after its shutdown returned"
        );
        let all: Vec<String> = [CLOCK.to_string()]
            .into_iter()
            .chain(early.iter().cloned())
            .chain(slow.iter().cloned())
            .collect();
        api.wait_all_ready(&all).await;
        for n in &all {
            assert_provisioned(&api.get(n).await.unwrap());
        }
        // Barrier before counting: a spec change to each early object, provisioned and
        // observed. Whatever the new runtime took in before the change (the first list, echoes
        // of its own writes) its actor took in first, so any run for it has started by now.
        for n in &early {
            api.patch_spec(n, serde_json::json!({"note": "changed"}))
                .await;
        }
        for n in &early {
            api.wait_ready_at(n, 2).await;
            let extra = reconciles.of(n) - before[n];
            assert!(
                extra <= 2,
                "{n} was Ready before the restart but ran {extra} more reconciles (at most one at \
                 start-up and one for the change)"
            );
        }
        for n in &slow {
            assert!(
                reconciles.of(n) > before[n],
                "{n} was provisioned by the new runtime"
            );
        }
        delete_all_and_wait(&api, &all).await;
        assert_eq!(deprovisions.entries().len(), all.len());
        rt.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn apiserver_restart_mid_provisioning_watches_recover_and_everything_converges() {
    bounded("apiserver restart", async {
        // Restarting the apiserver would disturb other tests: this one has its own.
        let mut env = own_env().await;
        let api = Ns::create(env.client(), "rt-apiserver-restart").await;
        let (reconciles, deprovisions) = (Reconciles::default(), Log::default());
        // `a*` objects yield (150 ms) until `finish` is set, which happens while the apiserver
        // is down: their last reconciles, and the status writes of those, fall into the outage.
        let finish = Arc::new(AtomicBool::new(false));
        let f = finish.clone();
        let rt = start(
            &api.client,
            &api.ns,
            sample_tree(reconciles.clone(), deprovisions.clone(), move |name| {
                if name.starts_with('a') && !f.load(Ordering::SeqCst) {
                    u32::MAX
                } else {
                    2
                }
            }),
        )
        .await;
        let before = names("a", 6);
        for n in &before {
            api.create_widget(n, 1).await;
        }
        for n in &before {
            api.wait_reason(n, "Building").await;
        }
        let (_, Some(old_pid)) = env.pids() else {
            panic!("the apiserver is running");
        };
        let restart = tokio::spawn(async move {
            env.restart_apiserver()
                .await
                .expect("restart kube-apiserver");
            env
        });
        eventually("the old apiserver is gone", CONVERGE, || async {
            (!std::path::Path::new(&format!("/proc/{old_pid}")).exists()).then_some(())
        })
        .await;
        finish.store(true, Ordering::SeqCst);
        let env = restart.await.expect("the restart task");
        api.wait_all_ready(&before).await;
        for n in &before {
            assert_provisioned(&api.get(n).await.unwrap());
        }
        // The watch recovered: objects created after the restart are provisioned too.
        let after = names("b", 3);
        for n in &after {
            api.create_widget(n, 1).await;
        }
        api.wait_all_ready(&after).await;
        let all: Vec<String> = before.iter().chain(&after).cloned().collect();
        delete_all_and_wait(&api, &all).await;
        rt.shutdown().await;
        env.stop().await;
    })
    .await;
}

/// A widget created as a barrier: its reconciles, 150 ms apart, mark time on the runtime's own timers.
const CLOCK: &str = "clock";

#[tokio::test]
async fn schema_invalid_objects_are_rejected_and_semantic_errors_end_terminal() {
    bounded("validation", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-invalid").await;
        let (reconciles, deprovisions) = (Reconciles::default(), Log::default());
        let rt = start(
            &api.client,
            &api.ns,
            sample_tree(reconciles.clone(), deprovisions.clone(), |name| {
                if name == CLOCK { 16 } else { 1 }
            }),
        )
        .await;

        // Schema-invalid: the CRD schema generated from the Rust types makes the apiserver
        // refuse the write (422 Invalid); nothing is stored and the tree never sees it.
        let ar = ApiResource::erase::<Widget>(&());
        let raw: Api<DynamicObject> = Api::namespaced_with(api.client.clone(), &api.ns, &ar);
        for (name, spec, field) in [
            (
                "bad-type",
                serde_json::json!({"size": "abc", "note": "x"}),
                "spec.size",
            ),
            ("bad-missing", serde_json::json!({"note": "x"}), "spec.size"),
        ] {
            let mut obj = DynamicObject::new(name, &ar);
            obj.data = serde_json::json!({ "spec": spec });
            match raw.create(&PostParams::default(), &obj).await {
                Err(kube::Error::Api(s)) => {
                    assert_eq!(s.code, 422, "{name}: {s:?}");
                    assert_eq!(s.reason, "Invalid", "{name}: {s:?}");
                    assert!(s.message.contains(field), "{name}: {}", s.message);
                }
                other => panic!("{name}: expected 422 Invalid, got {other:?}"),
            }
            assert!(api.get(name).await.is_none(), "{name} was not stored");
        }

        // Semantically invalid: the tree answers Terminal with its typed reason.
        api.create_widget("neg", -5).await;
        let s = api.wait_reason("neg", "InvalidSize").await;
        assert_eq!(s.phase, Some(Phase::Failed));
        let c = s.ready().unwrap();
        assert_eq!(c.status, "False");
        assert!(c.message == "spec.size must not be negative", "{c:?}");
        assert_eq!(s.observed_generation, Some(1));
        // Terminal: no retries (the policy's yield and backoff delays are ≤ 2 s). The barrier:
        // a widget created now yields 15 times, 150 ms apart, on the runtime's own timers, so
        // its last reconcile comes more than 2 s later; a retry of `neg` would have been due before.
        api.create_widget(CLOCK, 1).await;
        api.wait_ready(CLOCK).await;
        let neg = api.get("neg").await.unwrap();
        assert_eq!(neg.finalizers(), [DEFAULT_FINALIZER.to_string()]);
        assert_eq!(reconciles.of(CLOCK), 16);
        assert_eq!(
            rt.metrics().provision_reconciles,
            1 + 16,
            "one run for the terminal object, none for the rejected ones (and the clock's 16)"
        );
        assert_eq!(reconciles.of("bad-type") + reconciles.of("bad-missing"), 0);

        // The object changed: provisioning resumes and succeeds.
        api.patch_spec("neg", serde_json::json!({"size": 3})).await;
        let w = api.wait_ready("neg").await;
        assert_provisioned(&w);
        assert_eq!(w.status.unwrap().observed_generation, Some(2));
        delete_all_and_wait(&api, &[CLOCK.to_string(), "neg".to_string()]).await;
        let mut log = deprovisions.entries();
        log.sort();
        assert_eq!(log, ["-clock", "-neg"]);
        rt.shutdown().await;
    })
    .await;
}

/// Peak resident memory of this test process (nextest runs each test in its own), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

#[tokio::test]
async fn hostile_objects_converge_with_bounded_reconciles_and_memory() {
    bounded("hostile input", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-hostile").await;
        let (reconciles, deprovisions) = (Reconciles::default(), Log::default());
        let rt = Runtime::builder(api.client.clone(), crate::common::names())
            .policy(real_policy())
            .controller(
                Controller::<Widget>::new(serial![
                    referencing(),
                    sample_tree(reconciles.clone(), deprovisions.clone(), |_| 1)
                ])
                .namespace(&api.ns),
            )
            .events("realapi-hostile-test")
            .start()
            .await
            .expect("start the runtime");
        let before = peak_rss();

        // A spec near etcd's 1.5 MiB object limit, in multi-byte unicode.
        let unit = "ünïcødé ✓ 🚀 ";
        let note = unit.repeat(1_300_000 / unit.len());
        let mut huge = widget_in(&api.ns, "huge", 1);
        huge.spec.note = note.clone();
        // 3 000 annotations, labels with values and prefixed keys at their length limits.
        let mut annotated = widget_in(&api.ns, "annotated", 1);
        annotated.spec.refs = vec!["huge".into()];
        annotated.metadata.annotations = Some(
            (0..3000)
                .map(|i| (format!("example.com/a{i}"), format!("välue {i} ✓")))
                .collect(),
        );
        let prefix = format!("{}.example.com", "p".repeat(253 - ".example.com".len()));
        annotated.metadata.labels = Some(
            (0..20)
                .map(|i| (format!("k{i}"), "v".repeat(63)))
                .chain([(format!("{prefix}/{}", "n".repeat(63)), "x".repeat(63))])
                .collect(),
        );
        // A name at the 253-character limit (a DNS subdomain of four labels), referencing the
        // object with 3 000 annotations: its reference annotation is the 3 001st.
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(long.len(), 253);
        let mut odd = widget_in(&api.ns, &long, 1);
        odd.spec.refs = vec!["annotated".into()];
        // A name of dots and digits.
        let dotted = "0.0-0.9";
        for w in [huge, annotated, odd, widget_in(&api.ns, dotted, 1)] {
            let name = w.name_any();
            api.api()
                .create(&PostParams::default(), &w)
                .await
                .unwrap_or_else(|e| panic!("create {}: {e}", &name[..20.min(name.len())]));
        }
        let all = vec![
            "huge".to_string(),
            "annotated".to_string(),
            long.clone(),
            dotted.to_string(),
        ];
        api.wait_all_ready(&all).await;
        for n in &all {
            assert_provisioned(&api.get(n).await.unwrap());
        }
        let huge = api.get("huge").await.unwrap();
        assert_eq!(huge.spec.note, note, "the huge spec is intact");
        assert_eq!(
            huge.annotations()
                .keys()
                .filter(|k| k.starts_with("ref."))
                .count(),
            1
        );
        let annotated = api.get("annotated").await.unwrap();
        assert_eq!(annotated.annotations().len(), 3001);
        // One reconcile each (the tree is done at its first), plus at most a re-run when a
        // reference written onto it met its status write (409): bounded, no loop.
        for n in &all {
            assert!(
                reconciles.of(n) <= 2,
                "{}: {}",
                &n[..20.min(n.len())],
                reconciles.of(n)
            );
        }
        let runs = rt.metrics().provision_reconciles;
        assert!(
            runs <= 2 * all.len() as u64,
            "{runs} runs for {} objects",
            all.len()
        );

        // Deletion in reference order: everything goes, nothing is left behind.
        delete_all_and_wait(&api, &all).await;
        assert_eq!(deprovisions.entries().len(), all.len());
        rt.shutdown().await;
        // Memory: the object is held once by the store and the actor (one `Arc`), plus what
        // decoding and the writes keep in flight.
        let grown = peak_rss().saturating_sub(before);
        eprintln!(
            "hostile input: peak RSS grew {:.1} MiB for a {:.1} MiB object",
            grown as f64 / (1 << 20) as f64,
            note.len() as f64 / (1 << 20) as f64
        );
        assert!(
            grown < 64 << 20,
            "peak RSS grew {} MiB for a {} MiB object",
            grown >> 20,
            note.len() >> 20
        );
    })
    .await;
}

/// A kind whose spec has no defaulted strings, so only actorcile's `ResourceStatus` is in play.
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "schema.actorcile.dev",
    version = "v1",
    kind = "Plain",
    namespaced,
    status = "ResourceStatus"
)]
struct PlainSpec {
    size: i32,
}

/// A kind with a `#[serde(default)]` string in its spec: schemars gives it `default: ""`.
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "schema.actorcile.dev",
    version = "v1",
    kind = "Defaulted",
    namespaced
)]
struct DefaultedSpec {
    #[serde(default)]
    note: String,
}

/// An operator puts `ResourceStatus` in its CRD's status (as `actorcile::status` recommends) and installs
/// the CRD generated from its Rust types: the server accepts it. A generated CRD with a
/// `default: ""` (what `status::Condition`'s `#[serde(default)]` strings would give if its schema
/// kept them) installs too on the supported releases; v1.20 refused it (see
/// `real::crd_for_v1_20`).
#[tokio::test]
async fn resource_status_schema_installs_on_a_real_apiserver_as_generated() {
    bounded("ResourceStatus schema", async {
        let env = shared_env().await;
        env.install_crds(&[<Defaulted as kube::CustomResourceExt>::crd()])
            .await
            .expect("current servers accept a CRD with a default of \"\"");
        env.install_crds(&[<Plain as kube::CustomResourceExt>::crd()])
            .await
            .expect("a CRD whose status is actorcile's ResourceStatus installs as generated");
    })
    .await;
}

/// A kind as a hand-written CRD often has it: no status subresource.
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "schema.actorcile.dev",
    version = "v1",
    kind = "Bare",
    namespaced
)]
struct BareSpec {
    size: i32,
}

/// A kind whose status is the operator's own and does not hold `ResourceStatus`.
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "schema.actorcile.dev",
    version = "v1",
    kind = "Terse",
    namespaced,
    status = "TerseStatus"
)]
struct TerseSpec {
    size: i32,
}

#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct TerseStatus {
    replicas: Option<i32>,
}

/// Two kinds whose status cannot hold what the runtime writes, on the real API server: without
/// a status subresource every status write is answered 404, as for a deleted object (the runtime
/// asks discovery, and says what is wrong instead of taking the object for deleted); with a
/// status schema of the operator's own the server prunes the runtime's fields (the runtime
/// checks the answer to its first write). Each is a Warning Event with the fix.
#[tokio::test]
async fn a_status_the_kind_cannot_hold_is_reported_on_a_real_apiserver() {
    bounded("status the kind cannot hold", async {
        let env = shared_env().await;
        env.install_crds(&[
            <Bare as kube::CustomResourceExt>::crd(),
            <Terse as kube::CustomResourceExt>::crd(),
        ])
        .await
        .expect("install the CRDs");
        let api = Ns::create(env.client(), "rt-status-set-up").await;
        let rt = Runtime::builder(api.client.clone(), crate::common::names())
            .policy(real_policy())
            .controller(
                Controller::<Bare>::new(step("done", |_cx: Context<Bare>| async { Outcome::Done }))
                    .namespace(&api.ns),
            )
            .controller(
                Controller::<Terse>::new(step("done", |_cx: Context<Terse>| async {
                    Outcome::Done
                }))
                .namespace(&api.ns),
            )
            .events("realapi-status-set-up-test")
            .start()
            .await
            .expect("start the runtime");
        let bares: Api<Bare> = Api::namespaced(api.client.clone(), &api.ns);
        let terses: Api<Terse> = Api::namespaced(api.client.clone(), &api.ns);
        let pp = PostParams::default();
        bares
            .create(&pp, &Bare::new("b", BareSpec { size: 1 }))
            .await
            .expect("create a Bare");
        terses
            .create(&pp, &Terse::new("t", TerseSpec { size: 1 }))
            .await
            .expect("create a Terse");
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(api.client.clone(), &api.ns);
        let note = |reason: &'static str, name: &'static str| {
            let events = events.clone();
            eventually(reason, CONVERGE, move || {
                let events = events.clone();
                async move {
                    let list = events.list(&Default::default()).await.ok()?;
                    list.items
                        .into_iter()
                        .filter(|e| {
                            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        })
                        .find(|e| e.reason.as_deref() == Some(reason))
                        .and_then(|e| e.note)
                }
            })
        };
        let not_served = note("StatusNotServed", "b").await;
        assert!(
            not_served.contains("schema.actorcile.dev/v1 bares"),
            "the Event names the resource: {not_served}"
        );
        let pruned = note("StatusPruned", "t").await;
        assert!(
            pruned.contains("schema.actorcile.dev/v1 terses"),
            "the Event names the resource: {pruned}"
        );
        assert_eq!(
            rt.metrics().status_writes,
            1,
            "only the Terse's write went through (pruned)"
        );
        // Both still delete: the finalizer is a plain patch of the object.
        bares
            .delete("b", &Default::default())
            .await
            .expect("delete");
        terses
            .delete("t", &Default::default())
            .await
            .expect("delete");
        eventually("both gone", CONVERGE, || async {
            let gone = (bares.get_opt("b").await, terses.get_opt("t").await);
            matches!(gone, (Ok(None), Ok(None))).then_some(())
        })
        .await;
        rt.shutdown().await;
    })
    .await;
}

const ROLE: &str = "actorcile-realapi-operator";

/// Takes a reference on each widget named in `spec.refs`.
fn referencing() -> impl Provisioner<Widget> {
    step("reference", |cx: Context<Widget>| async move {
        for n in &cx.object().spec.refs {
            let t = Target::for_kind::<Widget>(cx.object().namespace().as_deref(), n);
            if let Err(e) = cx.add_reference(&t).await {
                return Outcome::failed(Reason::new("ReferenceFailed", "could not reference"), e);
            }
        }
        Outcome::Done
    })
}

#[tokio::test]
async fn the_runtimes_roles_suffice_for_a_non_admin_are_minimal_and_preflight_names_what_is_missing()
 {
    bounded("rbac", async {
        let env = shared_env().await;
        let admin = env.client();
        // The user's client records every request it sends, as (API group, resource, verb).
        let used = Used::default();
        let user = recorded_user_client(env, &used);
        let api = Ns::create(admin.clone(), "rt-rbac").await;
        let (reconciles, deprovisions) = (Reconciles::default(), Log::default());
        let builder = || {
            Runtime::builder(user.clone(), crate::common::names())
                .policy(real_policy())
                .controller(
                    Controller::<Widget>::new(serial![
                        referencing(),
                        sample_tree(reconciles.clone(), deprovisions.clone(), |_| 2)
                    ])
                    .namespace(&api.ns),
                )
                .events("realapi-rbac-test")
                .preflight_rbac(true)
        };
        let full = builder().roles(ROLE);
        // A namespaced controller: one Role in its namespace, nothing cluster-wide.
        assert!(full.cluster_role.is_none(), "{:?}", full.cluster_role);
        assert_eq!(full.roles.len(), 1);
        let all_rules = full.rules();

        // The role without `patch` on widgets/status.
        let mut reduced = full.clone();
        if let Some(rules) = reduced.roles[0].rules.as_mut() {
            rules.retain(|r| r.resources.as_deref() != Some(&["widgets/status".to_string()][..]));
        }
        assert_ne!(
            reduced, full,
            "the runtime's role includes patch on widgets/status"
        );
        let subject = user_subject(env);
        reduced
            .apply(&admin, subject.clone(), "realapi-test")
            .await
            .expect("apply the roles");
        let expected = vec![MissingPermission {
            step: None,
            verb: "patch".into(),
            resource: "widgets/status".into(),
            group: "test.actorcile.dev".into(),
            namespace: Some(api.ns.clone()),
            name: None,
        }];
        // RBAC changes reach the authorizer through an informer: wait until they are in force.
        eventually("the reduced role is in force", CONVERGE, || async {
            let missing = missing_scoped_permissions(&user, &all_rules).await.ok()?;
            (missing == expected).then_some(())
        })
        .await;
        match builder().start().await {
            Err(actorcile::Error::Forbidden(missing)) => {
                assert_eq!(missing, expected);
                let msg = actorcile::Error::Forbidden(missing).to_string();
                assert!(
                    msg.contains("patch") && msg.contains("widgets/status"),
                    "{msg}"
                );
            }
            Err(e) => panic!("expected Error::Forbidden, got {e}"),
            Ok(rt) => {
                rt.shutdown().await;
                panic!("start() succeeded without patch on widgets/status");
            }
        }

        // The full role: preflight reconciles and the whole lifecycle works as the non-admin.
        full.apply(&admin, subject, "realapi-test")
            .await
            .expect("apply the roles");
        eventually("the full role is in force", CONVERGE, || async {
            let missing = missing_scoped_permissions(&user, &all_rules).await.ok()?;
            missing.is_empty().then_some(())
        })
        .await;
        let rt = builder().start().await.expect("start with the full role");
        let all = names("r", 3);
        for n in &all {
            api.create_widget(n, 1).await;
        }
        api.wait_all_ready(&all).await;
        // r2 references r0 (so r0's deletion waits for r2's), and changes once.
        api.patch_spec("r2", serde_json::json!({ "refs": ["r0"] }))
            .await;
        eventually("r2 holds a reference on r0", CONVERGE, || async {
            let r0 = api.get("r0").await?;
            let refs = r0
                .annotations()
                .keys()
                .filter(|k| k.starts_with("ref."))
                .count();
            (refs == 1).then_some(())
        })
        .await;
        api.wait_ready_at("r2", 2).await;
        // r1 turns invalid, then valid again: its second Provisioned Event is a series patch.
        api.patch_spec("r1", serde_json::json!({ "size": -1 }))
            .await;
        api.wait_reason("r1", "InvalidSize").await;
        api.patch_spec("r1", serde_json::json!({ "size": 1 })).await;
        api.wait_ready_at("r1", 3).await;
        for n in &all {
            assert_provisioned(&api.get(n).await.unwrap());
        }
        // Events were published with the role's permissions.
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(admin.clone(), &api.ns);
        eventually("a Provisioned event for r0", CONVERGE, || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("Provisioned")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("r0")
                })
                .then_some(())
        })
        .await;
        delete_all_and_wait(&api, &all).await;
        assert_eq!(deprovisions.entries().len(), all.len());
        rt.shutdown().await;

        // The role is minimal: the lifecycle used every permission it grants, so removing
        // any one breaks it (the request named here would be refused).
        let used = used.take();
        let granted = granted(&all_rules);
        // `list` of the managed kind is the fallback of streaming lists: a server that offers
        // them (WatchList) is only watched, one that does not is listed. It is the one grant a
        // run on a current server does not use.
        let list = (
            "test.actorcile.dev".to_string(),
            "widgets".to_string(),
            "list".to_string(),
        );
        assert!(
            granted.contains(&list),
            "the role lacks the fallback's list"
        );
        let unused: Vec<_> = granted.difference(&used).filter(|g| **g != list).collect();
        assert!(
            unused.is_empty(),
            "the role grants permissions the runtime never used: {unused:?} (used: {used:?})"
        );
    })
    .await;
}

/// The Widget CRD with CEL validation rules: `spec.size` at most `max_size`, and a status in
/// phase Progressing refused.
fn widget_crd_with_rules(
    max_size: i32,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let mut v = serde_json::to_value(crd_for_v1_20::<Widget>()).unwrap();
    let props = &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    props["spec"]["x-kubernetes-validations"] = serde_json::json!([{
        "rule": format!("self.size <= {max_size}"),
        "message": format!("size must be at most {max_size}"),
    }]);
    props["status"]["x-kubernetes-validations"] = serde_json::json!([{
        "rule": "!has(self.phase) || self.phase != 'Progressing'",
        "message": "a Progressing status is refused by this cluster's rule",
    }]);
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn cel_rules_refusing_status_writes_are_reported_and_backed_off_and_ratcheting_keeps_old_objects_workable()
 {
    let log = LogBuffer::default();
    let _capture = log.capture();
    bounded("cel", async {
        let env = actorcile::envtest::Envtest::builder()
            .crds(vec![widget_crd_with_rules(10)])
            .start()
            .await
            .expect("start etcd + kube-apiserver");
        let api = Ns::create(env.client(), "cel").await;
        // Valid when created; the rule then tightens below its size.
        api.create_widget("old", 5).await;
        env.install_crds(&[widget_crd_with_rules(3)]).await.unwrap();
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let refused = eventually("the tightened rule in force", CONVERGE, || async {
            match api
                .api()
                .create(&dry_run, &widget_in(&api.ns, "new", 5))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 422 => Some(s),
                _ => None,
            }
        })
        .await;
        assert!(
            refused.message.contains("size must be at most 3"),
            "{refused:?}"
        );
        api.create_widget("building", 1).await;

        // "building" yields (phase Progressing, which the status rule refuses); "old" is done.
        let tree = step("build", |cx: Context<Widget>| async move {
            if cx.object().name_any() == "building" {
                Outcome::yield_after(
                    Duration::from_millis(150),
                    Reason::new("Building", "still building"),
                )
            } else {
                Outcome::Done
            }
        });
        let rt = Runtime::builder(api.client.clone(), crate::common::names())
            .policy(real_policy())
            .events("cel-test")
            .controller(Controller::<Widget>::new(tree).namespace(&api.ns))
            .start()
            .await
            .expect("start the runtime");

        // Ratcheting: "old" breaks the tightened spec rule, yet its finalizer and status writes
        // (which leave its spec alone) are admitted.
        let old = api.wait_ready("old").await;
        assert_provisioned(&old);

        // The refused status: a Warning Event naming the rule's message, and an error log.
        let events = eventually("a StatusRejected Event", CONVERGE, || async {
            let evs = events_in(&api.client, &api.ns, "StatusRejected").await;
            (!evs.is_empty()).then_some(evs)
        })
        .await;
        let note = events[0].note.clone().unwrap_or_default();
        assert!(
            note.contains("a Progressing status is refused by this cluster's rule"),
            "{note}"
        );
        assert_eq!(events[0].type_.as_deref(), Some("Warning"));
        // Backed off, not hot: the yield asks for a reconcile every 150 ms, the error backoff
        // (100 ms doubling to 2 s) allows about 7 writes in 8 s. A busier machine makes fewer.
        let before = rt.metrics().status_rejected;
        assert!(before >= 1);
        tokio::time::sleep(Duration::from_secs(8)).await;
        let during = rt.metrics().status_rejected - before;
        assert!(
            (1..=12).contains(&during),
            "{during} refused status writes in 8 s: the backoff does not hold"
        );
        assert!(
            api.status_of("building")
                .await
                .is_none_or(|s| s.phase != Some(Phase::Progressing))
        );
        rt.shutdown().await;
        env.stop().await;
    })
    .await;
    let text = log.text();
    assert!(
        text.lines().any(|l| l.contains("ERROR")
            && l.contains("a Progressing status is refused by this cluster's rule")),
        "no error log names the rule:\n{text}"
    );
}

/// A ConfigMap `<widget>-child` holding the widget's size.
fn size_child(w: &Widget) -> k8s_openapi::api::core::v1::ConfigMap {
    k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{}-child", w.name_any())),
            ..Default::default()
        },
        data: Some([("size".to_string(), w.spec.size.to_string())].into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_child_field_owned_by_another_manager_is_a_typed_outcome_until_it_is_released() {
    use k8s_openapi::api::core::v1::ConfigMap;
    bounded("apply conflicts", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-apply-conflict").await;
        let cms: Api<ConfigMap> = Api::namespaced(api.client.clone(), &api.ns);
        // Someone else owns `data.size` of the child before the operator applies it.
        let theirs = PatchParams::apply("someone-else");
        let apply_theirs = |data: serde_json::Value| {
            let cms = cms.clone();
            let theirs = theirs.clone();
            async move {
                let mut body = serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "w-child"},
                });
                if !data.is_null() {
                    body["data"] = data;
                }
                cms.patch("w-child", &theirs, &Patch::Apply(&body))
                    .await
                    .unwrap();
            }
        };
        apply_theirs(serde_json::json!({"size": "theirs"})).await;
        // Their ConfigMap is nobody's child: the step takes it over (adopt), field by field,
        // and leaves the fields others own to them (not forced).
        let tree = resource("child", size_child)
            .rules(ChildRules::default().adopt())
            .report_conflicts();
        let rt = start(&api.client, &api.ns, tree).await;
        api.create_widget("w", 1).await;
        let s = api.wait_reason("w", "ChildFieldConflict").await;
        let c = s.ready().unwrap();
        assert_eq!(c.status, "False");
        assert!(
            c.message.contains("someone-else") && c.message.contains(".data.size"),
            "{c:?}"
        );
        // Their value stays: the runtime did not force.
        let child = cms.get("w-child").await.unwrap();
        assert_eq!(child.data.unwrap()["size"], "theirs");
        // They let go of the field (their apply no longer names it): the runtime's next try
        // applies its own.
        apply_theirs(serde_json::Value::Null).await;
        api.wait_ready("w").await;
        let child = cms.get("w-child").await.unwrap();
        assert_eq!(child.data.unwrap()["size"], "1");
        rt.shutdown().await;
    })
    .await;
}

/// An owned child edited by hand (a merge patch, which the API server records as the editor's
/// `Update`) is put back at once by the forced apply, and a Warning Event on the parent names
/// the editor.
#[tokio::test]
async fn an_owned_child_edited_by_hand_is_set_back_with_a_warning_naming_the_editor() {
    use k8s_openapi::api::core::v1::ConfigMap;
    bounded("child drift", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-child-drift").await;
        let cms: Api<ConfigMap> = Api::namespaced(api.client.clone(), &api.ns);
        let tree = resource("child", size_child);
        let rt = Runtime::builder(api.client.clone(), crate::common::names())
            .policy(real_policy())
            .events("drift-test")
            .controller(
                Controller::<Widget>::new(tree)
                    .namespace(&api.ns)
                    .owns::<ConfigMap>(),
            )
            .start()
            .await
            .expect("start the runtime");
        api.create_widget("w", 1).await;
        api.wait_ready("w").await;
        let edit = PatchParams {
            field_manager: Some("kubectl-edit".into()),
            ..Default::default()
        };
        cms.patch(
            "w-child",
            &edit,
            &Patch::Merge(serde_json::json!({"data": {"size": "edited"}})),
        )
        .await
        .unwrap();
        // The edit runs the owner (an owned child changed), whose forced apply sets it back.
        eventually("the child set back", CONVERGE, || async {
            let child = cms.get("w-child").await.ok()?;
            (child.data?.get("size")? == "1").then_some(())
        })
        .await;
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(api.client.clone(), &api.ns);
        let note = eventually("the ChildFieldsOverridden Event", CONVERGE, || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w"))
                .find(|e| e.reason.as_deref() == Some("ChildFieldsOverridden"))
                .and_then(|e| e.type_.filter(|t| t == "Warning").and(e.note))
        })
        .await;
        assert!(
            note.contains("ConfigMap w-child") && note.contains("kubectl-edit"),
            "{note}"
        );
        let child = cms.get("w-child").await.unwrap();
        let size_owner: Vec<&str> = child
            .managed_fields()
            .iter()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:data/f:size").is_some())
            })
            .filter_map(|m| m.manager.as_deref())
            .collect();
        assert_eq!(
            size_owner,
            [crate::common::FIELD_MANAGER],
            "the runtime owns data.size again"
        );
        rt.shutdown().await;
    })
    .await;
}

/// envtest's start-up probes meet a server that refuses connections and answers 500 while it
/// starts; those are expected there and stay out of the user's log.
#[tokio::test]
async fn starting_logs_no_error_for_a_server_that_is_still_coming_up() {
    let log = LogBuffer::default();
    // The test's runtime is single-threaded: everything start-up runs logs to `log`.
    let _capture = log.capture();
    tokio::time::timeout(TEST_LIMIT, async {
        let env = actorcile::envtest::Envtest::builder()
            .controller_manager(true)
            .start()
            .await
            .unwrap();
        env.stop().await;
    })
    .await
    .unwrap();
    // The capture works: an error logged here is in it.
    tracing::error!("the capture's own check");
    let text = log.text();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.len() == 1 && errors[0].contains("the capture's own check"),
        "start-up probes logged errors a user would take for failures:\n{}",
        errors.join("\n")
    );
}

#[tokio::test]
async fn a_long_non_ascii_event_note_is_cut_to_what_the_server_accepts() {
    bounded("event note", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rt-event-note").await;
        // 1 000 characters of two bytes each: 2 000 bytes, twice what an Event's note holds.
        let message = "é".repeat(1000);
        let tree = step("fail", move |_cx: Context<Widget>| {
            let message = message.clone();
            async move { Outcome::Terminal(Reason::new("Unicode", message)) }
        });
        let rt = Runtime::builder(api.client.clone(), crate::common::names())
            .policy(real_policy())
            .controller(Controller::<Widget>::new(tree).namespace(&api.ns))
            .events("realapi-event-note")
            .start()
            .await
            .unwrap();
        api.create_widget("w", 1).await;
        let events = eventually("the Event published", CONVERGE, || async {
            let events = events_in(&api.client, &api.ns, "Unicode").await;
            (!events.is_empty()).then_some(events)
        })
        .await;
        // The note is the message cut to 1 KiB of bytes (what comes before it, if anything,
        // included), at a character boundary: a String, so valid UTF-8 by construction.
        let note = events[0].note.clone().unwrap_or_default();
        assert!(
            note.len() <= 1024 && note.len() > 1000,
            "{} bytes",
            note.len()
        );
        assert!(note.ends_with("éé"), "{note}");
        rt.shutdown().await;
    })
    .await;
}
