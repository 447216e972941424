//! Guarded side effects on a real etcd + kube-apiserver (v1.20, `actorcile::envtest`): a stale
//! object never runs the task, two replicas racing run each task once, and a replica stopped in
//! the middle of a task holds its object back until the lock expires, not longer and not less.
//!
//! Run with `cargo test --release --features envtest --test integration real_guard::`.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::real;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::provisioners::{Lock, guard};
use common::Widget;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use real::*;

/// Every run of a guarded task: object name → (wall-clock start, resourceVersion it ran on).
type Runs = Arc<Mutex<HashMap<String, Vec<(jiff::Timestamp, String)>>>>;

fn record(runs: &Runs, cx: &Context<Widget>) {
    runs.lock()
        .unwrap()
        .entry(cx.object().name_any())
        .or_default()
        .push((
            jiff::Timestamp::now(),
            cx.object().resource_version().unwrap_or_default(),
        ));
}

async fn start(
    ns: &Ns,
    policy: SupervisorPolicy,
    tree: impl Provisioner<Widget> + 'static,
) -> RuntimeHandle {
    Runtime::builder(ns.client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree).namespace(&ns.ns))
        .start()
        .await
        .expect("start the runtime")
}

#[tokio::test]
async fn an_object_made_stale_between_read_and_guard_does_not_run_the_task() {
    bounded("stale object", async {
        let env = shared_env().await;
        let ns = Ns::create(env.client(), "guard-stale").await;
        let runs: Runs = Arc::default();
        // The resourceVersion the other writer's change produced.
        let touched: Arc<Mutex<Option<u64>>> = Arc::default();
        let (r, t, other) = (runs.clone(), touched.clone(), env.client());
        let namespace = ns.ns.clone();
        let tree = serial![
            // On the first reconcile only: someone else changes the object after the reconcile read it.
            step("someone-else-writes", move |cx: Context<Widget>| {
                let (t, other, namespace) = (t.clone(), other.clone(), namespace.clone());
                async move {
                    if t.lock().unwrap().is_none() {
                        let api = kube::Api::<Widget>::namespaced(other, &namespace);
                        let label = Patch::Merge(
                            serde_json::json!({"metadata": {"labels": {"touched": "yes"}}}),
                        );
                        let w = api
                            .patch(&cx.object().name_any(), &PatchParams::default(), &label)
                            .await
                            .expect("label the widget");
                        *t.lock().unwrap() = w.resource_version().and_then(|v| v.parse().ok());
                    }
                    Outcome::Done
                }
            }),
            guard("External", move |cx: Context<Widget>| {
                let r = r.clone();
                async move {
                    record(&r, &cx);
                    Outcome::Done
                }
            }),
        ];
        let rt = start(&ns, real_policy(), tree).await;
        ns.create_widget("w", 1).await;
        let w = ns.wait_ready("w").await;
        let touched = touched.lock().unwrap().expect("the other writer wrote");
        assert_eq!(w.labels().get("touched").map(String::as_str), Some("yes"));
        let runs = runs.lock().unwrap().get("w").cloned().unwrap_or_default();
        assert_eq!(runs.len(), 1, "the task ran once: {runs:?}");
        // ...on a version at or after the other writer's (etcd revisions only grow), never on
        // the stale one the first reconcile read.
        let ran_on: u64 = runs[0].1.parse().unwrap();
        assert!(
            ran_on >= touched,
            "the task ran on version {ran_on}, older than the other writer's {touched}"
        );
        let c = w.status.as_ref().unwrap().condition("External").unwrap();
        assert_eq!(c.reason, "Done");
        rt.shutdown().await;
    })
    .await;
}

/// A guarded task that counts its runs and takes a while, so the other replica meets the lock.
fn slow_counting_guard(runs: Runs) -> impl Provisioner<Widget> {
    guard("External", move |cx: Context<Widget>| {
        let runs = runs.clone();
        async move {
            record(&runs, &cx);
            tokio::time::sleep(Duration::from_millis(300)).await;
            Outcome::Done
        }
    })
}

