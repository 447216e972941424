//! `actorcile chaos`: a mixed workload on a real etcd + kube-apiserver while faults are injected,
//! then the invariants an operator runtime promises, counted.
//!
//! Each round creates items (a third stand alone, the others use one of those: they wait for it
//! to be Ready, reference it, and it cannot go before them), changes a quarter of them (a new
//! generation), then deletes half (a set closed under "is used by", plus items that use nothing
//! deleted). The operator (`operator.rs`) runs in its own process as a non-admin user bound to
//! the ClusterRole the runtime generates, behind a client that injects API faults, loses the
//! answers of writes that landed and breaks watches (`api_faults.rs`), with provisioner panics
//! and hangs injected around its tree. While it provisions, the driver kills it with SIGKILL and
//! starts it again, restarts kube-apiserver, and restarts etcd; while it deprovisions, kills it
//! again and restarts kube-apiserver. With `--replicas N`, N operator processes share the items'
//! shards on Leases: one is killed in each phase, and while they provision another is paused
//! with SIGSTOP past its Leases and then continued; how long each shard stood without a holder
//! is measured on the Leases (`shards.rs`).
//!
//! Checked, and reported as counts (all must be 0): items not Ready (or not gone once deleted);
//! stale status (`observedGeneration` behind); leaked finalizers; orphaned or missing child
//! ConfigMaps; deletion-order violations (an item gone while an item using it still exists, seen
//! in the order the API reports it); overlapping reconciles of one item; side effects run more than
//! once per intent (other than after their holder was killed in the middle, the guard's
//! documented window) or not at all; an unguarded teardown step run more than once per deletion
//! (other than after its process was killed, or the item's shard moved, before the finalizer's
//! removal); planted secrets (the Secret's value, the operator's bearer
//! token) found in the operator's logs, the Events or any status; an operator that did not stop
//! on SIGTERM.
//!
//! Faults are drawn from `--seed`: the same seed injects the same faults at the same points of
//! each process's request and reconcile sequence; the interleaving of real processes is not
//! repeatable.

mod api_faults;
mod check;
mod lines;
mod load;
pub mod operator;
mod order;
mod process;
mod report;
mod rounds;
mod setup;
mod shards;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use actorcile::envtest::Envtest;
use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::retry::idempotent;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

pub use api_faults::ApiFaultRates;
use operator::{CHILD_SUFFIX, ChaosItem, ChaosItemSpec, EFFECT};
use process::Operator;
pub use report::{Report, Violations};
use report::{print_load_report, print_report};
use rounds::{drive, round_items};
use setup::Planted;

/// `actorcile chaos` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Items per round (at least 3)
    #[arg(long, default_value_t = 60, value_parser = at_least_three)]
    pub objects: usize,
    /// Seed of every injected fault
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run rounds until this long has passed (a soak: `10m`, `2h`; at most a week); default
    /// one round
    #[arg(long, value_parser = parse_soak)]
    pub duration: Option<Duration>,
    /// Fraction of reconciles whose provisioner steps panic
    #[arg(long, default_value_t = 0.05, value_parser = fraction)]
    pub panic_rate: f64,
    /// Fraction of reconciles whose provisioner steps hang until the reconcile timeout (2 s) stops them
    #[arg(long, default_value_t = 0.02, value_parser = fraction)]
    pub hang_rate: f64,
    #[command(flatten)]
    pub api: ApiFaultRates,
    /// Operator replicas, sharing the items' shards on Leases (more than one: each round also
    /// pauses a replica with SIGSTOP past its Leases, then lets it go on)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=5), conflicts_with = "load")]
    pub replicas: u32,
    /// Set the operator processes' wall clocks this many seconds apart (0: not at all): each
    /// incarnation's clock runs on time, this far ahead or this far behind, in turn, through
    /// libfaketime (`apt-get install libfaketime`); their monotonic clocks stay true. At most
    /// 2 s: the clocks of two processes then disagree by less than the lock expiry (5 s), the
    /// guard's bound, and by more than the Leases' duration (3 s), which no lease may depend on
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=2))]
    pub clock_skew: u32,
    /// Print the report as one JSON line
    #[arg(long)]
    pub json: bool,
    /// A load run instead of rounds of faults: `--objects` items (e.g. 10000) created at
    /// once; the operator stopped with SIGTERM once half of them started a reconcile, and started
    /// again; every item deleted once all are Ready. No other fault is injected. Reports the
    /// time to all Ready and to all gone, and the operator's peak RSS
    #[arg(long, conflicts_with = "duration")]
    pub load: bool,
    /// Keep the records (reconciles, effects, faults, operator logs) and the control plane's
    /// directory here; by default they are removed unless a check fails
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
}

