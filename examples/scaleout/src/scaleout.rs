//! The figures of running several replicas of the example operator, measured on a real etcd +
//! kube-apiserver (`actorcile::envtest`), each replica a separate `example-operator run`
//! process (the binary beside this one, or `--operator PATH`).
//!
//! - **CPU split**: N Networks (validate, a ConfigMap, the Ready status) reconciled by 1, 2 and
//!   3 sharded replicas (12 shards, default lease timings), one round each on a control plane of
//!   its own, with the replicas watching every object, watching only their shards
//!   (`--shards-held-only`), and watching only their shards with every Network created
//!   already labelled with its shard (`Sharding::label`); per round the time until every Network is Ready and each
//!   replica's CPU seconds (user + system, from `/proc/<pid>/stat`); then a change wave (every
//!   Network's spec patched once) and each replica's CPU seconds for it until every Network is
//!   Ready for its new generation, and each replica's resident memory at the end. Last, a
//!   backlog: the replicas stop, every spec changes again, and as many new replicas start
//!   together; the time until every Network is Ready for its new generation, and each new
//!   replica's CPU seconds from its start. With `--rounds N` every replica count is measured
//!   N times, alternating, and a summary gives each replica's CPU as a share of the one
//!   replica's in the same round (median and range over rounds): this machine's speed drifts
//!   more between rounds than the difference being measured.
//! - **Failover**: `--kills` times, two replicas (2 s leases): `kill -9` one, create a Network
//!   at once, and time until it is Ready — with sharding (every replica watches everything, or
//!   only its shards), and with leader election, warm and cold standby. A replica is started again after each
//!   kill.
//!
//! ```text
//! cargo build --release -p example-operator
//! cargo run --release -p operator-scaleout -- --objects 10000 --kills 10
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};

use example_operator::operator::{Cluster, Network, NetworkSpec};

/// The example operator's binary the replicas run (set once, at the start of [`run`]).
static OPERATOR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The options.
#[derive(clap::Args)]
pub struct ScaleoutArgs {
    /// Networks reconciled in each CPU-split round.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Replica counts of the CPU-split rounds.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    replicas: Vec<usize>,
    /// Times each watch mode's replica counts are measured, one after the other (1, 2, 3, 1,
    /// 2, 3, …). With more than one, a summary follows: each replica's CPU as a share of the
    /// one replica's in the same round, the median over rounds and the range.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Networks created per second in the CPU-split rounds (0: one after the other, as fast as
    /// the API server answers).
    #[arg(long, default_value_t = 0.0)]
    create_rate: f64,
    /// Kills per failover mode (0: no failover figures).
    #[arg(long, default_value_t = 10)]
    kills: usize,
    /// Shards.
    #[arg(long, default_value_t = 12)]
    shards: u32,
    /// What the replicas of the CPU-split rounds watch: `everything` (every object), `held`
    /// (only their shards', `--shards-held-only`), `held-labelled` (the same, with every
    /// Network created already labelled with its shard, `Sharding::label`), `server` (only
    /// their shards', selected by the API server, `--shards-server-side`, on a control plane
    /// with the `ShardedListAndWatch` feature gate), or several.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "everything,held,held-labelled"
    )]
    watch: Vec<String>,
    /// Failover modes: `sharded`, `sharded-held` (`--shards-held-only`), `sharded-server`
    /// (`--shards-server-side`), `leader-warm`, `leader-cold`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sharded,sharded-held,leader-warm,leader-cold"
    )]
    failover: Vec<String>,
    /// The example operator's binary (default: `example-operator` beside this program, as
    /// `cargo build --release -p example-operator` leaves it).
    #[arg(long, value_name = "PATH")]
    operator: Option<PathBuf>,
}

