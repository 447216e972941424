//! Sharding on the in-process cluster: two runtimes (replicas) split the shards, each runs only
//! the objects of its shards, readiness crosses shards by watch, a graceful stop hands the
//! shards over at once, and a replica cut off from the API stops its reconciles before another
//! takes its shards. (The same with separate OS processes on a real kube-apiserver is in the
//! example operator's process test.)
//!
//! The in-process cases run on a paused clock: Lease durations, renew deadlines and held
//! reconciles are virtual time, so the order they assert (a fence lapses before a Lease can be
//! taken; a released shard is taken before its Lease could expire) does not depend on how busy
//! the machine is. The kube-apiserver case talks to real processes and runs on the wall clock.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::sharding::{ShardWatch, Sharding, object_key, shard_of, shard_of_uid};
use common::*;
use kube::ResourceExt;
use kube::api::PostParams;
use tokio::time::Instant;

const SHARDS: u32 = 4;
const LIMIT: Duration = Duration::from_secs(20);

fn policy() -> SupervisorPolicy {
    let mut p = test_policy();
    // Only messages wake a waiter: a chain across shards converges by watch events, not polls.
    p.kind.dependency_poll = Duration::from_secs(3600);
    p.lease.duration = Duration::from_secs(2);
    p.lease.renew_deadline = Duration::from_millis(1500);
    p.lease.retry_period = Duration::from_millis(100);
    p
}

/// One reconcile: replica, object, start, end (`None` while running, or if it was abandoned and
/// `Dropped` recorded its end).
type Reconciles = Arc<Mutex<Vec<(String, String, Instant, Option<Instant>)>>>;

/// Records the end of a reconcile when the step's future is dropped, whether it finished or was
/// abandoned.
struct Dropped(Reconciles, usize);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1].3 = Some(Instant::now());
    }
}

/// Waits for `needs`; holds objects named `slow-*` for `hold`.
fn tree(replica: &str, reconciles: Reconciles, hold: Duration) -> impl Provisioner<Widget> + use<> {
    let replica = replica.to_string();
    step("record", move |cx: Context<Widget>| {
        let (replica, reconciles) = (replica.clone(), reconciles.clone());
        async move {
            let name = cx.object().name_any();
            let i = {
                let mut p = reconciles.lock().unwrap();
                p.push((replica, name.clone(), Instant::now(), None));
                p.len() - 1
            };
            let _end = Dropped(reconciles, i);
            if name.starts_with("slow-") {
                tokio::time::sleep(hold).await;
            }
            for n in &cx.object().spec.needs {
                let t = Target::for_kind::<Widget>(Some("default"), n);
                if let Some(wait) = cx.require_ready(&t).await {
                    return wait;
                }
            }
            for n in &cx.object().spec.refs {
                let t = Target::for_kind::<Widget>(Some("default"), n);
                if let Err(e) = cx.add_reference(&t).await {
                    return Outcome::yield_after(
                        Duration::from_millis(50),
                        Reason::new("ReferencePending", e.to_string()),
                    );
                }
            }
            Outcome::Done
        }
    })
}

async fn replica(
    client: &kube::Client,
    id: &str,
    reconciles: &Reconciles,
    hold: Duration,
) -> RuntimeHandle {
    replica_watching(client, id, reconciles, hold, ShardWatch::Everything).await
}

async fn replica_watching(
    client: &kube::Client,
    id: &str,
    reconciles: &Reconciles,
    hold: Duration,
    watch: ShardWatch,
) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(policy())
        .controller(Controller::<Widget>::new(tree(
            id,
            reconciles.clone(),
            hold,
        )))
        .sharding(
            Sharding::new(SHARDS, "default")
                .named(&common::names())
                .identity(id)
                .watch(watch),
        )
        .start()
        .await
        .expect("start a replica")
}

fn shard(name: &str) -> u32 {
    shard_of(&object_key(Some("default"), name), SHARDS)
}

/// Waits until the replicas hold every shard between them, each its fair share, none twice.
async fn balanced(replicas: &[&RuntimeHandle]) -> Vec<Vec<u32>> {
    eventually("the shards balanced", LIMIT, || async {
        let held: Vec<Vec<u32>> = replicas.iter().map(|r| r.shards_held()).collect();
        let mut all: Vec<u32> = held.iter().flatten().copied().collect();
        all.sort();
        let fair = SHARDS.div_ceil(replicas.len() as u32) as usize;
        (all == (0..SHARDS).collect::<Vec<_>>() && held.iter().all(|h| h.len() <= fair))
            .then_some(held)
    })
    .await
}

