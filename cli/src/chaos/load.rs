//! `actorcile chaos --load`: many items at once on the real control plane, the operator stopped
//! gracefully (SIGTERM) in the middle and started again, then everything deleted; the same
//! invariants as the chaos rounds, with the time to all Ready, to all gone, and the operator's
//! peak memory.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actorcile::envtest::Envtest;
use anyhow::Result;
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use serde::Serialize;

use super::operator::{ChaosItem, ChaosItemSpec};
use super::process::Operator;
use super::{NAMESPACE, Report, check, lines};

/// What a load run measures.
#[derive(Debug, Default, Serialize)]
pub struct LoadFigures {
    /// Seconds from the first create until every item was Ready (the graceful restart
    /// included).
    pub ready_seconds: f64,
    /// Seconds from the first create to the SIGTERM.
    pub sigterm_at_seconds: f64,
    /// Reconciles running when the SIGTERM came.
    pub reconciles_in_flight_at_sigterm: usize,
    /// Seconds from the first delete until every item was gone.
    pub deleted_seconds: f64,
    /// The highest peak resident memory of the operator's processes (`VmHWM`), in bytes.
    pub operator_peak_rss_bytes: u64,
}

/// Requests the driver keeps in flight while it creates or deletes.
const IN_FLIGHT: usize = 32;

/// How long a phase of `n` items may take before its stragglers count as violations.
fn limit(n: usize) -> Duration {
    super::CONVERGE + Duration::from_millis(30 * n as u64)
}

/// `VmHWM` of process `pid`, in bytes (`None` once it is gone).
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    crate::bench::stats::proc_status_field_bytes(&status, "VmHWM")
}

/// Samples the peak RSS of whichever operator process is current, every 100 ms.
struct RssSampler {
    pid: Arc<AtomicU32>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let pid = Arc::new(AtomicU32::new(pid));
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (pid, peak, stop) = (pid.clone(), peak.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(b) = peak_rss(pid.load(Ordering::Relaxed)) {
                        peak.fetch_max(b, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Self {
            pid,
            peak,
            stop,
            task,
        }
    }

    /// Samples `old` once more (just before it stops) and follows `new` from now on.
    fn switch(&self, old: u32, new: u32) {
        if let Some(b) = peak_rss(old) {
            self.peak.fetch_max(b, Ordering::Relaxed);
        }
        self.pid.store(new, Ordering::Relaxed);
    }

    async fn finish(self, last: u32) -> u64 {
        if let Some(b) = peak_rss(last) {
            self.peak.fetch_max(b, Ordering::Relaxed);
        }
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak.load(Ordering::Relaxed)
    }
}

/// The load run: see the module's documentation.
pub(super) async fn drive(
    args: &super::ChaosArgs,
    env: &mut Envtest,
    records: &Path,
) -> Result<Report> {
    // No injected faults but the graceful restart.
    let args = super::ChaosArgs {
        panic_rate: 0.0,
        hang_rate: 0.0,
        api: super::ApiFaultRates::default(),
        ..args.clone()
    };
    let planted = super::setup::set_up(env, &args, records).await?;
    let admin = env.client();
    let items: Api<ChaosItem> = Api::namespaced(admin.clone(), NAMESPACE);
    let watch = super::order::Watch::start(items.clone());
    let mut report = Report {
        seed: args.seed,
        rounds: 1,
        ..Default::default()
    };
    let mut figures = LoadFigures::default();
    let mut deaths = HashMap::new();
    let mut statuses = String::new();
    let all = super::round_items(0, args.objects);
    report.objects = all.len();
    report.deleted = all.len();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();

    let mut operator = Operator::start(env, &args, records, 0)?;
    let rss = RssSampler::start(operator.pid());
    let since = lines::wall_micros();
    let first_create = Instant::now();
    futures::stream::iter(&all)
        .map(|(name, uses)| {
            let item = ChaosItem::new(
                name,
                ChaosItemSpec {
                    uses: uses.clone(),
                    revision: 0,
                },
            );
            let items = items.clone();
            async move { super::create(&items, &item, "creating an item").await }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<()>()
        .await?;

    // Once half the items started a reconcile: SIGTERM, and a new process.
    super::reconciles_started(records, since, "provision", all.len() / 2, limit(all.len())).await?;
    let old_pid = operator.pid();
    rss.switch(old_pid, old_pid);
    figures.sigterm_at_seconds = first_create.elapsed().as_secs_f64();
    let sigterm_at = lines::wall_micros();
    let (incarnation, clean) = operator.stop().await;
    deaths.insert(incarnation, lines::wall_micros());
    if !clean {
        report.violations.unclean_shutdowns += 1;
    }
    operator = Operator::start(env, &args, records, incarnation + 1)?;
    rss.switch(old_pid, operator.pid());
    super::converge_within(
        &items,
        &names,
        &mut report.violations,
        &mut statuses,
        limit(all.len()),
    )
    .await?;
    figures.ready_seconds = first_create.elapsed().as_secs_f64();
    super::check_children(&admin, &items, &mut report.violations).await?;

    // Every item deleted, at once.
    let first_delete = Instant::now();
    futures::stream::iter(&names)
        .map(|name| {
            let items = items.clone();
            async move { super::delete(&items, name).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<()>()
        .await?;
    let doomed: HashSet<String> = names.iter().map(|n| n.to_string()).collect();
    super::wait_gone_within(&items, &doomed, &mut report.violations, limit(all.len())).await?;
    figures.deleted_seconds = first_delete.elapsed().as_secs_f64();
    super::check_children(&admin, &items, &mut report.violations).await?;

    let last_pid = operator.pid();
    figures.operator_peak_rss_bytes = rss.finish(last_pid).await;
    let (incarnation, clean) = operator.stop().await;
    deaths.insert(incarnation, lines::wall_micros());
    if !clean {
        report.violations.unclean_shutdowns += 1;
    }
    report.violations.deletion_order = watch.stop().await;
    // Nothing was killed: every repeated side effect is a violation.
    super::check_records(
        records,
        super::Fates {
            deaths: &deaths,
            killed: &HashSet::new(),
            pauses: &[],
        },
        &planted,
        &admin,
        &statuses,
        &mut report,
    )
    .await?;
    figures.reconciles_in_flight_at_sigterm = check::reconciles(records, &deaths)?
        .iter()
        .filter(|p| p.incarnation == 0 && p.start < sigterm_at && p.end >= sigterm_at)
        .count();
    report.load = Some(figures);
    Ok(report)
}