/// Shards of a run with replicas.
const SHARDS: u32 = 12;
/// How long a paused replica stands still: past its Leases' duration (3 s), so its shards move.
const PAUSE: Duration = Duration::from_secs(5);

impl ChaosArgs {
    /// The shards each operator process runs with (0: one replica, no sharding).
    pub fn shards(&self) -> u32 {
        if self.replicas > 1 { SHARDS } else { 0 }
    }
}

/// A number of items: at least one standalone item and two that use it.
fn at_least_three(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 3 => Ok(n),
        _ => Err(format!("{s:?} is not a number of items of at least 3")),
    }
}

/// A fraction in [0, 1], for the fault rates.
pub fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a fraction between 0 and 1")),
    }
}

/// How long a phase may take to converge before the run fails.
const CONVERGE: Duration = Duration::from_secs(120);
/// How long a kill waits for the reconciles it should land among.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// The namespace of the workload.
const NAMESPACE: &str = "chaos";

/// `actorcile chaos`.
pub fn main(args: ChaosArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let report = rt.block_on(run(&args))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else if let Some(l) = &report.load {
        print_load_report(&report, l);
    } else {
        print_report(&report);
    }
    let total = report.violations.total();
    if total > 0 {
        bail!(
            "{total} invariant violation(s); the records are in {}",
            report
                .records
                .as_ref()
                .map_or("(not kept)".into(), |p| p.display().to_string())
        );
    }
    Ok(())
}

/// Creates `obj` (one that exists already counts as created), riding out the faults.
async fn create<K>(api: &Api<K>, obj: &K, what: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Serialize + std::fmt::Debug,
{
    idempotent(what, Some(409), || async {
        api.create(&PostParams::default(), obj).await.map(drop)
    })
    .await
}

/// Deletes `name` (one already gone counts as deleted), riding out the faults.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    idempotent(&format!("deleting {name}"), Some(404), || async {
        api.delete(name, &DeleteParams::default()).await.map(drop)
    })
    .await
}

/// Every object of `api`, riding out the faults.
async fn list<K>(api: &Api<K>) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    idempotent("listing", None, || async {
        api.list(&ListParams::default()).await.map(|l| l.items)
    })
    .await
}

async fn run(args: &ChaosArgs) -> Result<Report> {
    let started = Instant::now();
    let records = match &args.keep {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("actorcile-chaos-{}", std::process::id())),
    };
    std::fs::create_dir_all(&records).with_context(|| format!("creating {}", records.display()))?;
    let mut env = Envtest::builder()
        .dir(records.join("control-plane"))
        .keep_dir(true)
        .start()
        .await
        .context("starting the control plane")?;
    let result = if args.load {
        load::drive(args, &mut env, &records).await
    } else {
        drive(args, &mut env, &records).await
    };
    env.stop().await;
    let mut report = result?;
    report.seconds = started.elapsed().as_secs_f64();
    if args.keep.is_none() && report.violations.total() == 0 {
        let _ = std::fs::remove_dir_all(&records);
    } else {
        report.records = Some(records);
    }
    Ok(report)
}

/// What happened to the operator processes of a run: when each died (killed or stopped), which
/// were killed, and which was frozen when (incarnation, from, to).
struct Fates<'a> {
    deaths: &'a HashMap<u32, u64>,
    killed: &'a HashSet<u32>,
    pauses: &'a [(u32, u64, u64)],
}