/// The shard Leases name replica `ids[i]` as the holder of `held[i]`'s shards, and no other.
async fn leases_agree(client: &kube::Client, ids: &[&str], held: &[Vec<u32>]) {
    let holders = Sharding::new(SHARDS, "default")
        .named(&common::names())
        .holders(client)
        .await
        .expect("list the shard Leases");
    let want: std::collections::BTreeMap<u32, String> = ids
        .iter()
        .zip(held)
        .flat_map(|(id, shards)| shards.iter().map(|&s| (s, id.to_string())))
        .collect();
    assert_eq!(holders, want);
}

/// Every reconcile of replicas `a` and `b` (holding `held[0]` and `held[1]`) ran an object of its
/// shards (`shard` of its name), both ran some, and none overlapped.
fn assert_split(reconciles: &Reconciles, held: &[Vec<u32>], shard: impl Fn(&str) -> u32) {
    let p = reconciles.lock().unwrap().clone();
    for (replica, name, _, _) in &p {
        let mine = if replica == "a" { &held[0] } else { &held[1] };
        assert!(
            mine.contains(&shard(name)),
            "{replica} ran {name} of shard {} but holds {mine:?}",
            shard(name)
        );
    }
    assert!(p.iter().any(|r| r.0 == "a") && p.iter().any(|r| r.0 == "b"));
    assert_no_overlap(reconciles);
}

