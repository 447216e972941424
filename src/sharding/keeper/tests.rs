//! The tests of `sharding/keeper.rs`.

use super::*;
use crate::cluster::ApiServer;

fn policy() -> SupervisorPolicy {
    SupervisorPolicy {
        lease: crate::policy::LeasePolicy {
            duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(100),
        },
        ..SupervisorPolicy::default()
    }
}

fn keeper(client: &kube::Client, id: &str) -> (Keeper, Arc<Shards>) {
    let shards = Arc::new(Shards::new(12));
    let cfg = Sharding::new(12, "default").identity(id);
    (
        Keeper::new(client.clone(), cfg, shards.clone(), &policy()),
        shards,
    )
}

/// Rounds of every keeper, in turn, `n` times.
async fn rounds(keepers: &mut [&mut Keeper], n: usize) {
    for _ in 0..n {
        for k in keepers.iter_mut() {
            k.round().await;
        }
    }
}

fn disjoint_and_complete(held: &[Vec<u32>]) {
    let mut all: Vec<u32> = held.iter().flatten().copied().collect();
    all.sort();
    assert_eq!(all, (0..12).collect::<Vec<_>>(), "{held:?}");
}

#[tokio::test(start_paused = true)]
async fn replicas_split_the_shards_fairly_and_rebalance_when_one_joins_or_leaves() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, sa) = keeper(&client, "a");
    let (mut b, sb) = keeper(&client, "b");
    let (mut c, sc) = keeper(&client, "c");
    // Alone, a takes everything (its first round only announces it).
    rounds(&mut [&mut a], 2).await;
    assert_eq!(a.state(), ((0..12).collect(), 1));
    assert_eq!(sa.held().len(), 12);
    // b and c join: a gives shards up, they take them; 4 each.
    rounds(&mut [&mut b, &mut c, &mut a], 3).await;
    let held = [a.state().0, b.state().0, c.state().0];
    assert!(held.iter().all(|h| h.len() == 4), "{held:?}");
    disjoint_and_complete(&held);
    // What the actors see agrees with the keepers.
    assert_eq!(sa.held(), held[0]);
    assert_eq!(sb.held(), held[1]);
    assert_eq!(sc.held(), held[2]);
    // More rounds change nothing (no thrashing).
    rounds(&mut [&mut a, &mut b, &mut c], 3).await;
    assert_eq!([a.state().0, b.state().0, c.state().0], held);

    // A fourth joins: ⌈12/4⌉ = 3 each.
    let (mut d, _) = keeper(&client, "d");
    rounds(&mut [&mut d, &mut a, &mut b, &mut c], 3).await;
    let held = [a.state().0, b.state().0, c.state().0, d.state().0];
    assert!(held.iter().all(|h| h.len() == 3), "{held:?}");
    disjoint_and_complete(&held);

    // d leaves gracefully: its shards are taken at the others' next rounds, not after
    // expiry (the lease is 2 s; this takes a few 100 ms rounds at most).
    let left = Instant::now();
    d.release_all().await;
    rounds(&mut [&mut a, &mut b, &mut c], 2).await;
    let held = [a.state().0, b.state().0, c.state().0];
    assert!(held.iter().all(|h| h.len() == 4), "{held:?}");
    disjoint_and_complete(&held);
    assert!(
        left.elapsed() < Duration::from_secs(1),
        "{:?}",
        left.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn replicas_started_together_see_each_other_before_they_take_shards() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, _) = keeper(&client, "a");
    let (mut b, _) = keeper(&client, "b");
    let (mut c, _) = keeper(&client, "c");
    rounds(&mut [&mut a, &mut b, &mut c], 1).await;
    assert!(
        [&a, &b, &c].iter().all(|k| k.state().0.is_empty()),
        "the first round only announces"
    );
    // From their second round on, each counts three replicas and takes at most its share.
    for k in [&mut a, &mut b, &mut c] {
        k.round().await;
        assert_eq!(k.state().1, 3);
        assert_eq!(k.state().0.len(), 4);
    }
    disjoint_and_complete(&[a.state().0, b.state().0, c.state().0]);
}

