//! `demo`: the operator on the in-process cluster (or a real control plane with `--envtest`):
//! create networks and clusters, show their progress, delete them all at once (deletion
//! ordering holds each network until its clusters are gone), print a summary.

use std::time::{Duration, Instant};

use actorcile::prelude::*;
use kube::CustomResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::operator::{self, Cluster, ClusterSpec, Network, NetworkSpec};

/// The demo's options.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Networks to create.
    #[arg(long, default_value_t = 4)]
    networks: usize,
    /// Clusters per network.
    #[arg(long, default_value_t = 6)]
    clusters_per_network: usize,
    /// Run on a real etcd + kube-apiserver (actorcile::envtest) instead of in-process.
    #[arg(long, conflicts_with = "kubeconfig")]
    envtest: bool,
    /// Run on the cluster of this kubeconfig (its current context) instead of in-process: the
    /// CRDs are installed there, and the demo's objects are created in its `default` namespace
    /// and deleted at the end.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Scrape the runtime's /metrics every 250 ms while the demo runs, and write the scrapes to
    /// this file (each after a line `# at SECONDS`): the input of `actorcile plot-dashboard`.
    /// (In process only.)
    #[arg(long, value_name = "PATH", conflicts_with_all = ["envtest", "kubeconfig"])]
    scrape_to: Option<std::path::PathBuf>,
    #[command(flatten)]
    infrastructure: operator::ProviderArgs,
}

/// Run the demo.
pub async fn run(args: DemoArgs) -> Result<(), String> {
    let crds = vec![Network::crd(), Cluster::crd()];
    // With --scrape-to: the runtime's metrics and the client's API requests, in one registry.
    let mut registry = args
        .scrape_to
        .as_ref()
        .map(|_| actorcile::metrics::Registry::default());
    let api_metrics = registry.as_mut().map(actorcile::metrics::ApiMetrics::new);
    let (client, _guard): (kube::Client, Box<dyn std::any::Any>) = if let Some(path) =
        &args.kubeconfig
    {
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        actorcile::crds::install(client.clone(), &crds, operator::NAME, operator::CONVERGE)
            .await
            .map_err(|e| e.to_string())?;
        (client, Box::new(()))
    } else if args.envtest {
        let env = actorcile::envtest::Envtest::builder()
            .crds(crds)
            .start()
            .await
            .map_err(|e| e.to_string())?;
        (env.client(), Box::new(env))
    } else {
        let cluster = actorcile::cluster::ApiServer::new();
        for crd in &crds {
            cluster.install_crd(crd).map_err(|e| e.to_string())?;
        }
        let client = match &api_metrics {
            Some(m) => kube::Client::new(
                tower::ServiceBuilder::new()
                    .layer(m)
                    .service(cluster.service()),
                "default",
            ),
            None => cluster.client(),
        };
        (client, Box::new(cluster))
    };
    let mut builder = Runtime::builder(client.clone(), operator::names());
    let mut scraper = None;
    if let (Some(path), Some(registry)) = (&args.scrape_to, registry) {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?;
        builder = builder.metrics_registry(registry).admin(addr);
        scraper = Some(tokio::spawn(scrape(addr, path.clone())));
    }
    let rt = operator::register(
        builder,
        args.infrastructure.provider()?,
        &args.infrastructure.allowed_images,
    )
    .start()
    .await
    .map_err(|e| e.to_string())?;
    let networks: Api<Network> = Api::namespaced(client.clone(), "default");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    for n in 0..args.networks {
        let net = Network::new(
            &format!("net-{n}"),
            NetworkSpec {
                cidr: format!("10.{n}.0.0/16"),
            },
        );
        networks
            .create(&PostParams::default(), &net)
            .await
            .map_err(|e| e.to_string())?;
        for c in 0..args.clusters_per_network {
            let cl = Cluster::new(
                &format!("net-{n}-cluster-{c}"),
                ClusterSpec {
                    network: format!("net-{n}"),
                    workers: 1 + c % 3,
                    image: "example/node:1.33".into(),
                },
            );
            clusters
                .create(&PostParams::default(), &cl)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    let total_clusters = args.networks * args.clusters_per_network;
    let deadline = started + operator::CONVERGE;
    loop {
        let ready_n = count(&networks, |o| ResourceStatus::of(o).is_ready()).await?;
        let ready_c = count(&clusters, |o| ResourceStatus::of(o).is_ready()).await?;
        println!(
            "{:>6.1}s  networks ready {ready_n}/{}  clusters ready {ready_c}/{total_clusters}",
            started.elapsed().as_secs_f64(),
            args.networks
        );
        if ready_n == args.networks && ready_c == total_clusters {
            break;
        }
        if Instant::now() > deadline {
            return Err("not every object became Ready in time".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_ready = started.elapsed();
    // Delete everything at once: each network waits (InUse) until its clusters are gone.
    let deleting = Instant::now();
    let dp = DeleteParams::default();
    networks
        .delete_collection(&dp, &ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    clusters
        .delete_collection(&dp, &ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let left_n = count(&networks, |_| true).await?;
        let left_c = count(&clusters, |_| true).await?;
        println!(
            "{:>6.1}s  deleting: networks left {left_n}  clusters left {left_c}",
            started.elapsed().as_secs_f64()
        );
        if left_n == 0 && left_c == 0 {
            break;
        }
        if Instant::now() > deadline + operator::CONVERGE {
            return Err("not every object was deleted in time".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_deleted = deleting.elapsed();
    let m = rt.metrics();
    println!(
        "summary: {} networks and {total_clusters} clusters Ready in {:.2}s, deleted in {:.2}s; \
         {} reconciles ({} deprovision), {} status writes, {} restarts",
        args.networks,
        all_ready.as_secs_f64(),
        all_deleted.as_secs_f64(),
        m.reconciles,
        m.deprovision_reconciles,
        m.status_writes,
        m.restarts,
    );
    for k in rt.kind_metrics() {
        let runs: Vec<String> = k
            .reconciles
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{}={n}", r.as_str()))
            .collect();
        println!(
            "  {}: reconciles {}; Events {}",
            k.kind,
            runs.join(" "),
            k.events
        );
    }
    if let Some(scraper) = scraper {
        // One last scrape after the deletions.
        tokio::time::sleep(Duration::from_millis(600)).await;
        scraper.abort();
    }
    rt.shutdown().await;
    Ok(())
}

/// `GET /metrics` on `addr` every 250 ms, each answer appended to `path` after `# at SECONDS`.
async fn scrape(addr: std::net::SocketAddr, path: std::path::PathBuf) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let mut file = match tokio::fs::File::create(&path).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            continue;
        };
        let req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        let mut answer = String::new();
        if s.write_all(req.as_bytes()).await.is_err()
            || s.read_to_string(&mut answer).await.is_err()
        {
            continue;
        }
        let Some((_, body)) = answer.split_once("\r\n\r\n") else {
            continue;
        };
        let at = format!("# at {:.3}\n", started.elapsed().as_secs_f64());
        if file.write_all(at.as_bytes()).await.is_err()
            || file.write_all(body.as_bytes()).await.is_err()
        {
            return;
        }
        let _ = file.flush().await;
    }
}

async fn count<K>(api: &Api<K>, f: impl Fn(&K) -> bool) -> Result<usize, String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items.iter().filter(|o| f(o)).count())
}