/// No two reconciles of one object overlap, on any replica.
fn assert_no_overlap(reconciles: &Reconciles) {
    let mut p = reconciles.lock().unwrap().clone();
    p.sort_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
    for w in p.windows(2) {
        if w[0].1 == w[1].1 {
            let end = w[0].3.expect("every reconcile ended");
            assert!(
                end <= w[1].2,
                "reconciles of {} overlap: {} until {:?}, {} from {:?}",
                w[0].1,
                w[0].0,
                end,
                w[1].0,
                w[1].2
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn two_replicas_split_the_shards_and_run_only_their_objects_and_readiness_crosses_shards() {
    split_run_and_hand_over(ShardWatch::Everything).await;
}

/// The same when each replica watches only its shards: objects are labelled with their shard,
/// each replica caches only its own, readiness and deletion ordering across replicas go
/// through the dependency watch of the kind, and a takeover relists.
#[tokio::test(start_paused = true)]
async fn the_same_when_each_replica_watches_only_the_shards_it_holds() {
    split_run_and_hand_over(ShardWatch::HeldShards).await;
}

async fn split_run_and_hand_over(watch: ShardWatch) {
    let (_cluster, client) = cluster();
    let reconciles = Reconciles::default();
    let a = replica_watching(&client, "a", &reconciles, Duration::ZERO, watch).await;
    let b = replica_watching(&client, "b", &reconciles, Duration::ZERO, watch).await;
    let held = balanced(&[&a, &b]).await;
    assert_eq!((held[0].len(), held[1].len()), (2, 2), "{held:?}");
    leases_agree(&client, &["a", "b"], &held).await;

    // A chain w0 → w1 → … → w39 (each needs the next), created dependents first: it converges
    // only if a replica's waiter is woken by the watch event of a dependency the other
    // replica made Ready (the dependency poll is an hour).
    let n = 40;
    for i in 0..n {
        let mut w = widget(&format!("w{i}"), 1);
        if i + 1 < n {
            w.spec.needs = vec![format!("w{}", i + 1)];
        }
        widgets(&client)
            .create(&PostParams::default(), &w)
            .await
            .unwrap();
    }
    wait_all_ready(&client, n, LIMIT).await;
    let crossings = (0..n - 1)
        .filter(|i| {
            let (x, y) = (shard(&format!("w{i}")), shard(&format!("w{}", i + 1)));
            held[0].contains(&x) != held[0].contains(&y)
        })
        .count();
    assert!(
        crossings > 5,
        "the chain crosses replicas {crossings} times"
    );

    assert_split(&reconciles, &held, shard);
    if watch == ShardWatch::HeldShards {
        // Every object carries its shard's label (as `Sharding::label` tells a program that
        // creates objects), and each replica caches only its shards'.
        let sharding = Sharding::new(SHARDS, "default").named(&common::names());
        for w in widgets(&client).list(&Default::default()).await.unwrap() {
            let (key, want) = sharding.label(&object_key(Some("default"), &w.name_any()));
            let label = w.labels().get(&key).cloned();
            assert_eq!(want, format!("{}-of-{SHARDS}", shard(&w.name_any())));
            assert_eq!(label.as_ref(), Some(&want), "{}", w.name_any());
        }
        let mine = |shards: &Vec<u32>| {
            (0..n)
                .filter(|i| shards.contains(&shard(&format!("w{i}"))))
                .count() as u64
        };
        let want = [mine(&held[0]), mine(&held[1])];
        eventually(
            "each replica caches only its shards' objects",
            LIMIT,
            || async {
                let cached = [&a, &b].map(|r| r.kind_metrics()[0].objects);
                (cached == want).then_some(())
            },
        )
        .await;
        // Readiness across replicas came from the kind's dependency watch.
        assert!(
            [&a, &b]
                .iter()
                .any(|r| r.dependency_watches().iter().any(|(_, k)| k == "Widget")),
            "no dependency watch of Widget"
        );
    }

    // A reference across replicas holds a deletion: `used` (run by a) is referenced by `user`
    // (run by b); deleting `used` waits (InUse) until `user` is gone, woken by watch events.
    let named_in = |shards: &[u32], prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|n| shards.contains(&shard(n)))
            .unwrap()
    };
    let (used, user) = (named_in(&held[0], "used"), named_in(&held[1], "user"));
    create(&client, &used, 1).await;
    let mut w = widget(&user, 1);
    w.spec.refs = vec![used.clone()];
    widgets(&client)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    wait_ready(&client, &user, LIMIT).await;
    // `used` Ready: a has run it and put its finalizer on it. Deleted before that, the API
    // server removes it at once (nothing holds it), references or not.
    wait_ready(&client, &used, LIMIT).await;
    delete(&client, &used).await;
    let held_back = wait_reason(&client, &used, "InUse", LIMIT).await;
    assert!(
        held_back.ready().unwrap().message.contains(&user),
        "{held_back:?}"
    );
    delete(&client, &user).await;
    wait_gone(&client, &used, LIMIT).await;

    // b stops gracefully: it releases its shards, and a takes them at its next rounds, long
    // before the 2 s lease would expire.
    let stopped = Instant::now();
    b.shutdown().await;
    eventually("a holds every shard", LIMIT, || async {
        (a.shards_held().len() == SHARDS as usize).then_some(())
    })
    .await;
    // Sooner than b's last Lease renewal could have expired: taken because released.
    assert!(
        stopped.elapsed() < policy().lease.duration,
        "taken over {:?} after the release",
        stopped.elapsed()
    );
    // An object of one of b's former shards is run by a now.
    let name = (0..)
        .map(|i| format!("late{i}"))
        .find(|n| held[1].contains(&shard(n)))
        .unwrap();
    create(&client, &name, 1).await;
    wait_ready(&client, &name, LIMIT).await;
    assert!(
        reconciles
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.0 == "a" && r.1 == name)
    );
    assert_no_overlap(&reconciles);
    a.shutdown().await;
}

/// With replicas watching only their shards, an object nobody has placed yet, of a shard
/// another holder keeps, is neither cached nor run by a replica; once that replica takes the
/// shard, its watch relists and it runs the object.
#[tokio::test(start_paused = true)]
async fn an_unplaced_object_of_a_shard_held_elsewhere_is_not_cached_until_its_shard_is_taken() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let (_cluster, client) = cluster();
    let reconciles = Reconciles::default();
    // A holder that is no replica keeps the shard of `unplaced` for an hour: nobody labels
    // its objects.
    let kept = shard("unplaced");
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "default");
    let lease_name = Sharding::new(SHARDS, "default")
        .named(&common::names())
        .shard_lease_name(kept);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let mut lease = Lease {
        spec: Some(LeaseSpec {
            holder_identity: Some("elsewhere".into()),
            lease_duration_seconds: Some(3600),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
        ..Default::default()
    };
    lease.metadata.name = Some(lease_name.clone());
    let named = Sharding::new(SHARDS, "default").named(&common::names());
    lease.metadata.labels = Some(
        [
            (named.group_label_key(), named.prefix().to_string()),
            (named.role_label_key(), "shard".to_string()),
        ]
        .into(),
    );
    leases.create(&PostParams::default(), &lease).await.unwrap();

    let a = replica_watching(
        &client,
        "a",
        &reconciles,
        Duration::ZERO,
        ShardWatch::HeldShards,
    )
    .await;
    let others: Vec<u32> = (0..SHARDS).filter(|&s| s != kept).collect();
    eventually("a holds every other shard", LIMIT, || async {
        (a.shards_held() == others).then_some(())
    })
    .await;
    let in_held = |prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|n| shard(n) != kept)
            .unwrap()
    };
    // A barrier: an object created labelled for a shard a holds reaches a only through a watch
    // that selects a's shards, so once it is Ready, a's watch follows the shards it holds.
    let probe = in_held("probe");
    let mut w = widget(&probe, 1);
    let sharding = Sharding::new(SHARDS, "default").named(&common::names());
    w.metadata.labels = Some([sharding.label(&object_key(Some("default"), &probe))].into());
    widgets(&client)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    wait_ready(&client, &probe, LIMIT).await;

    let placed = in_held("placed");
    for name in ["unplaced", placed.as_str()] {
        widgets(&client)
            .create(&PostParams::default(), &widget(name, 1))
            .await
            .unwrap();
    }
    // The watch delivers events in order: once `placed` (created second) is Ready, a has seen
    // `unplaced` too.
    wait_ready(&client, &placed, LIMIT).await;
    let cached = || a.kind_metrics()[0].objects;
    assert_eq!(
        cached(),
        2,
        "only the probe and the placed object are cached"
    );
    let ran = |name: &str| reconciles.lock().unwrap().iter().any(|p| p.1 == name);
    assert!(!ran("unplaced"));
    let unplaced = widgets(&client).get("unplaced").await.unwrap();
    assert!(!unplaced.labels().contains_key(&sharding.label_key()));

    // The shard comes free: a takes it, relists, and runs the object.
    leases
        .delete(&lease_name, &Default::default())
        .await
        .unwrap();
    wait_ready(&client, "unplaced", LIMIT).await;
    assert!(ran("unplaced"));
    assert_eq!(a.shards_held(), (0..SHARDS).collect::<Vec<_>>());
    eventually("every object cached", LIMIT, || async {
        (cached() == 3).then_some(())
    })
    .await;
    a.shutdown().await;
}