#[tokio::test(start_paused = true)]
async fn the_shards_of_a_replica_that_stops_renewing_are_taken_only_after_expiry() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, sa) = keeper(&client, "a");
    let (mut b, _) = keeper(&client, "b");
    rounds(&mut [&mut a, &mut b], 3).await;
    assert_eq!((a.state().0.len(), b.state().0.len()), (6, 6));
    // a stops (no more rounds, as after kill -9). b keeps going: until a's Leases stood
    // still for the lease duration, it takes none of them.
    let stopped = Instant::now();
    loop {
        b.round().await;
        if b.state().0.len() == 12 {
            break;
        }
        let waited = stopped.elapsed();
        assert!(waited < Duration::from_secs(5), "never taken over");
        // Before expiry, b holds only its own six.
        if waited < Duration::from_millis(1900) {
            assert_eq!(b.state().0.len(), 6, "taken before expiry after {waited:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stopped.elapsed() >= Duration::from_millis(1900));
    // a's fence lapsed before that: 1.5 s after its last renewal, whatever its keeper did.
    assert!(sa.held().is_empty());
    // And when a comes back, its first round sees another holder: it holds nothing.
    a.round().await;
    assert_eq!(
        a.state().0,
        Vec::<u32>::new(),
        "b holds every shard and renews them"
    );
    rounds(&mut [&mut a, &mut b], 3).await;
    let held = [a.state().0, b.state().0];
    assert!(held.iter().all(|h| h.len() == 6), "{held:?}");
    disjoint_and_complete(&held);
}

/// Leases are judged by when this replica saw them change, not by the times their holders
/// wrote: a holder whose clock runs an hour behind keeps its shard while it renews, and one
/// whose clock runs an hour ahead loses it a lease duration after it stopped renewing, not
/// an hour later. Paused time: the keeper's own clock is tokio's.
#[tokio::test(start_paused = true)]
async fn a_holders_skewed_clock_neither_loses_a_live_shard_nor_keeps_a_dead_one() {
    let name = Sharding::new(12, "default").shard_lease_name(0);
    for skew in [-3600, 3600] {
        let cluster = ApiServer::new();
        let client = cluster.client();
        let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
        let (mut b, _) = keeper(&client, "b");
        // Another replica holds shard 0 and renews it every 100 ms, its clock `skew` s off.
        let write = |i: i64| {
            let renew = k8s_openapi::jiff::Timestamp::now()
                + k8s_openapi::jiff::SignedDuration::from_secs(skew)
                + k8s_openapi::jiff::SignedDuration::from_millis(i);
            serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "labels": {
                    "sharding.actorcile.dev/group": "actorcile-shards",
                    "sharding.actorcile.dev/role": "shard",
                }},
                "spec": {
                    "holderIdentity": "skewed",
                    "leaseDurationSeconds": 2,
                    "renewTime": MicroTime(renew),
                    "acquireTime": MicroTime(renew),
                },
            })
        };
        let pp = kube::api::PatchParams::apply("skewed").force();
        let mut stopped = Instant::now();
        for i in 0..30 {
            leases
                .patch(&name, &pp, &kube::api::Patch::Apply(write(i)))
                .await
                .unwrap();
            stopped = Instant::now();
            b.round().await;
            assert!(
                !b.state().0.contains(&0),
                "skew {skew} s: a renewed shard was taken at round {i}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // It stops renewing: b takes the shard once the record stood still for the lease
        // duration, as b saw it.
        while !b.state().0.contains(&0) {
            assert!(
                stopped.elapsed() < Duration::from_secs(3),
                "skew {skew} s: a dead holder kept the shard"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.round().await;
        }
        assert!(
            stopped.elapsed() >= Duration::from_secs(2),
            "skew {skew} s: taken {:?} after the last renewal",
            stopped.elapsed()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_keeper_whose_writes_fail_drops_its_shards_at_the_renew_deadline() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (a, sa) = keeper(&client, "a");
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(a.run(stop));
    let start = Instant::now();
    while sa.held().len() < 12 {
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A reconcile of shard 0 in flight: it must see the loss.
    let mut reconcile = sa.enter(0).expect("held");
    cluster.set_faults(crate::cluster::Faults {
        error_rate: 1.0,
        ..Default::default()
    });
    let failing = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), reconcile.lost())
        .await
        .expect("the reconcile is told of the loss");
    let dropped = failing.elapsed();
    // Within the renew deadline of the last renewal (at most one retry period before the
    // faults), and before the 2 s lease could expire elsewhere.
    assert!(
        dropped >= Duration::from_millis(1300) && dropped < Duration::from_millis(1700),
        "{dropped:?}"
    );
    assert!(sa.held().is_empty());
    stop_tx.send(true).unwrap();
    let keeper = task.await.unwrap();
    assert!(keeper.state().0.is_empty());
}

/// Keepers `a`, `b`, `c` holding four shards each, after their first rounds.
async fn three(client: &kube::Client) -> [(Keeper, Arc<Shards>); 3] {
    let [mut a, mut b, mut c] = ["a", "b", "c"].map(|id| keeper(client, id));
    rounds(&mut [&mut a.0, &mut b.0, &mut c.0], 2).await;
    for k in [&a.0, &b.0, &c.0] {
        assert_eq!(k.state().0.len(), 4);
    }
    [a, b, c]
}

/// A replica counted alive that holds nothing cannot keep the shards of a dead one
/// without a holder: they are taken past the fair share once expired, and given back
/// when the counts settle.
#[tokio::test(start_paused = true)]
async fn a_dead_replicas_shards_are_taken_past_the_fair_share() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let [(mut a, _), (mut b, _), (c, _)] = three(&client).await;
    let dead = c.state().0;
    // c stops renewing its shards, but its member Lease is kept alive by hand (a replica
    // paused between its member write and its renewals, or one whose shard writes fail):
    // a and b count three replicas, a fair share of four, which they hold.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let member = c.cfg.member_lease();
    let started = Instant::now();
    while a.state().0.len() + b.state().0.len() != 12 {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "orphans left without a holder: a {:?}, b {:?}",
            a.state().0,
            b.state().0
        );
        let mut lease = leases.get(&member).await.unwrap();
        lease.spec.as_mut().unwrap().renew_time =
            Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        leases
            .replace(&member, &PostParams::default(), &lease)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        rounds(&mut [&mut a, &mut b], 1).await;
        assert_eq!(a.state().1, 3, "c counted alive");
    }
    // Not before they expired (2 s).
    assert!(started.elapsed() >= Duration::from_secs(2));
    let held = [a.state().0, b.state().0];
    disjoint_and_complete(&held);
    assert!(dead.iter().all(|s| held.iter().any(|h| h.contains(s))));
}

/// A conflict on a renewal (a write of ours whose answer was lost landed, or anyone
/// touched the Lease) does not lose the shard: the next round reads it again and renews.
/// Only the fence drops a shard whose renewals keep failing.
#[tokio::test(start_paused = true)]
async fn a_conflicting_renewal_reads_the_lease_again_instead_of_losing_the_shard() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, sa) = keeper(&client, "a");
    rounds(&mut [&mut a], 2).await;
    let mut reconcile = sa.enter(3).expect("held");
    let conflicts = |rate| crate::cluster::Faults {
        conflict_rate: rate,
        ..Default::default()
    };
    // Every renewal conflicts for 1 s (ten rounds), less than the 1.5 s renew deadline.
    cluster.set_faults(conflicts(1.0));
    for _ in 0..10 {
        a.round().await;
        a.enforce_fences();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(a.state().0.len(), 12, "no shard lost to a conflict");
    cluster.set_faults(conflicts(0.0));
    a.round().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(10), reconcile.lost())
            .await
            .is_err(),
        "the reconcile went on"
    );
    // Past the renew deadline of conflicts, the fence drops them.
    cluster.set_faults(conflicts(1.0));
    for _ in 0..16 {
        a.round().await;
        a.enforce_fences();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(a.state().0.is_empty() && sa.held().is_empty());
    tokio::time::timeout(Duration::from_millis(1), reconcile.lost())
        .await
        .expect("told of the loss");
}