/// A replica process, killed when dropped, and the port of its admin server.
struct Replica(Child, u16);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Replica {
    /// CPU seconds (user + system) the process used so far.
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap_or_default();
        // utime and stime are the line's 14th and 15th fields; after the command name (which
        // may hold spaces) and its ") ", the 12th and 13th.
        let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split(' ').collect();
        let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        // SAFETY: sysconf has no preconditions.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Resident memory now, in MiB (`VmRSS` of `/proc/<pid>/status`).
    fn rss_mib(&self) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    }

    /// The sum of the counter `name`'s samples (`<name>_total{…}`) on the replica's `/metrics`.
    async fn counter(&self, name: &str) -> Result<f64, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.1))
            .await
            .map_err(|e| format!("the replica's /metrics: {e}"))?;
        let req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text)
            .await
            .map_err(|e| e.to_string())?;
        Ok(counter_total(&text, name))
    }

    fn stop(mut self) {
        // SAFETY: signalling a child process we own.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn spawn(kubeconfig: &Path, policy: &Path, args: &[String]) -> Replica {
    let exe = OPERATOR
        .get()
        .expect("the operator's binary is set at the start");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let child = Command::new(exe)
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--policy")
        .arg(policy)
        .args([
            "--admin-addr",
            &format!("127.0.0.1:{port}"),
            "--log",
            "warn",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a replica");
    Replica(child, port)
}

/// The sum of the samples of counter `name` (`<name>_total`, any labels) in an OpenMetrics text.
fn counter_total(text: &str, name: &str) -> f64 {
    let series = format!("{name}_total");
    text.lines()
        .filter_map(|l| l.strip_prefix(series.as_str()))
        .filter(|rest| rest.starts_with('{') || rest.starts_with(' '))
        .filter_map(|rest| rest.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A real etcd + kube-apiserver with the example's CRDs, and the server-side sharding gate
/// when `server_side`.
async fn control_plane(server_side: bool) -> Result<actorcile::envtest::Envtest, String> {
    let gates = if server_side {
        "ShardedListAndWatch=true"
    } else {
        ""
    };
    actorcile::envtest::Envtest::builder()
        .crds(vec![Network::crd(), Cluster::crd()])
        .feature_gates(gates)
        .start()
        .await
        .map_err(|e| e.to_string())
}

async fn create_namespace(client: &kube::Client, ns: &str) -> Result<(), String> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let o = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    api.create(&PostParams::default(), &serde_json::from_value(o).unwrap())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn network(name: &str, i: usize) -> Network {
    Network::new(
        name,
        NetworkSpec {
            cidr: format!("10.{}.{}.0/24", (i / 256) % 256, i % 256),
        },
    )
}

/// Patch the spec of every one of the `n` Networks (a CIDR of its own, from `offset` within its
/// /24), one at a time.
async fn change_every_spec(api: &Api<Network>, n: usize, offset: u32) -> Result<(), String> {
    for i in 0..n {
        let cidr = format!("10.{}.{}.{offset}/25", (i / 256) % 256, i % 256);
        let patch = serde_json::json!({"spec": {"cidr": cidr}});
        api.patch(
            &format!("n-{i}"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Wait until `n` Networks of `ns` are Ready (at most `limit`).
async fn all_ready(api: &Api<Network>, n: usize, limit: Duration) -> Result<(), String> {
    let ready = |o: &Network| actorcile::status::ResourceStatus::of(o).is_ready();
    wait_until(api, n, limit, "Ready", ready).await
}

/// Wait until `n` Networks of `ns` are Ready for their current generation (at most `limit`).
async fn all_current(api: &Api<Network>, n: usize, limit: Duration) -> Result<(), String> {
    let current = |o: &Network| {
        let status = actorcile::status::ResourceStatus::of(o);
        status.is_ready()
            && status.ready().and_then(|c| c.observed_generation) == o.metadata.generation
    };
    wait_until(api, n, limit, "current", current).await
}

/// Wait until `n` Networks of `ns` are `what` by `test` (at most `limit`), listing them every
/// 100 ms.
async fn wait_until(
    api: &Api<Network>,
    n: usize,
    limit: Duration,
    what: &str,
    test: impl Fn(&Network) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let count = list.items.iter().filter(|o| test(o)).count();
        if count == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{count} of {n} Networks {what} after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Run the measurements and print their tables.
pub async fn run(args: ScaleoutArgs) -> Result<(), String> {
    let operator = match &args.operator {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("this program's path: {e}"))?
            .with_file_name("example-operator"),
    };
    if !operator.is_file() {
        return Err(format!(
            "{} is not there: build it first (cargo build --release -p example-operator), or name it with --operator",
            operator.display()
        ));
    }
    let _ = OPERATOR.set(operator);
    let dir: PathBuf =
        std::env::temp_dir().join(format!("example-operator-scaleout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        "lease_duration = \"2s\"\nlease_renew_deadline = \"1500ms\"\nlease_retry_period = \"200ms\"\n",
    )
    .map_err(|e| e.to_string())?;
    // The CPU split runs with the default lease timings (15 s / 10 s / 2 s), as a user would:
    // the failover's short leases renew ten times as often, a cost that does not split.
    let split_policy = dir.join("split-policy.toml");
    std::fs::write(&split_policy, "").map_err(|e| e.to_string())?;
    let shards = args.shards.to_string();

    let rounds = if args.objects == 0 {
        &[][..]
    } else {
        &args.replicas[..]
    };
    if !rounds.is_empty() {
        println!(
            "CPU split: {} Networks, {} shards",
            args.objects, args.shards
        );
        println!(
            "| watch | replicas | all Ready (s) | CPU s per replica | CPU s total | change wave: CPU s per replica | backlog: all Ready (s) | backlog: CPU s per replica | RSS MiB per replica |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    let modes: Vec<(&str, usize, usize)> = args
        .watch
        .iter()
        .flat_map(|w| (1..=args.rounds).map(move |r| (w.as_str(), r)))
        .flat_map(|(w, r)| rounds.iter().map(move |&n| (w, r, n)))
        .collect();
    let mut measured: Vec<Split> = Vec::new();
    for (watch, round, n) in modes {
        let (flag, labelled) = match watch {
            "everything" => (None, false),
            "held" => (Some("--shards-held-only"), false),
            "held-labelled" => (Some("--shards-held-only"), true),
            "server" => (Some("--shards-server-side"), false),
            other => {
                return Err(format!(
                    "--watch {other}: not `everything`, `held`, `held-labelled` or `server`"
                ));
            }
        };
        // Each round on a control plane of its own: one that kept the earlier rounds' objects
        // and Events serves later rounds more slowly, which would favour the first rounds.
        let env = control_plane(watch == "server").await?;
        let client = env.client();
        let kubeconfig = env.kubeconfig_path().to_path_buf();
        let ns = format!("split-{watch}-{n}");
        // The replicas' sharding: their flags name the Leases from the operator's names.
        let sharding = actorcile::sharding::Sharding::new(args.shards, &ns)
            .named(&example_operator::operator::names());
        create_namespace(&client, &ns).await?;
        let api: Api<Network> = Api::namespaced(client.clone(), &ns);
        let start_replicas = |generation: usize| -> Vec<Replica> {
            (0..n)
                .map(|i| {
                    let mut a: Vec<String> = [
                        "--namespace",
                        &ns,
                        "--shards",
                        &shards,
                        "--shards-namespace",
                        &ns,
                        "--identity",
                        &format!("{ns}-{generation}-{i}"),
                    ]
                    .map(String::from)
                    .to_vec();
                    if let Some(flag) = flag {
                        a.push(flag.into());
                    }
                    spawn(&kubeconfig, &split_policy, &a)
                })
                .collect()
        };
        let replicas = start_replicas(0);
        // Wait until the shards are spread (each replica ⌈shards / n⌉ at most).
        wait_spread(&client, &ns, n, args.shards).await?;
        let started = Instant::now();
        for i in 0..args.objects {
            if args.create_rate > 0.0 {
                let due = started + Duration::from_secs_f64(i as f64 / args.create_rate);
                tokio::time::sleep_until(due.into()).await;
            }
            let mut net = network(&format!("n-{i}"), i);
            if labelled {
                let key = actorcile::sharding::object_key(Some(&ns), &net.name_any());
                net.metadata.labels = Some([sharding.label(&key)].into());
            }
            api.create(&PostParams::default(), &net)
                .await
                .map_err(|e| e.to_string())?;
        }
        all_ready(&api, args.objects, Duration::from_secs(900)).await?;
        let took = started.elapsed().as_secs_f64();
        let cpu: Vec<f64> = replicas.iter().map(Replica::cpu_seconds).collect();
        // The work behind it, as each replica counted it.
        let mut work = Vec::new();
        for r in &replicas {
            let reconciles = r.counter("actorcile_reconciles").await?;
            let requests = r.counter("actorcile_api_requests").await?;
            let received = r.counter("actorcile_api_response_bytes").await? / (1024.0 * 1024.0);
            work.push((reconciles, requests, received));
        }
        let labelled_by_replicas = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|o| o.labels().contains_key(&sharding.label_key()))
            .count()
            - if labelled { args.objects } else { 0 };
        // A change wave over the existing objects: every Network's spec changes once.
        change_every_spec(&api, args.objects, 0).await?;
        all_current(&api, args.objects, Duration::from_secs(900)).await?;
        let wave: Vec<f64> = replicas
            .iter()
            .zip(&cpu)
            .map(|(r, before)| r.cpu_seconds() - before)
            .collect();
        let rss: Vec<f64> = replicas.iter().map(Replica::rss_mib).collect();
        // A backlog, as after a restart: the replicas stop (gracefully), every spec changes
        // again, and n new replicas start together on it.
        for r in replicas {
            r.stop();
        }
        change_every_spec(&api, args.objects, 128).await?;
        let restarted = Instant::now();
        let replicas = start_replicas(1);
        all_current(&api, args.objects, Duration::from_secs(900)).await?;
        let backlog_took = restarted.elapsed().as_secs_f64();
        let backlog: Vec<f64> = replicas.iter().map(Replica::cpu_seconds).collect();
        let split = Split {
            watch: watch.to_string(),
            round,
            replicas: n,
            phases: [cpu, wave, backlog],
            work,
            labelled: labelled_by_replicas,
        };
        let [cpu, wave, backlog] = &split.phases;
        println!(
            "| {} | {n} | {took:.1} | {} | {:.2} | {} | {backlog_took:.1} | {} | {} |",
            split.label(args.rounds),
            joined(cpu, 2),
            cpu.iter().sum::<f64>(),
            joined(wave, 2),
            joined(backlog, 2),
            joined(&rss, 0)
        );
        measured.push(split);
        for r in replicas {
            r.stop();
        }
    }
    if !measured.is_empty() {
        println!();
        println!(
            "Work per replica to create and converge, from each replica's /metrics: reconciles (`actorcile_reconciles_total`), API requests (`actorcile_api_requests_total`, Lease renewals included), MiB received (`actorcile_api_response_bytes_total`: the API server's answers and watch events); and the Networks the replicas labelled with their shard"
        );
        println!(
            "| watch | replicas | reconciles per replica | API requests per replica | MiB received per replica | labelled by the replicas |"
        );
        println!("|---|---|---|---|---|---|");
        for m in &measured {
            let reconciles: Vec<f64> = m.work.iter().map(|w| w.0).collect();
            let requests: Vec<f64> = m.work.iter().map(|w| w.1).collect();
            let read: Vec<f64> = m.work.iter().map(|w| w.2).collect();
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                m.label(args.rounds),
                m.replicas,
                joined(&reconciles, 0),
                joined(&requests, 0),
                joined(&read, 1),
                m.labelled
            );
        }
    }
    if args.rounds > 1 {
        println!();
        println!(
            "Per replica, as a share of the same round's one replica's CPU: median over {} rounds (range)",
            args.rounds
        );
        println!("| watch | replicas | create and converge | change wave | backlog |");
        println!("|---|---|---|---|---|");
        for (watch, n, cells) in shares(&measured) {
            let cells: Vec<String> = cells
                .iter()
                .map(|(median, lo, hi)| format!("{median:.2} ({lo:.2}–{hi:.2})"))
                .collect();
            println!("| {watch} | {n} | {} |", cells.join(" | "));
        }
    }

    if args.kills > 0 {
        // The failover rounds share one control plane.
        let server_side = args.failover.iter().any(|m| m == "sharded-server");
        let env = control_plane(server_side).await?;
        let client = env.client();
        let kubeconfig = env.kubeconfig_path().to_path_buf();
        println!();
        println!(
            "Failover: kill -9 the replica that runs a new Network, create it at once; time until its Lease is held by the survivor, and until it is Ready ({} kills each; 2 s leases)",
            args.kills
        );
        println!("| mode | Lease taken p50 (s) | max (s) | new object Ready p50 (s) | max (s) |");
        println!("|---|---|---|---|---|");
        for mode in &args.failover {
            let times = failover(&client, &kubeconfig, &policy, mode, &shards, args.kills).await?;
            let (taken, ready): (Vec<f64>, Vec<f64>) = times.into_iter().unzip();
            let (t50, tmax) = p50_max(taken);
            let (r50, rmax) = p50_max(ready);
            println!("| {mode} | {t50:.2} | {tmax:.2} | {r50:.2} | {rmax:.2} |");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One CPU-split measurement: per phase (create and converge, change wave, backlog), each
/// replica's CPU seconds; each replica's reconciles, API requests and MiB received to create and
/// converge; and how many objects the replicas labelled with their shard.
struct Split {
    watch: String,
    round: usize,
    replicas: usize,
    phases: [Vec<f64>; 3],
    work: Vec<(f64, f64, f64)>,
    labelled: usize,
}

impl Split {
    /// The watch mode, and the round when there are several.
    fn label(&self, rounds: usize) -> String {
        if rounds > 1 {
            format!("{} (round {})", self.watch, self.round)
        } else {
            self.watch.clone()
        }
    }
}

/// A share's median, minimum and maximum.
type Spread = (f64, f64, f64);

/// Per watch mode and replica count above one: per phase, every replica's CPU as a share of
/// the one replica's in the same round, as a [`Spread`] over rounds and replicas.
/// Measurements without a one-replica round of their own are left out.
fn shares(measured: &[Split]) -> Vec<(String, usize, [Spread; 3])> {
    let mut keys: Vec<(&str, usize)> = Vec::new();
    for m in measured.iter().filter(|m| m.replicas > 1) {
        if !keys.contains(&(m.watch.as_str(), m.replicas)) {
            keys.push((m.watch.as_str(), m.replicas));
        }
    }
    let mut out = Vec::new();
    for (watch, n) in keys {
        let mut per_phase: [Vec<f64>; 3] = Default::default();
        for m in measured
            .iter()
            .filter(|m| m.watch == watch && m.replicas == n)
        {
            let Some(one) = measured
                .iter()
                .find(|o| o.watch == watch && o.round == m.round && o.replicas == 1)
            else {
                continue;
            };
            for (phase, shares) in per_phase.iter_mut().enumerate() {
                let base = one.phases[phase][0];
                shares.extend(m.phases[phase].iter().map(|c| c / base));
            }
        }
        if per_phase[0].is_empty() {
            continue;
        }
        let cells = per_phase.map(|mut v| {
            v.sort_by(f64::total_cmp);
            (median(&v), v[0], v[v.len() - 1])
        });
        out.push((watch.to_string(), n, cells));
    }
    out
}

/// The median of sorted, non-empty `v` (the mean of the middle two of an even count).
fn median(v: &[f64]) -> f64 {
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// `v`'s values with `decimals` decimals, joined by " / " (one per replica in a table cell).
fn joined(v: &[f64], decimals: usize) -> String {
    v.iter()
        .map(|c| format!("{c:.decimals$}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The median (the upper one of an even count) and the maximum.
fn p50_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

async fn wait_spread(client: &kube::Client, ns: &str, n: usize, shards: u32) -> Result<(), String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ns);
    let fair = (shards as usize).div_ceil(n);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lp = ListParams::default().labels("sharding.actorcile.dev/role=shard");
        let list = leases.list(&lp).await.map_err(|e| e.to_string())?;
        let mut holders = std::collections::HashMap::<String, usize>::new();
        for l in &list.items {
            if let Some(h) = l.spec.as_ref().and_then(|s| s.holder_identity.clone()) {
                *holders.entry(h).or_default() += 1;
            }
        }
        let held: usize = holders.values().sum();
        if held == shards as usize && holders.len() == n && holders.values().all(|c| *c <= fair) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("shards not spread over {n} replicas: {holders:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `kills` times: two replicas in `mode`; kill -9 the one that runs the probe Network's shard
/// (or leads), create the probe at once, time until the probe's Lease is held by the survivor
/// and until the probe is Ready; start a replica again.
async fn failover(
    client: &kube::Client,
    kubeconfig: &Path,
    policy: &Path,
    mode: &str,
    shards: &str,
    kills: usize,
) -> Result<Vec<(f64, f64)>, String> {
    if ![
        "sharded",
        "sharded-held",
        "sharded-server",
        "leader-warm",
        "leader-cold",
    ]
    .contains(&mode)
    {
        return Err(format!("--failover {mode}: not a failover mode"));
    }
    let ns = format!("failover-{mode}");
    create_namespace(client, &ns).await?;
    let api: Api<Network> = Api::namespaced(client.clone(), &ns);
    // Objects the replicas cache (what a cold standby must list first).
    let cached = 2000;
    for i in 0..cached {
        api.create(&PostParams::default(), &network(&format!("n-{i}"), i))
            .await
            .map_err(|e| e.to_string())?;
    }
    let args = |id: &str| -> Vec<String> {
        let mut a: Vec<String> = ["--namespace", &ns, "--identity", id]
            .map(String::from)
            .to_vec();
        match mode {
            "sharded" => {
                a.extend(["--shards", shards, "--shards-namespace", &ns].map(String::from))
            }
            "sharded-held" | "sharded-server" => a.extend(
                [
                    "--shards",
                    shards,
                    "--shards-namespace",
                    &ns,
                    if mode == "sharded-held" {
                        "--shards-held-only"
                    } else {
                        "--shards-server-side"
                    },
                ]
                .map(String::from),
            ),
            "leader-warm" => {
                a.extend(["--leader-elect", "--leader-elect-namespace", &ns].map(String::from))
            }
            _ => a.extend(
                [
                    "--leader-elect",
                    "--leader-elect-namespace",
                    &ns,
                    "--cold-standby",
                ]
                .map(String::from),
            ),
        }
        a
    };
    let mut next = 0;
    let spawn_next = |next: &mut usize| {
        *next += 1;
        let id = format!("{mode}-{next}");
        (id.clone(), spawn(kubeconfig, policy, &args(&id)))
    };
    let mut running = vec![spawn_next(&mut next), spawn_next(&mut next)];
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &ns);
    all_ready(&api, cached, Duration::from_secs(300)).await?;
    let mut times = Vec::new();
    for k in 0..kills {
        let mut probe = format!("probe-{k}");
        // Who runs the probe: the holder of its shard, or the leader; wait until the two
        // replicas are settled (both hold shards, or one leads) so a kill hits a busy one.
        // With server-side sharding the probe's shard comes from its uid, known once it is
        // created: the first replica is killed, and probes are created until one is of a shard
        // it held.
        let mut lease_name = match mode {
            "sharded-server" => {
                let ids: Vec<&str> = running.iter().map(|(id, _)| id.as_str()).collect();
                wait_spread(client, &ns, ids.len(), shards.parse().unwrap()).await?;
                String::new()
            }
            "sharded" | "sharded-held" => {
                let ids: Vec<&str> = running.iter().map(|(id, _)| id.as_str()).collect();
                wait_spread(client, &ns, ids.len(), shards.parse().unwrap()).await?;
                let shard = actorcile::sharding::shard_of(
                    &actorcile::sharding::object_key(Some(&ns), &probe),
                    shards.parse().unwrap(),
                );
                format!(
                    "{}-shard-{shard}",
                    example_operator::operator::names().shard_lease_prefix()
                )
            }
            _ => example_operator::operator::names().leader_lease(),
        };
        let holder = loop {
            if mode == "sharded-server" {
                break running[0].0.clone();
            }
            let h = leases
                .get_opt(&lease_name)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| running.iter().any(|(id, _)| id == h));
            if let Some(h) = h {
                break h;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let victim_shards: Vec<u32> = leases
            .list(&ListParams::default().labels("sharding.actorcile.dev/role=shard"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_ref()) == Some(&holder))
            .filter_map(|l| l.name_any().rsplit_once('-')?.1.parse().ok())
            .collect();
        let i = running.iter().position(|(id, _)| *id == holder).unwrap();
        let (_, victim) = running.remove(i);
        // SAFETY: signalling a child process we own.
        unsafe { libc::kill(victim.0.id() as i32, libc::SIGKILL) };
        let killed = Instant::now();
        drop(victim);
        for j in 0.. {
            let name = if mode == "sharded-server" {
                format!("probe-{k}-{j}")
            } else {
                probe.clone()
            };
            let created = api
                .create(&PostParams::default(), &network(&name, cached + k))
                .await
                .map_err(|e| e.to_string())?;
            if mode != "sharded-server" {
                break;
            }
            let shard = actorcile::sharding::shard_of_uid(
                created.uid().as_deref().unwrap_or(""),
                shards.parse().unwrap(),
            );
            if victim_shards.contains(&shard) {
                (probe, lease_name) = (
                    name,
                    format!(
                        "{}-shard-{shard}",
                        example_operator::operator::names().shard_lease_prefix()
                    ),
                );
                break;
            }
        }
        let mut taken = None;
        loop {
            if taken.is_none() {
                let h = leases
                    .get_opt(&lease_name)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|l| l.spec?.holder_identity);
                if h.is_some_and(|h| running.iter().any(|(id, _)| *id == h)) {
                    taken = Some(killed.elapsed().as_secs_f64());
                }
            }
            let o = api.get(&probe).await.map_err(|e| e.to_string())?;
            if let Some(taken) = taken
                && actorcile::status::ResourceStatus::of(&o).is_ready()
            {
                times.push((taken, killed.elapsed().as_secs_f64()));
                break;
            }
            if killed.elapsed() > Duration::from_secs(60) {
                return Err(format!("{mode}: {probe} not Ready 60 s after the kill"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        running.push(spawn_next(&mut next));
    }
    for (_, r) in running {
        r.stop();
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(watch: &str, round: usize, cpu: &[f64]) -> Split {
        Split {
            watch: watch.into(),
            round,
            replicas: cpu.len(),
            phases: [
                cpu.to_vec(),
                cpu.iter().map(|c| c / 2.0).collect(),
                cpu.to_vec(),
            ],
            work: Vec::new(),
            labelled: 0,
        }
    }

    #[test]
    fn shares_are_against_the_same_rounds_one_replica() {
        let measured = [
            split("held", 1, &[9.0]),
            split("held", 1, &[3.0, 4.5, 6.0]),
            split("held", 2, &[6.0]),
            split("held", 2, &[2.0, 3.0, 3.0]),
            // No one-replica round 3: left out.
            split("held", 3, &[100.0, 100.0, 100.0]),
            split("everything", 1, &[8.0]),
            split("everything", 1, &[4.0, 4.0]),
        ];
        let out = shares(&measured);
        assert_eq!(out.len(), 2);
        let (watch, n, cells) = &out[0];
        assert_eq!((watch.as_str(), *n), ("held", 3));
        // Round 1: 1/3, 1/2, 2/3; round 2: 1/3, 1/2, 1/2.
        for (median, lo, hi) in cells {
            assert!((median - 0.5).abs() < 1e-9, "{median}");
            assert!((lo - 1.0 / 3.0).abs() < 1e-9, "{lo}");
            assert!((hi - 2.0 / 3.0).abs() < 1e-9, "{hi}");
        }
        let (watch, n, cells) = &out[1];
        assert_eq!((watch.as_str(), *n), ("everything", 2));
        assert_eq!(cells[0], (0.5, 0.5, 0.5));
    }

    #[test]
    fn counters_are_summed_over_their_labels() {
        let text = "# TYPE actorcile_reconciles counter\n\
            actorcile_reconciles_total{controller=\"Network\",result=\"ready\"} 3300\n\
            actorcile_reconciles_total{controller=\"Network\",result=\"waiting\"} 34\n\
            actorcile_reconciles_created 1.7e9\n\
            actorcile_reconciles_waiting 0\n\
            actorcile_api_requests_total{verb=\"PATCH\",code=\"200\"} 7\n\
            # EOF\n";
        assert_eq!(counter_total(text, "actorcile_reconciles"), 3334.0);
        assert_eq!(counter_total(text, "actorcile_api_requests"), 7.0);
        assert_eq!(counter_total(text, "actorcile_restarts"), 0.0);
    }

    #[test]
    fn cells_join_one_value_per_replica() {
        assert_eq!(joined(&[4.386, 4.49, 4.0], 2), "4.39 / 4.49 / 4.00");
        assert_eq!(joined(&[76.6], 0), "77");
        assert_eq!(joined(&[3354.0, 3337.0], 0), "3354 / 3337");
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
    }
}
