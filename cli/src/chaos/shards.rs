//! Who holds each shard Lease during a run with replicas: the Leases are read every 200 ms, and
//! every hand-over's gap is measured on the Leases' own times, from the former holder's last
//! renewal (or its release) to the new holder's acquisition, less the time the control plane
//! was down. No shard may stand without a holder for longer than twice the lease duration.

use std::collections::HashMap;
use std::time::Duration;

use actorcile::sharding::Sharding;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the hand-overs of a run came to.
#[derive(Debug, Default, Clone, Serialize)]
pub struct HandOvers {
    /// Shards that changed holder.
    pub count: usize,
    /// The longest time a shard stood without a holder while the control plane was up, in
    /// seconds.
    pub longest_gap_seconds: f64,
    /// Hand-overs whose gap was longer than the limit (twice the lease duration).
    pub too_slow: usize,
    /// Every hand-over: the shard, the former holder's last write and the new holder's
    /// acquisition (wall-clock microseconds).
    #[serde(skip)]
    pub moves: Vec<(u32, u64, u64)>,
}

impl HandOvers {
    /// The gaps measured without the `outages` (wall-clock microseconds: while kube-apiserver
    /// or etcd was down, no replica could take a shard), against `limit`.
    pub fn measure(&mut self, outages: &[(u64, u64)], limit: Duration) {
        self.count = self.moves.len();
        self.longest_gap_seconds = 0.0;
        self.too_slow = 0;
        for &(_, from, to) in &self.moves {
            let down: u64 = outages
                .iter()
                .map(|&(a, b)| b.min(to).saturating_sub(a.max(from)))
                .sum();
            let gap = to.saturating_sub(from).saturating_sub(down) as f64 / 1e6;
            self.longest_gap_seconds = self.longest_gap_seconds.max(gap);
            if gap > limit.as_secs_f64() {
                self.too_slow += 1;
            }
        }
    }
}

/// The watch of the shard Leases; [`ShardWatch::stop`] gives its figures.
pub struct ShardWatch {
    stop: watch::Sender<bool>,
    task: JoinHandle<HandOvers>,
}

/// A shard Lease as last read: its holder, the last time its holder wrote (renewal,
/// acquisition or release), and how many times it changed hands.
struct Seen {
    holder: Option<String>,
    wrote: Option<Timestamp>,
    transitions: Option<i32>,
}

impl ShardWatch {
    /// Reads the shard Leases of group `prefix` in `namespace` until stopped.
    /// The times a holder writes are taken on its clock; `skew_of` (a holder's identity) says
    /// how far ahead it runs, in seconds, so that gaps are measured on one clock.
    pub fn start(
        client: Client,
        namespace: &str,
        prefix: &str,
        skew_of: impl Fn(&str) -> i64 + Send + 'static,
    ) -> Self {
        let leases: Api<Lease> = Api::namespaced(client, namespace);
        let group = Sharding::new(1, namespace)
            .lease_prefix(prefix)
            .named(&super::operator::names());
        let lp = ListParams::default().labels(&format!(
            "{}={prefix},{}=shard",
            group.group_label_key(),
            group.role_label_key()
        ));
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut seen: HashMap<String, Seen> = HashMap::new();
            let mut figures = HandOvers::default();
            while !*stopped.borrow() {
                // Reads fail while kube-apiserver restarts: the next one catches up.
                if let Ok(list) = leases.list(&lp).await {
                    for lease in list.items {
                        observe(&mut seen, &mut figures, &lease, &skew_of);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stopped.changed() => {}
                }
            }
            figures
        });
        Self { stop, task }
    }

    /// Stops reading; the figures.
    pub async fn stop(self) -> HandOvers {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// One read of `lease`: a new holder is a hand-over, measured from what the former holder
/// wrote last.
fn observe(
    seen: &mut HashMap<String, Seen>,
    figures: &mut HandOvers,
    lease: &Lease,
    skew_of: &impl Fn(&str) -> i64,
) {
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    // On the machine's clock: less the writer's skew (a release is written by the holder
    // before).
    let writer = holder
        .clone()
        .or_else(|| seen.get(&lease.name_any()).and_then(|s| s.holder.clone()));
    let skew = SignedDuration::from_secs(writer.as_deref().map_or(0, skew_of));
    let on_time = |t: Timestamp| t.checked_sub(skew).unwrap_or(t);
    let wrote = spec.renew_time.map(|t| on_time(t.0));
    let acquired = spec.acquire_time.map(|t| on_time(t.0)).or(wrote);
    let transitions = spec.lease_transitions;
    let now = Seen {
        holder: holder.clone(),
        wrote,
        transitions,
    };
    let Some(before) = seen.insert(lease.name_any(), now) else {
        return;
    };
    // A new holder, or the same one again after a release and a new acquisition between two
    // reads (the transitions count moved).
    if holder.is_none() || (holder == before.holder && transitions == before.transitions) {
        return;
    }
    if let (Some(from), Some(to)) = (before.wrote, acquired)
        && let Some(shard) = lease
            .name_any()
            .rsplit_once("-shard-")
            .and_then(|(_, n)| n.parse().ok())
    {
        let micros = |t: Timestamp| u64::try_from(t.as_microsecond()).unwrap_or_default();
        figures
            .moves
            .push((shard, micros(from), micros(to).max(micros(from))));
    }
}
