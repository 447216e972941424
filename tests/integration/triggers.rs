//! A controller's triggers on the in-process cluster (paused time): the provider config, the
//! Secrets its objects reference, the poll interval's spread, the ignore annotation, and the
//! builder's validation.
//!
//! "Nothing else ran" is asserted after a long sleep of paused time: tokio advances a paused
//! clock only when every task is idle, so by then the runtime has handled every event it was
//! going to see.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::triggers::ConfigRef;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(120);

/// Every provision reconcile, by object: how many, and what it saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<String, Vec<String>>>>);

impl Seen {
    fn push(&self, name: String, what: String) {
        self.0.lock().unwrap().entry(name).or_default().push(what);
    }
    fn runs(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).map_or(0, Vec::len)
    }
    fn last(&self, name: &str) -> Option<String> {
        self.0.lock().unwrap().get(name)?.last().cloned()
    }
    /// A step that records each provision reconcile of its object, seeing nothing.
    fn step(&self) -> actorcile::provisioners::Step<Widget> {
        let seen = self.clone();
        step("record", move |cx: Context<Widget>| {
            let seen = seen.clone();
            async move {
                seen.push(cx.object().name_any(), String::new());
                Outcome::Done
            }
        })
    }
    fn counts(&self) -> HashMap<String, usize> {
        let m = self.0.lock().unwrap();
        m.iter().map(|(k, v)| (k.clone(), v.len())).collect()
    }
}

fn config_maps(client: &Client) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), "default")
}

async fn put_config(client: &Client, value: &str) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("provider".into());
    cm.data = Some([("value".to_string(), value.to_string())].into());
    config_maps(client)
        .patch(
            "provider",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&cm),
        )
        .await
        .expect("apply the config");
}

/// A tree that records the config's `value` each reconcile sees.
fn config_tree(seen: Seen) -> impl Provisioner<Widget> {
    step("read-config", move |cx: Context<Widget>| {
        let seen = seen.clone();
        async move {
            let value = cx
                .config::<ConfigMap>()
                .and_then(|c| c.data.as_ref()?.get("value").cloned())
                .unwrap_or_else(|| "<none>".into());
            seen.push(cx.object().name_any(), value);
            Outcome::Done
        }
    })
}

async fn start_with_config(client: &Client, policy: SupervisorPolicy, seen: Seen) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(
            Controller::<Widget>::new(config_tree(seen))
                .config(ConfigRef::<ConfigMap>::namespaced("default", "provider")),
        )
        .start()
        .await
        .expect("start the runtime")
}