/// Requests' URIs as each replica sent them: (replica, path and query).
type Sent = Arc<Mutex<Vec<(String, String)>>>;

/// A client of `cluster` that records in `sent` the URI of every request, as replica `id`'s.
fn recording_client(
    cluster: &actorcile::cluster::ApiServer,
    id: &str,
    sent: &Sent,
) -> kube::Client {
    let (id, sent) = (id.to_string(), sent.clone());
    let service = tower::ServiceBuilder::new()
        .map_request(move |req: http::Request<kube::client::Body>| {
            let uri = req
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            sent.lock().unwrap().push((id.clone(), uri));
            req
        })
        .service(cluster.service());
    kube::Client::new(service, "default")
}

/// Waits until replica `id` watches the ConfigMaps with `selector` (`None`: without one), by a
/// request sent after the first `from`: its watch request is sent once the list before it is
/// in, so from then on every change of a selected ConfigMap reaches it.
async fn watching_children(sent: &Sent, from: usize, id: &str, selector: Option<&str>) {
    let what = format!("{id} watching the ConfigMaps with {selector:?}");
    eventually(&what, LIMIT, || async {
        sent.lock()
            .unwrap()
            .iter()
            .skip(from)
            .filter(|(r, uri)| r == id && uri.starts_with("/api/v1/configmaps?"))
            .any(|(_, uri)| {
                let query = uri.split_once('?').map_or("", |q| q.1);
                let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
                    .into_owned()
                    .collect();
                let get = |k: &str| params.iter().find(|p| p.0 == k).map(|p| p.1.as_str());
                get("watch") == Some("true") && get("labelSelector") == selector
            })
            .then_some(())
    })
    .await;
}

