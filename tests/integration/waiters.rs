//! Those waiting on a target (`Context::require_ready`) are woken by every change of its
//! readiness, not only by Ready: it fails, it is deleted, it is gone. The dependency poll is set
//! to an hour, longer than the test waits, so only a wake-up can move a waiter. The same case
//! runs on the in-process cluster (paused time: an hour of poll cannot pass unnoticed) and on a
//! real kube-apiserver, where the time from the target's change to the waiter's status is
//! measured and printed.

use std::time::Duration;

use actorcile::prelude::*;
use actorcile::testing::wait_reason;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

use crate::common::{Widget, names, set_note_in, test_policy, widget};

const LIMIT: Duration = Duration::from_secs(60);

/// `needs` → `require_ready` on each; then the note says what the widget itself does: `fail`
/// ends Terminal, `wait` yields for an hour, anything else is done.
fn tree() -> impl Provisioner<Widget> + 'static {
    step("deps", |cx: Context<Widget>| async move {
        let w = cx.object();
        for n in &w.spec.needs {
            let target = Target::for_kind::<Widget>(w.namespace().as_deref(), n);
            if let Some(wait) = cx.require_ready(&target).await {
                return wait;
            }
        }
        match w.spec.note.as_str() {
            "fail" => Outcome::Terminal(Reason::new("Broken", "told to fail")),
            "wait" => {
                Outcome::yield_after(Duration::from_secs(3600), Reason::new("Slow", "not yet"))
            }
            _ => Outcome::Done,
        }
    })
}

async fn create(api: &Api<Widget>, ns: &str, name: &str, note: &str, needs: &[&str]) {
    let mut w = widget(name, 1);
    w.metadata.namespace = Some(ns.into());
    w.spec.note = note.into();
    w.spec.needs = needs.iter().map(|n| n.to_string()).collect();
    api.create(&PostParams::default(), &w).await.unwrap();
}

/// The case on `client` in namespace `ns` (which exists); how long each waiter took to show
/// its target's change.
async fn waiters_follow_every_change(client: Client, ns: &str) -> Vec<(&'static str, Duration)> {
    let api: Api<Widget> = Api::namespaced(client.clone(), ns);
    let mut policy = test_policy();
    policy.kind.dependency_poll = Duration::from_secs(3600);
    let rt = Runtime::builder(client, names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree()).namespace(ns))
        .start()
        .await
        .expect("start the runtime");
    let mut took = Vec::new();

    // The target fails: its waiter says so at once.
    create(&api, ns, "quota", "wait", &[]).await;
    create(&api, ns, "bucket", "ok", &["quota"]).await;
    wait_reason(&api, "bucket", "DependencyNotReady", LIMIT).await;
    set_note_in(&api, "quota", "fail").await;
    let at = Instant::now();
    let s = wait_reason(&api, "bucket", "DependencyFailed", LIMIT).await;
    took.push(("failed", at.elapsed()));
    assert!(s.ready().unwrap().message.contains("quota"), "{s:?}");

    // It recovers: Ready wakes the waiter too.
    set_note_in(&api, "quota", "ok").await;
    let at = Instant::now();
    actorcile::testing::wait_ready(&api, "bucket", LIMIT).await;
    took.push(("ready", at.elapsed()));

    // A target deleted and gone: its waiter finds it missing.
    create(&api, ns, "network", "wait", &[]).await;
    create(&api, ns, "cluster", "ok", &["network"]).await;
    wait_reason(&api, "cluster", "DependencyNotReady", LIMIT).await;
    api.delete("network", &DeleteParams::default())
        .await
        .unwrap();
    let at = Instant::now();
    wait_reason(&api, "cluster", "DependencyNotFound", LIMIT).await;
    took.push(("gone", at.elapsed()));

    rt.shutdown().await;
    for name in ["quota", "bucket", "cluster"] {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    took
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_when_its_target_fails_recovers_or_goes() {
    let (_cluster, client) = crate::common::cluster();
    let took = waiters_follow_every_change(client, "default").await;
    for (what, d) in took {
        // Woken by a message: no timer of the waiter's ran (the poll is an hour).
        assert!(d < Duration::from_secs(60), "{what}: {d:?} of paused time");
    }
}

#[cfg(feature = "envtest")]
#[tokio::test]
async fn a_waiter_is_woken_when_its_target_fails_recovers_or_goes_on_kube_apiserver() {
    use crate::common::real::{bounded, create_namespace, shared_env};
    bounded("waiters", async {
        let env = shared_env().await;
        create_namespace(&env.client(), "waiters").await;
        let took = waiters_follow_every_change(env.client(), "waiters").await;
        // Each wait above is bounded by a minute, the poll is an hour: only a wake-up passes.
        for (what, d) in took {
            eprintln!("waiter saw its target {what} after {d:?}");
        }
    })
    .await;
}
