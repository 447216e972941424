//! Readiness, references and deletion ordering on a real etcd + kube-apiserver
//! (`actorcile::envtest`): a chain and a diamond deleted in the worst order, a foreign
//! finalizer that must not count as a reference, and foreground deletion with the real garbage
//! collector (kube-controller-manager).
//!
//! Run with `cargo test --release --features envtest --test integration real_references::`. The fallback
//! dependency poll is an hour, so everything that converges here converged by messages.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::real;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::FINALIZER as DEFAULT_FINALIZER;
use actorcile::prelude::*;
use actorcile::references::referrers_of;
use common::{Widget, eventually};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use real::*;

/// No polling: the fallback dependency poll is an hour.
fn no_polling() -> SupervisorPolicy {
    let mut p = real_policy();
    p.kind.dependency_poll = Duration::from_secs(3600);
    p
}

/// A widget of the same namespace as `cx`'s object.
fn sibling(cx: &Context<Widget>, name: &str) -> Target {
    Target::for_kind::<Widget>(cx.object().namespace().as_deref(), name)
}

/// `needs` → `require_ready`; `refs` → `add_reference`; each deprovision logged as `-name`.
fn widget_tree(log: Log) -> impl Provisioner<Widget> {
    step("deps", |cx: Context<Widget>| async move {
        for n in &cx.object().spec.needs {
            if let Some(wait) = cx.require_ready(&sibling(&cx, n)).await {
                return wait;
            }
        }
        for n in &cx.object().spec.refs {
            if let Err(e) = cx.add_reference(&sibling(&cx, n)).await {
                return Outcome::yield_after(
                    Duration::from_millis(100),
                    Reason::new("ReferencePending", e.to_string()),
                );
            }
        }
        Outcome::Done
    })
    .on_delete(move |cx: Context<Widget>| {
        let log = log.clone();
        async move {
            log.push(format!("-{}", cx.object().name_any()));
            Outcome::Done
        }
    })
}

async fn start(api: &Ns, log: Log) -> RuntimeHandle {
    Runtime::builder(api.client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(Controller::<Widget>::new(widget_tree(log)).namespace(&api.ns))
        .start()
        .await
        .expect("start the runtime")
}

/// The names of the referrers persisted on widget `name`.
async fn persisted_referrers(api: &Ns, name: &str) -> Vec<String> {
    let w = api
        .get(name)
        .await
        .unwrap_or_else(|| panic!("{name} exists"));
    let mut r: Vec<String> = referrers_of(&w, &crate::common::names())
        .into_iter()
        .map(|t| t.name)
        .collect();
    r.sort();
    r
}

/// (referrer, target) edges of a chain a ← b ← c ← d and a diamond: top references left and
/// right, both reference bottom. Every referrer also needs its targets Ready.
const EDGES: [(&str, &str); 7] = [
    ("b", "a"),
    ("c", "b"),
    ("d", "c"),
    ("top", "left"),
    ("top", "right"),
    ("left", "bottom"),
    ("right", "bottom"),
];

/// Create the chain and the diamond (dependents first, so readiness is reached by messages),
/// wait until all are Ready and check the persisted references; returns every name.
async fn create_chain_and_diamond(api: &Ns) -> Vec<String> {
    let order = ["d", "c", "b", "a", "top", "left", "right", "bottom"];
    for n in order {
        let targets: Vec<&str> = EDGES
            .iter()
            .filter(|(r, _)| *r == n)
            .map(|(_, t)| *t)
            .collect();
        api.create_with(n, &targets, &targets).await;
    }
    let all: Vec<String> = order.iter().map(|s| s.to_string()).collect();
    api.wait_all_ready(&all).await;
    assert_eq!(persisted_referrers(api, "a").await, ["b"]);
    assert_eq!(persisted_referrers(api, "c").await, ["d"]);
    assert_eq!(persisted_referrers(api, "bottom").await, ["left", "right"]);
    assert_eq!(persisted_referrers(api, "top").await, Vec::<String>::new());
    all
}

/// Everything is gone, every deprovision run of a referrer came before any run of its targets,
/// and each object was deprovisioned once (after its finalizer is gone nothing of ours runs).
async fn assert_clean_in_reference_order(api: &Ns, log: &Log, all: &[String]) {
    for n in all {
        api.wait_gone(n).await;
    }
    assert_eq!(
        api.names().await,
        Vec::<String>::new(),
        "nothing left behind"
    );
    let entries = log.entries();
    let runs = |n: &str| -> Vec<usize> {
        let e = format!("-{n}");
        entries
            .iter()
            .enumerate()
            .filter(|(_, x)| **x == e)
            .map(|(i, _)| i)
            .collect()
    };
    for (referrer, target) in EDGES {
        let (r, t) = (runs(referrer), runs(target));
        assert!(
            !r.is_empty() && !t.is_empty() && r.iter().max() < t.iter().min(),
            "every deprovision of {referrer} before any of its target {target}: {entries:?}"
        );
    }
    for n in all {
        assert_eq!(runs(n).len(), 1, "{n} deprovisioned once: {entries:?}");
    }
}

/// All deleted at once, targets first: releases and deletions race, as in a real teardown
/// (`kubectl delete -f` of a whole manifest).
#[tokio::test]
async fn a_chain_and_a_diamond_deleted_targets_first_end_clean_in_reference_order() {
    bounded("chain and diamond", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "refs-chain-diamond").await;
        let log = Log::default();
        let rt = start(&api, log.clone()).await;
        let all = create_chain_and_diamond(&api).await;
        for n in ["a", "b", "c", "d", "bottom", "left", "right", "top"] {
            api.delete(n).await;
        }
        assert_clean_in_reference_order(&api, &log, &all).await;
        rt.shutdown().await;
    })
    .await;
}

