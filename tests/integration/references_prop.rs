//! Property test: random DAGs of up to 30 resources across two kinds, random references and
//! readiness requirements, random create/delete interleavings, random yields, failures and
//! panics in provisioners. Invariants:
//! - a target's deprovision never starts while a live referrer still holds a reference;
//! - every object ends Ready or gone; no leaked finalizers once everything is deleted;
//! - never two runs of one object at once.
//!
//! The second property runs the same cases with the runtime shut down and started again at a
//! random point of the creates and early deletes: the new runtime rebuilds references and
//! readiness from what the first persisted (annotations, status, finalizers), and the invariants
//! hold across both (a deprovision may run again only in the new runtime, after the first was
//! stopped between it and the finalizer's removal).

use crate::common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use common::*;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Node {
    gadget: bool,
    needs: Vec<usize>,
    refs: Vec<usize>,
    yields: u32,
    failures: u32,
    panics: u32,
}

#[derive(Clone, Debug)]
struct Case {
    nodes: Vec<Node>,
    create_order: Vec<usize>,
    /// Deleted while the others are still being created/provisioned (closed under dependents).
    early_delete: BTreeSet<usize>,
    delete_order: Vec<usize>,
    /// Restart the runtime before this step of the creates followed by the early deletes
    /// (only in the restart property).
    restart_at: usize,
}

fn name(i: usize) -> String {
    format!("n{i}")
}

fn target(nodes: &[Node], i: usize) -> Target {
    if nodes[i].gadget {
        Target::for_kind::<Gadget>(Some("default"), &name(i))
    } else {
        Target::for_kind::<Widget>(Some("default"), &name(i))
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (2usize..=30)
        .prop_flat_map(|n| {
            let nodes = (0..n)
                .map(|i| {
                    let earlier = if i == 0 { 0 } else { i };
                    (
                        any::<bool>(),
                        proptest::collection::btree_set(0..earlier.max(1), 0..=earlier.min(2)),
                        proptest::collection::btree_set(0..earlier.max(1), 0..=earlier.min(2)),
                        0u32..3,
                        0u32..3,
                        prop_oneof![8 => Just(0u32), 2 => Just(1u32)],
                    )
                        .prop_map(
                            move |(gadget, needs, refs, yields, failures, panics)| Node {
                                gadget,
                                needs: needs.into_iter().filter(|&j| j < i).collect(),
                                refs: refs.into_iter().filter(|&j| j < i).collect(),
                                yields,
                                failures,
                                panics,
                            },
                        )
                })
                .collect::<Vec<_>>();
            (
                nodes,
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                proptest::collection::btree_set(0..n, 0..=n / 3),
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            )
        })
        .prop_flat_map(|(nodes, create_order, seeds, delete_order)| {
            let n = nodes.len();
            (Just((nodes, create_order, seeds, delete_order)), 0..2 * n)
        })
        .prop_map(|((nodes, create_order, seeds, delete_order), restart_at)| {
            // close the early-delete set under dependents: whoever needs or references a
            // deleted node is deleted too (otherwise it could never become Ready)
            let mut early: BTreeSet<usize> = seeds;
            loop {
                let before = early.len();
                for (i, n) in nodes.iter().enumerate() {
                    if n.needs.iter().chain(&n.refs).any(|d| early.contains(d)) {
                        early.insert(i);
                    }
                }
                if early.len() == before {
                    break;
                }
            }
            Case {
                nodes,
                create_order,
                early_delete: early,
                delete_order,
                restart_at,
            }
        })
}

#[derive(Default)]
struct Observed {
    running: HashSet<String>,
    reconciles: HashMap<String, u32>,
    holds: HashSet<(String, String)>,
    /// Deprovisioned objects, with the runtime incarnation that did it.
    released: HashMap<String, u32>,
    /// The runtime incarnation (bumped at each restart).
    epoch: u32,
    violations: Vec<String>,
}

type Shared = Arc<Mutex<Observed>>;

/// Marks a run of `name` as over when dropped: at its end, or when a runtime that stops
/// abandons it.
struct Running(Shared, String);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().unwrap().running.remove(&self.1);
    }
}