/// With replicas watching only their shards, the runtime labels each child it writes with its
/// owner's shard, and each replica's watch of the children selects the children of its
/// shards: a child deleted by hand is put back by its owner's replica at once (there is no
/// poll), and after a takeover the remaining replica watches every child.
#[tokio::test(start_paused = true)]
async fn each_replica_watches_the_children_of_its_shards_only() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (cluster, client) = cluster();
    let (reconciles, sent) = (Reconciles::default(), Sent::default());
    let sharding = Sharding::new(SHARDS, "default")
        .named(&common::names())
        .watch(ShardWatch::HeldShards);
    let key = sharding.owner_label_key();
    let mut p = policy();
    p.kind.poll_interval = None;
    let start = |id: &'static str| {
        let tree = serial![
            tree(id, reconciles.clone(), Duration::ZERO),
            resource("settings", |w: &Widget| ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: w.metadata.name.clone(),
                    ..Default::default()
                },
                ..Default::default()
            }),
        ];
        Runtime::builder(
            recording_client(&cluster, id, &sent),
            crate::common::names(),
        )
        .policy(p.clone())
        .controller(Controller::<Widget>::new(tree).owns::<ConfigMap>())
        .sharding(sharding.clone().identity(id))
        .start()
    };
    let a = start("a").await.expect("start a");
    let b = start("b").await.expect("start b");
    let held = balanced(&[&a, &b]).await;
    let selector = |holds: &Vec<u32>| {
        let others: Vec<String> = (0..SHARDS)
            .filter(|s| !holds.contains(s))
            .map(|s| format!("{s}-of-{SHARDS}"))
            .collect();
        format!("{key} notin ({})", others.join(","))
    };
    let n = 12;
    for i in 0..n {
        create(&client, &format!("w{i}"), 1).await;
    }
    wait_all_ready(&client, n, LIMIT).await;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "default");
    for i in 0..n {
        let name = format!("w{i}");
        let cm = cms.get(&name).await.unwrap();
        assert_eq!(
            cm.labels().get(&key),
            Some(&format!("{}-of-{SHARDS}", shard(&name))),
            "{name}'s ConfigMap names its owner's shard"
        );
    }
    watching_children(&sent, 0, "a", Some(&selector(&held[0]))).await;
    watching_children(&sent, 0, "b", Some(&selector(&held[1]))).await;
    let of = |holds: &Vec<u32>| {
        (0..n)
            .map(|i| format!("w{i}"))
            .find(|name| holds.contains(&shard(name)))
            .expect("each replica has an object")
    };
    let (of_a, of_b) = (of(&held[0]), of(&held[1]));
    let back = |name: String| {
        let cms = cms.clone();
        async move {
            cms.delete(&name, &Default::default()).await.unwrap();
            eventually(&format!("{name}'s ConfigMap back"), LIMIT, || async {
                cms.get_opt(&name).await.ok()?.map(|_| ())
            })
            .await;
        }
    };
    back(of_a.clone()).await;
    back(of_b.clone()).await;

    // b stops: a takes every shard, and its watch of the children selects all of them.
    let before = sent.lock().unwrap().len();
    b.shutdown().await;
    eventually("a holds every shard", LIMIT, || async {
        (a.shards_held().len() == SHARDS as usize).then_some(())
    })
    .await;
    watching_children(&sent, before, "a", None).await;
    back(of_b).await;
    a.shutdown().await;
}

/// With replicas watching only their shards and a shard key from a label, an object whose key
/// changes is moved (relabelled) by the replica that sees it, and run by the replica of its
/// new shard.
#[tokio::test(start_paused = true)]
async fn an_object_whose_shard_key_changes_moves_to_the_replica_of_its_new_shard() {
    let (_cluster, client) = cluster();
    let reconciles = Reconciles::default();
    let tenant = |w: &Widget| w.labels().get("tenant").cloned().unwrap_or_default();
    let start = |id: &'static str| {
        Runtime::builder(client.clone(), crate::common::names())
            .policy(policy())
            .controller(
                Controller::<Widget>::new(tree(id, reconciles.clone(), Duration::ZERO))
                    .shard_key(tenant),
            )
            .sharding(
                Sharding::new(SHARDS, "default")
                    .named(&common::names())
                    .identity(id)
                    .watch(ShardWatch::HeldShards),
            )
            .start()
    };
    let a = start("a").await.unwrap();
    let b = start("b").await.unwrap();
    let held = balanced(&[&a, &b]).await;
    let tenant_in = |shards: &[u32]| {
        (0..)
            .map(|i| format!("tenant-{i}"))
            .find(|t| shards.contains(&shard_of(t, SHARDS)))
            .unwrap()
    };
    let (ta, tb) = (tenant_in(&held[0]), tenant_in(&held[1]));
    let mut w = widget("moving", 1);
    w.metadata.labels = Some([("tenant".to_string(), ta)].into());
    widgets(&client)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    wait_ready(&client, "moving", LIMIT).await;
    let ran_on = |replica: &str| {
        reconciles
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.0 == replica && p.1 == "moving")
    };
    assert!(ran_on("a") && !ran_on("b"));

    let patch = serde_json::json!({"metadata": {"labels": {"tenant": tb}}, "spec": {"size": 2}});
    widgets(&client)
        .patch(
            "moving",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .unwrap();
    let key = Sharding::new(SHARDS, "default")
        .named(&common::names())
        .label_key();
    let want = format!("{}-of-{SHARDS}", shard_of(&tb, SHARDS));
    eventually("moved and run by b", LIMIT, || async {
        let w = widgets(&client).get("moving").await.ok()?;
        let moved = w.labels().get(&key) == Some(&want);
        let observed = w.status.as_ref()?.ready()?.observed_generation == w.metadata.generation;
        (moved && observed && ran_on("b")).then_some(())
    })
    .await;
    assert_no_overlap(&reconciles);
    a.shutdown().await;
    b.shutdown().await;
}

