//! A provider that runs nothing: in-memory nodes with seeded latency, failures and stuck nodes,
//! for tests, benchmarks and policy simulations. Deterministic for a seed: the same calls in the
//! same order give the same latencies, failures and stuck nodes.
//!
//! ```
//! use std::time::Duration;
//! use actorcile::providers::simulated::{ProviderFaults, SimulatedProvider};
//! use actorcile::providers::{NodeRole, NodeSpec, NodeState, Provider};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // every call takes 1–5 ms; one call in ten fails; one started node in four never runs
//! let faults = ProviderFaults {
//!     latency: (Duration::from_millis(1), Duration::from_millis(5)),
//!     failure_rate: 0.1,
//!     stuck_rate: 0.25,
//! };
//! let provider = SimulatedProvider::new(42, faults);
//! let _ = provider.create_node("dev", &NodeSpec::new("dev-w-0", NodeRole::Worker, "node:1")).await;
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use super::{NodeInfo, NodeSpec, NodeState, Provider, ProviderError};

/// The faults a [`SimulatedProvider`] injects.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderFaults {
    /// Each call takes a duration drawn uniformly from this range (tokio time, so a paused
    /// clock runs it instantly).
    pub latency: (Duration, Duration),
    /// The fraction of calls that fail ([`ProviderError::Refused`]).
    pub failure_rate: f64,
    /// The fraction of started nodes that stay [`NodeState::Starting`] for good.
    pub stuck_rate: f64,
}

impl Default for ProviderFaults {
    fn default() -> Self {
        Self {
            latency: (Duration::ZERO, Duration::ZERO),
            failure_rate: 0.0,
            stuck_rate: 0.0,
        }
    }
}

/// In-memory nodes; see the module docs.
pub struct SimulatedProvider {
    faults: ProviderFaults,
    state: Mutex<State>,
}

struct State {
    rng: fastrand::Rng,
    /// node name → node
    nodes: BTreeMap<String, NodeInfo>,
    /// cluster → its nodes' names (listing a cluster does not scan every node of the run)
    clusters: BTreeMap<String, BTreeSet<String>>,
    /// Calls so far (reported by [`SimulatedProvider::calls`]).
    calls: u64,
}

