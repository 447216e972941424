//! A watch that follows the shards this replica holds: when it ends to watch them anew (a relist
//! with the new selector), and the waits it selects on.

/// How long the held shards must stay unchanged before the watch follows an acquisition (a
/// keeper round that takes several shards makes one relist, not one per shard).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// When a watch of the `watched` shards ends to follow the `held` ones (`at`: when it was to
/// end before this change): after [`SETTLE`] when a shard is held that it does not select, after
/// `narrow_after` (or sooner, as before) when it only selects shards no longer held, never when
/// the two agree.
pub(crate) fn follow_at(
    watched: &[u32],
    held: &[u32],
    at: Option<tokio::time::Instant>,
    narrow_after: std::time::Duration,
) -> Option<tokio::time::Instant> {
    let now = tokio::time::Instant::now();
    if held.iter().any(|s| !watched.contains(s)) {
        Some(now + SETTLE)
    } else if watched.iter().any(|s| !held.contains(s)) {
        Some(at.map_or(now + narrow_after, |f| f.min(now + narrow_after)))
    } else {
        None
    }
}

/// Resolves on the next change of the held set; never without a receiver (no
/// `ShardWatch::HeldShards`) or once its sender is gone. Cancel-safe (`changed` is).
pub(crate) async fn next_change(changes: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    let changed = match changes {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

/// Resolves at `at`; never without one.
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