/// What the records say, into `report`: reconciles (and their overlaps: one with a reconcile of a
/// replica frozen in `pauses` — incarnation, from, to — when the other started is counted apart),
/// side effects (repeated or missing; a repeat is explained only by a SIGKILL of its holder, one
/// of `killed`, or a move of the item's shard in between), injected faults, and the planted
/// secrets in the operator's logs, the Events and `statuses`.
async fn check_records(
    records: &std::path::Path,
    fates: Fates<'_>,
    planted: &Planted,
    admin: &Client,
    statuses: &str,
    report: &mut Report,
) -> Result<()> {
    let Fates {
        deaths,
        killed,
        pauses,
    } = fates;
    // The records.
    let reconciles = check::reconciles(records, deaths)?;
    report.reconciles = reconciles.len();
    let frozen = |inc: u32, at: u64| {
        pauses
            .iter()
            .any(|&(i, from, to)| i == inc && from <= at && at < to)
    };
    let (with_frozen, overlapping): (Vec<_>, Vec<_>) = check::overlaps(&reconciles)
        .into_iter()
        .partition(|(_, earlier, _, at)| frozen(*earlier, *at));
    report.violations.overlapping_reconciles = overlapping.len();
    report.overlaps_with_frozen_reconciles = with_frozen.len();
    report.faults.reconciles_cut_by_kills = reconciles
        .iter()
        .filter(|p| p.cut && killed.contains(&p.incarnation))
        .count();
    let effects = check::Effects::read(records)?;
    report.effects = effects
        .provisioned
        .values()
        .chain(effects.deprovisioned.values())
        .map(Vec::len)
        .sum();
    report.teardowns = effects.torn_down.values().map(Vec::len).sum();
    let moves = report
        .hand_overs
        .as_ref()
        .map(|h| h.moves.clone())
        .unwrap_or_default();
    // Whether the shard of item `key` (`namespace/name`) changed hands in `(from, to]`, or up to
    // a lock's expiry before `from`: a run starts while its replica holds the shard (its lock or
    // its reconcile began then), and what it does outside Kubernetes until its next write is not
    // fenced (a guarded task runs at most the lock's expiry).
    let margin = u64::try_from(operator::policy(false).kind.lock_expiry.as_micros()).unwrap_or(0);
    let moved = |key: &str, from: u64, to: u64| {
        let from = from.saturating_sub(margin);
        let Some((namespace, name)) = key.split_once('/') else {
            return false;
        };
        let shard = actorcile::sharding::shard_of(
            &actorcile::sharding::object_key(Some(namespace), name),
            SHARDS,
        );
        moves
            .iter()
            .any(|&(s, _, at)| s == shard && from < at && at <= to)
    };
    let (unexplained, explained) = effects.repeats(killed, moved);
    report.violations.repeated_effects = unexplained;
    report.effects_repeated_after_kill = explained;
    report.violations.missing_effects += missing_deprovisions(&effects);
    let mut injected = check::faults(records, "reconciles")?;
    injected.extend(check::faults(records, "api-faults")?);
    report.faults.injected = injected;

    // Planted secrets: in the operator's logs, the Events, any status.
    let events: Api<Event> = Api::namespaced(admin.clone(), NAMESPACE);
    let events = list(&events).await?;
    let mut written = serde_json::to_string(&events)?;
    written.push_str(statuses);
    for entry in std::fs::read_dir(records)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("operator-"))
        {
            written.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    report.violations.secret_leaks = [&planted.secret, &planted.token]
        .iter()
        .flat_map(|s| std::iter::once(s.to_string()).chain(base64_forms(s)))
        .map(|form| written.matches(form.as_str()).count())
        .sum();
    Ok(())
}

/// `--duration`: humantime's form (`10m`, `2h`), above zero and at most a week.
fn parse_soak(s: &str) -> std::result::Result<Duration, String> {
    let d = humantime_serde::re::humantime::parse_duration(s)
        .map_err(|e| format!("{e} (e.g. 10m, 2h)"))?;
    if d.is_zero() || d > Duration::from_secs(7 * 24 * 3600) {
        return Err("must be above zero and at most a week (168h)".into());
    }
    Ok(d)
}

