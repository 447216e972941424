//! The flags an operator binary takes (feature `operator`): [`RuntimeArgs`], a clap
//! [`Args`](clap::Args) struct to flatten into the operator's own parser (or a
//! [`Parser`](clap::Parser) of its own, for an operator with no flags of its own:
//! `RuntimeArgs::parse()`). Each flag falls back
//! to an `ACTORCILE_*` environment variable ([`RuntimeArgs::env_prefix`] names them after the
//! operator instead).
//!
//! ```no_run
//! use actorcile::cli::RuntimeArgs;
//! use clap::Parser;
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     runtime: RuntimeArgs,
//!     /// The operator's own flag.
//!     #[arg(long, default_value = "eu-west")]
//!     region: String,
//! }
//!
//! # async fn run() -> Result<(), actorcile::Error> {
//! let args = Args::parse();
//! args.runtime.init_tracing()?;
//! let mut registry = actorcile::metrics::Registry::default();
//! let client = args.runtime.client(Some(&mut registry)).await?;
//! let names = actorcile::names::OperatorNames::new("bucket-operator", "buckets.example.com");
//! let builder = args.runtime.builder(client, names)?.metrics_registry(registry);
//! // builder.controller(...).run().await
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::Error;
use crate::admin::DEFAULT_ADMIN_ADDR;
use crate::leader::LeaderElection;
use crate::metrics::{ApiMetrics, Registry};
use crate::names::OperatorNames;
use crate::policy::SupervisorPolicy;
use crate::runtime::{Runtime, RuntimeBuilder};
use crate::sharding::Sharding;
use crate::telemetry::LogFormat;

/// The runtime's flags.
#[derive(clap::Parser, Clone, Debug)]
#[command(next_help_heading = "Runtime")]
pub struct RuntimeArgs {
    /// Kubeconfig file to use [default: in-cluster config, else $KUBECONFIG, else
    /// ~/.kube/config]
    #[arg(long, env = "ACTORCILE_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use [default: the kubeconfig's current context]
    #[arg(long, env = "ACTORCILE_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,