/// A shard lost to the fence and taken again by the same replica is a new acquisition:
/// its reconciles were abandoned, and the Lease says so (`leaseTransitions`,
/// `acquireTime`), as it would for another replica.
#[tokio::test(start_paused = true)]
async fn a_shard_taken_back_after_its_fence_lapsed_counts_as_a_transition() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, sa) = keeper(&client, "a");
    rounds(&mut [&mut a], 2).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let name = a.cfg.shard_lease_name(5);
    let first = leases.get(&name).await.unwrap().spec.unwrap();
    // No renewal for longer than the renew deadline (the API did not answer).
    tokio::time::sleep(Duration::from_millis(1600)).await;
    a.enforce_fences();
    assert!(a.state().0.is_empty() && sa.held().is_empty());
    // Its Leases expire (2 s); then a takes them again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.round().await;
    assert_eq!(a.state().0.len(), 12);
    let again = leases.get(&name).await.unwrap().spec.unwrap();
    assert_eq!(again.holder_identity.as_deref(), Some("a"));
    assert_eq!(
        again.lease_transitions,
        Some(first.lease_transitions.unwrap_or(0) + 1)
    );
    assert_ne!(again.acquire_time, first.acquire_time);
    // A plain renewal is not.
    a.round().await;
    let renewed = leases.get(&name).await.unwrap().spec.unwrap();
    assert_eq!(renewed.lease_transitions, again.lease_transitions);
    assert_eq!(renewed.acquire_time, again.acquire_time);
}

