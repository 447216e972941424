//! Readiness waits, references and deletion ordering as messages between resource actors
//! (in-process cluster; paused clock but for the passivation-window test, which bounds its waits
//! in real time). Polling is disabled (1 h fallback poll and yield delay), so anything that
//! converges quickly converged by message.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use common::*;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(600);
const QUICK: Duration = Duration::from_secs(5);

type Events = Arc<Mutex<Vec<String>>>;

fn no_polling() -> SupervisorPolicy {
    let mut p = test_policy();
    p.kind.dependency_poll = Duration::from_secs(3600);
    p.kind.yield_delay = Duration::from_secs(3600);
    p
}

fn wt(name: &str) -> Target {
    Target::for_kind::<Widget>(Some("default"), name)
}

/// needs → require_ready; refs → add_reference; deprovision logged as "-name".
fn widget_tree(events: Events) -> impl Provisioner<Widget> {
    let ev = events.clone();
    deps_step().on_delete(move |cx: Context<Widget>| {
        let ev = ev.clone();
        async move {
            ev.lock()
                .unwrap()
                .push(format!("-{}", cx.object().name_any()));
            Outcome::Done
        }
    })
}

async fn start(client: &kube::Client, events: Events) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(Controller::<Widget>::new(widget_tree(events)))
        .start()
        .await
        .unwrap()
}

