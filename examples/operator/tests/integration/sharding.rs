//! Sharded replicas of the example operator as separate OS processes on one real etcd +
//! kube-apiserver (`actorcile::envtest`), 12 shards, 4 s leases: three replicas split the
//! shards and make 300 objects Ready (Clusters need and reference their Network, often in
//! another replica's shard); `kill -9` of one mid-load hands its shards over within 2 × the
//! lease duration; a fourth joins and the shards rebalance; one stops gracefully and its
//! shards are taken at once. Every replica records its reconciles and shard changes to a file
//! (`--record-reconciles`); the checker at the end proves that no two reconciles of one object
//! overlapped, across replicas, and that each reconcile started while its replica held the
//! object's shard. The same again with every replica watching only its own shards
//! (`--shards-held-only`): objects carry their shard's label, and a takeover relists.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use actorcile::envtest::Envtest;
use actorcile::sharding::{Sharding, object_key, shard_of};
use kube::api::{Api, ListParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;

/// The replicas' lease duration: a failover after `kill -9` takes at most two, a takeover
/// after a graceful release (no expiry to wait for) less than one.
const LEASE: Duration = Duration::from_secs(4);

const SHARDS: u32 = 12;
/// The slack allowed between a shard change and a reconcile start in the record: the gate and the
/// reconcile's span are a few instructions apart in one task, but the shard change is logged by
/// another.
const SLACK_MICROS: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_on_a_real_apiserver() {
    tokio::time::timeout(Duration::from_secs(240), run(false))
        .await
        .expect("the test took over 240 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_watching_only_their_shards_on_a_real_apiserver() {
    tokio::time::timeout(Duration::from_secs(240), run(true))
        .await
        .expect("the test took over 240 s");
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

struct Replicas {
    held_only: bool,
    kubeconfig: PathBuf,
    dir: PathBuf,
    policy: PathBuf,
    running: BTreeMap<String, Operator>,
}

impl Replicas {
    fn spawn(&mut self, id: &str, extra: &[&str]) {
        let record = self.dir.join(format!("{id}.reconciles"));
        let mut args = vec![
            "--shards",
            "12",
            "--shards-namespace",
            "default",
            "--identity",
            id,
            "--log",
            "info",
        ];
        let (policy, record) = (self.policy.to_str().unwrap(), record.to_str().unwrap());
        args.extend(["--policy", policy, "--record-reconciles", record]);
        args.extend(extra);
        if self.held_only {
            args.push("--shards-held-only");
        }
        let op = spawn_with(&self.kubeconfig, free_port(), &args);
        self.running.insert(id.to_string(), op);
    }
}

/// The replicas' sharding, as their flags set it up (the Lease prefix of the operator's names).
fn sharding() -> Sharding {
    Sharding::new(SHARDS, "default").named(&example_operator::operator::names())
}

/// Each shard's holder, from the Leases.
async fn holders(client: &kube::Client) -> BTreeMap<u32, String> {
    sharding().holders(client).await.unwrap_or_default()
}

/// Wait until exactly `ids` hold every shard, each ⌈12 / n⌉ at most.
async fn balanced(client: &kube::Client, ids: &[&str]) -> BTreeMap<u32, String> {
    let fair = SHARDS.div_ceil(ids.len() as u32) as usize;
    eventually(&format!("the shards balanced over {ids:?}"), || async {
        let h = holders(client).await;
        let ok = h.len() == SHARDS as usize
            && h.values().all(|v| ids.contains(&v.as_str()))
            && ids
                .iter()
                .all(|id| h.values().filter(|v| v == id).count() <= fair);
        ok.then_some(h)
    })
    .await
}

async fn create_clusters(clusters: &Api<DynamicObject>, range: std::ops::Range<usize>) {
    for i in range {
        let o = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Cluster",
            "metadata": {"name": format!("c-{i}")},
            "spec": {"network": format!("net-{}", i % 30), "workers": 1}});
        clusters
            .create(&PostParams::default(), &serde_json::from_value(o).unwrap())
            .await
            .unwrap();
    }
}

async fn all_ready(networks: &Api<DynamicObject>, clusters: &Api<DynamicObject>, n: usize) {
    eventually(&format!("30 networks and {n} clusters Ready"), || async {
        let lp = ListParams::default();
        let (nets, cls) = (
            networks.list(&lp).await.ok()?,
            clusters.list(&lp).await.ok()?,
        );
        let ok = nets.items.len() == 30
            && cls.items.len() == n
            && nets.items.iter().chain(&cls.items).all(ready);
        ok.then_some(())
    })
    .await;
}

async fn run(held_only: bool) {
    let env = Envtest::builder().start().await.expect("start envtest");
    let client = env.client();
    // One folder per test: `cargo test` runs both cases in one process.
    let dir = std::env::temp_dir().join(format!(
        "example-operator-shards-{}-{}",
        std::process::id(),
        if held_only { "held" } else { "all" }
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "lease_duration = \"{}s\"\nlease_renew_deadline = \"3s\"\nlease_retry_period = \"200ms\"\n",
            LEASE.as_secs()
        ),
    )
    .unwrap();
    let mut replicas = Replicas {
        held_only,
        kubeconfig: env.kubeconfig_path().to_path_buf(),
        dir: dir.clone(),
        policy,
        running: BTreeMap::new(),
    };

    // r1 installs the CRDs; three replicas take 4 shards each.
    replicas.spawn("r1", &["--install-crds"]);
    let (networks, clusters) = (api(&client, "Network"), api(&client, "Cluster"));
    eventually("the CRDs installed", || async {
        clusters.list(&ListParams::default()).await.ok()
    })
    .await;
    replicas.spawn("r2", &[]);
    replicas.spawn("r3", &[]);
    let held = balanced(&client, &["r1", "r2", "r3"]).await;
    for id in ["r1", "r2", "r3"] {
        assert_eq!(held.values().filter(|v| *v == id).count(), 4, "{held:?}");
    }

    // 30 networks and 270 clusters: every object Ready.
    for i in 0..30 {
        let o = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Network",
            "metadata": {"name": format!("net-{i}")}, "spec": {"cidr": format!("10.{i}.0.0/16")}});
        networks
            .create(&PostParams::default(), &serde_json::from_value(o).unwrap())
            .await
            .unwrap();
    }
    create_clusters(&clusters, 0..270).await;
    all_ready(&networks, &clusters, 270).await;

    // kill -9 r1 while 60 new clusters are being provisioned: r2 and r3 take its shards
    // within 2 × the lease duration, and finish the work.
    create_clusters(&clusters, 270..330).await;
    let mut r1 = replicas.running.remove("r1").unwrap();
    unsafe { libc::kill(r1.0.id() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let killed_at = now_micros();
    let _ = r1.0.wait();
    balanced(&client, &["r2", "r3"]).await;
    let failover = killed.elapsed();
    eprintln!("shards of a replica killed with SIGKILL taken over after {failover:?}");
    assert!(failover < 2 * LEASE, "failover took {failover:?}");
    all_ready(&networks, &clusters, 330).await;

    // A fourth replica joins: the shards rebalance to 4 each; new work is done.
    replicas.spawn("r4", &[]);
    let held = balanced(&client, &["r2", "r3", "r4"]).await;
    for id in ["r2", "r3", "r4"] {
        assert_eq!(held.values().filter(|v| *v == id).count(), 4, "{held:?}");
    }
    create_clusters(&clusters, 330..360).await;
    all_ready(&networks, &clusters, 360).await;

    // r2 stops gracefully: it releases its shards, taken at once (before the lease
    // could expire).
    let r2 = replicas.running.remove("r2").unwrap();
    let stopped = Instant::now();
    let status = terminate(r2).await;
    assert!(status.success(), "{status:?}");
    balanced(&client, &["r3", "r4"]).await;
    let handover = stopped.elapsed();
    eprintln!("shards of a replica stopped gracefully taken over after {handover:?}");
    assert!(handover < LEASE, "handover took {handover:?}");
    create_clusters(&clusters, 360..390).await;
    all_ready(&networks, &clusters, 390).await;

    for (id, op) in std::mem::take(&mut replicas.running) {
        let status = terminate(op).await;
        assert!(status.success(), "{id}: {status:?}");
    }
    if held_only {
        // Every object carries its shard's label.
        let key = sharding().label_key();
        for api in [&networks, &clusters] {
            for o in api.list(&ListParams::default()).await.unwrap() {
                let name = o.metadata.name.clone().unwrap();
                let shard = shard_of(&object_key(o.metadata.namespace.as_deref(), &name), SHARDS);
                let label = o.metadata.labels.as_ref().and_then(|l| l.get(&key));
                assert_eq!(label, Some(&format!("{shard}-of-{SHARDS}")), "{name}");
            }
        }
        // Every child they own carries its owner's shard, so that each replica's watch of
        // the children selects its own.
        let owner_key = sharding().owner_label_key();
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), "default");
        let mut children = 0;
        for cm in config_maps.list(&ListParams::default()).await.unwrap() {
            let mut owners = cm.metadata.owner_references.iter().flatten();
            let Some(owner) = owners.find(|o| o.kind == "Network" || o.kind == "Cluster") else {
                continue;
            };
            let shard = shard_of(&object_key(Some("default"), &owner.name), SHARDS);
            let label = cm.metadata.labels.as_ref().and_then(|l| l.get(&owner_key));
            assert_eq!(
                label,
                Some(&format!("{shard}-of-{SHARDS}")),
                "{:?}",
                cm.metadata.name
            );
            children += 1;
        }
        assert!(children > 0, "the objects own ConfigMaps");
    }
    let killed = HashMap::from([("r1".to_string(), killed_at)]);
    let report = check(&dir, &killed);
    eprintln!("{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One reconcile as recorded: replica, object key, start, end (µs since the epoch).
struct Reconcile {
    replica: String,
    key: String,
    start: u64,
    end: u64,
}

/// Reads every replica's record and checks it; panics on an overlap or a reconcile outside its
/// replica's holding of the object's shard. `killed`: replicas killed, and when (their open
/// reconciles and holdings end then).
fn check(dir: &Path, killed: &HashMap<String, u64>) -> String {
    let mut reconciles = Vec::new();
    // (replica, shard) → [from, to)
    let mut holdings: HashMap<(String, u32), Vec<(u64, u64)>> = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "reconciles") {
            continue;
        }
        let replica = path.file_stem().unwrap().to_string_lossy().to_string();
        let until = killed.get(&replica).copied().unwrap_or(u64::MAX);
        let mut open: HashMap<u64, (String, u64)> = HashMap::new();
        let mut held: HashMap<u32, u64> = HashMap::new();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let t: u64 = f[0].parse().unwrap();
            match f[1] {
                "start" => {
                    open.insert(f[2].parse().unwrap(), (format!("{} {}", f[3], f[4]), t));
                }
                "end" => {
                    let (key, start) = open.remove(&f[2].parse().unwrap()).expect("started");
                    reconciles.push(Reconcile {
                        replica: replica.clone(),
                        key,
                        start,
                        end: t,
                    });
                }
                "acquire" => {
                    held.insert(f[2].parse().unwrap(), t);
                }
                "lose" => {
                    let s: u32 = f[2].parse().unwrap();
                    let from = held.remove(&s).expect("acquired before lost");
                    holdings
                        .entry((replica.clone(), s))
                        .or_default()
                        .push((from, t));
                }
                other => panic!("unknown record {other:?} in {line:?}"),
            }
        }
        for (key, start) in open.into_values() {
            reconciles.push(Reconcile {
                replica: replica.clone(),
                key,
                start,
                end: until,
            });
        }
        for (s, from) in held {
            holdings
                .entry((replica.clone(), s))
                .or_default()
                .push((from, until));
        }
    }
    assert!(!reconciles.is_empty(), "nothing recorded");

    // Each reconcile started while its replica held the object's shard.
    let mut outside = Vec::new();
    for p in &reconciles {
        let (_, ns_name) = p.key.split_once(' ').unwrap();
        let (ns, name) = ns_name.split_once('/').unwrap();
        let shard = shard_of(&object_key(Some(ns), name), SHARDS);
        let within = holdings.get(&(p.replica.clone(), shard)).is_some_and(|h| {
            h.iter().any(|(from, to)| {
                from.saturating_sub(SLACK_MICROS) <= p.start
                    && p.start < to.saturating_add(SLACK_MICROS)
            })
        });
        if !within {
            outside.push(format!(
                "{} ran {} (shard {shard}) at {}",
                p.replica, p.key, p.start
            ));
        }
    }
    assert!(
        outside.is_empty(),
        "reconciles outside their shard's holding: {outside:#?}"
    );

    // No two reconciles of one object overlap.
    let mut by_key: BTreeMap<&str, Vec<&Reconcile>> = BTreeMap::new();
    for p in &reconciles {
        by_key.entry(&p.key).or_default().push(p);
    }
    let mut overlaps = Vec::new();
    let mut moved = 0;
    for (key, mut ps) in by_key.clone() {
        ps.sort_by_key(|p| p.start);
        for w in ps.windows(2) {
            if w[0].end > w[1].start {
                overlaps.push(format!(
                    "{key}: {} [{}, {}) and {} from {}",
                    w[0].replica, w[0].start, w[0].end, w[1].replica, w[1].start
                ));
            }
            if w[0].replica != w[1].replica {
                moved += 1;
            }
        }
    }
    assert!(overlaps.is_empty(), "overlapping reconciles: {overlaps:#?}");
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &reconciles {
        *per_replica.entry(&p.replica).or_default() += 1;
    }
    assert!(
        per_replica.len() == 4,
        "every replica ran reconciles: {per_replica:?}"
    );
    assert!(moved > 0, "some object was run by two replicas in turn");
    format!(
        "{} reconciles of {} objects ({per_replica:?}), {moved} hand-overs of an object between replicas, 0 overlaps, 0 reconciles outside their shard",
        reconciles.len(),
        by_key.len()
    )
}
