//! `actorcile simulate`: compare supervisor policies on a seeded scenario, in virtual time.
//!
//! ```text
//! actorcile simulate --scenario flaky --policy default --policy aggressive --policy my.toml \
//!     --plot ready.svg --json
//! ```
//!
//! Each policy runs in a fresh in-process cluster and runtime, one after another, on the same
//! scenario (see [`scenario`]): N objects whose provisioners take time, yield, fail and panic as
//! the scenario says, under the API faults it names. Every run is on its own current-thread tokio
//! runtime with a paused clock that advances by itself when nothing is runnable, so an hour of
//! behaviour takes seconds, and every random choice is seeded (provisioner behaviour per object
//! name and reconcile, the policy's `seed` — set from the scenario's when the policy has none — and
//! the cluster's fault seed): the same scenario and policies give the same report.
//!
//! Reported per policy: virtual time until 50/90/99/100 % of the objects were Ready, runs,
//! restarts, quarantined resources, API requests and peak runs in flight ([`PolicyResult`]). A
//! table by default; `--json` adds one JSON object as the last line; `--plot out.svg|out.png`
//! draws the fraction Ready over virtual time.

mod common;
pub mod engine;
pub mod plot;
pub mod policies;
pub mod report;
pub mod scenario;
pub mod workload;

pub(crate) use common::{built_in_names, mix};

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

pub use policies::NamedPolicy;
pub use report::{Comparison, PolicyResult};
pub use scenario::Scenario;

/// Arguments of `actorcile simulate`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SimulateArgs {
    /// The scenario: a built-in name (steady, flaky, panicky, slow-api, hour-10k, infra) or a TOML file.
    #[arg(long, default_value = "flaky")]
    pub scenario: String,
    /// A policy to compare: a built-in name (default, aggressive, conservative, fail-fast,
    /// polling) or a TOML file. Repeat to compare several. Default: default, aggressive, conservative.
    #[arg(long = "policy", value_name = "POLICY")]
    pub policies: Vec<String>,
    /// Override the scenario's number of objects.
    #[arg(long)]
    pub objects: Option<usize>,
    /// Override the scenario's virtual time limit (e.g. "30m", "2h").
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Override the scenario's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run the whole duration even once every object is Ready (steady-state cost, e.g. of
    /// polling); sets the scenario's `stop_when_ready = false`.
    #[arg(long)]
    pub full_duration: bool,
    /// Also print the report as one JSON object, on the last line.
    #[arg(long)]
    pub json: bool,
    /// Draw the fraction Ready over virtual time to this file (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// List the built-in scenarios and policies, and exit.
    #[arg(long)]
    pub list: bool,
    /// Keep the runtime's log output (by default it is silenced during runs: injected failures
    /// would flood it).
    #[arg(long)]
    pub verbose: bool,
}

/// The scenario `args` ask for, with their overrides applied and validated.
pub fn scenario_of(args: &SimulateArgs) -> anyhow::Result<Scenario> {
    let mut s = Scenario::resolve(&args.scenario)?;
    if let Some(n) = args.objects {
        s.objects = n;
    }
    if let Some(d) = args.duration {
        s.duration = d;
    }
    if let Some(seed) = args.seed {
        s.seed = seed;
    }
    if args.full_duration {
        s.stop_when_ready = false;
    }
    s.validate()
        .context("after applying --objects/--duration/--seed")?;
    Ok(s)
}

/// Run `scenario` once per policy, each on a fresh paused-clock runtime. `progress` is told
/// each result as it comes.
pub fn compare(
    scenario: &Scenario,
    policies: &[NamedPolicy],
    mut progress: impl FnMut(&PolicyResult),
) -> anyhow::Result<Comparison> {
    workload::quiet_injected_panics();
    let mut results = Vec::with_capacity(policies.len());
    for p in policies {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .context("cannot build the tokio runtime")?;
        let r = rt
            .block_on(engine::run_one(scenario, &p.name, &p.policy))
            .with_context(|| format!("policy {}", p.name))?;
        // Dropping the runtime ends whatever the run left behind (timers of stopped actors).
        drop(rt);
        progress(&r);
        results.push(r);
    }
    Ok(Comparison {
        scenario: scenario.into(),
        results,
    })
}