/// A shard key that changes while the replica of the old shard is reconciling the object: the
/// replica of the new shard sees the change at once (with `ShardWatch::Everything`) but starts
/// no reconcile of it until the old one's has finished and that replica has moved the object
/// (relabelled it); then it runs it. Whichever way the replicas watch.
#[tokio::test(start_paused = true)]
async fn a_shard_key_change_with_a_reconcile_in_flight_is_run_by_one_replica_at_a_time() {
    key_change_in_flight(ShardWatch::Everything).await;
    key_change_in_flight(ShardWatch::HeldShards).await;
}

async fn key_change_in_flight(watch: ShardWatch) {
    let (_cluster, client) = cluster();
    let reconciles = Reconciles::default();
    // Replica a's reconciles of `gated` wait until the gate opens.
    let (open, gate) = tokio::sync::watch::channel(false);
    let tenant = |w: &Widget| w.labels().get("tenant").cloned().unwrap_or_default();
    let start = |id: &'static str| {
        let (reconciles, gate) = (reconciles.clone(), gate.clone());
        let tree = step("record", move |cx: Context<Widget>| {
            let (reconciles, mut gate) = (reconciles.clone(), gate.clone());
            async move {
                let name = cx.object().name_any();
                let i = {
                    let mut p = reconciles.lock().unwrap();
                    p.push((id.to_string(), name.clone(), Instant::now(), None));
                    p.len() - 1
                };
                let _end = Dropped(reconciles, i);
                if id == "a" && name == "gated" {
                    let _ = gate.wait_for(|open| *open).await;
                }
                Outcome::Done
            }
        });
        Runtime::builder(client.clone(), crate::common::names())
            .policy(policy())
            // Kept running through the key change (which is also a spec change, and would
            // otherwise cut it): the reconcile in flight is what this test is about.
            .controller(
                Controller::<Widget>::new(tree)
                    .shard_key(tenant)
                    .cancel_on_change(false),
            )
            .sharding(
                Sharding::new(SHARDS, "default")
                    .named(&common::names())
                    .identity(id)
                    .watch(watch),
            )
            .start()
    };
    let a = start("a").await.unwrap();
    let b = start("b").await.unwrap();
    let held = balanced(&[&a, &b]).await;
    let tenant_in = |shards: &[u32], n: usize| {
        (0..)
            .map(|i| format!("tenant-{i}"))
            .filter(|t| shards.contains(&shard_of(t, SHARDS)))
            .nth(n)
            .unwrap()
    };
    let (ta, tb) = (tenant_in(&held[0], 0), tenant_in(&held[1], 0));
    let started = |replica: &str, name: &str| {
        reconciles
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.0 == replica && p.1 == name)
    };
    let create = |name: &'static str, tenant: String| {
        let mut w = widget(name, 1);
        w.metadata.labels = Some([("tenant".to_string(), tenant)].into());
        let api = widgets(&client);
        async move { api.create(&PostParams::default(), &w).await.unwrap() }
    };
    create("gated", ta).await;
    eventually("a reconciling gated", LIMIT, || async {
        started("a", "gated").then_some(())
    })
    .await;

    let patch = serde_json::json!({"metadata": {"labels": {"tenant": &tb}}, "spec": {"size": 2}});
    widgets(&client)
        .patch(
            "gated",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .unwrap();
    // Barrier: b's watch delivers the change before the creation of an object of b's shard that
    // follows it, and b's manager takes them in that order; once b runs the later object, it
    // has had its chance to run `gated`.
    create("after", tenant_in(&held[1], 1)).await;
    eventually("b running the later object", LIMIT, || async {
        started("b", "after").then_some(())
    })
    .await;
    assert!(
        !started("b", "gated"),
        "b started gated while a's reconcile of it is in flight ({watch:?})"
    );

    open.send_replace(true);
    let key = Sharding::new(SHARDS, "default")
        .named(&common::names())
        .label_key();
    let want = format!("{}-of-{SHARDS}", shard_of(&tb, SHARDS));
    eventually("moved and run by b", LIMIT, || async {
        let w = widgets(&client).get("gated").await.ok()?;
        let moved = w.labels().get(&key) == Some(&want);
        let observed = w.status.as_ref()?.ready()?.observed_generation == w.metadata.generation;
        (moved && observed && started("b", "gated")).then_some(())
    })
    .await;
    assert_no_overlap(&reconciles);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_replica_cut_off_abandons_its_reconciles_before_another_takes_its_shards() {
    let (cluster, client) = cluster();
    let reconciles = Reconciles::default();
    // a talks to the cluster through a link the test can cut.
    let cut = Arc::new(AtomicBool::new(false));
    let link = {
        let (base, cut) = (cluster.client(), cut.clone());
        tower::service_fn(move |req| {
            let (base, cut) = (base.clone(), cut.clone());
            async move {
                if cut.load(Ordering::Acquire) {
                    return Err::<_, tower::BoxError>("cut off".into());
                }
                base.send(req).await.map_err(Into::into)
            }
        })
    };
    let a_client = kube::Client::new(link, "default");
    let hold = Duration::from_secs(30);
    let a = replica(&a_client, "a", &reconciles, hold).await;
    eventually("a holds every shard", LIMIT, || async {
        (a.shards_held().len() == SHARDS as usize).then_some(())
    })
    .await;
    // A reconcile that runs long on a.
    create(&client, "slow-1", 1).await;
    eventually("a runs slow-1", LIMIT, || async {
        reconciles
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.0 == "a" && r.1 == "slow-1")
            .then_some(())
    })
    .await;
    let b = replica(&client, "b", &reconciles, Duration::ZERO).await;

    // Cut a off: it cannot renew. Its fence lapses at the renew deadline (1.5 s) and its reconcile
    // is abandoned; b may take the shards only once their Leases stood still for the lease
    // duration (2 s), and then runs slow-1 (in no more than 30 s, its hold).
    let cut_at = Instant::now();
    cut.store(true, Ordering::Release);
    eventually("b runs slow-1", LIMIT, || async {
        reconciles
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.0 == "b" && r.1 == "slow-1")
            .then_some(())
    })
    .await;
    let p = reconciles.lock().unwrap().clone();
    let on_a = p.iter().find(|r| r.0 == "a" && r.1 == "slow-1").unwrap();
    let on_b = p.iter().find(|r| r.0 == "b" && r.1 == "slow-1").unwrap();
    let a_end = on_a.3.expect("a's reconcile was abandoned");
    assert!(
        a_end < on_b.2,
        "a's reconcile ended {:?} after b's started",
        a_end - on_b.2
    );
    // a's reconcile was abandoned (it would have held slow-1 for 30 s), and b ran it before that
    // reconcile could have ended: a stopped because its fence lapsed, not because the reconcile was done.
    assert!(
        a_end.duration_since(on_a.2) < hold,
        "a's reconcile ran its whole hold: {:?}",
        a_end.duration_since(on_a.2)
    );
    assert!(
        on_b.2 < on_a.2 + hold,
        "b took over {:?} after the cut",
        on_b.2.duration_since(cut_at)
    );
    assert!(a.shards_held().is_empty());
    assert_no_overlap(&reconciles);
    b.shutdown().await;
    cut.store(false, Ordering::Release);
    a.shutdown().await;
}

