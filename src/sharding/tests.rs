//! The tests of `sharding/mod.rs`.

use super::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

#[test]
fn shard_of_is_stable_and_spread() {
    // Fixed values: replicas of different builds must agree.
    assert_eq!(shard_of("default/web", 1), 0);
    let mut counts = [0u32; 12];
    for i in 0..12_000 {
        counts[shard_of(&format!("default/obj-{i}"), 12) as usize] += 1;
    }
    for c in counts {
        assert!((800..1200).contains(&c), "uneven: {counts:?}");
    }
}

#[test]
fn validation_names_the_field() {
    let p = SupervisorPolicy::default();
    assert!(Sharding::new(12, "default").validate(&p).is_ok());
    let e = Sharding::new(0, "default").validate(&p).unwrap_err();
    assert!(e.to_string().contains("shards"), "{e}");
    let e = Sharding::new(4, "default")
        .lease_prefix("Bad_Prefix")
        .validate(&p)
        .unwrap_err();
    assert!(e.to_string().contains("lease_prefix"), "{e}");
    let e = Sharding::new(4, "not a namespace")
        .validate(&p)
        .unwrap_err();
    assert!(e.to_string().contains("namespace"), "{e}");
    let bad = SupervisorPolicy {
        lease: crate::policy::LeasePolicy {
            renew_deadline: Duration::from_secs(20),
            ..p.lease
        },
        ..p
    };
    assert!(Sharding::new(4, "default").validate(&bad).is_err());
}

#[test]
fn the_held_selector_excludes_the_other_shards_only() {
    let names = crate::names::OperatorNames::new("op", "ops.example.com");
    let key = Sharding::new(4, "default").named(&names).label_key();
    assert_eq!(key, "shard.ops.example.com/op-shards");
    assert_eq!(
        held_selector(&key, &[1, 3], 4).as_deref(),
        Some("shard.ops.example.com/op-shards notin (0-of-4,2-of-4)")
    );
    assert_eq!(held_selector(&key, &[0, 1, 2, 3], 4), None);
    assert_eq!(
        held_selector(&key, &[], 2).as_deref(),
        Some("shard.ops.example.com/op-shards notin (0-of-2,1-of-2)")
    );
    // Unnamed (outside a runtime): actorcile's former defaults.
    assert_eq!(
        Sharding::new(4, "default").label_key(),
        "shard.actorcile.dev/actorcile-shards"
    );
    let long = Sharding::new(4, "default")
        .lease_prefix(format!("{}.{}", "a".repeat(40), "b".repeat(30)))
        .watch(ShardWatch::HeldShards);
    let e = long.validate(&SupervisorPolicy::default()).unwrap_err();
    assert!(e.to_string().contains("63"), "{e}");
    // The children's owner label too, also when the server selects the objects.
    let e = long
        .clone()
        .watch(ShardWatch::ServerSide)
        .validate(&SupervisorPolicy::default())
        .unwrap_err();
    assert!(e.to_string().contains("owner-shard.actorcile.dev/"), "{e}");
    assert!(
        long.watch(ShardWatch::Everything)
            .validate(&SupervisorPolicy::default())
            .is_ok(),
        "no label is written when every replica watches everything"
    );
}

#[test]
fn a_label_value_names_a_shard_of_its_own_count_only() {
    assert_eq!(parse_label_value(&label_value(3, 4), 4), Some(3));
    assert_eq!(parse_label_value("3-of-4", 12), None, "another count");
    assert_eq!(parse_label_value("4-of-4", 4), None, "out of range");
    for bad in ["", "3", "-of-4", "x-of-4", "3-of-", "3-of-4-of-4"] {
        assert_eq!(parse_label_value(bad, 4), None, "{bad:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_shard_is_held_until_its_deadline_and_a_loss_ends_its_reconciles() {
    let shards = Arc::new(Shards::new(2));
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let a = acquired.clone();
    shards.on_acquired(Box::new(move |s| a.lock().unwrap().push(s)));
    assert!(!shards.holds(1) && shards.enter(1).is_none());
    shards.hold_until(1, Instant::now() + Duration::from_secs(1));
    shards.hold_until(1, Instant::now() + Duration::from_secs(1)); // a renewal
    assert_eq!(*acquired.lock().unwrap(), vec![1], "one acquisition");
    assert_eq!(shards.held(), vec![1]);
    // Past the deadline it is not held, even before the keeper says so.
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(!shards.holds(1));

    shards.hold_until(1, Instant::now() + Duration::from_secs(10));
    let mut reconcile = shards.enter(1).expect("held");
    let drained = {
        let shards = shards.clone();
        tokio::spawn(async move {
            shards
                .drained(1, Instant::now() + Duration::from_secs(5))
                .await
        })
    };
    shards.lose(1);
    tokio::time::timeout(Duration::from_millis(1), reconcile.lost())
        .await
        .expect("the reconcile sees the loss at once");
    drop(reconcile);
    assert!(drained.await.unwrap(), "drained once the reconcile ended");
    assert!(
        shards
            .drained(0, Instant::now() + Duration::from_millis(1))
            .await
    );
}

/// A shard being given up lets its reconciles in flight finish (they are not told of a
/// loss) and starts no new one; a drain that ends without a give-up (the keeper renewed the
/// shard instead) runs the shard's objects again, since the drain turned them away.
#[tokio::test(start_paused = true)]
async fn a_draining_shard_lets_its_reconciles_finish_and_starts_none() {
    let shards = Arc::new(Shards::new(2));
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let a = acquired.clone();
    shards.on_acquired(Box::new(move |s| a.lock().unwrap().push(s)));
    shards.hold_until(0, Instant::now() + Duration::from_secs(10));
    let mut reconcile = shards.enter(0).expect("held");
    shards.drain(0);
    assert!(shards.enter(0).is_none(), "no new reconcile while draining");
    assert!(
        shards.holds(0),
        "still held: the reconcile's writes pass the fence"
    );
    // The reconcile is not told of a loss; the drain waits for it.
    let waiting = {
        let shards = shards.clone();
        tokio::spawn(async move {
            shards
                .drained(0, Instant::now() + Duration::from_secs(5))
                .await
        })
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(1), reconcile.lost())
            .await
            .is_err(),
        "a draining reconcile is not abandoned"
    );
    assert!(!waiting.is_finished());
    drop(reconcile);
    assert!(waiting.await.unwrap());
    // A drain that times out says so.
    shards.hold_until(1, Instant::now() + Duration::from_secs(10));
    let stuck = shards.enter(1).expect("held");
    shards.drain(1);
    assert!(
        !shards
            .drained(1, Instant::now() + Duration::from_millis(10))
            .await
    );
    drop(stuck);
    // Renewed instead of given up: reconciles start again and the objects run.
    assert_eq!(*acquired.lock().unwrap(), vec![0, 1]);
    shards.hold_until(1, Instant::now() + Duration::from_secs(10));
    assert!(shards.enter(1).is_some());
    assert_eq!(*acquired.lock().unwrap(), vec![0, 1, 1]);
    // Given up: lost, not draining any more.
    shards.drain(0);
    shards.lose(0);
    shards.hold_until(0, Instant::now() + Duration::from_secs(10));
    assert!(shards.enter(0).is_some());
}