#[tokio::test(start_paused = true)]
async fn a_config_change_reconciles_every_object_passive_ones_included() {
    let (_cluster, client) = cluster();
    put_config(&client, "one").await;
    let seen = Seen::default();
    let mut policy = test_policy();
    policy.kind.idle_timeout = Some(Duration::from_secs(1));
    policy.runtime.max_concurrent_reconciles = 4;
    let rt = start_with_config(&client, policy, seen.clone()).await;
    for i in 0..40 {
        create(&client, &format!("w{i}"), 1).await;
    }
    wait_all_ready(&client, 40, LIMIT).await;
    eventually("every actor passivated", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    for i in 0..40 {
        assert_eq!(seen.last(&format!("w{i}")).as_deref(), Some("one"));
    }
    let before = rt.metrics();

    put_config(&client, "two").await;
    eventually("every object ran with the new config", LIMIT, || async {
        (0..40)
            .all(|i| seen.last(&format!("w{i}")).as_deref() == Some("two"))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    for i in 0..40 {
        assert_eq!(
            seen.runs(&format!("w{i}")),
            2,
            "w{i}: one reconcile per config version"
        );
    }
    let after = rt.metrics();
    assert!(
        after.peak_in_flight <= 4,
        "the fan-out waits for reconcile slots: {} in flight at most",
        after.peak_in_flight
    );
    assert_eq!(
        after.activations - before.activations,
        40,
        "every passive object re-activated"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_config_holds_objects_in_config_missing_until_it_exists() {
    let (_cluster, client) = cluster();
    let seen = Seen::default();
    let rt = start_with_config(&client, test_policy(), seen.clone()).await;
    create(&client, "a", 1).await;
    let s = wait_reason(&client, "a", "ConfigMissing", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Failed));
    assert!(
        s.ready().unwrap().message.contains("default/provider"),
        "the status names the config: {:?}",
        s.ready()
    );
    assert_eq!(
        seen.runs("a"),
        0,
        "the tree does not run without its config"
    );

    put_config(&client, "one").await;
    wait_ready(&client, "a", LIMIT).await;
    assert_eq!(seen.last("a").as_deref(), Some("one"));

    config_maps(&client)
        .delete("provider", &DeleteParams::default())
        .await
        .unwrap();
    wait_reason(&client, "a", "ConfigMissing", LIMIT).await;
    put_config(&client, "back").await;
    wait_ready(&client, "a", LIMIT).await;
    assert_eq!(seen.last("a").as_deref(), Some("back"));
    rt.shutdown().await;
}

/// `secrets_where`: a predicate over the Secrets of an object's namespace (openmcp's
/// `IsReferencedSecret`) chooses which objects a changed or deleted Secret re-runs.
#[tokio::test(start_paused = true)]
async fn a_secret_chosen_by_the_predicate_reconciles_the_objects_it_says() {
    let (_cluster, client) = cluster();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    for (name, tier) in [("db-creds", "db"), ("web-creds", "web")] {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.labels = Some([("tier".to_string(), tier.to_string())].into());
        s.string_data = Some([("k".to_string(), "v1".to_string())].into());
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let seen = Seen::default();
    let tree = seen.step();
    // A widget uses the Secrets labelled with the tier its note names.
    let controller = Controller::<Widget>::new(tree).secrets_where(|w: &Widget, secret| {
        !w.spec.note.is_empty()
            && secret.labels.as_ref().and_then(|l| l.get("tier")) == Some(&w.spec.note)
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(controller)
        .start()
        .await
        .unwrap();
    let api = widgets(&client);
    for (name, note) in [("app-db", "db"), ("app-web", "web"), ("plain", "")] {
        let mut w = widget(name, 1);
        w.spec.note = note.into();
        api.create(&PostParams::default(), &w).await.unwrap();
    }
    wait_all_ready(&client, 3, LIMIT).await;
    let patch = Patch::Merge(serde_json::json!({"stringData": {"k": "v2"}}));
    secrets
        .patch("db-creds", &PatchParams::default(), &patch)
        .await
        .unwrap();
    eventually("app-db ran again", LIMIT, || async {
        (seen.runs("app-db") == 2).then_some(())
    })
    .await;
    // The web Secret's change comes after the db one's: once it ran app-web, the db change
    // had its chance to run anything else.
    secrets
        .patch("web-creds", &PatchParams::default(), &patch)
        .await
        .unwrap();
    eventually("app-web ran again", LIMIT, || async {
        (seen.runs("app-web") == 2).then_some(())
    })
    .await;
    assert_eq!(seen.runs("app-db"), 2, "the web Secret is not app-db's");
    assert_eq!(seen.runs("plain"), 1, "no Secret is plain's");
    secrets
        .delete("db-creds", &DeleteParams::default())
        .await
        .unwrap();
    eventually("app-db ran on the deletion", LIMIT, || async {
        (seen.runs("app-db") == 3).then_some(())
    })
    .await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn one_changed_secret_reconciles_exactly_the_object_that_references_it() {
    let (_cluster, client) = cluster();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    for name in ["s7", "unused"] {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.string_data = Some([("k".to_string(), "v1".to_string())].into());
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let seen = Seen::default();
    let tree = seen.step();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(Controller::<Widget>::new(tree).secrets(|w: &Widget| {
            // w7 names its Secret in the note; the others name none
            if w.spec.note.is_empty() {
                vec![]
            } else {
                vec![ObjectRef::<Secret>::new(&w.spec.note).within("default")]
            }
        }))
        .start()
        .await
        .unwrap();
    let api = widgets(&client);
    for i in 0..1000 {
        let mut w = widget(&format!("w{i}"), 1);
        if i == 7 {
            w.spec.note = "s7".into();
        }
        api.create(&PostParams::default(), &w).await.unwrap();
    }
    wait_all_ready(&client, 1000, LIMIT).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let before = seen.counts();
    assert!(
        before.values().all(|&n| n == 1),
        "one reconcile each so far"
    );

    // A Secret nobody references: nothing runs.
    let patch = Patch::Merge(serde_json::json!({"stringData": {"k": "v2"}}));
    secrets
        .patch("unused", &PatchParams::default(), &patch)
        .await
        .unwrap();
    // The referenced one: exactly its referrer runs.
    secrets
        .patch("s7", &PatchParams::default(), &patch)
        .await
        .unwrap();
    eventually("w7 ran again", LIMIT, || async {
        (seen.runs("w7") == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = seen.counts();
    let ran: Vec<_> = after
        .iter()
        .filter(|(k, n)| before.get(*k) != Some(*n))
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(ran, vec!["w7".to_string()], "only the referrer ran");

    // Deleting the Secret runs its referrer too (it may depend on it being there).
    secrets
        .delete("s7", &DeleteParams::default())
        .await
        .unwrap();
    eventually("w7 ran on the deletion", LIMIT, || async {
        (seen.runs("w7") == 3).then_some(())
    })
    .await;
    rt.shutdown().await;
}

/// The poll reconciles of `n` objects, as seconds after the earliest one, with `jitter`.
async fn poll_times(n: usize, jitter: f64) -> Vec<f64> {
    let (_cluster, client) = cluster();
    let starts: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
    let st = starts.clone();
    let tree = step("record", move |cx: Context<Widget>| {
        let st = st.clone();
        async move {
            st.lock()
                .unwrap()
                .entry(cx.object().name_any())
                .or_default()
                .push(Instant::now());
            Outcome::Done
        }
    });
    let mut policy = test_policy();
    policy.kind.poll_interval = Some(Duration::from_secs(60));
    policy.kind.poll_jitter = jitter;
    policy.kind.idle_timeout = Some(Duration::from_secs(5));
    let rt = start_widgets(&client, policy, tree).await;
    let api = widgets(&client);
    for i in 0..n {
        api.create(&PostParams::default(), &widget(&format!("w{i}"), 1))
            .await
            .unwrap();
    }
    eventually(
        "every object polled once",
        Duration::from_secs(600),
        || async {
            let s = starts.lock().unwrap();
            (s.len() == n && s.values().all(|v| v.len() >= 2)).then_some(())
        },
    )
    .await;
    rt.shutdown().await;
    let s = starts.lock().unwrap();
    let polls: Vec<Instant> = s.values().map(|v| v[1]).collect();
    let first = *polls.iter().min().unwrap();
    polls.iter().map(|t| (*t - first).as_secs_f64()).collect()
}

#[tokio::test(start_paused = true)]
async fn poll_reconciles_of_ten_thousand_objects_spread_over_the_jitter() {
    let n = 10_000;
    let most_in_one_second = |times: &[f64]| {
        let mut buckets: HashMap<u64, usize> = HashMap::new();
        for t in times {
            *buckets.entry(*t as u64).or_default() += 1;
        }
        buckets.values().copied().max().unwrap_or(0)
    };
    // Without jitter, objects listed together poll in the same second: the measure can fail.
    let flat = poll_times(n, 0.0).await;
    assert!(
        most_in_one_second(&flat) > n / 2,
        "without jitter the polls bunch up: {} of {n} in one second",
        most_in_one_second(&flat)
    );
    // The default jitter (10 % of 60 s) spreads them over 6 s.
    let spread = poll_times(n, 0.1).await;
    let span = spread.iter().cloned().fold(0.0, f64::max);
    let peak = most_in_one_second(&spread);
    assert!(span >= 5.0, "the polls spread over {span:.1} s");
    assert!(
        peak <= n / 4,
        "at most a quarter of the objects in any one second: {peak} of {n}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_ignore_annotation_skips_every_reconcile_until_it_is_removed() {
    let (_cluster, client) = cluster();
    let seen = Seen::default();
    let deprovisioned = Arc::new(Mutex::new(0));
    let d = deprovisioned.clone();
    let tree = seen.step().on_delete(move |_cx: Context<Widget>| {
        let d = d.clone();
        async move {
            *d.lock().unwrap() += 1;
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    let api = widgets(&client);
    let ignore = crate::common::names().ignore_annotation();
    let annotate = |v: Option<&str>| {
        Patch::Merge(serde_json::json!({"metadata": {"annotations": {&ignore: v}}}))
    };

    // Ignored from birth: no reconcile, no finalizer, no status.
    let mut w = widget("a", 1);
    w.metadata.annotations = Some([(ignore.clone(), "true".to_string())].into());
    api.create(&PostParams::default(), &w).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let w = api.get("a").await.unwrap();
    assert_eq!(seen.runs("a"), 0);
    assert!(w.finalizers().is_empty() && w.status.is_none());
    assert!(rt.metrics().ignored >= 1, "the skip is counted");

    // Removing it resumes the object at once.
    api.patch("a", &PatchParams::default(), &annotate(None))
        .await
        .unwrap();
    wait_ready(&client, "a", LIMIT).await;
    assert_eq!(seen.runs("a"), 1);

    // Set again: a spec change runs nothing, and the status stays as it was.
    api.patch("a", &PatchParams::default(), &annotate(Some("true")))
        .await
        .unwrap();
    set_note(&client, "a", "changed").await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let w = api.get("a").await.unwrap();
    assert_eq!(seen.runs("a"), 1, "no reconcile while ignored");
    assert_eq!(w.status.unwrap().observed_generation, Some(1));

    // Deleted while ignored: it waits, finalizer kept, until the annotation goes.
    api.delete("a", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(api.get_opt("a").await.unwrap().is_some(), "still there");
    assert_eq!(*deprovisioned.lock().unwrap(), 0);
    api.patch("a", &PatchParams::default(), &annotate(None))
        .await
        .unwrap();
    wait_gone(&client, "a", LIMIT).await;
    assert_eq!(*deprovisioned.lock().unwrap(), 1);
    rt.shutdown().await;
}

fn noop() -> impl Provisioner<Widget> {
    step("noop", |_cx: Context<Widget>| async { Outcome::Done })
}

/// The field an invalid-setting error names.
fn field_of(e: actorcile::Error) -> String {
    match e {
        actorcile::Error::Invalid { field, .. } => field.to_string(),
        actorcile::Error::Policy(actorcile::policy::PolicyError::Invalid { field, .. }) => {
            format!("policy.{field}")
        }
        other => panic!("not a typed invalid-setting error: {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn builders_refuse_missing_or_contradictory_settings_naming_the_field() {
    let (_cluster, client) = cluster();
    let b = || Runtime::builder(client.clone(), crate::common::names());
    let err = |r: Result<RuntimeHandle, actorcile::Error>| field_of(r.err().expect("refused"));

    assert_eq!(err(b().start().await), "controllers");
    assert_eq!(
        err(b()
            .controller(Controller::<Widget>::new(noop()))
            .controller(Controller::<Widget>::new(noop()))
            .start()
            .await),
        "controller Widget"
    );
    assert_eq!(
        err(b()
            .finalizer("cleanup")
            .controller(Controller::<Widget>::new(noop()))
            .start()
            .await),
        "finalizer"
    );
    let bad = SupervisorPolicy {
        runtime: actorcile::policy::RuntimePolicy {
            max_concurrent_reconciles: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        err(b()
            .policy(bad.clone())
            .controller(Controller::<Widget>::new(noop()))
            .start()
            .await),
        "policy.max_concurrent_reconciles"
    );
    let bad_lock = actorcile::policy::KindPolicy {
        lock_expiry: Duration::ZERO,
        ..Default::default()
    };
    assert_eq!(
        err(b()
            .controller(Controller::<Widget>::new(noop()).policy(bad_lock))
            .start()
            .await),
        "policy.lock_expiry"
    );
    assert_eq!(
        err(b()
            .controller(Controller::<Widget>::new(noop()).max_concurrent_reconciles(0))
            .start()
            .await),
        "max_concurrent_reconciles of the Widget controller"
    );
    // A policy section for a kind no controller runs, or for one whose controller sets its
    // policy in code: one of the two would be silently ignored.
    let sections = |kind: &str| {
        SupervisorPolicy::from_toml(&format!("[kinds.{kind}]\nyield_delay = \"9s\"")).unwrap()
    };
    assert_eq!(
        err(b()
            .policy(sections("Widgets"))
            .controller(Controller::<Widget>::new(noop()))
            .start()
            .await),
        "policy section kinds.Widgets"
    );
    assert_eq!(
        err(b()
            .policy(sections("Widget"))
            .controller(
                Controller::<Widget>::new(noop()).policy(actorcile::policy::KindPolicy::default())
            )
            .start()
            .await),
        "policy of the Widget controller"
    );
    assert!(
        b().policy(sections("Widget"))
            .controller(Controller::<Widget>::new(noop()))
            .validate()
            .is_ok()
    );
    // A namespaced config kind named without a namespace: no way to read it.
    assert_eq!(
        err(b()
            .controller(
                Controller::<Widget>::new(noop()).config(ConfigRef::<ConfigMap>::cluster("p"))
            )
            .start()
            .await),
        "config of the Widget controller"
    );
    // A config kind the API server does not serve.
    #[derive(
        kube::CustomResource,
        Clone,
        Debug,
        serde::Deserialize,
        serde::Serialize,
        schemars::JsonSchema,
    )]
    #[kube(group = "missing.actorcile.dev", version = "v1", kind = "Nothing")]
    struct NothingSpec {}
    let e = b()
        .controller(Controller::<Widget>::new(noop()).config(ConfigRef::<Nothing>::cluster("p")))
        .start()
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("does not serve"), "{e}");
    assert!(
        matches!(
            &e,
            actorcile::Error::Invalid {
                field: actorcile::runtime::Setting::Controller {
                    part: actorcile::runtime::ControllerPart::Config,
                    kind,
                },
                ..
            } if kind == "Widget"
        ),
        "{e:?}"
    );
    assert_eq!(field_of(e), "config of the Widget controller");
    // And validate() says the same without starting anything.
    assert!(b().validate().is_err());
    assert!(
        b().controller(Controller::<Widget>::new(noop()))
            .validate()
            .is_ok()
    );
}

/// The gaps between one object's reconciles when the config's `pollSeconds` is `value` (the
/// policy's poll interval an hour, no jitter), over `reconciles` reconciles.
async fn poll_gaps(value: &str, reconciles: usize) -> Vec<Duration> {
    let (_cluster, client) = cluster();
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("provider".into());
    cm.data = Some([("pollSeconds".to_string(), value.to_string())].into());
    config_maps(&client)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let st = starts.clone();
    let tree = step("record", move |_cx: Context<Widget>| {
        let st = st.clone();
        async move {
            st.lock().unwrap().push(Instant::now());
            Outcome::Done
        }
    });
    let mut policy = test_policy();
    policy.kind.poll_interval = Some(Duration::from_secs(3600));
    policy.kind.poll_jitter = 0.0;
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree).config(
            ConfigRef::<ConfigMap>::namespaced("default", "provider").poll_interval_from(
                |c: &ConfigMap| {
                    let secs = c.data.as_ref()?.get("pollSeconds")?.parse().ok()?;
                    Some(Duration::from_secs(secs))
                },
            ),
        ))
        .start()
        .await
        .unwrap();
    create(&client, "a", 1).await;
    eventually("the reconciles", LIMIT, || async {
        (starts.lock().unwrap().len() >= reconciles).then_some(())
    })
    .await;
    rt.shutdown().await;
    let s = starts.lock().unwrap().clone();
    s.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn the_config_can_set_the_poll_interval() {
    for gap in poll_gaps("30", 3).await {
        assert!(
            gap >= Duration::from_secs(30) && gap < Duration::from_secs(31),
            "the config's 30 s, not the policy's hour: {gap:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_config_poll_interval_of_zero_is_taken_as_one_second_not_a_hot_loop() {
    // `pollSeconds: 0` would re-run the object without pause: it polls every second.
    for gap in poll_gaps("0", 4).await {
        assert!(
            gap >= Duration::from_secs(1) && gap < Duration::from_millis(1100),
            "0 s taken as the floor, 1 s: {gap:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_yield_of_an_absurd_length_does_not_stop_the_other_objects_timers() {
    let (_cluster, client) = cluster();
    let reconciles: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let p = reconciles.clone();
    let tree = step("yield", move |cx: Context<Widget>| {
        let p = p.clone();
        async move {
            let name = cx.object().name_any();
            let n = {
                let mut p = p.lock().unwrap();
                let n = p.entry(name.clone()).or_default();
                *n += 1;
                *n
            };
            match (name.as_str(), n) {
                ("huge", 1) => Outcome::yield_after(Duration::MAX, Reason::new("Forever", "")),
                ("small", 1..=3) => {
                    Outcome::yield_after(Duration::from_secs(1), Reason::new("Soon", ""))
                }
                _ => Outcome::Done,
            }
        }
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(Controller::<Widget>::new(tree))
        .start()
        .await
        .unwrap();
    create(&client, "huge", 1).await;
    eventually("huge yielded", LIMIT, || async {
        (reconciles.lock().unwrap().get("huge") == Some(&1)).then_some(())
    })
    .await;
    // The timers took the huge wake-up; the small object's yields still come back.
    create(&client, "small", 1).await;
    eventually("small done after three yields", LIMIT, || async {
        (reconciles.lock().unwrap().get("small") == Some(&4)).then_some(())
    })
    .await;
    rt.shutdown().await;
}

/// Reconciles per object.
type PassCounts = Arc<Mutex<HashMap<String, u32>>>;

fn reconciles_of(p: &PassCounts, name: &str) -> u32 {
    p.lock().unwrap().get(name).copied().unwrap_or(0)
}

/// Counts each widget's reconciles in `reconciles`.
fn counting_step(reconciles: PassCounts) -> impl Provisioner<Widget> {
    step("count", move |cx: Context<Widget>| {
        let reconciles = reconciles.clone();
        async move {
            *reconciles
                .lock()
                .unwrap()
                .entry(cx.object().name_any())
                .or_default() += 1;
            Outcome::Done
        }
    })
}

/// Counts each widget's reconciles, then applies a ConfigMap named after it holding its size.
fn owning_tree(reconciles: PassCounts) -> impl Provisioner<Widget> {
    serial![
        counting_step(reconciles),
        resource("settings", |w: &Widget| ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: w.metadata.name.clone(),
                ..Default::default()
            },
            data: Some([("size".to_string(), w.spec.size.to_string())].into()),
            ..Default::default()
        }),
    ]
}

/// Until the runtime has nothing left to do: paused time moves on only when every task waits.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn an_owned_child_deleted_or_edited_by_hand_runs_its_owner_and_the_runtimes_own_writes_run_nothing()
 {
    let (_cluster, client) = cluster();
    let reconciles = PassCounts::default();
    let mut policy = test_policy();
    policy.kind.poll_interval = None;
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(owning_tree(reconciles.clone())).owns::<ConfigMap>())
        .start()
        .await
        .unwrap();
    create(&client, "a", 1).await;
    create(&client, "b", 1).await;
    wait_ready(&client, "a", LIMIT).await;
    wait_ready(&client, "b", LIMIT).await;
    settle().await;
    assert_eq!(
        (
            reconciles_of(&reconciles, "a"),
            reconciles_of(&reconciles, "b")
        ),
        (1, 1),
        "the runtime's own creation of the ConfigMaps ran nothing"
    );
    let cms = config_maps(&client);

    // Deleted by hand: back, without a poll.
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("a's ConfigMap back", LIMIT, || async {
        cms.get_opt("a").await.ok()?.map(|_| ())
    })
    .await;
    // Edited by hand: put back as the tree says.
    cms.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"size": "99"}})),
    )
    .await
    .unwrap();
    eventually("b's ConfigMap put back", LIMIT, || async {
        let cm = cms.get_opt("b").await.ok()??;
        (cm.data?.get("size")? == "1").then_some(())
    })
    .await;
    // A ConfigMap nobody owns runs nothing.
    let mut loose = ConfigMap::default();
    loose.metadata.name = Some("loose".into());
    cms.create(&PostParams::default(), &loose).await.unwrap();
    settle().await;
    assert_eq!(
        (
            reconciles_of(&reconciles, "a"),
            reconciles_of(&reconciles, "b")
        ),
        (2, 2),
        "one reconcile each for the hand-made change; the echo of the repair ran nothing"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_related_object_runs_the_objects_it_maps_to_when_it_changes_appears_or_goes() {
    let (_cluster, client) = cluster();
    let reconciles = PassCounts::default();
    let tree = counting_step(reconciles.clone());
    let mut policy = test_policy();
    policy.kind.poll_interval = None;
    // A Secret labelled `widget: <name>` belongs to that widget.
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree).watches(|s: &Secret| {
            let ns = s.namespace().unwrap_or_default();
            s.labels()
                .get("widget")
                .map(|w| vec![ObjectRef::new(w).within(&ns)])
                .unwrap_or_default()
        }))
        .start()
        .await
        .unwrap();
    create(&client, "a", 1).await;
    create(&client, "b", 1).await;
    wait_ready(&client, "a", LIMIT).await;
    wait_ready(&client, "b", LIMIT).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let mut s = Secret::default();
    s.metadata.name = Some("creds".into());
    s.metadata.labels = Some([("widget".to_string(), "a".to_string())].into());
    secrets.create(&PostParams::default(), &s).await.unwrap();
    eventually("a runs for the new Secret", LIMIT, || async {
        (reconciles_of(&reconciles, "a") == 2).then_some(())
    })
    .await;
    // Relabelled to b: both run (b gains it, a loses it).
    secrets
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"widget": "b"}}})),
        )
        .await
        .unwrap();
    eventually("both run for the relabel", LIMIT, || async {
        (reconciles_of(&reconciles, "a") == 3 && reconciles_of(&reconciles, "b") == 2).then_some(())
    })
    .await;
    secrets
        .delete("creds", &DeleteParams::default())
        .await
        .unwrap();
    eventually("b runs for the deletion", LIMIT, || async {
        (reconciles_of(&reconciles, "b") == 3).then_some(())
    })
    .await;
    settle().await;
    assert_eq!(
        (
            reconciles_of(&reconciles, "a"),
            reconciles_of(&reconciles, "b")
        ),
        (3, 3),
        "nothing else ran"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_secret_the_config_names_reconciles_every_object_when_it_changes() {
    let (_cluster, client) = cluster();
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("provider".into());
    cm.data = Some([("credentials".to_string(), "creds".to_string())].into());
    config_maps(&client)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    for name in ["creds", "other"] {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let reconciles = PassCounts::default();
    let tree = counting_step(reconciles.clone());
    let mut policy = test_policy();
    policy.kind.poll_interval = None;
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree).config(
            ConfigRef::<ConfigMap>::namespaced("default", "provider").secrets_from(
                |cm: &ConfigMap| {
                    cm.data
                        .as_ref()
                        .and_then(|d| d.get("credentials"))
                        .map(|n| vec![ObjectRef::<Secret>::new(n).within("default")])
                        .unwrap_or_default()
                },
            ),
        ))
        .start()
        .await
        .unwrap();
    create(&client, "a", 1).await;
    create(&client, "b", 1).await;
    wait_ready(&client, "a", LIMIT).await;
    wait_ready(&client, "b", LIMIT).await;
    let touch = |name: &'static str| {
        let secrets = secrets.clone();
        async move {
            secrets
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {"rotated": "yes"}}})),
                )
                .await
                .unwrap();
        }
    };
    // A Secret the config does not name: nothing runs.
    touch("other").await;
    settle().await;
    assert_eq!(
        (
            reconciles_of(&reconciles, "a"),
            reconciles_of(&reconciles, "b")
        ),
        (1, 1)
    );
    // The one it names: every object runs again.
    touch("creds").await;
    eventually("both run for the config's Secret", LIMIT, || async {
        (reconciles_of(&reconciles, "a") == 2 && reconciles_of(&reconciles, "b") == 2).then_some(())
    })
    .await;
    rt.shutdown().await;
}

/// A config read from another cluster (`ConfigRef::in_cluster`, a platform cluster holding
/// the provider configs): the objects run with it and re-run when it changes there, a config
/// of the same name in the objects' own cluster is not read, and the rendered roles (for the
/// objects' cluster) leave it out.
#[tokio::test(start_paused = true)]
async fn a_config_from_another_cluster_reconciles_the_objects_and_stays_out_of_their_roles() {
    let (_cluster, client) = cluster();
    let platform = actorcile::cluster::ApiServer::new();
    let platform_client = platform.client();
    put_config(&platform_client, "one").await;
    put_config(&client, "local").await;
    let seen = Seen::default();
    let builder = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(
            Controller::<Widget>::new(config_tree(seen.clone())).config(
                ConfigRef::<ConfigMap>::namespaced("default", "provider")
                    .in_cluster(platform_client.clone()),
            ),
        );
    let roles = builder.roles("op").rules();
    assert!(
        roles.iter().all(|r| !r
            .rule
            .resources
            .iter()
            .flatten()
            .any(|res| res == "configmaps")),
        "no role for the config in the objects' cluster: {roles:?}"
    );
    let rt = builder.start().await.expect("start the runtime");
    create(&client, "a", 1).await;
    create(&client, "b", 1).await;
    wait_all_ready(&client, 2, LIMIT).await;
    assert_eq!(
        seen.last("a").as_deref(),
        Some("one"),
        "read from the platform cluster"
    );
    put_config(&platform_client, "two").await;
    eventually("both ran with the platform's new config", LIMIT, || async {
        (seen.last("a").as_deref() == Some("two") && seen.last("b").as_deref() == Some("two"))
            .then_some(())
    })
    .await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_mapper_that_panics_on_one_object_does_not_end_the_watch() {
    let (_cluster, client) = cluster();
    let reconciles = PassCounts::default();
    let tree = counting_step(reconciles.clone());
    let mut policy = test_policy();
    policy.kind.poll_interval = None;
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree).watches(|s: &Secret| {
            let widget = s.labels().get("widget").cloned().unwrap_or_default();
            assert!(widget != "boom", "a mapper that trusts its input");
            vec![ObjectRef::new(&widget).within("default")]
        }))
        .start()
        .await
        .unwrap();
    create(&client, "a", 1).await;
    wait_ready(&client, "a", LIMIT).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret = |name: &str, widget: &str| {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.labels = Some([("widget".to_string(), widget.to_string())].into());
        s
    };
    // The hostile Secret first, then one for `a`: the watch events come in this order, so
    // `a` running proves the watch outlived the panic.
    secrets
        .create(&PostParams::default(), &secret("hostile", "boom"))
        .await
        .unwrap();
    secrets
        .create(&PostParams::default(), &secret("creds", "a"))
        .await
        .unwrap();
    eventually(
        "a runs for the Secret after the hostile one",
        LIMIT,
        || async { (reconciles_of(&reconciles, "a") == 2).then_some(()) },
    )
    .await;
    rt.shutdown().await;
}

/// The controller's own functions over objects (which Secrets one references, its shard key)
/// run on what anyone who can write the kind wrote: a panic on one object does not stop the
/// kind's watch, nor make it restart.
#[tokio::test(start_paused = true)]
async fn a_secrets_function_that_panics_on_one_object_does_not_stop_its_kind() {
    let (_cluster, client) = cluster();
    let reconciles = PassCounts::default();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(
            Controller::<Widget>::new(counting_step(reconciles.clone())).secrets(|w: &Widget| {
                assert!(w.spec.note != "boom", "a function that trusts its input");
                vec![]
            }),
        )
        .start()
        .await
        .unwrap();
    let api = widgets(&client);
    let mut hostile = widget("hostile", 1);
    hostile.spec.note = "boom".into();
    api.create(&PostParams::default(), &hostile).await.unwrap();
    api.create(&PostParams::default(), &widget("after", 1))
        .await
        .unwrap();
    wait_ready(&client, "after", LIMIT).await;
    wait_ready(&client, "hostile", LIMIT).await;
    assert_eq!(rt.metrics().watch_restarts, 0, "the watch never stopped");
    assert!(rt.health().ready().ok, "{:?}", rt.health().ready());
    rt.shutdown().await;
}

/// A reconcile asked from outside Kubernetes ([`RuntimeHandle::reconcile`] and
/// [`RuntimeHandle::reconcile_on`]) runs the object once per ask; a kind the runtime does not
/// manage, or an object that does not exist, runs nothing.
#[tokio::test(start_paused = true)]
async fn a_reconcile_asked_from_outside_runs_the_object() {
    let (_cluster, client) = cluster();
    let seen = Seen::default();
    let tree = seen.step();
    let mut rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "a", 1).await;
    wait_ready(&client, "a", LIMIT).await;
    assert_eq!(seen.runs("a"), 1);
    let a = Target::new("test.actorcile.dev/v1", "Widget", Some("default"), "a");

    assert!(rt.reconcile(&a), "Widget is managed here");
    eventually("the asked reconcile", LIMIT, || async {
        (seen.runs("a") == 2).then_some(())
    })
    .await;

    let other = Target::new("example.com/v1", "Database", Some("default"), "a");
    assert!(!rt.reconcile(&other), "Database is not managed here");
    let missing = Target {
        name: "missing".into(),
        ..a.clone()
    };
    assert!(rt.reconcile(&missing));

    // The stream form: each target it yields is one reconcile.
    let (mut tx, rx) = futures::channel::mpsc::channel::<Target>(4);
    rt.reconcile_on(rx);
    use futures::SinkExt;
    tx.send(other).await.unwrap();
    tx.send(a.clone()).await.unwrap();
    eventually("the streamed reconcile", LIMIT, || async {
        (seen.runs("a") == 3).then_some(())
    })
    .await;
    // Paused time advances only once every task is idle: by now the asks above have been
    // handled, and none ran anything more.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(seen.counts(), HashMap::from([("a".to_string(), 3)]));
    rt.shutdown().await;
}