impl SimulatedProvider {
    /// A provider whose faults are drawn from `seed`.
    pub fn new(seed: u64, faults: ProviderFaults) -> Self {
        Self {
            faults,
            state: Mutex::new(State {
                rng: fastrand::Rng::with_seed(seed),
                nodes: BTreeMap::new(),
                clusters: BTreeMap::new(),
                calls: 0,
            }),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One call: its latency, then whether it fails (both drawn before the wait, so the draws
    /// depend only on the order of calls).
    async fn call(&self, operation: &'static str, node: &str) -> Result<(), ProviderError> {
        let (latency, fails) = {
            let mut st = self.lock();
            st.calls += 1;
            let (lo, hi) = self.faults.latency;
            let latency = lo + (hi.saturating_sub(lo)).mul_f64(st.rng.f64());
            (latency, st.rng.f64() < self.faults.failure_rate)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if fails {
            return Err(ProviderError::Refused {
                operation,
                node: node.to_string(),
                message: "injected failure".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Provider for SimulatedProvider {
    fn name(&self) -> &str {
        "simulated"
    }

    async fn create_node(&self, cluster: &str, spec: &NodeSpec) -> Result<NodeInfo, ProviderError> {
        self.call("create", &spec.name).await?;
        let mut st = self.lock();
        if let Some(existing) = st.nodes.get(&spec.name) {
            return Ok(existing.clone());
        }
        let node = NodeInfo {
            name: spec.name.clone(),
            cluster: cluster.to_string(),
            role: spec.role,
            state: NodeState::Created,
            endpoints: Vec::new(),
            api_endpoint: None,
        };
        st.nodes.insert(spec.name.clone(), node.clone());
        st.clusters
            .entry(cluster.to_string())
            .or_default()
            .insert(spec.name.clone());
        Ok(node)
    }

    async fn list_nodes(&self, cluster: &str) -> Result<Vec<NodeInfo>, ProviderError> {
        self.call("list", cluster).await?;
        let st = self.lock();
        let names = st.clusters.get(cluster).into_iter().flatten();
        Ok(names.filter_map(|n| st.nodes.get(n)).cloned().collect())
    }

    /// In memory: always there (its faults are per call).
    async fn is_available(&self) -> bool {
        true
    }

    async fn list_clusters(&self) -> Result<Vec<String>, ProviderError> {
        self.call("list", "*").await?;
        // Sorted and unique: the keys of the index (a cluster leaves it with its last node).
        Ok(self.lock().clusters.keys().cloned().collect())
    }

    async fn start_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
        self.call("start", &node.name).await?;
        let mut st = self.lock();
        let stuck = st.rng.f64() < self.faults.stuck_rate;
        match st.nodes.get_mut(&node.name) {
            Some(n) if n.state == NodeState::Running => Ok(()),
            Some(n) => {
                n.state = if stuck {
                    NodeState::Starting
                } else {
                    NodeState::Running
                };
                Ok(())
            }
            None => Err(ProviderError::Refused {
                operation: "start",
                node: node.name.clone(),
                message: "no such node".into(),
            }),
        }
    }

    async fn stop_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
        self.call("stop", &node.name).await?;
        match self.lock().nodes.get_mut(&node.name) {
            Some(n) => {
                n.state = NodeState::Stopped;
                Ok(())
            }
            None => Err(ProviderError::Refused {
                operation: "stop",
                node: node.name.clone(),
                message: "no such node".into(),
            }),
        }
    }

    async fn delete_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
        self.call("delete", &node.name).await?;
        let mut st = self.lock();
        if let Some(gone) = st.nodes.remove(&node.name)
            && let Some(names) = st.clusters.get_mut(&gone.cluster)
        {
            names.remove(&gone.name);
            if names.is_empty() {
                st.clusters.remove(&gone.cluster);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ClusterPhase, NodeRole};
    use super::*;

    async fn script(p: &SimulatedProvider) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..20 {
            let spec = NodeSpec::new(format!("n{i}"), NodeRole::Worker, "img");
            out.push(format!(
                "{:?}",
                p.create_node("c", &spec).await.map(|n| n.state)
            ));
            if let Ok(n) = p.create_node("c", &spec).await {
                out.push(format!("{:?}", p.start_node(&n).await));
            }
        }
        // The nodes' states, listed as soon as a list is not failed by injection.
        for _ in 0..10 {
            if let Ok(nodes) = p.list_nodes("c").await {
                let states: Vec<_> = nodes.iter().map(|n| n.state).collect();
                out.push(format!("{states:?}"));
                break;
            }
        }
        out
    }

    fn faulty() -> ProviderFaults {
        ProviderFaults {
            latency: (Duration::from_millis(1), Duration::from_millis(9)),
            failure_rate: 0.2,
            stuck_rate: 0.3,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_gives_the_same_faults_and_another_does_not() {
        let a = script(&SimulatedProvider::new(1, faulty())).await;
        let b = script(&SimulatedProvider::new(1, faulty())).await;
        let c = script(&SimulatedProvider::new(2, faulty())).await;
        assert_eq!(a, b);
        assert_ne!(a, c);
        let failures = a.iter().filter(|s| s.contains("injected")).count();
        assert!(failures > 0, "failures are injected: {a:?}");
        assert!(
            a.last().unwrap().contains("Starting"),
            "some nodes stay stuck"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_contract_semantics_hold() {
        let p = SimulatedProvider::new(1, ProviderFaults::default());
        assert!(matches!(
            p.start_nodes("none").await,
            Err(ProviderError::NoNodes { .. })
        ));
        assert!(matches!(
            p.stop_nodes("none").await,
            Err(ProviderError::NoNodes { .. })
        ));
        p.delete_nodes("none")
            .await
            .expect("deleting a missing cluster succeeds");
        assert!(p.cluster_status("none").await.unwrap().is_none());
        for i in 0..2 {
            let spec = NodeSpec::new(format!("n{i}"), NodeRole::Worker, "img");
            p.create_node("c", &spec).await.unwrap();
        }
        p.start_nodes("c").await.unwrap();
        assert_eq!(
            p.cluster_status("c").await.unwrap().unwrap().phase,
            ClusterPhase::Ready
        );
        let n0 = p.list_nodes("c").await.unwrap().remove(0);
        p.stop_node(&n0).await.unwrap();
        assert_eq!(
            p.cluster_status("c").await.unwrap().unwrap().phase,
            ClusterPhase::Degraded
        );
        p.stop_nodes("c").await.unwrap();
        assert_eq!(
            p.cluster_status("c").await.unwrap().unwrap().phase,
            ClusterPhase::Stopped
        );
        assert_eq!(p.list_clusters().await.unwrap(), vec!["c".to_string()]);
        assert!(p.nodes_exist("c").await.unwrap());
    }
}