/// A shard given up to rebalance lets its reconciles in flight finish and is released
/// after them; one whose reconcile does not finish by the drain deadline is dropped (the
/// reconcile abandoned) and left to expire.
#[tokio::test(start_paused = true)]
async fn a_shard_given_up_is_released_after_its_reconciles_finish() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, sa) = keeper(&client, "a");
    rounds(&mut [&mut a], 2).await;
    let (mut b, _) = keeper(&client, "b");
    b.round().await; // b announces itself
    // a gives up the six highest shards (6..=11) at its next round. A reconcile of shard
    // 11 ends 300 ms into the drain; one of shard 10 never does.
    let mut finishing = sa.enter(11).expect("held");
    let mut stuck = sa.enter(10).expect("held");
    let ended = tokio::spawn(async move {
        let lost = tokio::time::timeout(Duration::from_millis(300), finishing.lost()).await;
        (lost.is_err(), finishing)
    });
    let round = tokio::spawn(async move {
        a.round().await;
        a
    });
    let (not_told, finishing) = ended.await.unwrap();
    assert!(not_told, "a draining reconcile is not abandoned");
    drop(finishing);
    let mut a = round.await.unwrap();
    assert_eq!(a.state().0, (0..6).collect::<Vec<_>>());
    tokio::time::timeout(Duration::from_millis(1), stuck.lost())
        .await
        .expect("the reconcile that ran past the drain deadline is abandoned");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = |name: String| {
        let leases = leases.clone();
        async move {
            leases
                .get(&name)
                .await
                .unwrap()
                .spec
                .unwrap()
                .holder_identity
        }
    };
    assert_eq!(holder(a.cfg.shard_lease_name(11)).await, None, "released");
    assert_eq!(
        holder(a.cfg.shard_lease_name(10)).await.as_deref(),
        Some("a"),
        "left to expire"
    );
    // b takes the released ones at once, and shard 10 once it expired.
    b.round().await;
    assert!(b.state().0.contains(&11) && !b.state().0.contains(&10));
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rounds(&mut [&mut a, &mut b], 1).await;
    }
    assert_eq!(a.state().0, (0..6).collect::<Vec<_>>());
    assert_eq!(b.state().0, (6..12).collect::<Vec<_>>());
}

/// A request that does not answer does not hold the round: it is bounded by half the
/// renew deadline, so the next round can renew before the fence.
#[tokio::test(start_paused = true)]
async fn a_request_without_an_answer_is_bounded_by_half_the_renew_deadline() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let (mut a, _) = keeper(&client, "a");
    rounds(&mut [&mut a], 2).await;
    cluster.set_faults(crate::cluster::Faults {
        latency: Duration::from_secs(60),
        ..Default::default()
    });
    let started = Instant::now();
    a.round().await;
    assert_eq!(started.elapsed(), Duration::from_millis(750));
    cluster.set_faults(crate::cluster::Faults::default());
    a.round().await;
    assert_eq!(a.state().0.len(), 12, "renewed at the next round");
}

/// A rolling upgrade to the operator's own domain, with the Lease prefix kept: the replica of
/// the earlier version labelled its Leases under `actorcile.dev`; the upgraded one (naming it
/// its former domain) and it count each other as members and share the shards; the upgraded
/// one takes the others' shards when it leaves, and labels the Leases it writes under both.
#[tokio::test(start_paused = true)]
async fn an_upgraded_replica_and_one_of_the_former_domain_share_the_shards() {
    let cluster = ApiServer::new();
    let client = cluster.client();
    let names = crate::names::OperatorNames::new("op", "ops.example.com")
        .former_domain(crate::names::LEGACY_DOMAIN);
    let (mut old, _) = keeper(&client, "old");
    let new_cfg = Sharding::new(12, "default")
        .identity("new")
        .lease_prefix("actorcile-shards")
        .named(&names);
    let mut new = Keeper::new(
        client.clone(),
        new_cfg.clone(),
        Arc::new(Shards::new(12)),
        &policy(),
    );
    rounds(&mut [&mut old], 2).await;
    assert_eq!(old.state().0.len(), 12);
    rounds(&mut [&mut new, &mut old], 3).await;
    let held = [old.state().0, new.state().0];
    assert!(held.iter().all(|h| h.len() == 6), "{held:?}");
    disjoint_and_complete(&held);

    old.release_all().await;
    rounds(&mut [&mut new], 2).await;
    assert_eq!(new.state().0.len(), 12);
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    for s in 0..12 {
        let l = leases.get(&new_cfg.shard_lease_name(s)).await.unwrap();
        let labels = l.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("sharding.ops.example.com/role")
                .map(String::as_str),
            Some("shard"),
            "{labels:?}"
        );
        // And under the former domain, for replicas of the earlier version still running.
        assert_eq!(
            labels
                .get("sharding.actorcile.dev/role")
                .map(String::as_str),
            Some("shard"),
            "{labels:?}"
        );
    }
}