fn dag_tree<K>(nodes: Arc<Vec<Node>>, obs: Shared) -> impl Provisioner<K>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    let (n1, o1) = (nodes.clone(), obs.clone());
    step("dag", move |cx: Context<K>| {
        let (nodes, obs) = (n1.clone(), o1.clone());
        async move {
            let me = cx.object().name_any();
            let i: usize = me[1..].parse().unwrap();
            let reconcile = {
                let mut o = obs.lock().unwrap();
                if !o.running.insert(me.clone()) {
                    o.violations.push(format!("two runs of {me} at once"));
                }
                let p = o.reconciles.entry(me.clone()).or_insert(0);
                *p += 1;
                *p
            };
            let _running = Running(obs.clone(), me.clone());
            let node = &nodes[i];
            async {
                // let other actors interleave with this run
                tokio::time::sleep(Duration::from_millis(1)).await;
                if reconcile <= node.yields {
                    return Outcome::yield_after(
                        Duration::from_millis(5),
                        Reason::new("Y", "yield"),
                    );
                }
                if reconcile <= node.yields + node.failures {
                    return Outcome::failed(
                        Reason::new("F", "fail"),
                        std::io::Error::other("injected"),
                    );
                }
                if reconcile <= node.yields + node.failures + node.panics {
                    panic!("injected panic in {me}");
                }
                for &d in &node.needs {
                    if let Some(w) = cx.require_ready(&target(&nodes, d)).await {
                        return w;
                    }
                }
                for &d in &node.refs {
                    match cx.add_reference(&target(&nodes, d)).await {
                        Ok(()) => {
                            obs.lock().unwrap().holds.insert((me.clone(), name(d)));
                        }
                        Err(e) => {
                            return Outcome::yield_after(
                                Duration::from_millis(5),
                                Reason::new("RefPending", e.to_string()),
                            );
                        }
                    }
                }
                Outcome::Done
            }
            .await
        }
    })
    .on_delete(move |cx: Context<K>| {
        let obs = obs.clone();
        async move {
            let me = cx.object().name_any();
            let mut o = obs.lock().unwrap();
            if !o.running.insert(me.clone()) {
                o.violations
                    .push(format!("two runs of {me} at once (deprovision)"));
            }
            let blocking: Vec<String> = o
                .holds
                .iter()
                .filter(|(r, t)| t == &me && !o.released.contains_key(r))
                .map(|(r, _)| r.clone())
                .collect();
            if !blocking.is_empty() {
                o.violations.push(format!(
                    "deprovision of {me} started while {blocking:?} hold references"
                ));
            }
            let epoch = o.epoch;
            if o.released.insert(me.clone(), epoch) == Some(epoch) {
                o.violations
                    .push(format!("{me} deprovisioned twice by one runtime"));
            }
            o.running.remove(&me);
            Outcome::Done
        }
    })
}

async fn create_node(client: &kube::Client, nodes: &[Node], i: usize) {
    let enc = |v: &[usize]| v.iter().map(|&d| name(d)).collect::<Vec<_>>();
    if nodes[i].gadget {
        let api: Api<Gadget> = Api::namespaced(client.clone(), "default");
        let mut g = Gadget::new(
            &name(i),
            GadgetSpec {
                needs: enc(&nodes[i].needs),
                refs: enc(&nodes[i].refs),
            },
        );
        g.metadata.namespace = Some("default".into());
        api.create(&PostParams::default(), &g).await.unwrap();
    } else {
        let mut w = widget(&name(i), 1);
        w.spec.needs = enc(&nodes[i].needs);
        w.spec.refs = enc(&nodes[i].refs);
        widgets(client)
            .create(&PostParams::default(), &w)
            .await
            .unwrap();
    }
}

async fn delete_node(client: &kube::Client, nodes: &[Node], i: usize) {
    if nodes[i].gadget {
        let api: Api<Gadget> = Api::namespaced(client.clone(), "default");
        let _ = api.delete(&name(i), &DeleteParams::default()).await;
    } else {
        let _ = widgets(client)
            .delete(&name(i), &DeleteParams::default())
            .await;
    }
}

