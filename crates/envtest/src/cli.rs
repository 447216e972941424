//! `up|down|status|restart` (feature `cli`): a real etcd + kube-apiserver that outlives the
//! command, for trying an operator by hand or from scripts
//! (`eval "$(actorcile-envtest up | grep ^export)"`). The `actorcile-envtest` binary of this
//! crate runs it (`cargo install actorcile-envtest --features cli`, much lighter to build than
//! the whole `actorcile` command, whose `envtest` subcommand is the same); `program` in
//! [`run`] is the command line it is reached by, named in its messages.
//!
//! The control plane's state (pids, ports, kubeconfigs, logs, etcd data) lives in
//! `~/.cache/actorcile/envtest/` (or `$ACTORCILE_CACHE_DIR/envtest/`). Starting, flags, keys and
//! readiness are the crate's ([`EnvtestBuilder::start_detached`](crate::EnvtestBuilder::start_detached),
//! [`DetachedEnvtest`]); this module only adds the state-directory bookkeeping.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::{Component, DetachedEnvtest, Envtest};

/// The `envtest` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum EnvtestCmd {
    /// Start a detached etcd + kube-apiserver (or report the one already running) and print its
    /// kubeconfig.
    Up {
        /// Also run a kube-controller-manager (garbage collector and namespace controller), for
        /// ownerReference cascades and namespace deletion.
        #[arg(long)]
        controller_manager: bool,
        /// CustomResourceDefinition YAML files (one or more documents each) to install and wait for.
        #[arg(long = "crds", value_name = "FILE")]
        crds: Vec<PathBuf>,
        /// How long each component may take to become ready (`30s`, `2m`).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Stop the detached control plane and remove its state.
    Down,
    /// Say whether the detached control plane runs (exit code 1 when it does not). A component
    /// restarted by hand with the same flags is recognised and recorded.
    Status,
    /// Stop one component of the detached control plane (`kill -9`, or SIGTERM with
    /// `--graceful`) and start it again with the same flags, data and ports; waits until the
    /// apiserver is ready again. A component that is down is just started.
    Restart {
        /// The component: `etcd` or `kube-apiserver`.
        #[arg(value_enum)]
        component: ComponentArg,
        /// Stop it with SIGTERM (then SIGKILL after 10 s) instead of SIGKILL.
        #[arg(long)]
        graceful: bool,
        /// How long the restarted component may take to become ready (`30s`, `2m`).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

/// A control-plane component, as named on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ComponentArg {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    KubeApiserver,
}

impl From<ComponentArg> for Component {
    fn from(c: ComponentArg) -> Component {
        match c {
            ComponentArg::Etcd => Component::Etcd,
            ComponentArg::KubeApiserver => Component::KubeApiserver,
        }
    }
}

/// The state directory: `$ACTORCILE_CACHE_DIR/envtest` or `~/.cache/actorcile/envtest`.
pub fn state_dir() -> anyhow::Result<PathBuf> {
    crate::cache_dir()
        .map(|d| d.join("envtest"))
        .context("cannot find a cache directory: set HOME or ACTORCILE_CACHE_DIR")
}

/// Runs one subcommand; `program` is how it was reached (`actorcile-envtest`, `actorcile
/// envtest`), for the messages that name the next command to run.
pub async fn run(cmd: EnvtestCmd, program: &str) -> anyhow::Result<()> {
    let dir = state_dir()?;
    match cmd {
        EnvtestCmd::Up {
            controller_manager,
            crds,
            timeout,
        } => up(dir, &crds, controller_manager, timeout, program).await,
        EnvtestCmd::Down => down(dir, program).await,
        EnvtestCmd::Status => status(dir, program).await,
        EnvtestCmd::Restart {
            component,
            graceful,
            timeout,
        } => restart(dir, component.into(), graceful, timeout, program).await,
    }
}

/// The recorded state, with components restarted by hand (same flags, new pid) adopted and
/// recorded, so that `status` reports them and `down` stops them.
fn load(dir: &std::path::Path, program: &str) -> anyhow::Result<Option<DetachedEnvtest>> {
    let Some(mut s) = DetachedEnvtest::load(dir)
        .with_context(|| format!("reading the envtest state (`{program} down` removes it)"))?
    else {
        return Ok(None);
    };
    let adopted = s.adopt_restarted();
    for (c, old, new) in &adopted {
        eprintln!(
            "envtest: {} was restarted by hand (pid {old} is gone; pid {new} serves its port): recorded",
            c.name()
        );
    }
    if !adopted.is_empty() {
        s.save()?;
    }
    Ok(Some(s))
}

async fn restart(
    dir: PathBuf,
    component: Component,
    graceful: bool,
    timeout: Duration,
    program: &str,
) -> anyhow::Result<()> {
    let Some(mut s) = load(&dir, program)? else {
        bail!("envtest control plane is not running (`{program} up` starts it)");
    };
    let old = s.pid(component);
    let was = if s.runs(component) {
        "stopped"
    } else {
        "was not running;"
    };
    let pid = s
        .restart(component, graceful, timeout)
        .await
        .with_context(|| format!("restarting {}", component.name()))?;
    println!(
        "{} {was} pid {old}, started again as pid {pid}; apiserver ready: {}",
        component.name(),
        s.server_url
    );
    Ok(())
}

async fn up(
    dir: PathBuf,
    crd_files: &[PathBuf],
    controller_manager: bool,
    timeout: Duration,
    program: &str,
) -> anyhow::Result<()> {
    let mut crds = Vec::new();
    for f in crd_files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        crds.extend(crate::crds_from_yaml(&text).with_context(|| format!("in {}", f.display()))?);
    }
    if let Some(existing) = load(&dir, program)? {
        if existing.is_running() {
            if !crds.is_empty() {
                let config = kube_config(&existing).await?;
                crate::install_crds(kube::Client::try_from(config)?, &crds, timeout).await?;
            }
            println!(
                "envtest control plane already running: Kubernetes {} at {}",
                existing.version, existing.server_url
            );
            if controller_manager && existing.controller_manager_pid.is_none() {
                eprintln!(
                    "envtest: it runs without a controller manager; `{program} down`, \
                     then `up --controller-manager` to have one"
                );
            }
            print_usage(&existing);
            return Ok(());
        }
        eprintln!(
            "envtest: a component is down; stopping the other and starting afresh in {}",
            dir.display()
        );
        existing.stop(Duration::from_secs(2)).await?;
    } else if dir.exists() {
        // Leftovers without a state file (an interrupted `up`): start from a clean directory.
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let started = Envtest::builder()
        .dir(&dir)
        .crds(crds)
        .startup_timeout(timeout)
        .controller_manager(controller_manager)
        .start_detached()
        .await
        .context("starting the envtest control plane")?;
    let cm = started
        .controller_manager_pid
        .map(|pid| format!(", kube-controller-manager pid {pid}"))
        .unwrap_or_default();
    println!(
        "envtest control plane started: Kubernetes {} at {} (etcd pid {}, kube-apiserver pid {}{cm})",
        started.version, started.server_url, started.etcd_pid, started.apiserver_pid
    );
    print_usage(&started);
    Ok(())
}

fn print_usage(s: &DetachedEnvtest) {
    println!("kubeconfig (admin): {}", s.kubeconfig.display());
    println!(
        "kubeconfig (non-admin user {}): {}",
        crate::USER_NAME,
        s.user_kubeconfig.display()
    );
    println!("logs: {}", s.dir.display());
    println!("export KUBECONFIG={}", s.kubeconfig.display());
}

async fn kube_config(s: &DetachedEnvtest) -> anyhow::Result<kube::Config> {
    let kc = kube::config::Kubeconfig::read_from(&s.kubeconfig)?;
    Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
}

async fn down(dir: PathBuf, program: &str) -> anyhow::Result<()> {
    let state = match load(&dir, program) {
        Ok(state) => state,
        Err(e) => {
            // Unreadable state: the processes cannot be found by pid; clean the directory anyway.
            eprintln!(
                "envtest: {e}; removing {} (stop any leftover etcd/kube-apiserver by hand)",
                dir.display()
            );
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            return Ok(());
        }
    };
    match state {
        Some(s) => {
            let was_running = s.is_running();
            s.stop(Duration::from_secs(5)).await?;
            if was_running {
                println!("envtest control plane stopped; removed {}", dir.display());
            } else {
                println!(
                    "envtest control plane was not running; removed stale state {}",
                    dir.display()
                );
            }
        }
        None if dir.exists() => {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            println!(
                "envtest control plane was not running; removed {}",
                dir.display()
            );
        }
        None => println!("envtest control plane is not running"),
    }
    Ok(())
}

async fn status(dir: PathBuf, program: &str) -> anyhow::Result<()> {
    match load(&dir, program)? {
        Some(s) if s.is_running() => {
            let ready = if s.is_ready().await {
                "ready"
            } else {
                "not ready"
            };
            println!(
                "envtest control plane running, {ready}: {} (etcd pid {}, kube-apiserver pid {})",
                s.server_url, s.etcd_pid, s.apiserver_pid
            );
            println!("export KUBECONFIG={}", s.kubeconfig.display());
            Ok(())
        }
        Some(s) => {
            let down: Vec<String> = [Component::Etcd, Component::KubeApiserver]
                .into_iter()
                .filter(|c| !s.runs(*c))
                .map(|c| format!("{} (pid {} gone)", c.name(), s.pid(c)))
                .collect();
            bail!(
                "envtest control plane is down: {}; `{program} restart <component>` starts it again, `{program} down` cleans up {}",
                down.join(", "),
                dir.display()
            )
        }
        None => bail!("envtest control plane is not running"),
    }
}