    /// Watch only this namespace [default: all namespaces]
    #[arg(long, env = "ACTORCILE_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Address of the admin server (/metrics, /healthz, /readyz); in a Pod, 0.0.0.0:PORT (or
    /// :PORT). controller-runtime's name for it, --health-probe-bind-address, is an alias
    #[arg(
        long,
        alias = "health-probe-bind-address",
        env = "ACTORCILE_ADMIN_ADDR",
        value_name = "ADDR",
        default_value = DEFAULT_ADMIN_ADDR,
        value_parser = parse_addr
    )]
    pub admin_addr: SocketAddr,

    /// Serve /metrics on this address instead of the admin address (which then serves the
    /// probes only); :PORT is every interface. controller-runtime's name for it,
    /// --metrics-bind-address, is an alias
    #[arg(
        long,
        alias = "metrics-bind-address",
        env = "ACTORCILE_METRICS_ADDR",
        value_name = "ADDR",
        value_parser = parse_addr
    )]
    pub metrics_addr: Option<SocketAddr>,

    /// Serve the runtime's introspection (what it knows of each object now, read with
    /// `actorcile why`) on this address; off unless set. Keep it on loopback: it names objects
    #[arg(
        long,
        env = "ACTORCILE_INTROSPECTION_ADDR",
        value_name = "ADDR",
        value_parser = parse_addr
    )]
    pub introspection_addr: Option<SocketAddr>,

    /// Log line format
    #[arg(long, env = "ACTORCILE_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,

    /// Log filter, in RUST_LOG syntax (e.g. info,actorcile=debug) [default: $RUST_LOG, else
    /// info]
    #[arg(
        long = "log",
        env = "ACTORCILE_LOG",
        value_name = "FILTER",
        default_value_t = default_log_filter(),
        hide_default_value = true
    )]
    pub log_filter: String,

    /// Export the runtime's spans over OTLP/HTTP to this collector traces URL (e.g.
    /// http://otel-collector:4318/v1/traces, or https:// for TLS; feature `otel`)
    #[cfg(feature = "otel")]
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// With an https OTLP endpoint: trust only the CA certificates of this PEM file [default:
    /// the system's roots] (feature `otel`)
    #[cfg(feature = "otel")]
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        value_name = "PATH"
    )]
    pub otlp_ca_file: Option<PathBuf>,

    /// The service name of the exported spans (feature `otel`) [default: the executable's
    /// file name]
    #[cfg(feature = "otel")]
    #[arg(long, env = "OTEL_SERVICE_NAME", value_name = "NAME")]
    pub otlp_service_name: Option<String>,

    /// Supervisor policy file (TOML) [default: the built-in policy]
    #[arg(long, env = "ACTORCILE_POLICY", value_name = "PATH")]
    pub policy: Option<PathBuf>,

    /// Most reconciles running at once, over every kind [default: the policy's]
    #[arg(
        long,
        alias = "max-concurrent-runs",
        env = "ACTORCILE_MAX_CONCURRENT_RECONCILES",
        value_name = "N"
    )]
    pub max_concurrent_reconciles: Option<usize>,

    /// Check at start-up that the running identity has every permission the runtime needs
    #[arg(long, env = "ACTORCILE_PREFLIGHT_RBAC")]
    pub preflight_rbac: bool,

    /// Elect a leader among the replicas on a Lease: only the leader runs the controllers
    #[arg(long, env = "ACTORCILE_LEADER_ELECT")]
    pub leader_elect: bool,

    /// The leader election's Lease name (controller-runtime's --leader-election-id is an
    /// alias) [default: NAME-leader, of the operator's name]
    #[arg(
        long,
        alias = "leader-election-id",
        env = "ACTORCILE_LEADER_ELECT_LEASE",
        value_name = "NAME"
    )]
    pub leader_elect_lease: Option<String>,

    /// The leader election's Lease namespace [default: $POD_NAMESPACE, else default]
    /// (controller-runtime's --leader-election-namespace is an alias)
    #[arg(
        long,
        alias = "leader-election-namespace",
        env = "ACTORCILE_LEADER_ELECT_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub leader_elect_namespace: Option<String>,

    /// How long a Lease holds without renewal before another replica may take it, for
    /// leader election and shards alike (e.g. 15s) [default: the policy's]
    #[arg(
        long,
        alias = "leader-elect-lease-duration",
        env = "ACTORCILE_LEASE_DURATION",
        value_name = "DURATION",
        value_parser = humantime_serde::re::humantime::parse_duration
    )]
    pub lease_duration: Option<Duration>,

    /// How long a holder keeps trying to renew before it stops acting as the holder (shorter
    /// than the lease duration) [default: the policy's]
    #[arg(
        long,
        alias = "leader-elect-renew-deadline",
        env = "ACTORCILE_LEASE_RENEW_DEADLINE",
        value_name = "DURATION",
        value_parser = humantime_serde::re::humantime::parse_duration
    )]
    pub lease_renew_deadline: Option<Duration>,

    /// How often Leases are renewed or tried [default: the policy's]
    #[arg(
        long,
        alias = "leader-elect-retry-period",
        env = "ACTORCILE_LEASE_RETRY_PERIOD",
        value_name = "DURATION",
        value_parser = humantime_serde::re::humantime::parse_duration
    )]
    pub lease_retry_period: Option<Duration>,

    /// This replica's identity in the election or among the shards' holders [default:
    /// $POD_NAME (else $HOSTNAME) and the process id]
    #[arg(long, env = "ACTORCILE_IDENTITY", value_name = "ID")]
    pub identity: Option<String>,

    /// Do not watch while standing by (a takeover then lists first; less memory on standbys)
    #[arg(long, env = "ACTORCILE_COLD_STANDBY")]
    pub cold_standby: bool,

    /// Split the objects across the replicas in N shards, each a Lease (not with
    /// --leader-elect)
    #[arg(long, env = "ACTORCILE_SHARDS", value_name = "N")]
    pub shards: Option<u32>,

    /// The shard Leases' name prefix [default: NAME-shards, of the operator's name]
    #[arg(long, env = "ACTORCILE_SHARDS_LEASE_PREFIX", value_name = "PREFIX")]
    pub shards_lease_prefix: Option<String>,

    /// The shard Leases' namespace [default: $POD_NAMESPACE, else default]
    #[arg(long, env = "ACTORCILE_SHARDS_NAMESPACE", value_name = "NAMESPACE")]
    pub shards_namespace: Option<String>,

    /// Watch and cache only the objects of the shards this replica holds (each object is
    /// labelled with its shard; a takeover relists first)
    #[arg(long, env = "ACTORCILE_SHARDS_HELD_ONLY")]
    pub shards_held_only: bool,

    /// Have the API server send each replica only the objects of the shards it holds (no label
    /// written; objects placed by their uid; Kubernetes 1.36+ with the ShardedListAndWatch
    /// feature gate, else every object is watched). Every replica must use it
    #[arg(
        long,
        env = "ACTORCILE_SHARDS_SERVER_SIDE",
        conflicts_with = "shards_held_only"
    )]
    pub shards_server_side: bool,
}