fn listing() -> String {
    let mut out = String::from("built-in scenarios:\n");
    for (name, _) in scenario::BUILT_INS {
        let s = Scenario::built_in(name).expect("built-in");
        out.push_str(&format!(
            "  {name:<14} {} objects, {}: {}\n",
            s.objects,
            humantime_serde::re::humantime::format_duration(s.duration),
            s.description
        ));
    }
    out.push_str("built-in policies:\n");
    for (name, _) in policies::BUILT_INS {
        let p = policies::built_in(name).expect("built-in");
        out.push_str(&format!(
            "  {name:<14} max_restarts {} in {}, restart backoff {}..{}, error backoff {}..{}, {} runs in flight\n",
            p.kind.restart.max_restarts,
            humantime_serde::re::humantime::format_duration(p.kind.restart.window),
            humantime_serde::re::humantime::format_duration(p.kind.restart.backoff.min),
            humantime_serde::re::humantime::format_duration(p.kind.restart.backoff.max),
            humantime_serde::re::humantime::format_duration(p.kind.error_backoff.min),
            humantime_serde::re::humantime::format_duration(p.kind.error_backoff.max),
            p.runtime.max_concurrent_reconciles,
        ));
    }
    out
}

/// `actorcile simulate`: resolve the scenario and policies, run them, print the report, draw the
/// plot. Errors (a bad scenario or policy file names the field) are returned for the caller to
/// print and exit non-zero.
///
/// Builds its own tokio runtimes (one per policy, current-thread, paused clock). Called from
/// inside a tokio runtime, it does the work on a thread of its own.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return std::thread::scope(|s| {
            s.spawn(move || run_here(args))
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the simulation thread panicked")))
        });
    }
    run_here(args)
}

