//! The simulated workload: a sample CRD and a provisioner tree whose behaviour is drawn from the
//! scenario, reproducibly.
//!
//! Each object's tree is `steps` steps in series. On every visit a step draws from a generator
//! seeded by (scenario seed, object name, reconcile number, step index):
//! it takes `latency + U[0, latency_jitter]` of virtual time, then panics with probability
//! `panic_rate`, fails transiently with probability `failure_rate`, and otherwise makes progress:
//! it yields until it has yielded its quota (drawn per object and step from
//! `[min_yields, max_yields]`), then it is done. Progress and reconcile counts live outside the actors
//! (they model the external system), so nothing is lost when an actor is restarted.

use std::sync::Arc;

use actorcile::prelude::*;
use actorcile::provisioners::BoxProvisioner;
use dashmap::DashMap;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::mix;
use super::scenario::{NodesSpec, Workload};
use actorcile::providers::simulated::{ProviderFaults, SimulatedProvider};
use actorcile::providers::{NodeRole, NodeSpec};
use actorcile::provisioners::{NodeSet, nodes as nodes_step};

/// Every injected panic's message starts with this (so the panic hook can keep them quiet).
pub const PANIC_MARKER: &str = "actorcile-simulate: injected panic";

/// The simulated resource.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "simulate.actorcile.dev",
    version = "v1",
    kind = "SimObject",
    namespaced,
    status = "ResourceStatus"
)]
pub struct SimObjectSpec {
    /// The object's number within the scenario.
    pub index: u32,
}

/// An injected transient failure (what a real provisioner's error would be).
#[derive(Debug, thiserror::Error)]
#[error("injected failure of step {step} on reconcile {reconcile}")]
pub struct InjectedFailure {
    step: u32,
    reconcile: u64,
}

/// Per-object progress, held outside the actors.
#[derive(Debug)]
struct Progress {
    reconcile: u64,
    yields_done: Vec<u32>,
}

/// The behaviour shared by every step of every object.
pub struct Behaviour {
    seed: u64,
    workload: Workload,
    progress: DashMap<String, Progress>,
}