/// What `secret` looks like inside any base64 text (a Secret's `data`, an encoded kubeconfig):
/// its encoding at each of the three offsets a 3-byte group can start at, without the
/// characters that also depend on the bytes around it.
fn base64_forms(secret: &str) -> Vec<String> {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    (0..3)
        .map(|k| {
            let mut bytes = vec![0u8; k];
            bytes.extend_from_slice(secret.as_bytes());
            let text = engine.encode(&bytes);
            // Character i holds bits 6i..6i+6: free of the k filler bytes from ceil(8k/6) on,
            // and within the secret up to (8 (k + len)) / 6.
            let start = (4 * k).div_ceil(3);
            let end = (8 * (k + secret.len())) / 6;
            text[start..end].to_string()
        })
        .collect()
}

/// Waits (`limit` at most) until `what` reconciles of `count` items started since `since`: the
/// kill that follows lands in the middle of the phase.
async fn reconciles_started(
    records: &std::path::Path,
    since: u64,
    what: &str,
    count: usize,
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    let mut reconciles = lines::Tail::open(&records.join("reconciles"))?;
    let mut started = HashSet::new();
    loop {
        started.extend(
            reconciles
                .new_lines()?
                .into_iter()
                .filter(|(at, w)| {
                    *at >= since
                        && w.first().is_some_and(|t| t == "start")
                        && w.get(4).is_some_and(|x| x == what)
                })
                .filter_map(|(_, mut w)| w.get_mut(3).map(std::mem::take)),
        );
        if started.len() >= count || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A component of the control plane.
enum Component {
    Apiserver,
    Etcd,
}

/// Kills `component` and starts it again with its data, noting when it was down in `outages`
/// (wall-clock microseconds).
async fn restart(
    env: &mut Envtest,
    component: Component,
    outages: &mut Vec<(u64, u64)>,
) -> Result<()> {
    let down = lines::wall_micros();
    match component {
        Component::Apiserver => env
            .restart_apiserver()
            .await
            .context("restarting kube-apiserver")?,
        Component::Etcd => env.restart_etcd().await.context("restarting etcd")?,
    }
    outages.push((down, lines::wall_micros()));
    Ok(())
}

/// The operator processes of a run, and what their deaths leave for the checks.
#[derive(Default)]
struct Procs {
    operators: Vec<Operator>,
    /// The next incarnation's number.
    next: u32,
    killed: HashSet<u32>,
    deaths: HashMap<u32, u64>,
}

impl Procs {
    /// Starts the next incarnation.
    fn start(
        &mut self,
        env: &Envtest,
        args: &ChaosArgs,
        records: &std::path::Path,
    ) -> Result<Operator> {
        let operator = Operator::start(env, args, records, self.next)?;
        self.next += 1;
        Ok(operator)
    }

    /// Kills operator `i` with SIGKILL, recording when, and starts a new incarnation in its
    /// place.
    fn kill_and_restart(
        &mut self,
        i: usize,
        env: &Envtest,
        args: &ChaosArgs,
        records: &std::path::Path,
    ) -> Result<()> {
        let (incarnation, at) = self.operators.remove(i).kill();
        self.killed.insert(incarnation);
        self.deaths.insert(incarnation, at);
        let next = self.start(env, args, records)?;
        self.operators.insert(i, next);
        Ok(())
    }
}

/// Waits until every item in `names` that exists is Ready for its generation; counts those that
/// are not within [`CONVERGE`] (not converged; stale status) and appends every status seen to
/// `statuses`; a Ready item whose side effect is not recorded done for its generation counts
/// as a missing effect.
async fn converge(
    items: &Api<ChaosItem>,
    names: &[&str],
    violations: &mut Violations,
    statuses: &mut String,
) -> Result<()> {
    converge_within(items, names, violations, statuses, CONVERGE).await
}

/// [`converge`] within `limit`.
async fn converge_within(
    items: &Api<ChaosItem>,
    names: &[&str],
    violations: &mut Violations,
    statuses: &mut String,
    limit: Duration,
) -> Result<()> {
    let wanted: HashSet<&str> = names.iter().copied().collect();
    let deadline = Instant::now() + limit;
    loop {
        let all = list(items).await?;
        let mine: Vec<&ChaosItem> = all
            .iter()
            .filter(|i| wanted.contains(i.name_any().as_str()))
            .collect();
        let ready = |i: &ChaosItem| {
            i.status
                .as_ref()
                .is_some_and(|s| s.is_ready() && s.observed_generation == i.metadata.generation)
        };
        let not_ready = mine.iter().filter(|i| !ready(i)).count();
        if not_ready == 0 || Instant::now() >= deadline {
            for i in &mine {
                let status = i.status.clone().unwrap_or_default();
                statuses.push_str(&serde_json::to_string(&status)?);
                if !ready(i) {
                    if status.is_ready() {
                        violations.stale_status += 1;
                    } else {
                        violations.not_converged += 1;
                    }
                    eprintln!("chaos: {} did not converge: {status:?}", i.name_any());
                }
                let effect_done = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == EFFECT && c.observed_generation == i.metadata.generation);
                if ready(i) && !effect_done {
                    violations.missing_effects += 1;
                }
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until no item in `names` exists; counts those still there after [`CONVERGE`].
async fn wait_gone(
    items: &Api<ChaosItem>,
    names: &HashSet<String>,
    violations: &mut Violations,
) -> Result<()> {
    wait_gone_within(items, names, violations, CONVERGE).await
}

/// [`wait_gone`] within `limit`.
async fn wait_gone_within(
    items: &Api<ChaosItem>,
    names: &HashSet<String>,
    violations: &mut Violations,
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let all = list(items).await?;
        let left: Vec<&ChaosItem> = all
            .iter()
            .filter(|i| names.contains(&i.name_any()))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            for i in left {
                eprintln!(
                    "chaos: {} was deleted and is still there: finalizers {:?}, status {:?}",
                    i.name_any(),
                    i.finalizers(),
                    i.status
                );
                violations.leaked_finalizers += 1;
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Child ConfigMaps whose item is gone (orphaned), live items without theirs (missing).
async fn check_children(
    admin: &Client,
    items: &Api<ChaosItem>,
    violations: &mut Violations,
) -> Result<()> {
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let maps = list(&maps).await?;
    let live: HashSet<String> = list(items).await?.iter().map(|i| i.name_any()).collect();
    let children: HashSet<String> = maps
        .iter()
        .filter_map(|m| m.name_any().strip_suffix(CHILD_SUFFIX).map(str::to_string))
        .collect();
    violations.orphaned_children += children.difference(&live).count();
    violations.missing_children += live.difference(&children).count();
    Ok(())
}

/// Items (all deleted by the end) whose deprovision side effect, or whose teardown step, never
/// ran. (Provision effects
/// of Ready items are checked on their status as each phase converges.)
fn missing_deprovisions(effects: &check::Effects) -> usize {
    let provisioned: HashSet<&str> = effects
        .provisioned
        .keys()
        .map(|(u, _)| u.as_str())
        .collect();
    provisioned
        .iter()
        .filter(|uid| !effects.deprovisioned.contains_key(**uid))
        .count()
        + provisioned
            .iter()
            .filter(|uid| !effects.torn_down.contains_key(**uid))
            .count()
}

#[cfg(test)]
mod secret_form_tests {
    #[test]
    fn a_secret_is_found_in_base64_text_at_any_offset() {
        use base64::Engine;
        let secret = "planted-secret-0123456789abcdef";
        let forms = super::base64_forms(secret);
        for prefix in ["", "a", "ab", "abc", "{\"token\":\""] {
            let text = base64::engine::general_purpose::STANDARD
                .encode(format!("{prefix}{secret}\" and more"));
            assert!(
                forms.iter().any(|f| text.contains(f.as_str())),
                "{prefix:?}: {text} holds none of {forms:?}"
            );
        }
    }
}