/// Targets deleted first and held: until the roots (d, top) go, every deleted target reports
/// InUse naming its referrers, and nothing is deprovisioned.
#[tokio::test]
async fn deleted_targets_stay_in_use_until_their_referrers_go() {
    bounded("held targets", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "refs-held").await;
        let log = Log::default();
        let rt = start(&api, log.clone()).await;
        let all = create_chain_and_diamond(&api).await;
        for n in ["a", "b", "c", "bottom", "left", "right"] {
            api.delete(n).await;
        }
        for (target, referrers) in [
            ("a", &["b"][..]),
            ("b", &["c"]),
            ("c", &["d"]),
            ("bottom", &["left", "right"]),
            ("left", &["top"]),
            ("right", &["top"]),
        ] {
            let s = api.wait_reason(target, "InUse").await;
            assert_eq!(s.phase, Some(Phase::Terminating), "{target}: {s:?}");
            let msg = &s.ready().unwrap().message;
            for r in referrers {
                assert!(msg.contains(r), "{target} names its referrer {r}: {msg}");
            }
        }
        // Barrier: a change to each held target makes its actor run a deletion reconcile (counted
        // as a deprovision run) that finds it still held; none may deprovision.
        let held = ["a", "b", "c", "bottom", "left", "right"];
        let before = rt.metrics().deprovision_reconciles;
        for n in held {
            api.patch_spec(n, serde_json::json!({"note": "poke"})).await;
        }
        eventually("a deletion reconcile per held target", CONVERGE, || async {
            (rt.metrics().deprovision_reconciles >= before + held.len() as u64).then_some(())
        })
        .await;
        assert_eq!(
            log.entries(),
            Vec::<String>::new(),
            "no deprovision while held"
        );
        for n in held {
            let s = api.status_of(n).await.unwrap();
            assert_eq!(s.ready().unwrap().reason, "InUse", "{n}: {s:?}");
        }
        for n in ["d", "top"] {
            api.delete(n).await;
        }
        assert_clean_in_reference_order(&api, &log, &all).await;
        rt.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_foreign_finalizer_on_a_target_does_not_count_as_a_reference() {
    bounded("foreign finalizer", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "refs-foreign-finalizer").await;
        let log = Log::default();
        let rt = start(&api, log.clone()).await;
        api.create_with("t", &[], &[]).await;
        api.wait_ready("t").await;
        let foreign = "example.com/foreign";
        api.api()
            .patch(
                "t",
                &PatchParams::default(),
                &Patch::Json::<()>(
                    serde_json::from_value(serde_json::json!([
                        {"op": "add", "path": "/metadata/finalizers/-", "value": foreign}
                    ]))
                    .unwrap(),
                ),
            )
            .await
            .expect("add a foreign finalizer");
        assert_eq!(
            api.get("t").await.unwrap().finalizers(),
            [DEFAULT_FINALIZER.to_string(), foreign.to_string()]
        );
        api.delete("t").await;
        let t = eventually(
            "our deprovision ran and our finalizer went",
            CONVERGE,
            || async {
                let t = api.get("t").await?;
                (log.contains("-t") && t.finalizers() == [foreign.to_string()]).then_some(t)
            },
        )
        .await;
        assert!(t.metadata.deletion_timestamp.is_some());
        let reason = t
            .status
            .as_ref()
            .and_then(|s| s.ready())
            .map(|c| c.reason.clone());
        assert_ne!(
            reason.as_deref(),
            Some("InUse"),
            "a foreign finalizer is no referrer"
        );
        // Nothing more of ours runs on it, and the foreign finalizer stays until its owner goes.
        // Barrier: a change to `t`, then a new widget provisioned. The watch delivers the change
        // first, so the runtime took it in before it provisioned `sentinel` (a reconcile on `t` would
        // be one message to its actor; `sentinel` takes a finalizer write, a reconcile and a status
        // write).
        api.patch_spec("t", serde_json::json!({"note": "poke"}))
            .await;
        api.create_with("sentinel", &[], &[]).await;
        api.wait_ready("sentinel").await;
        assert_eq!(log.entries(), ["-t"]);
        assert_eq!(
            api.get("t").await.unwrap().finalizers(),
            [foreign.to_string()]
        );
        // The foreign controller finishes: the object goes.
        api.api()
            .patch(
                "t",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("remove the foreign finalizer");
        api.wait_gone("t").await;
        api.delete("sentinel").await;
        api.wait_gone("sentinel").await;
        rt.shutdown().await;
    })
    .await;
}