/// The log filter without `--log` or `ACTORCILE_LOG`: `RUST_LOG`, as in the rest of the Rust
/// ecosystem, else `info`.
fn default_log_filter() -> String {
    log_filter_or_info(std::env::var("RUST_LOG").ok())
}

fn log_filter_or_info(rust_log: Option<String>) -> String {
    rust_log
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "info".into())
}

/// An address to bind: `HOST:PORT`, or `:PORT` for every interface (controller-runtime's
/// form, e.g. `--metrics-bind-address=:8080`).
/// The file name of the running executable, the service name of exported spans when no flag
/// names one (OTel's own default is `unknown_service`).
#[cfg(feature = "otel")]
fn executable_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown_service".into())
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse()
        .map_err(|e| format!("{s:?} is not HOST:PORT or :PORT ({e})"))
}

impl RuntimeArgs {
    /// `command` (the operator's parser, with these flags flattened in) with each
    /// `ACTORCILE_*` environment variable of the flags named `<prefix>_*` instead, so that the
    /// operator's Deployment sets `BUCKETS_NAMESPACE`, not a variable of the framework's name.
    /// The flags' names and the `OTEL_*` variables stay.
    ///
    /// ```
    /// use actorcile::cli::RuntimeArgs;
    /// use clap::{CommandFactory, FromArgMatches, Parser};
    ///
    /// #[derive(Parser)]
    /// struct Args {
    ///     #[command(flatten)]
    ///     runtime: RuntimeArgs,
    /// }
    ///
    /// let command = RuntimeArgs::env_prefix(Args::command(), "BUCKETS");
    /// let namespace = command.get_arguments().find(|a| a.get_id() == "namespace").unwrap();
    /// assert_eq!(namespace.get_env().unwrap(), "BUCKETS_NAMESPACE");
    /// let matches = command.try_get_matches_from(["bucket-operator", "--namespace", "team-a"]).unwrap();
    /// let args = Args::from_arg_matches(&matches).unwrap();
    /// assert_eq!(args.runtime.namespace.as_deref(), Some("team-a"));
    /// ```
    pub fn env_prefix(command: clap::Command, prefix: &str) -> clap::Command {
        command.mut_args(|arg| {
            let renamed = arg
                .get_env()
                .and_then(|e| e.to_str())
                .and_then(|e| e.strip_prefix("ACTORCILE_"))
                .map(|rest| format!("{prefix}_{rest}"));
            match renamed {
                Some(name) => arg.env(name),
                None => arg,
            }
        })
    }

    /// Install the tracing subscriber the flags ask for
    /// ([`init_tracing`](crate::telemetry::init_tracing)); with the feature `otel` and
    /// `--otlp-endpoint`, one that also exports the spans
    /// ([`init_tracing_with_otlp`](crate::telemetry::init_tracing_with_otlp)), kept until
    /// [`shutdown_otlp`](crate::telemetry::shutdown_otlp) (which
    /// [`RuntimeBuilder::run`](crate::runtime::RuntimeBuilder::run) calls when it returns).
    pub fn init_tracing(&self) -> Result<(), Error> {
        #[cfg(feature = "otel")]
        if let Some(endpoint) = &self.otlp_endpoint {
            let service = self
                .otlp_service_name
                .clone()
                .unwrap_or_else(executable_name);
            let otlp = match &self.otlp_ca_file {
                Some(ca) => crate::telemetry::Otlp::with_ca_file(endpoint, &service, ca)?,
                None => crate::telemetry::Otlp::new(endpoint, &service)?,
            };
            crate::telemetry::init_tracing_with_otlp(self.log_format, &self.log_filter, &otlp)?;
            crate::telemetry::keep_otlp(otlp);
            return Ok(());
        }
        crate::telemetry::init_tracing(self.log_format, &self.log_filter)
    }