/// (ready names, existing names, names with finalizers) over both kinds.
async fn snapshot(client: &kube::Client) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let g: Api<Gadget> = Api::namespaced(client.clone(), "default");
    let ws = widgets(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let gs = g.list(&ListParams::default()).await.unwrap().items;
    let mut ready = BTreeSet::new();
    let mut all = BTreeSet::new();
    let mut fin = BTreeSet::new();
    for (n, st, f) in ws
        .iter()
        .map(|w| (w.name_any(), w.status.clone(), w.finalizers().to_vec()))
        .chain(
            gs.iter()
                .map(|g| (g.name_any(), g.status.clone(), g.finalizers().to_vec())),
        )
    {
        if st.is_some_and(|s| s.is_ready()) {
            ready.insert(n.clone());
        }
        if !f.is_empty() {
            fin.insert(n.clone());
        }
        all.insert(n);
    }
    (ready, all, fin)
}

fn run_case(case: Case, restart: bool) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let (_cluster, client) = cluster();
        let nodes = Arc::new(case.nodes.clone());
        let obs: Shared = Arc::default();
        let mut policy = test_policy();
        policy.kind.restart.max_restarts = 100;
        policy.kind.restart.backoff.min = Duration::from_millis(5);
        policy.kind.error_backoff.min = Duration::from_millis(5);
        policy.kind.dependency_poll = Duration::from_secs(3600);
        policy.kind.idle_timeout = Some(Duration::from_millis(200));
        let start = || {
            Runtime::builder(client.clone(), crate::common::names())
                .policy(policy.clone())
                .controller(Controller::<Widget>::new(dag_tree::<Widget>(
                    nodes.clone(),
                    obs.clone(),
                )))
                .controller(Controller::<Gadget>::new(dag_tree::<Gadget>(
                    nodes.clone(),
                    obs.clone(),
                )))
                .start()
        };
        let mut handle = Some(start().await.unwrap());
        let mut step = 0;
        // The old runtime stops before the new one starts: never two at once.
        let maybe_restart = async |step: usize, handle: &mut Option<RuntimeHandle>| {
            if restart && step == case.restart_at {
                if let Some(old) = handle.take() {
                    old.shutdown().await;
                }
                obs.lock().unwrap().epoch += 1;
                *handle = Some(start().await.unwrap());
            }
        };
        for (k, &i) in case.create_order.iter().enumerate() {
            maybe_restart(step, &mut handle).await;
            step += 1;
            create_node(&client, &nodes, i).await;
            if k % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
        // early deletes, interleaved with provisioning of the rest
        for &i in case
            .delete_order
            .iter()
            .filter(|i| case.early_delete.contains(i))
        {
            maybe_restart(step, &mut handle).await;
            step += 1;
            delete_node(&client, &nodes, i).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let keep: BTreeSet<String> = (0..nodes.len())
            .filter(|i| !case.early_delete.contains(i))
            .map(name)
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        loop {
            let (ready, all, _) = snapshot(&client).await;
            if ready == keep && all == keep {
                break;
            }
            prop_assert!(
                tokio::time::Instant::now() < deadline,
                "not converged: ready {ready:?}, existing {all:?}, want {keep:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for &i in &case.delete_order {
            if !case.early_delete.contains(&i) {
                delete_node(&client, &nodes, i).await;
            }
        }
        loop {
            let (_, all, fin) = snapshot(&client).await;
            if all.is_empty() {
                break;
            }
            prop_assert!(
                tokio::time::Instant::now() < deadline,
                "not all gone: {all:?} (with finalizers: {fin:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(handle) = handle {
            handle.shutdown().await;
        }
        let o = obs.lock().unwrap();
        prop_assert!(o.violations.is_empty(), "violations: {:?}", o.violations);
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24),
        max_shrink_iters: 64,
        .. ProptestConfig::default()
    })]

    #[test]
    fn random_dags_keep_deletion_order_and_end_clean(case in case_strategy()) {
        run_case(case, false)?;
    }

    #[test]
    fn a_restart_at_any_point_rebuilds_references_and_keeps_deletion_order(
        case in case_strategy()
    ) {
        run_case(case, true)?;
    }
}