/// Many referrers take a reference on one target at once. Their guarded writes conflict (each
/// changes the target's resourceVersion under the others): the runtime retries them, so every
/// referrer's first `add_reference` succeeds and no `Errored` status is ever written. Every write
/// of the runtime carries its field manager, so `managedFields` names it for the reference
/// annotations, the finalizers and the status.
#[tokio::test]
async fn two_hundred_referrers_of_one_target_all_succeed_and_writes_name_the_field_manager() {
    bounded("200 referrers", async {
        const N: usize = 200;
        let env = shared_env().await;
        let api = Ns::create(env.client(), "refs-many-referrers").await;
        let failures = Arc::new(AtomicUsize::new(0));
        let f = failures.clone();
        let tree = step("refs", move |cx: Context<Widget>| {
            let f = f.clone();
            async move {
                for n in &cx.object().spec.refs {
                    if let Err(e) = cx.add_reference(&sibling(&cx, n)).await {
                        f.fetch_add(1, Ordering::SeqCst);
                        return Outcome::failed(Reason::new("Reference", "cannot reference"), e);
                    }
                }
                Outcome::Done
            }
        });
        let rt = Runtime::builder(api.client.clone(), crate::common::names())
            .policy(no_polling())
            .controller(Controller::<Widget>::new(tree).namespace(&api.ns))
            .start()
            .await
            .expect("start the runtime");
        api.create_with("t", &[], &[]).await;
        api.wait_ready("t").await;
        let names: Vec<String> = (0..N).map(|i| format!("r{i}")).collect();
        for n in &names {
            api.create_with(n, &[], &["t"]).await;
        }
        api.wait_all_ready(&names).await;
        assert_eq!(
            failures.load(Ordering::SeqCst),
            0,
            "no referrer saw a conflict"
        );
        assert_eq!(persisted_referrers(&api, "t").await.len(), N);
        // managedFields: the runtime's manager owns what it wrote
        let fields_of = |w: &Widget| -> String {
            w.metadata
                .managed_fields
                .iter()
                .flatten()
                .filter(|m| m.manager.as_deref() == Some(crate::common::FIELD_MANAGER))
                .map(|m| serde_json::to_string(&m.fields_v1).unwrap())
                .collect()
        };
        let t = fields_of(&api.get("t").await.unwrap());
        assert!(t.contains("f:annotations"), "reference annotations: {t}");
        let r = fields_of(&api.get("r0").await.unwrap());
        assert!(r.contains("f:finalizers"), "finalizer: {r}");
        assert!(r.contains("f:status"), "status: {r}");
        rt.shutdown().await;
    })
    .await;
}

