//! An example operator on actorcile: `Network`s and the `Cluster`s that use them.
//!
//! ```text
//! example-operator run [--install-crds] [--webhook-addr ADDR] [runtime flags]   # the operator
//! example-operator crds                                    # its CRDs, as YAML
//! example-operator manifests [--image IMAGE]               # RBAC and a Deployment, as YAML
//! example-operator demo [--networks N] [--clusters-per-network M] [--envtest]
//! ```

use example_operator::{demo, manifests, operator, record};

use std::process::ExitCode;

use actorcile::cli::RuntimeArgs;
use actorcile::webhooks::{Certificates, WebhookLimits, WebhookServer};
use clap::{Parser, Subcommand};
use kube::CustomResourceExt;

use operator::{Cluster, Network};

#[derive(Parser)]
#[command(
    version,
    about = "An example operator on actorcile: Networks and the Clusters that use them"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator against a cluster (in-cluster config, or --kubeconfig).
    Run {
        #[command(flatten)]
        runtime: Box<RuntimeArgs>,
        #[command(flatten)]
        infrastructure: operator::ProviderArgs,
        /// Install (or update) the CRDs at start-up.
        #[arg(long, env = "EXAMPLE_OPERATOR_INSTALL_CRDS")]
        install_crds: bool,
        /// Append every reconcile's start and end, and every shard acquired or lost, to this file
        /// (see `record.rs`; for tests).
        #[arg(long, hide = true, value_name = "PATH")]
        record_reconciles: Option<std::path::PathBuf>,
        /// Serve the admission and conversion webhooks (see `webhooks.rs`) on this address,
        /// over TLS with the certificate in --webhook-cert-dir.
        #[arg(long, env = "EXAMPLE_OPERATOR_WEBHOOK_ADDR", value_name = "ADDR")]
        webhook_addr: Option<std::net::SocketAddr>,
        /// The webhook server's `tls.crt`, `tls.key` and `ca.crt` (a mounted Secret's
        /// directory, read again when it changes).
        #[arg(
            long,
            env = "EXAMPLE_OPERATOR_WEBHOOK_CERT_DIR",
            default_value = "/tmp/k8s-webhook-server/serving-certs"
        )]
        webhook_cert_dir: std::path::PathBuf,
    },
    /// Print the CRDs as YAML.
    Crds,
    /// Print the Helm chart's RBAC template (examples/operator/chart/templates/rbac.yaml),
    /// generated from the roles the runtime renders.
    #[command(hide = true)]
    ChartRbac,
    /// Print the Helm chart's Grafana dashboard (examples/operator/chart/files/dashboard.json).
    #[command(hide = true)]
    ChartDashboard,
    /// Print the ServiceAccount, ClusterRole, ClusterRoleBinding and Deployment as YAML.
    Manifests {
        /// The operator's container image.
        #[arg(long, default_value = "example-operator:latest")]
        image: String,
        /// The namespace the operator runs in.
        #[arg(long, default_value = "example-operator")]
        namespace: String,
    },
    /// Create networks and clusters, show their progress, delete them, print a summary.
    Demo(demo::DemoArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Run {
            runtime,
            infrastructure,
            install_crds,
            record_reconciles,
            webhook_addr,
            webhook_cert_dir,
        } => {
            let webhooks = webhook_addr.map(|addr| (addr, webhook_cert_dir));
            run(
                *runtime,
                infrastructure,
                install_crds,
                record_reconciles,
                webhooks,
            )
            .await
        }
        Command::Crds => actorcile::crds::to_yaml(&[Network::crd(), Cluster::crd()])
            .map(|y| print!("{y}"))
            .map_err(|e| e.to_string()),
        Command::ChartDashboard => {
            print!("{}", example_operator::dashboard::to_json());
            Ok(())
        }
        Command::ChartRbac => manifests::chart_rbac().map(|y| print!("{y}")),
        Command::Manifests { image, namespace } => {
            manifests::render(&image, &namespace).map(|y| print!("{y}"))
        }
        Command::Demo(args) => demo::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("example-operator: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    args: RuntimeArgs,
    infrastructure: operator::ProviderArgs,
    install_crds: bool,
    record_reconciles: Option<std::path::PathBuf>,
    webhooks: Option<(std::net::SocketAddr, std::path::PathBuf)>,
) -> Result<(), String> {
    match record_reconciles {
        None => args.init_tracing().map_err(|e| e.to_string())?,
        Some(path) => {
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            let recorder = record::ReconcileRecorder::create(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let filter = tracing_subscriber::EnvFilter::builder()
                .parse(&args.log_filter)
                .map_err(|e| e.to_string())?;
            tracing_subscriber::registry()
                .with(filter)
                .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
                .with(recorder)
                .try_init()
                .map_err(|e| e.to_string())?;
        }
    }
    let mut registry = actorcile::metrics::Registry::default();
    let client = args
        .client(Some(&mut registry))
        .await
        .map_err(|e| e.to_string())?;
    // Served for as long as the operator runs; it writes its CA bundle into the webhook
    // configurations and the Network CRD's conversion, which the deployment installs.
    let _webhook_server = match webhooks {
        Some((addr, dir)) => Some(
            WebhookServer::bind(
                addr,
                example_operator::webhooks::webhooks(client.clone()),
                Certificates::from_dir(dir),
                WebhookLimits::default(),
                Some(client.clone()),
            )
            .await
            .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let mut builder = args
        .builder(client, operator::names())
        .map_err(|e| e.to_string())?;
    if install_crds {
        builder = builder.install_crds([Network::crd(), Cluster::crd()]);
    }
    operator::register(
        builder,
        infrastructure.provider()?,
        &infrastructure.allowed_images,
    )
    .metrics_registry(registry)
    .run()
    .await
    .map_err(|e| e.to_string())
}