async fn create_with(client: &kube::Client, name: &str, needs: &[&str], refs: &[&str]) {
    let mut w = widget(name, 1);
    w.spec.needs = needs.iter().map(|s| s.to_string()).collect();
    w.spec.refs = refs.iter().map(|s| s.to_string()).collect();
    widgets(client)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_chain_of_readiness_waits_converges_by_messages_not_polls() {
    let (_c, client) = cluster();
    let rt = start(&client, Events::default()).await;
    // create dependents first: w9 needs w8 … w1 needs w0
    for i in (1..10).rev() {
        create_with(&client, &format!("w{i}"), &[&format!("w{}", i - 1)], &[]).await;
    }
    let s = wait_reason(&client, "w5", "DependencyNotReady", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("w4"),
        "status names the target: {s:?}"
    );
    let t0 = Instant::now();
    create_with(&client, "w0", &[], &[]).await;
    wait_all_ready(&client, 10, LIMIT).await;
    assert!(
        Instant::now() - t0 < QUICK,
        "converged by message, not by the 1 h poll"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn readiness_works_across_kinds() {
    let (_c, client) = cluster();
    let gadget_tree = step("needs-widgets", |cx: Context<Gadget>| async move {
        for n in &cx.object().spec.needs {
            if let Some(wait) = cx.require_ready(&wt(n)).await {
                return wait;
            }
        }
        Outcome::Done
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(Controller::<Widget>::new(widget_tree(Events::default())))
        .controller(Controller::<Gadget>::new(gadget_tree))
        .start()
        .await
        .unwrap();
    let gadgets: Api<Gadget> = Api::namespaced(client.clone(), "default");
    let mut g = Gadget::new(
        "g",
        GadgetSpec {
            needs: vec!["base".into()],
            refs: vec![],
        },
    );
    g.metadata.namespace = Some("default".into());
    gadgets.create(&PostParams::default(), &g).await.unwrap();
    eventually("gadget waiting", LIMIT, || async {
        let g = gadgets.get("g").await.ok()?;
        g.status
            .filter(|s| s.ready().is_some_and(|c| c.reason == "DependencyNotFound"))
    })
    .await;
    let t0 = Instant::now();
    create_with(&client, "base", &[], &[]).await;
    eventually("gadget ready", LIMIT, || async {
        gadgets.get("g").await.ok()?.status.filter(|s| s.is_ready())
    })
    .await;
    assert!(Instant::now() - t0 < QUICK);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_target_is_a_typed_readiness_the_tree_can_make_terminal() {
    let (_c, client) = cluster();
    let tree = step("strict", |cx: Context<Widget>| async move {
        match cx.readiness(&wt("nonexistent")).await {
            Readiness::Missing => Outcome::Terminal(Reason::new(
                "DependencyMissing",
                "nonexistent does not exist",
            )),
            Readiness::NotReady | Readiness::Deleting | Readiness::Failed => {
                Outcome::yield_now(Reason::new("Waiting", ""))
            }
            Readiness::Ready => Outcome::Done,
        }
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(Controller::<Widget>::new(tree))
        .start()
        .await
        .unwrap();
    create(&client, "strict", 1).await;
    let s = wait_reason(&client, "strict", "DependencyMissing", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Failed));
    assert_eq!(s.ready().unwrap().message, "nonexistent does not exist");
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_referenced_target_stays_in_use_and_goes_the_moment_the_last_referrer_releases() {
    let (_c, client) = cluster();
    let events = Events::default();
    let rt = start(&client, events.clone()).await;
    create_with(&client, "db", &[], &[]).await;
    create_with(&client, "app1", &["db"], &["db"]).await;
    create_with(&client, "app2", &[], &["db"]).await;
    wait_all_ready(&client, 3, LIMIT).await;
    let db = widgets(&client).get("db").await.unwrap();
    assert_eq!(
        actorcile::references::referrers_of(&db, &crate::common::names()).len(),
        2,
        "references persisted on the target: {:?}",
        db.annotations()
    );
    delete(&client, "db").await;
    let s = wait_reason(&client, "db", "InUse", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Terminating));
    let msg = &s.ready().unwrap().message;
    assert!(
        msg.contains("app1") && msg.contains("app2"),
        "referrers named: {msg}"
    );
    tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
    assert!(
        widgets(&client).get_opt("db").await.unwrap().is_some(),
        "still held"
    );
    assert!(
        !events.lock().unwrap().contains(&"-db".to_string()),
        "no deprovision while referenced"
    );
    delete(&client, "app1").await;
    wait_gone(&client, "app1", LIMIT).await;
    let s = wait_reason(&client, "db", "InUse", LIMIT).await;
    let msg = &s.ready().unwrap().message;
    assert!(!msg.contains("app1") && msg.contains("app2"), "{msg}");
    let t0 = Instant::now();
    delete(&client, "app2").await;
    wait_gone(&client, "db", LIMIT).await;
    assert!(
        Instant::now() - t0 < QUICK,
        "released by message, not by poll"
    );
    let ev = events.lock().unwrap().clone();
    let pos = |n: &str| ev.iter().position(|e| e == n).unwrap();
    assert!(
        pos("-app1") < pos("-db") && pos("-app2") < pos("-db"),
        "{ev:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_foreign_finalizer_does_not_count_as_a_reference() {
    let (_c, client) = cluster();
    let events = Events::default();
    let rt = start(&client, events.clone()).await;
    create_with(&client, "t", &[], &[]).await;
    wait_ready(&client, "t", LIMIT).await;
    widgets(&client)
        .patch(
            "t",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(serde_json::json!([
                    {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/foreign"}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    delete(&client, "t").await;
    eventually(
        "our deprovision ran and our finalizer went",
        LIMIT,
        || async {
            let t = widgets(&client).get("t").await.ok()?;
            (events.lock().unwrap().contains(&"-t".to_string())
                && t.finalizers() == ["example.com/foreign".to_string()])
            .then_some(())
        },
    )
    .await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_reference_cycle_is_reported_not_silently_deadlocked() {
    let (_c, client) = cluster();
    let rt = start(&client, Events::default()).await;
    create_with(&client, "x", &[], &["y"]).await;
    create_with(&client, "y", &[], &["x"]).await;
    wait_all_ready(&client, 2, LIMIT).await;
    delete(&client, "x").await;
    delete(&client, "y").await;
    let s = eventually("cycle reported", LIMIT, || async {
        status_of(&client, "x").await.filter(|s| {
            s.ready()
                .is_some_and(|c| c.message.contains("reference cycle"))
        })
    })
    .await;
    let msg = &s.ready().unwrap().message;
    assert!(
        msg.contains("Widget default/x") && msg.contains("Widget default/y"),
        "{msg}"
    );
    rt.shutdown().await;
}

/// A running runtime in which `db` is being deleted and held `InUse` by `app`'s reference,
/// with `others` more Ready objects (`z0`, `z1`, …, created after both).
async fn db_deleted_while_app_refers_to_it(
    client: &kube::Client,
    events: &Events,
    others: usize,
) -> RuntimeHandle {
    let rt = start(client, events.clone()).await;
    create_with(client, "db", &[], &[]).await;
    create_with(client, "app", &[], &["db"]).await;
    for i in 0..others {
        create_with(client, &format!("z{i}"), &[], &[]).await;
    }
    wait_all_ready(client, 2 + others, LIMIT).await;
    delete(client, "db").await;
    wait_reason(client, "db", "InUse", LIMIT).await;
    rt
}

#[tokio::test(start_paused = true)]
async fn references_survive_an_operator_restart_mid_deletion() {
    let (_c, client) = cluster();
    let events = Events::default();
    let rt = db_deleted_while_app_refers_to_it(&client, &events, 0).await;
    rt.shutdown().await;

    // a new operator process: nothing in memory, everything from the API
    let rt = start(&client, events.clone()).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(widgets(&client).get_opt("db").await.unwrap().is_some());
    assert!(!events.lock().unwrap().contains(&"-db".to_string()));
    delete(&client, "app").await;
    wait_gone(&client, "app", LIMIT).await;
    wait_gone(&client, "db", LIMIT).await;
    let ev = events.lock().unwrap().clone();
    assert_eq!(ev, ["-app", "-db"]);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn no_new_reference_is_accepted_by_a_deleting_target() {
    let (_c, client) = cluster();
    let rt = start(&client, Events::default()).await;
    create_with(&client, "old", &[], &[]).await;
    create_with(&client, "holder", &[], &["old"]).await;
    wait_all_ready(&client, 2, LIMIT).await;
    delete(&client, "old").await;
    wait_reason(&client, "old", "InUse", LIMIT).await;
    create_with(&client, "late", &[], &["old"]).await;
    let s = wait_reason(&client, "late", "ReferencePending", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("being deleted"),
        "{s:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn foreground_deletion_waits_for_owned_children_before_deprovisioning() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Resource;
    let (_c, client) = cluster();
    let events = Events::default();
    let rt = start(&client, events.clone()).await;
    create_with(&client, "parent", &[], &[]).await;
    wait_ready(&client, "parent", LIMIT).await;
    let parent = widgets(&client).get("parent").await.unwrap();
    let mut owner = parent.controller_owner_ref(&()).unwrap();
    owner.block_owner_deletion = Some(true);
    // a child that holds its own deletion back with a finalizer of its own
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("child".into());
    cm.metadata.owner_references = Some(vec![owner]);
    cm.metadata.finalizers = Some(vec!["example.com/slow".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();

    widgets(&client)
        .delete("parent", &kube::api::DeleteParams::foreground())
        .await
        .unwrap();
    let s = eventually("parent waits for its children", LIMIT, || async {
        status_of(&client, "parent")
            .await
            .filter(|s| s.ready().is_some_and(|c| c.message.contains("foreground")))
    })
    .await;
    assert_eq!(s.phase, Some(Phase::Terminating));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        events.lock().unwrap().is_empty(),
        "no deprovision while an owned child remains"
    );

    // the child goes; the garbage collector lifts foregroundDeletion; deprovision runs
    cms.patch(
        "child",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&client, "parent", LIMIT).await;
    assert_eq!(*events.lock().unwrap(), ["-parent"]);
    rt.shutdown().await;
}

/// A kind whose every value carries a [`DropProbe`]: dropping one can run the test's code.
#[derive(kube::CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "Waiter",
    namespaced,
    status = "ResourceStatus"
)]
struct WaiterSpec {
    /// The widget this waiter must see Ready.
    needs: String,
    /// Never read: it is here to be dropped with the object.
    #[serde(skip)]
    #[allow(dead_code)]
    probe: DropProbe,
}

/// Calls [`WINDOW`]'s hook when dropped.
#[derive(Clone, Debug, Default)]
struct DropProbe;

impl Drop for DropProbe {
    fn drop(&mut self) {
        if let Some(w) = WINDOW.get() {
            w.on_drop();
        }
    }
}

/// The passivation window of the waiter's actor, held open by the test.
static WINDOW: std::sync::OnceLock<Window> = std::sync::OnceLock::new();

#[derive(Default)]
struct Window {
    /// The task of the waiter's actor, set by its tree when its reconcile ends waiting.
    waiter_task: Mutex<Option<tokio::task::Id>>,
    /// Lets the dependency's reconcile finish.
    release: tokio::sync::Notify,
    /// The dependency's reconcile ended and its actor passivated (after it announced Ready).
    dependency_done: std::sync::atomic::AtomicBool,
    /// The hook ran (once).
    opened: std::sync::atomic::AtomicBool,
}

impl Window {
    /// The first `Waiter` dropped on the waiter actor's task after its waiting reconcile ended: the
    /// copy of the object its own status write returned, dropped when the actor hands the object
    /// back (or takes the watch echo of that write in), which it does only after it removed its
    /// route. The actor is passivating now: hold it here until the dependency turned Ready, so
    /// that the dependency's notification finds no route and goes to the manager before the
    /// actor's state does.
    fn on_drop(&self) {
        let Some(task) = tokio::task::try_id() else {
            return;
        };
        if *self.waiter_task.lock().unwrap() != Some(task)
            || self.opened.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        // Off the runtime's worker (its other tasks move on), bounded: the test fails by its own
        // waits if the dependency never finishes.
        tokio::task::block_in_place(|| {
            self.release.notify_one();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !self
                .dependency_done
                .load(std::sync::atomic::Ordering::SeqCst)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
    }
}

/// A dependent passivates while it waits (the default idle timeout), and its dependency turns
/// Ready while it is passivating: after its actor removed its route, before the manager has its
/// state. The notification then reaches the manager, not the actor, and must still re-run the
/// dependent. The test holds the dependent's actor in that window (from a drop of its object, see
/// [`Window::on_drop`]) until the dependency announced Ready, so the interleaving is the same on
/// every run. A lost notification leaves the dependent waiting for the 1 h fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reaches_dependents_that_are_passivating() {
    use kube::CustomResourceExt;
    let window = WINDOW.get_or_init(Window::default);
    let (c, client) = cluster();
    c.install_crd(&Waiter::crd()).expect("install CRD");
    let dependency_tree = step("held", move |_cx: Context<Widget>| async move {
        window.release.notified().await;
        Outcome::Done
    });
    let waiter_tree = step("needs", move |cx: Context<Waiter>| async move {
        let target = wt(&cx.object().spec.needs);
        match cx.require_ready(&target).await {
            Some(wait) => {
                *window.waiter_task.lock().unwrap() = Some(tokio::task::id());
                wait
            }
            None => Outcome::Done,
        }
    });
    let mut policy = no_polling();
    policy.kind.idle_timeout = SupervisorPolicy::default().kind.idle_timeout;
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(dependency_tree))
        .controller(Controller::<Waiter>::new(waiter_tree))
        .start()
        .await
        .unwrap();
    create(&client, "base", 1).await;
    let waiters: Api<Waiter> = Api::namespaced(client.clone(), "default");
    let mut w = Waiter::new(
        "dependent",
        WaiterSpec {
            needs: "base".into(),
            ..Default::default()
        },
    );
    w.metadata.namespace = Some("default".into());
    waiters.create(&PostParams::default(), &w).await.unwrap();
    // Real time here, every wait bounded. The dependency's reconcile is held until the waiter's actor
    // is in its window; the first passivation is then the dependency's, which comes after it
    // announced Ready.
    eventually("the dependency passivated", QUICK, || async {
        (rt.metrics().passivations >= 1).then_some(())
    })
    .await;
    window
        .dependency_done
        .store(true, std::sync::atomic::Ordering::SeqCst);
    eventually(
        "the dependent Ready, by the notification (the fallback poll is an hour away)",
        QUICK,
        || async {
            let w = waiters.get("dependent").await.ok()?;
            w.status.filter(|s| s.is_ready())
        },
    )
    .await;
    assert!(
        window.opened.load(std::sync::atomic::Ordering::SeqCst),
        "the waiter was held in its window"
    );
    rt.shutdown().await;
}

/// Reconciles start while the first list is still arriving, before the store can say whether a
/// referrer exists; a deletion checked then counts every referrer as live. Once the list is in,
/// a deletion whose referrer went away while no operator ran goes on at once, not at the next
/// fallback poll (an hour here).
#[tokio::test(start_paused = true)]
async fn a_deletion_held_only_by_a_vanished_referrer_goes_on_once_the_first_list_is_in() {
    let (cluster, client) = cluster();
    let events = Events::default();
    let rt = db_deleted_while_app_refers_to_it(&client, &events, 4).await;
    rt.shutdown().await;

    // While no operator runs, `app` goes (its finalizer stripped by hand) without releasing
    // its reference: `db`'s annotations still name it.
    delete(&client, "app").await;
    widgets(&client)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    wait_gone(&client, "app", LIMIT).await;

    // One object per page, each page answered after a second: `db` is listed (and its
    // deletion checked) seconds before the list is complete.
    cluster.set_faults(one_second_requests());
    let t0 = Instant::now();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(
            Controller::<Widget>::new(widget_tree(events.clone())).watcher_config(pages_of(1)),
        )
        .start()
        .await
        .unwrap();
    wait_gone(&client, "db", LIMIT).await;
    assert!(
        Instant::now() - t0 < Duration::from_secs(60),
        "db went {:?} after the restart: it waited for the fallback poll",
        Instant::now() - t0
    );
    assert!(events.lock().unwrap().contains(&"-db".to_string()));
    rt.shutdown().await;
}

/// While the first list is still arriving (one object per page, a second per page), a target
/// that is not listed yet is not reported missing (it may just come on a later page); once the
/// list is in, a target that really does not exist is, at once, to whoever waits on it — not
/// at the next fallback poll.
#[tokio::test(start_paused = true)]
async fn a_target_not_listed_yet_is_not_ready_and_a_missing_one_is_told_once_listed() {
    let (cluster, client) = cluster();
    create_with(&client, "a", &["b"], &[]).await; // `a` is listed before `b`
    create_with(&client, "b", &[], &[]).await;
    create_with(&client, "c", &["zz"], &[]).await; // `zz` never exists
    for i in 0..4 {
        create_with(&client, &format!("d{i}"), &[], &[]).await; // listed after `c`
    }
    cluster.set_faults(one_second_requests());
    let seen: Arc<Mutex<Vec<(String, Readiness)>>> = Arc::default();
    let s = seen.clone();
    let tree = step("look", move |cx: Context<Widget>| {
        let s = s.clone();
        async move {
            for n in &cx.object().spec.needs {
                let r = cx.readiness(&wt(n)).await;
                s.lock().unwrap().push((n.clone(), r));
                if r != Readiness::Ready {
                    return Outcome::Waiting {
                        target: wt(n),
                        reason: Reason::new("DependencyNotReady", format!("{n}: {r:?}")),
                    };
                }
            }
            Outcome::Done
        }
    });
    let t0 = Instant::now();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(
            // No finalizer to add first: each reconcile runs as soon as its object is listed.
            Controller::<Widget>::new(tree)
                .without_finalizer()
                .watcher_config(pages_of(1)),
        )
        .start()
        .await
        .unwrap();
    eventually("c was told zz is missing", LIMIT, || async {
        seen.lock()
            .unwrap()
            .contains(&("zz".to_string(), Readiness::Missing))
            .then_some(())
    })
    .await;
    assert!(
        Instant::now() - t0 < Duration::from_secs(60),
        "told {:?} after start: it waited for the fallback poll",
        Instant::now() - t0
    );
    wait_ready(&client, "a", LIMIT).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.contains(&("b".to_string(), Readiness::Missing)),
        "b exists and was reported missing: {seen:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn references_follow_the_spec_and_the_one_no_longer_named_is_released() {
    let (_cluster, client) = cluster();
    // Each widget holds references on exactly the widgets its spec.refs names.
    let tree = step("refs", |cx: Context<Widget>| async move {
        let ns = cx.object().namespace();
        let targets: Vec<Target> = cx
            .object()
            .spec
            .refs
            .iter()
            .map(|n| Target::for_kind::<Widget>(ns.as_deref(), n))
            .collect();
        match cx.hold_references(&targets).await {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::failed(Reason::new("References", "cannot hold them"), e),
        }
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(no_polling())
        .controller(Controller::<Widget>::new(tree))
        .start()
        .await
        .unwrap();
    let api = widgets(&client);
    let referrers = |name: &'static str| {
        let api = api.clone();
        async move {
            let w = api.get(name).await.unwrap();
            actorcile::references::referrers_of(&w, &crate::common::names())
                .into_iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
        }
    };
    create(&client, "t1", 1).await;
    create(&client, "t2", 1).await;
    let mut a = widget("a", 1);
    a.spec.refs = vec!["t1".into()];
    api.create(&PostParams::default(), &a).await.unwrap();
    wait_ready(&client, "a", LIMIT).await;
    assert_eq!(referrers("t1").await, ["a"]);

    // spec.refs moves from t1 to t2: t2 is referenced, t1 released.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"refs": ["t2"]}})),
    )
    .await
    .unwrap();
    eventually("the reference moved", LIMIT, || async {
        (referrers("t1").await.is_empty() && referrers("t2").await == ["a"]).then_some(())
    })
    .await;
    // t1 is free to go; t2 is held.
    delete(&client, "t1").await;
    wait_gone(&client, "t1", LIMIT).await;
    rt.shutdown().await;
}