/// A widget waits on a `Gadget`, a kind this runtime does not manage (another operator's). It is
/// woken by the runtime's one watch of gadgets the moment the gadget's status turns Ready —
/// within seconds, with the fallback poll an hour — and the runtime never GETs the gadget: its
/// only reads of gadgets are the watch's list and watch requests.
#[tokio::test]
async fn a_dependency_of_another_operator_wakes_its_waiter_by_watch_without_polling() {
    bounded("external dependency", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "refs-external").await;
        let gadgets: kube::Api<common::Gadget> = kube::Api::namespaced(env.client(), &api.ns);
        let requests = common::Requests::default();
        let runtime_client = requests.client(
            kube::client::ClientBuilder::try_from(env.config()).expect("a client for envtest"),
        );
        let tree = step("gadgets", |cx: Context<Widget>| async move {
            for n in &cx.object().spec.needs {
                let gadget =
                    Target::for_kind::<common::Gadget>(cx.object().namespace().as_deref(), n);
                if let Some(wait) = cx.require_ready(&gadget).await {
                    return wait;
                }
            }
            Outcome::Done
        });
        // The Gadget CRD was just installed: its first lists may still be refused. Served
        // before the runtime starts, so that the one list counted below is not a retry.
        eventually("gadgets are served", Duration::from_secs(30), || async {
            gadgets.list(&Default::default()).await.ok().map(|_| ())
        })
        .await;
        let rt = Runtime::builder(runtime_client, crate::common::names())
            .policy(no_polling())
            .controller(Controller::<Widget>::new(tree).namespace(&api.ns))
            .start()
            .await
            .expect("start the runtime");
        api.create_with("app", &["db"], &[]).await;
        api.wait_reason("app", "DependencyNotFound").await;
        let mut g = common::Gadget::new("db", common::GadgetSpec::default());
        g.metadata.namespace = Some(api.ns.clone());
        gadgets
            .create(&Default::default(), &g)
            .await
            .expect("create the gadget");
        api.wait_reason("app", "DependencyNotReady").await;

        let woken = std::time::Instant::now();
        gadgets
            .patch_status(
                "db",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": { "conditions": [{
                    "type": "Ready", "status": "True", "reason": "Up", "message": "serving",
                    "observedGeneration": 1
                }] } })),
            )
            .await
            .expect("the gadget's controller writes Ready");
        api.wait_ready("app").await;
        let took = woken.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "woken by the watch, not the hourly poll: {took:?}"
        );
        assert_eq!(
            requests.count("GET", "/gadgets/"),
            0,
            "the runtime never GETs the gadget"
        );
        let lists = requests.count("GET", "/gadgets?") - requests.watches("/gadgets?");
        assert_eq!(
            lists,
            1,
            "one list of gadgets: the watch's first; every request for gadgets: {:#?}",
            requests.matching("/gadgets")
        );
        rt.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_waits_for_owned_children_that_the_real_garbage_collector_removes() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Resource;
    use kube::api::{Api, DeleteParams, PostParams};
    bounded("foreground deletion", async {
        let env = actorcile::envtest::Envtest::builder()
            .crds(sample_crds())
            .controller_manager(true)
            .start()
            .await
            .expect("start etcd + kube-apiserver + kube-controller-manager");
        let api = Ns::create(env.client(), "foreground").await;
        let log = Log::default();
        let rt = start(&api, log.clone()).await;
        api.create_widget("parent", 1).await;
        let parent = api.wait_ready("parent").await;
        let mut owner = parent.controller_owner_ref(&()).unwrap();
        owner.block_owner_deletion = Some(true);
        // A child that holds its own deletion back with a finalizer of its own.
        let cms: Api<ConfigMap> = Api::namespaced(api.client.clone(), &api.ns);
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("child".into());
        cm.metadata.owner_references = Some(vec![owner]);
        cm.metadata.finalizers = Some(vec!["example.com/slow".into()]);
        cms.create(&PostParams::default(), &cm).await.unwrap();

        api.api()
            .delete("parent", &DeleteParams::foreground())
            .await
            .unwrap();
        // The runtime has looked at the deleting parent (it wrote this status) and deprovisioned
        // nothing: the garbage collector holds the parent with foregroundDeletion.
        let s = eventually("the parent waits for its child", CONVERGE, || async {
            api.status_of("parent")
                .await
                .filter(|s| s.ready().is_some_and(|c| c.message.contains("foreground")))
        })
        .await;
        assert_eq!(s.phase, Some(Phase::Terminating));
        assert!(
            log.entries().is_empty(),
            "no deprovision while an owned child remains"
        );
        eventually(
            "the real garbage collector deletes the child",
            CONVERGE,
            || async {
                let child = cms.get("child").await.unwrap();
                child.metadata.deletion_timestamp.is_some().then_some(())
            },
        )
        .await;
        assert!(log.entries().is_empty(), "no deprovision while it remains");
        // The child's finalizer goes: the collector removes it, lifts foregroundDeletion, and
        // the runtime deprovisions once and lets the parent go.
        cms.patch(
            "child",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        api.wait_gone("parent").await;
        assert_eq!(log.entries(), ["-parent"]);
        rt.shutdown().await;
        env.stop().await;
    })
    .await;
}