/// With `ShardWatch::ServerSide` on a server that does not apply shard selectors (the
/// in-process one ignores the option, as a real one without the feature gate does): objects are
/// placed by their uid all the same, each replica watches every object, and the split holds.
#[tokio::test(start_paused = true)]
async fn server_side_shards_on_a_server_without_selectors_watch_everything() {
    let (_cluster, client) = cluster();
    server_side_split(&client, false, LIMIT).await;
}

/// `ShardWatch::ServerSide` on kube-apiserver with `ShardedListAndWatch`: each replica receives
/// and caches only the objects of its shards, no object is labelled, readiness crosses replicas
/// through the kind's dependency watch, and a takeover relists.
#[cfg(feature = "envtest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_shards_on_kube_apiserver_receive_only_their_objects() {
    crate::common::real::bounded("server-side shards", server_side_on_kube_apiserver()).await;
}

#[cfg(feature = "envtest")]
async fn server_side_on_kube_apiserver() {
    use actorcile::envtest::{Envtest, KubeVersion, binaries};
    let binaries = binaries().expect("kube-apiserver (run scripts/install-test-deps.sh)");
    let version = KubeVersion::of_binary(&binaries.kube_apiserver).unwrap();
    assert!(
        version.at_least(1, 36),
        "server-side sharding needs kube-apiserver 1.36+, found {version}"
    );
    let env = Envtest::builder()
        .binaries(binaries)
        .crds(vec![crate::common::real::crd_for_v1_20::<Widget>()])
        .feature_gates("ShardedListAndWatch=true")
        .start()
        .await
        .expect("start etcd + kube-apiserver with ShardedListAndWatch");
    server_side_split(&env.client(), true, Duration::from_secs(90)).await;
}