#[tokio::test]
async fn two_replicas_racing_on_fifty_objects_run_each_guarded_task_once() {
    bounded("two replicas", async {
        let env = shared_env().await;
        let ns = Ns::create(env.client(), "guard-race").await;
        let runs: Runs = Arc::default();
        // Two runtimes with clients of their own, as two replicas would be.
        let a = start(
            &Ns {
                client: env.client(),
                ns: ns.ns.clone(),
            },
            real_policy(),
            slow_counting_guard(runs.clone()),
        )
        .await;
        let b = start(
            &Ns {
                client: env.client(),
                ns: ns.ns.clone(),
            },
            real_policy(),
            slow_counting_guard(runs.clone()),
        )
        .await;
        assert_ne!(a.holder(), b.holder());
        let names: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
        for n in &names {
            ns.create_widget(n, 1).await;
        }
        ns.wait_all_ready(&names).await;
        // Both replicas ran reconciles of the objects: the race happened.
        assert!(
            a.metrics().provision_reconciles >= 25 && b.metrics().provision_reconciles >= 25,
            "both replicas ran: {} and {} reconciles",
            a.metrics().provision_reconciles,
            b.metrics().provision_reconciles
        );
        let runs = runs.lock().unwrap().clone();
        let counts: HashMap<&String, usize> = runs.iter().map(|(k, v)| (k, v.len())).collect();
        assert_eq!(counts.len(), 50);
        assert!(
            counts.values().all(|&n| n == 1),
            "every guarded task ran exactly once: {counts:?}"
        );
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_replica_stopped_mid_task_holds_the_object_until_the_lock_expires() {
    bounded("stopped mid-task", async {
        let env = shared_env().await;
        let ns = Ns::create(env.client(), "guard-expiry").await;
        let mut policy = real_policy();
        policy.kind.lock_expiry = Duration::from_secs(4);
        policy.runtime.shutdown_timeout = Duration::from_millis(200);
        // Replica A: its task starts and never finishes.
        let started = Arc::new(tokio::sync::Notify::new());
        let s = started.clone();
        let hanging = guard("External", move |_cx: Context<Widget>| {
            let s = s.clone();
            async move {
                s.notify_one();
                std::future::pending::<()>().await;
                Outcome::Done
            }
        });
        let a = start(&ns, policy.clone(), hanging).await;
        let holder_a = a.holder().to_string();
        ns.create_widget("w", 1).await;
        started.notified().await;
        a.shutdown().await; // stopped mid-task: the lock stays behind
        let lock = Lock::of(
            ns.status_of("w")
                .await
                .unwrap()
                .condition("External")
                .expect("A's lock"),
        )
        .expect("a lock");
        assert_eq!(lock.holder, holder_a);

        // Replica B: meets A's lock, yields, and runs the task once it expired.
        let runs: Runs = Arc::default();
        let r = runs.clone();
        let b = start(
            &Ns {
                client: env.client(),
                ns: ns.ns.clone(),
            },
            policy,
            guard("External", move |cx: Context<Widget>| {
                let r = r.clone();
                async move {
                    record(&r, &cx);
                    Outcome::Done
                }
            }),
        )
        .await;
        ns.wait_reason("w", "Locked").await;
        assert!(
            jiff::Timestamp::now() < lock.until,
            "B met the lock before it expired (so the check below is not vacuous)"
        );
        assert!(
            runs.lock().unwrap().is_empty(),
            "B did not run the task while A held it"
        );
        ns.wait_ready("w").await;
        let runs = runs.lock().unwrap().get("w").cloned().unwrap();
        assert_eq!(runs.len(), 1);
        assert!(
            runs[0].0 >= lock.until,
            "B ran at {}, A's lock held until {}",
            runs[0].0,
            lock.until
        );
        // and not long after it: B's yield ends at the expiry
        assert!(runs[0].0.duration_since(lock.until) < jiff::SignedDuration::from_secs(3));
        b.shutdown().await;
    })
    .await;
}