fn name_hash(s: &str) -> u64 {
    // FNV-1a: stable across Rust versions, unlike std's hashers.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Reconcile number used to draw an object's yield quotas (never a real reconcile).
const QUOTA_PASS: u64 = u64::MAX;

impl Behaviour {
    /// Behaviour of `workload`, seeded with the scenario's `seed`.
    pub fn new(seed: u64, workload: Workload) -> Arc<Self> {
        Arc::new(Self {
            seed,
            workload,
            progress: DashMap::new(),
        })
    }

    /// How many yields `step` of `name` makes before it is done.
    fn quota(&self, name: &str, step: u32) -> u32 {
        let w = &self.workload;
        let mut rng =
            fastrand::Rng::with_seed(mix(&[self.seed, name_hash(name), QUOTA_PASS, step.into()]));
        rng.u32(w.min_yields..=w.max_yields)
    }

    /// One visit of `step` on the object named `name`.
    pub async fn visit(&self, step: u32, name: &str) -> Outcome {
        let w = &self.workload;
        let reconcile = {
            let mut p = self
                .progress
                .entry(name.to_string())
                .or_insert_with(|| Progress {
                    reconcile: 0,
                    yields_done: vec![0; w.steps as usize],
                });
            if step == 0 {
                p.reconcile += 1;
            }
            p.reconcile
        };
        let mut rng =
            fastrand::Rng::with_seed(mix(&[self.seed, name_hash(name), reconcile, step.into()]));
        let work = w.latency + w.latency_jitter.mul_f64(rng.f64());
        if !work.is_zero() {
            tokio::time::sleep(work).await;
        }
        let r = rng.f64();
        if r < w.panic_rate {
            panic!("{PANIC_MARKER} in step {step} of {name} on reconcile {reconcile}");
        }
        if r < w.panic_rate + w.failure_rate {
            return Outcome::failed(
                Reason::new("SimulatedFailure", format!("step {} failed", step + 1)),
                InjectedFailure { step, reconcile },
            );
        }
        let quota = self.quota(name, step);
        let yielded = self.progress.get_mut(name).is_some_and(|mut p| {
            let done = &mut p.yields_done[step as usize];
            if *done < quota {
                *done += 1;
                true
            } else {
                false
            }
        });
        if yielded {
            let reason = Reason::new(
                "SimulatedWork",
                format!("step {} of {} in progress", step + 1, w.steps),
            );
            return match w.yield_after {
                Some(after) => Outcome::yield_after(after, reason),
                None => Outcome::yield_now(reason),
            };
        }
        Outcome::Done
    }

    /// Reconciles the object named `name` has started so far.
    #[cfg(test)]
    pub fn reconciles(&self, name: &str) -> u64 {
        self.progress.get(name).map_or(0, |p| p.reconcile)
    }
}

/// The provisioner tree of every [`SimObject`]: `steps` steps in series, then, when the scenario
/// has `[nodes]`, a `nodes(..)` step converging the object's cluster on a simulated provider
/// seeded from the scenario's seed.
pub fn tree(behaviour: Arc<Behaviour>, nodes: Option<NodesSpec>) -> impl Provisioner<SimObject> {
    let mut children: Vec<BoxProvisioner<SimObject>> = (0..behaviour.workload.steps)
        .map(|i| {
            let b = behaviour.clone();
            boxed(step(
                format!("step-{}", i + 1),
                move |cx: Context<SimObject>| {
                    let b = b.clone();
                    async move { b.visit(i, &cx.object().name_any()).await }
                },
            ))
        })
        .collect();
    if let Some(spec) = nodes {
        let faults = ProviderFaults {
            latency: (spec.latency, spec.latency + spec.latency_jitter),
            failure_rate: spec.failure_rate,
            stuck_rate: spec.stuck_rate,
        };
        let provider = Arc::new(SimulatedProvider::new(
            mix(&[behaviour.seed, 0x40DE]),
            faults,
        ));
        let (control_planes, workers) = (spec.control_planes, spec.workers);
        children.push(boxed(nodes_step(provider, move |o: &SimObject| {
            NodeSet::new(
                o.name_any(),
                control_planes,
                workers,
                NodeSpec::new("", NodeRole::Worker, "simulated"),
            )
        })));
    }
    actorcile::provisioners::serial("simulated", children)
}

/// A quiet hook for injected panics: they are the scenario, not bugs. Every other panic goes to
/// the previous hook. Installed once per process.
pub fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            if msg.is_some_and(|m| m.starts_with(PANIC_MARKER)) {
                return;
            }
            previous(info)
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn workload() -> Workload {
        Workload {
            steps: 2,
            latency: Duration::ZERO,
            latency_jitter: Duration::ZERO,
            min_yields: 1,
            max_yields: 4,
            yield_after: Some(Duration::from_secs(1)),
            failure_rate: 0.3,
            panic_rate: 0.0,
        }
    }

    async fn outcomes(b: &Behaviour, name: &str, reconciles: usize) -> Vec<String> {
        let mut v = Vec::new();
        for _ in 0..reconciles {
            for step in 0..2 {
                let o = b.visit(step, name).await;
                let done = o.is_done();
                v.push(format!(
                    "{step}:{:?}",
                    o.reason().map(|r| r.code().to_string())
                ));
                if !done {
                    break;
                }
            }
        }
        v
    }

    #[tokio::test(start_paused = true)]
    async fn behaviour_is_a_function_of_seed_name_and_reconcile() {
        let a = outcomes(&Behaviour::new(5, workload()), "obj-1", 30).await;
        let b = outcomes(&Behaviour::new(5, workload()), "obj-1", 30).await;
        assert_eq!(a, b);
        let c = outcomes(&Behaviour::new(6, workload()), "obj-1", 30).await;
        let d = outcomes(&Behaviour::new(5, workload()), "obj-2", 30).await;
        assert!(a != c || a != d, "seed and name change the draws");
        assert!(a.iter().any(|o| o.contains("SimulatedFailure")));
        assert!(a.iter().any(|o| o.contains("SimulatedWork")));
        assert!(a.iter().any(|o| o == "1:None"), "eventually done: {a:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_virtual_time_and_quota_is_respected() {
        let w = Workload {
            steps: 1,
            latency: Duration::from_millis(100),
            latency_jitter: Duration::from_millis(50),
            min_yields: 2,
            max_yields: 2,
            failure_rate: 0.0,
            ..workload()
        };
        let b = Behaviour::new(1, w);
        let t0 = tokio::time::Instant::now();
        let o: Vec<bool> = [
            b.visit(0, "x").await,
            b.visit(0, "x").await,
            b.visit(0, "x").await,
        ]
        .iter()
        .map(Outcome::is_done)
        .collect();
        assert_eq!(o, vec![false, false, true]);
        assert_eq!(b.reconciles("x"), 3);
        let spent = t0.elapsed();
        assert!(
            spent >= Duration::from_millis(300) && spent <= Duration::from_millis(450),
            "{spent:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn injected_panics_carry_the_marker() {
        let w = Workload {
            steps: 1,
            panic_rate: 1.0,
            failure_rate: 0.0,
            ..workload()
        };
        quiet_injected_panics();
        let b = Behaviour::new(1, w);
        let r = tokio::spawn(async move { b.visit(0, "p").await }).await;
        let err = r.unwrap_err();
        assert!(err.is_panic());
        let payload = err.into_panic();
        let msg = payload.downcast_ref::<String>().unwrap();
        assert!(msg.starts_with(PANIC_MARKER), "{msg}");
    }
}
