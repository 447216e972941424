//! What `actorcile chaos` reports: the faults injected, the invariants' violations (each must be
//! 0), the figures of a run, and how they are printed.

use serde::Serialize;

use super::*;

/// Faults injected, by kind.
#[derive(Debug, Default, Serialize)]
pub struct FaultCounts {
    /// Operator processes killed with SIGKILL while reconciles ran (and started again).
    pub operator_kills: u32,
    /// Reconciles in flight at those kills, in all.
    pub reconciles_cut_by_kills: usize,
    /// kube-apiserver killed and restarted.
    pub apiserver_restarts: u32,
    /// etcd killed and restarted.
    pub etcd_restarts: u32,
    /// Replicas paused with SIGSTOP past their Leases, then continued.
    pub replicas_paused: u32,
    /// How far apart the operator processes' wall clocks were set: each one on time, this many
    /// seconds ahead, or as many behind.
    pub clock_skew_seconds: u32,
    /// Provisioner reconciles that panicked, hung, and API answers injected (`api-500`, `api-409`,
    /// `api-429`).
    pub injected: BTreeMap<String, u64>,
}

/// Invariant violations: every one must be 0.
#[derive(Debug, Default, Serialize)]
pub struct Violations {
    /// Live items not Ready at the end of a phase.
    pub not_converged: usize,
    /// Items whose status speaks of an older generation.
    pub stale_status: usize,
    /// Deleted items still there (their finalizer not removed).
    pub leaked_finalizers: usize,
    /// Child ConfigMaps of items that are gone, or left at the end.
    pub orphaned_children: usize,
    /// Live items without their child ConfigMap.
    pub missing_children: usize,
    /// An item gone while an item using it still existed.
    pub deletion_order: usize,
    /// Pairs of reconciles of one item that overlapped.
    pub overlapping_reconciles: usize,
    /// Intents whose side effect ran more than once, and deletions whose teardown ran more
    /// than once, not after a kill of its holder.
    pub repeated_effects: usize,
    /// Intents whose side effect never ran, and deletions whose teardown never ran.
    pub missing_effects: usize,
    /// Planted secret values found in logs, Events or status.
    pub secret_leaks: usize,
    /// Operator processes that did not exit within the shutdown timeout of a SIGTERM, or
    /// exited with an error.
    pub unclean_shutdowns: usize,
    /// With replicas: shard hand-overs that left the shard without a holder for longer than
    /// twice the lease duration while the control plane was up.
    pub unowned_shards: usize,
}

impl Violations {
    pub(super) fn total(&self) -> usize {
        self.not_converged
            + self.stale_status
            + self.leaked_finalizers
            + self.orphaned_children
            + self.missing_children
            + self.deletion_order
            + self.overlapping_reconciles
            + self.repeated_effects
            + self.missing_effects
            + self.secret_leaks
            + self.unclean_shutdowns
            + self.unowned_shards
    }
}

/// What a chaos run reports.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Rounds run.
    pub rounds: u32,
    /// Items created over all rounds.
    pub objects: usize,
    /// Items deleted over all rounds (the rest are deleted at the end).
    pub deleted: usize,
    /// Provisioner reconciles recorded.
    pub reconciles: usize,
    /// Side effects run (provision and deprovision).
    pub effects: usize,
    /// Unguarded teardown steps run (the last step of each deletion's deprovision tree).
    pub teardowns: usize,
    /// Side effects and teardowns run again after their holder was killed mid-task, and
    /// teardowns run again after the item's shard moved before its finalizer's removal.
    pub effects_repeated_after_kill: usize,
    /// Faults injected.
    pub faults: FaultCounts,
    /// Operator replicas.
    pub replicas: u32,
    /// Reconciles that began while another reconcile of their item was frozen with its replica (SIGSTOP):
    /// the frozen one could not act, and once continued its writes were refused by its fence.
    pub overlaps_with_frozen_reconciles: usize,
    /// With replicas: how the shards changed hands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hand_overs: Option<shards::HandOvers>,
    /// Invariant violations.
    pub violations: Violations,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Seconds of each phase of each round, from its first request to everything converged
    /// (faults included).
    pub phases: Vec<(String, f64)>,
    /// Where the records are, when kept.
    pub records: Option<PathBuf>,
    /// The figures of a `--load` run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<load::LoadFigures>,
}

pub(super) fn print_report(r: &Report) {
    println!(
        "chaos: seed {}, {} round(s), {} items ({} deleted mid-run), {} reconciles, {} side effects, {} teardowns, {:.1} s",
        r.seed, r.rounds, r.objects, r.deleted, r.reconciles, r.effects, r.teardowns, r.seconds
    );
    let f = &r.faults;
    println!(
        "faults: operator kill -9 ×{} ({} reconciles in flight), kube-apiserver restart ×{}, etcd restart ×{}",
        f.operator_kills, f.reconciles_cut_by_kills, f.apiserver_restarts, f.etcd_restarts
    );
    if f.clock_skew_seconds > 0 {
        println!(
            "clocks: each operator process's wall clock on time, {0} s ahead or {0} s behind",
            f.clock_skew_seconds
        );
    }
    if r.replicas > 1 {
        let h = r.hand_overs.clone().unwrap_or_default();
        println!(
            "replicas: {} sharing {SHARDS} shards; paused with SIGSTOP past their Leases ×{}; {} shard hand-overs, the longest without a holder {:.1} s ({} longer than twice the lease duration)",
            r.replicas, f.replicas_paused, h.count, h.longest_gap_seconds, h.too_slow
        );
    }
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|(p, s)| format!("{p} {s:.1} s"))
        .collect();
    println!("phases: {}", phases.join(", "));
    let injected: Vec<String> = f
        .injected
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect();
    println!("injected: {}", injected.join(", "));
    if r.overlaps_with_frozen_reconciles > 0 {
        println!(
            "reconciles begun while another reconcile of their item was frozen with its replica: {}",
            r.overlaps_with_frozen_reconciles
        );
    }
    if r.effects_repeated_after_kill > 0 {
        println!(
            "run again after their holder was killed mid-task (or, teardowns, after the shard moved first): {}",
            r.effects_repeated_after_kill
        );
    }
    print_violations(r);
}

/// The violation counts, and where the records are when kept.
fn print_violations(r: &Report) {
    let v = serde_json::to_value(&r.violations).unwrap_or_default();
    println!("invariant violations:");
    if let Some(map) = v.as_object() {
        for (k, n) in map {
            println!("  {k:<20} {n}");
        }
    }
    if let Some(p) = &r.records {
        println!("records: {}", p.display());
    }
}

pub(super) fn print_load_report(r: &Report, l: &load::LoadFigures) {
    println!(
        "load: {} items, seed {}, {} reconciles, {} side effects, {} teardowns, {:.1} s in all",
        r.objects, r.seed, r.reconciles, r.effects, r.teardowns, r.seconds
    );
    println!(
        "all Ready {:.1} s after the first create (the operator stopped with SIGTERM at {:.1} s, {} reconciles in flight, and started again); all gone {:.1} s after the first delete",
        l.ready_seconds, l.sigterm_at_seconds, l.reconciles_in_flight_at_sigterm, l.deleted_seconds
    );
    println!(
        "operator peak RSS: {:.1} MiB (highest of its processes)",
        l.operator_peak_rss_bytes as f64 / (1u64 << 20) as f64
    );
    print_violations(r);
}