async fn server_side_split(client: &kube::Client, server_selects: bool, limit: Duration) {
    let reconciles = Reconciles::default();
    let a = replica_watching(
        client,
        "a",
        &reconciles,
        Duration::ZERO,
        ShardWatch::ServerSide,
    )
    .await;
    let b = replica_watching(
        client,
        "b",
        &reconciles,
        Duration::ZERO,
        ShardWatch::ServerSide,
    )
    .await;
    let held = balanced(&[&a, &b]).await;
    // A chain w0 → … → w23, created dependents first: it converges only if waiters are woken
    // across replicas.
    let n = 24;
    for i in 0..n {
        let mut w = widget(&format!("w{i}"), 1);
        if i + 1 < n {
            w.spec.needs = vec![format!("w{}", i + 1)];
        }
        widgets(client)
            .create(&PostParams::default(), &w)
            .await
            .unwrap();
    }
    wait_all_ready(client, n, limit).await;
    let listed = widgets(client).list(&Default::default()).await.unwrap();
    let shard_of = |name: &str| {
        let w = listed.items.iter().find(|w| w.name_any() == name).unwrap();
        shard_of_uid(w.uid().as_deref().unwrap(), SHARDS)
    };
    for w in &listed.items {
        assert!(
            !w.labels().keys().any(|k| k.starts_with("shard.")),
            "{} was labelled: {:?}",
            w.name_any(),
            w.labels()
        );
    }
    assert_split(&reconciles, &held, shard_of);
    let mine = |shards: &Vec<u32>| {
        (0..n)
            .filter(|i| shards.contains(&shard_of(&format!("w{i}"))))
            .count() as u64
    };
    let want = if server_selects {
        [mine(&held[0]), mine(&held[1])]
    } else {
        [n as u64; 2]
    };
    let cached = || [&a, &b].map(|r| r.kind_metrics()[0].objects);
    let what = format!("each replica caching {want:?} (shards {held:?})");
    let _ = tokio::time::timeout(limit, async {
        while cached() != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(cached(), want, "{what}");

    // b stops: a takes its shards, relists (with the server's selection) and runs a new object
    // of any shard.
    b.shutdown().await;
    eventually("a holds every shard", limit, || async {
        (a.shards_held().len() == SHARDS as usize).then_some(())
    })
    .await;
    create(client, "late", 1).await;
    wait_ready(client, "late", limit).await;
    eventually("a caches every object", limit, || async {
        (a.kind_metrics()[0].objects == n as u64 + 1).then_some(())
    })
    .await;
    assert!(
        reconciles
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.0 == "a" && r.1 == "late")
    );
    assert_no_overlap(&reconciles);
    a.shutdown().await;
}

#[tokio::test]
async fn sharding_and_its_settings_are_checked_at_start() {
    let (_cluster, client) = cluster();
    let tree = || step("noop", |_cx: Context<Widget>| async { Outcome::Done });
    let e = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(tree()))
        .sharding(Sharding::new(0, "default"))
        .start()
        .await
        .err()
        .expect("zero shards is refused");
    assert!(e.to_string().contains("sharding shards"), "{e}");
    let mut p = test_policy();
    p.lease.renew_deadline = p.lease.duration;
    let e = Runtime::builder(client.clone(), crate::common::names())
        .policy(p)
        .controller(Controller::<Widget>::new(tree()))
        .sharding(Sharding::new(4, "default"))
        .start()
        .await
        .err()
        .expect("a renew deadline as long as the lease is refused");
    assert!(e.to_string().contains("lease_renew_deadline"), "{e}");
    // The server places objects by uid: a shard key of the controller's cannot apply.
    let e = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(tree()).shard_key(|w| w.name_any()))
        .sharding(Sharding::new(4, "default").watch(ShardWatch::ServerSide))
        .start()
        .await
        .err()
        .expect("a shard key with server-side sharding is refused");
    assert!(
        e.to_string().contains("shard key of the Widget controller"),
        "{e}"
    );
    // The roles include the Leases, in a Role in the Leases' namespace only.
    let roles = Runtime::builder(client, crate::common::names())
        .controller(Controller::<Widget>::new(tree()))
        .sharding(Sharding::new(4, "shards"))
        .roles("op");
    let yaml = roles.to_yaml().unwrap();
    let lease_scopes: Vec<_> = roles
        .rules()
        .into_iter()
        .filter(|r| r.rule.resources.as_deref() == Some(&["leases".to_string()][..]))
        .map(|r| r.scope)
        .collect();
    assert_eq!(
        lease_scopes,
        [actorcile::rbac::RuleScope::namespace("shards")],
        "{yaml}"
    );
}