fn run_here(args: SimulateArgs) -> anyhow::Result<()> {
    if args.list {
        print!("{}", listing());
        return Ok(());
    }
    let scenario = scenario_of(&args)?;
    let policies = policies::resolve_all(&args.policies)?;
    if let Some(p) = &args.plot {
        crate::plot_file::format_of(p)?;
    }
    let _quiet = (!args.verbose)
        .then(|| tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default()));
    eprintln!(
        "simulating scenario {} ({} objects, up to {} virtual) under {} policies",
        scenario.name,
        scenario.objects,
        humantime_serde::re::humantime::format_duration(scenario.duration),
        policies.len()
    );
    let comparison = compare(&scenario, &policies, |r| {
        eprintln!(
            "  {}: {}/{} Ready after {:.0}s virtual, {:.1}s wall",
            r.policy, r.ready_at_end, r.objects, r.virtual_seconds, r.wall_seconds
        );
    })?;
    print!("{}", comparison.table());
    if let Some(p) = &args.plot {
        plot::plot(p, &comparison)?;
        eprintln!("plot written to {}", p.display());
    }
    if args.json {
        println!("{}", comparison.to_json());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use actorcile::policy::{Exhausted, SupervisorPolicy};
    use std::sync::mpsc;

    /// Run `f` on its own thread; fail the test if it takes longer than `limit` of wall time.
    fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| panic!("did not finish within {limit:?} of wall time"))
    }

    const LIMIT: Duration = Duration::from_secs(180);

    fn small_flaky() -> Scenario {
        let mut s = Scenario::built_in("flaky").unwrap();
        s.objects = 60;
        s.duration = Duration::from_secs(600);
        s
    }

    #[test]
    fn a_scenario_with_nodes_converges_through_the_simulated_provider_and_stuck_nodes_show() {
        let run = |stuck: f64| {
            let mut s = Scenario::built_in("infra").unwrap();
            s.objects = 30;
            s.duration = Duration::from_secs(300);
            s.nodes.as_mut().unwrap().stuck_rate = stuck;
            let policies = policies::resolve_all(&["default".into()]).unwrap();
            bounded(LIMIT, move || compare(&s, &policies, |_| {}).unwrap())
        };
        let ok = run(0.0);
        assert_eq!(
            ok.results[0].ready_at_end, 30,
            "every object's nodes came up"
        );
        let stuck = run(0.2);
        let r = &stuck.results[0];
        assert!(
            r.ready_at_end < 30,
            "objects with a stuck node never become Ready: {} of 30",
            r.ready_at_end
        );
    }

    fn named(name: &str, policy: SupervisorPolicy) -> NamedPolicy {
        NamedPolicy {
            name: name.into(),
            policy,
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("actorcile-sim-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn same_seed_gives_an_identical_report_and_another_seed_does_not() {
        let (a, b, c) = bounded(LIMIT, || {
            let policies =
                policies::resolve_all(&["default".into(), "aggressive".into(), "polling".into()])
                    .unwrap();
            let s = small_flaky();
            let a = compare(&s, &policies, |_| {}).unwrap();
            let b = compare(&s, &policies, |_| {}).unwrap();
            let mut other = s.clone();
            other.seed += 1;
            let c = compare(&other, &policies, |_| {}).unwrap();
            (a, b, c)
        });
        let det = |c: &Comparison| -> Vec<PolicyResult> {
            c.results.iter().map(PolicyResult::deterministic).collect()
        };
        assert_eq!(det(&a), det(&b));
        assert_ne!(det(&a), det(&c), "a different seed draws differently");
        let s_objects = small_flaky().objects as u64;
        for r in &a.results {
            assert!(r.runs > 0 && r.api_requests > 0, "{r:?}");
            assert!(
                (1..=s_objects).contains(&r.peak_live_actors),
                "every object had an actor, never more than one: {r:?}"
            );
            assert!(
                r.injected_errors + r.injected_conflicts > 0,
                "faults were injected: {r:?}"
            );
            assert!(r.restarts > 0, "panics were injected and restarted: {r:?}");
            assert!(r.series.len() > 2, "{r:?}");
        }
    }

    #[test]
    fn restart_intensity_decides_quarantine_on_a_failure_heavy_scenario() {
        let mut s = Scenario::built_in("panicky").unwrap();
        s.objects = 40;
        s.duration = Duration::from_secs(1800);
        s.faults = Default::default();
        let strict = policies::built_in("fail-fast").unwrap();
        let mut lenient = SupervisorPolicy::default();
        lenient.kind.restart.max_restarts = 1000;
        lenient.kind.restart.backoff.min = Duration::from_millis(10);
        lenient.kind.restart.backoff.max = Duration::from_millis(100);
        let policies = vec![named("strict", strict), named("lenient", lenient)];
        let c = bounded(LIMIT, move || compare(&s, &policies, |_| {}).unwrap());
        let (strict, lenient) = (&c.results[0], &c.results[1]);
        assert!(strict.quarantined > 0, "{strict:?}");
        assert_eq!(
            strict.restarts, 0,
            "max_restarts 0 never restarts: {strict:?}"
        );
        assert!(strict.ready_at_end < strict.objects, "{strict:?}");
        assert_eq!(strict.time_to_ready.p100, None);
        assert_eq!(
            strict.not_ready.get("Quarantined").copied(),
            Some(strict.quarantined as usize),
            "{strict:?}"
        );
        assert_eq!(lenient.quarantined, 0, "{lenient:?}");
        assert!(lenient.restarts > 0, "{lenient:?}");
        assert_eq!(lenient.ready_at_end, lenient.objects, "{lenient:?}");
        assert!(lenient.time_to_ready.p100.is_some());
        assert!(lenient.not_ready.is_empty());
        // the run stops once everything is Ready
        assert!(lenient.virtual_seconds < 1800.0, "{lenient:?}");
    }

    #[test]
    fn an_escalating_policy_stops_the_run_and_says_so() {
        let mut s = Scenario::built_in("panicky").unwrap();
        s.objects = 20;
        s.duration = Duration::from_secs(1800);
        let mut p = SupervisorPolicy::default();
        p.kind.restart.max_restarts = 0;
        p.kind.restart.on_exhausted = Exhausted::Escalate;
        let policies = vec![named("escalate", p)];
        let c = bounded(LIMIT, move || compare(&s, &policies, |_| {}).unwrap());
        let r = &c.results[0];
        assert!(r.escalated.is_some(), "{r:?}");
        assert!(r.virtual_seconds < 1800.0, "{r:?}");
        assert!(c.table().contains("escalated"));
    }

    #[test]
    fn bad_scenario_file_fails_naming_the_field() {
        let dir = temp_dir("badscn");
        let p = dir.join("bad.toml");
        std::fs::write(&p, "objects = 5\n[provisioner]\nfailure_rate = 1.5\n").unwrap();
        let args = SimulateArgs {
            scenario: p.display().to_string(),
            ..SimulateArgs::default()
        };
        let e = run(args).unwrap_err();
        assert!(
            format!("{e:#}").contains("provisioner.failure_rate"),
            "{e:#}"
        );
        std::fs::write(&p, "objects = 5\nobjcts = 5\n").unwrap();
        let args = SimulateArgs {
            scenario: p.display().to_string(),
            ..SimulateArgs::default()
        };
        let e = run(args).unwrap_err();
        assert!(format!("{e:#}").contains("objcts"), "{e:#}");
        let args = SimulateArgs {
            scenario: "flaky".into(),
            objects: Some(0),
            ..SimulateArgs::default()
        };
        let e = run(args).unwrap_err();
        assert!(format!("{e:#}").contains("objects"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_policy_file_fails_naming_the_field() {
        let dir = temp_dir("badpol");
        let p = dir.join("bad-policy.toml");
        std::fs::write(&p, "[restart]\nmax_restarts = -1\n").unwrap();
        let args = SimulateArgs {
            scenario: "steady".into(),
            policies: vec!["default".into(), p.display().to_string()],
            ..SimulateArgs::default()
        };
        let e = run(args).unwrap_err();
        assert!(format!("{e:#}").contains("max_restarts"), "{e:#}");
        std::fs::write(&p, "poll_jitter = 2.0\n").unwrap();
        let args = SimulateArgs {
            scenario: "steady".into(),
            policies: vec![p.display().to_string()],
            ..SimulateArgs::default()
        };
        let e = run(args).unwrap_err();
        assert!(format!("{e:#}").contains("poll_jitter"), "{e:#}");
        let args = SimulateArgs {
            scenario: "steady".into(),
            plot: Some(dir.join("out.gif")),
            ..SimulateArgs::default()
        };
        let e = run(args).unwrap_err();
        assert!(format!("{e:#}").contains(".svg or .png"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_writes_a_plot_naming_every_policy() {
        let dir = temp_dir("plotrun");
        let scenario = dir.join("tiny.toml");
        std::fs::write(
            &scenario,
            "objects = 20\nduration = \"5m\"\n[provisioner]\nsteps = 2\nmax_yields = 1\n",
        )
        .unwrap();
        let out = dir.join("ready.svg");
        let args = SimulateArgs {
            scenario: scenario.display().to_string(),
            policies: vec!["aggressive".into(), "conservative".into()],
            plot: Some(out.clone()),
            json: true,
            ..SimulateArgs::default()
        };
        bounded(LIMIT, move || run(args)).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.len() > 1000);
        assert!(svg.contains("aggressive") && svg.contains("conservative"));
        assert!(svg.contains("tiny: 20 objects"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn run_works_from_inside_a_tokio_runtime() {
        let args = SimulateArgs {
            scenario: "steady".into(),
            objects: Some(10),
            duration: Some(Duration::from_secs(120)),
            policies: vec!["default".into()],
            ..SimulateArgs::default()
        };
        tokio::time::timeout(LIMIT, tokio::task::spawn_blocking(move || run(args)))
            .await
            .expect("bounded")
            .unwrap()
            .unwrap();
        // and directly on the runtime's thread
        let args = SimulateArgs {
            list: true,
            ..SimulateArgs::default()
        };
        run(args).unwrap();
        let args = SimulateArgs {
            scenario: "steady".into(),
            objects: Some(5),
            duration: Some(Duration::from_secs(60)),
            policies: vec!["default".into()],
            ..SimulateArgs::default()
        };
        run(args).unwrap();
    }

    #[test]
    fn full_duration_keeps_running_after_everything_is_ready() {
        let mut s = Scenario::built_in("steady").unwrap();
        s.objects = 10;
        s.duration = Duration::from_secs(300);
        let policies = policies::resolve_all(&["polling".into()]).unwrap();
        let stop = s.clone();
        s.stop_when_ready = false;
        let (early, full) = bounded(LIMIT, move || {
            (
                compare(&stop, &policies, |_| {}).unwrap(),
                compare(&s, &policies, |_| {}).unwrap(),
            )
        });
        let (early, full) = (&early.results[0], &full.results[0]);
        assert!(early.virtual_seconds < 60.0, "{early:?}");
        assert_eq!(full.virtual_seconds, 300.0, "{full:?}");
        assert_eq!(full.time_to_ready, early.time_to_ready);
        // a policy that polls every minute keeps running Ready objects
        assert!(
            full.runs >= early.runs + 3 * 10,
            "{} vs {}",
            full.runs,
            early.runs
        );
        assert!(full.series.len() > 290);
    }

    #[test]
    fn listing_names_every_built_in() {
        let l = listing();
        for (n, _) in scenario::BUILT_INS.iter().chain(policies::BUILT_INS) {
            assert!(l.contains(n), "{n} missing from {l}");
        }
    }
}