    /// A client for the cluster the flags name. With a registry, its API requests are counted
    /// there ([`ApiMetrics`]).
    pub async fn client(&self, registry: Option<&mut Registry>) -> Result<Client, Error> {
        let invalid = |problem: String| Error::Invalid {
            field: crate::runtime::Setting::Kubeconfig,
            problem,
        };
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| invalid(format!("{}: {e}", path.display())))?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| invalid(e.to_string()))?,
            (None, None) => kube::Config::infer()
                .await
                .map_err(|e| invalid(e.to_string()))?,
        };
        let builder = kube::client::ClientBuilder::try_from(config)?;
        Ok(match registry {
            Some(registry) => builder.with_layer(&ApiMetrics::new(registry)).build(),
            None => builder.build(),
        })
    }

    /// The policy the flags ask for: the file's (or the default), with the flags' overrides.
    pub fn policy(&self) -> Result<SupervisorPolicy, Error> {
        let mut policy = match &self.policy {
            Some(path) => SupervisorPolicy::from_file(path)?,
            None => SupervisorPolicy::default(),
        };
        if let Some(n) = self.max_concurrent_reconciles {
            policy.runtime.max_concurrent_reconciles = n;
        }
        if let Some(d) = self.lease_duration {
            policy.lease.duration = d;
        }
        if let Some(d) = self.lease_renew_deadline {
            policy.lease.renew_deadline = d;
        }
        if let Some(d) = self.lease_retry_period {
            policy.lease.retry_period = d;
        }
        policy.validate()?;
        Ok(policy)
    }

    /// A runtime builder for the operator `names` set up as the flags say: policy, admin
    /// address, namespace, RBAC preflight, leader election or sharding (their Leases named
    /// from `names` unless the flags name them). Register controllers (and a metrics
    /// registry) on it.
    pub fn builder(&self, client: Client, names: OperatorNames) -> Result<RuntimeBuilder, Error> {
        let leader_lease = self
            .leader_elect_lease
            .clone()
            .unwrap_or_else(|| names.leader_lease());
        let shard_prefix = self
            .shards_lease_prefix
            .clone()
            .unwrap_or_else(|| names.shard_lease_prefix());
        let mut builder = Runtime::builder(client, names)
            .policy(self.policy()?)
            .admin(self.admin_addr)
            .preflight_rbac(self.preflight_rbac);
        if let Some(ns) = &self.namespace {
            builder = builder.namespace(ns);
        }
        if let Some(addr) = self.metrics_addr {
            builder = builder.metrics_addr(addr);
        }
        if let Some(addr) = self.introspection_addr {
            builder = builder.introspection(addr);
        }
        let pod_namespace = |flag: &Option<String>| {
            flag.clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| "default".into())
        };
        if let Some(n) = self.shards {
            let mut sharding =
                Sharding::new(n, pod_namespace(&self.shards_namespace)).lease_prefix(&shard_prefix);
            if self.shards_held_only {
                sharding = sharding.watch(crate::sharding::ShardWatch::HeldShards);
            }
            if self.shards_server_side {
                sharding = sharding.watch(crate::sharding::ShardWatch::ServerSide);
            }
            if let Some(id) = &self.identity {
                sharding = sharding.identity(id);
            }
            builder = builder.sharding(sharding);
        }
        if self.leader_elect {
            let namespace = pod_namespace(&self.leader_elect_namespace);
            let mut election =
                LeaderElection::new(&leader_lease, namespace).warm_standby(!self.cold_standby);
            if let Some(id) = &self.identity {
                election = election.identity(id);
            }
            builder = builder.leader_election(election);
        }
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Args {
        #[command(flatten)]
        runtime: RuntimeArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let a = Args::try_parse_from(["op"]).unwrap().runtime;
        assert_eq!(a.admin_addr, DEFAULT_ADMIN_ADDR.parse().unwrap());
        assert!(
            a.admin_addr.ip().is_loopback(),
            "the admin endpoint binds loopback unless told otherwise"
        );
        assert_eq!(a.log_format, LogFormat::Plain);
        assert_eq!(a.log_filter, "info");
        assert!(a.namespace.is_none() && a.policy.is_none() && !a.preflight_rbac);

        let a = Args::try_parse_from([
            "op",
            "--namespace",
            "tenants",
            "--admin-addr",
            "0.0.0.0:9000",
            "--log-format",
            "json",
            "--log",
            "debug",
            "--max-concurrent-reconciles",
            "8",
        ])
        .unwrap()
        .runtime;
        assert_eq!(a.namespace.as_deref(), Some("tenants"));
        assert_eq!(a.admin_addr.port(), 9000);
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.policy().unwrap().runtime.max_concurrent_reconciles, 8);
    }

    /// The OTLP flags, and an endpoint that is no URL refused by `init_tracing` before any
    /// subscriber is installed.
    #[cfg(feature = "otel")]
    #[test]
    fn otlp_flags() {
        let a = Args::try_parse_from(["op"]).unwrap().runtime;
        assert!(a.otlp_endpoint.is_none());
        assert_eq!(a.otlp_service_name, None);
        let a = Args::try_parse_from([
            "op",
            "--otlp-endpoint",
            "not a url",
            "--otlp-service-name",
            "dbs",
        ])
        .unwrap()
        .runtime;
        assert_eq!(a.otlp_service_name.as_deref(), Some("dbs"));
        let e = a.init_tracing().unwrap_err();
        assert!(e.to_string().contains("OTLP endpoint"), "{e}");
    }

    /// controller-runtime's flag names and address form, and the Lease timings as flags.
    #[test]
    fn controller_runtime_names_and_lease_timings() {
        let a = Args::try_parse_from([
            "op",
            "--health-probe-bind-address",
            ":8081",
            "--metrics-bind-address=127.0.0.1:8080",
            "--leader-elect",
            "--leader-election-id",
            "dbs.example.com",
            "--leader-election-namespace",
            "ops",
            "--leader-elect-lease-duration",
            "30s",
            "--lease-renew-deadline",
            "20s",
            "--leader-elect-retry-period",
            "500ms",
        ])
        .unwrap()
        .runtime;
        assert_eq!(a.admin_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(a.metrics_addr, Some("127.0.0.1:8080".parse().unwrap()));
        assert!(a.leader_elect);
        assert_eq!(a.leader_elect_lease.as_deref(), Some("dbs.example.com"));
        assert_eq!(a.leader_elect_namespace.as_deref(), Some("ops"));
        let lease = a.policy().unwrap().lease;
        assert_eq!(
            (lease.duration, lease.renew_deadline, lease.retry_period),
            (
                Duration::from_secs(30),
                Duration::from_secs(20),
                Duration::from_millis(500)
            )
        );
        // Timings that cannot work are refused at start (leader election and sharding check
        // them), naming the setting.
        let a = Args::try_parse_from([
            "op",
            "--lease-duration",
            "5s",
            "--lease-renew-deadline",
            "10s",
        ])
        .unwrap()
        .runtime;
        let (key, _) = a.policy().unwrap().lease.check_timings().unwrap_err();
        assert_eq!(key, "lease_renew_deadline");
        let e = Args::try_parse_from(["op", "--lease-duration", "soon"]).unwrap_err();
        assert!(e.to_string().contains("--lease-duration"), "{e}");
    }

    #[test]
    fn the_log_filter_falls_back_to_rust_log_then_info() {
        assert_eq!(
            log_filter_or_info(Some("warn,kube=debug".into())),
            "warn,kube=debug"
        );
        assert_eq!(log_filter_or_info(Some(" ".into())), "info");
        assert_eq!(log_filter_or_info(None), "info");
    }

    #[test]
    fn bad_values_are_errors_naming_the_flag() {
        let e = Args::try_parse_from(["op", "--admin-addr", "nowhere"]).unwrap_err();
        assert!(e.to_string().contains("--admin-addr"), "{e}");
        let a = Args::try_parse_from(["op", "--max-concurrent-reconciles", "0"])
            .unwrap()
            .runtime;
        assert!(a.policy().is_err(), "zero reconcile slots is not a policy");
    }

    #[test]
    fn help_names_every_env_var() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        for var in [
            "ACTORCILE_KUBECONFIG",
            "ACTORCILE_CONTEXT",
            "ACTORCILE_NAMESPACE",
            "ACTORCILE_ADMIN_ADDR",
            "ACTORCILE_LOG_FORMAT",
            "ACTORCILE_LOG",
            "ACTORCILE_POLICY",
            "ACTORCILE_MAX_CONCURRENT_RECONCILES",
            "ACTORCILE_PREFLIGHT_RBAC",
            "ACTORCILE_LEADER_ELECT",
            "ACTORCILE_LEADER_ELECT_LEASE",
            "ACTORCILE_LEADER_ELECT_NAMESPACE",
            "ACTORCILE_IDENTITY",
            "ACTORCILE_COLD_STANDBY",
            "ACTORCILE_SHARDS",
            "ACTORCILE_SHARDS_LEASE_PREFIX",
            "ACTORCILE_SHARDS_NAMESPACE",
            "ACTORCILE_LEASE_DURATION",
            "ACTORCILE_LEASE_RENEW_DEADLINE",
            "ACTORCILE_LEASE_RETRY_PERIOD",
            "RUST_LOG",
        ] {
            assert!(help.contains(var), "{var} missing from --help:\n{help}");
        }
    }
}
