//! The operator a chaos run drives, run as its own process (`actorcile chaos-operator`, hidden)
//! so it can be killed with SIGKILL and started again.
//!
//! Its kind, `ChaosItem`, exercises what operators do: a reference to another item it waits to
//! be Ready (and that cannot be deleted before it), a Secret it reads, an owned child ConfigMap,
//! a guarded side effect, and an unguarded teardown step. Around the whole tree, provisioner bugs are injected: a reconcile panics
//! or hangs (past the policy's `reconcile_timeout`) at the rates given. Every reconcile's start and end,
//! every injected fault and every execution of the side effect is recorded (see
//! [`super::lines`]) for the checker.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::rbac::rule_for;
use anyhow::Context as _;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::api_faults::{ApiFaultRates, ApiFaults};
use super::lines::Lines;

/// The item a chaos run creates, updates and deletes.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "chaos.actorcile.dev",
    version = "v1",
    kind = "ChaosItem",
    namespaced,
    status = "ResourceStatus"
)]
pub struct ChaosItemSpec {
    /// Another item (same namespace) this one waits on and references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<String>,
    /// Bumped to make a new generation.
    #[serde(default)]
    pub revision: u32,
}

/// The Secret every item reads (its value is planted: it must appear nowhere the runtime writes).
pub const SECRET: &str = "chaos-credentials";
/// The guarded side effect's condition type.
pub const EFFECT: &str = "Effect";
/// The runtime's name: field manager, Events' reporting controller, finalizer prefix.
pub const NAME: &str = "actorcile-chaos";

/// The chaos operator's names.
pub fn names() -> OperatorNames {
    OperatorNames::new(NAME, "chaos.actorcile.dev")
}
/// The suffix of each item's child ConfigMap.
pub const CHILD_SUFFIX: &str = "-child";

/// The operator's flags (set by the chaos driver).
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// The kubeconfig of the user the operator runs as
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Where the records are appended (reconciles, effects, faults)
    #[arg(long)]
    pub dir: PathBuf,
    /// This process's number among the operator's incarnations
    #[arg(long)]
    pub incarnation: u32,
    /// Seed of the injected faults
    #[arg(long)]
    pub seed: u64,
    /// Fraction of reconciles that panic
    #[arg(long)]
    pub panic_rate: f64,
    /// Fraction of reconciles that hang until the run timeout stops them
    #[arg(long)]
    pub hang_rate: f64,
    /// Run as one of several replicas sharing this many shards on Leases (0: alone)
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
    /// How far the driver set this process's wall clock off (seconds; the records take it
    /// out, the runtime is not told)
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub clock_skew: i64,
    #[command(flatten)]
    pub api: ApiFaultRates,
}

/// A replica's identity on the shard Leases: this and its incarnation.
pub const IDENTITY_PREFIX: &str = "chaos-operator-";

/// The namespace of the shard Leases (the items' own) and their name prefix.
pub const SHARD_LEASES: (&str, &str) = ("chaos", "chaos-shards");

/// How long the chaos operator waits for the answer of a write of its own (a lost answer is
/// held longer).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The supervisor policy of the chaos operator: short backoffs, lock expiry and write timeout,
/// so that a run converges within a bounded time after its faults; a short run timeout only
/// when reconciles are made to hang (`hangs`), which it ends.
///
/// Without injected hangs the run timeout is the default's: on a loaded machine a real reconcile
/// can run past 2 s, and a reconcile stopped after its guarded effect ran but before the guard
/// recorded it runs the effect again on its retry (the guard's at-least-once window, like a
/// kill's). That is a fault of its own, not one a run without hangs injects.
pub fn policy(hangs: bool) -> SupervisorPolicy {
    let mut p = SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            reconcile_timeout: hangs
                .then_some(Duration::from_secs(2))
                .or(SupervisorPolicy::default().kind.reconcile_timeout),
            lock_expiry: Duration::from_secs(5),
            write_timeout: Some(WRITE_TIMEOUT),
            ..Default::default()
        },
        // Replicas: a shard whose holder died or stopped moves within two lease durations.
        lease: actorcile::policy::LeasePolicy {
            duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(250),
        },
        ..Default::default()
    };
    p.kind.error_backoff.max = Duration::from_secs(2);
    p.kind.restart.backoff.max = Duration::from_secs(2);
    // Past what the injected panics can reach: an item retried every few hundred milliseconds
    // (its locks and writes failing too) meets six 5 % panics within a minute now and then, and
    // the default intensity (5 in 60 s) would quarantine it. Quarantine is the verdict on a
    // provisioner that keeps failing, which the chaos workload does not have.
    p.kind.restart.max_restarts = 50;
    p
}

/// What the checker reads of one reconcile and what a reconcile injects.
struct Chaos {
    incarnation: u32,
    seed: u64,
    panic_rate: f64,
    hang_rate: f64,
    reconciles: Lines,
    effects: Lines,
    next_reconcile: AtomicU64,
}

/// Writes a reconcile's `end` line when dropped: at its end, its panic, or when the run timeout drops
/// it.
struct ReconcileEnd<'a>(&'a Chaos, u64);

impl Drop for ReconcileEnd<'_> {
    fn drop(&mut self) {
        self.0
            .reconciles
            .write(format_args!("end {} {}", self.0.incarnation, self.1));
    }
}

/// The tree, with reconciles recorded and bugs injected around it.
struct Chaotic<P> {
    chaos: Arc<Chaos>,
    inner: P,
}

impl<P> Chaotic<P> {
    /// Records the reconcile's start and rolls its bug: the returned guard ends it.
    async fn enter(&self, cx: &Context<ChaosItem>, what: &str) -> ReconcileEnd<'_> {
        let c = &self.chaos;
        let reconcile = c.next_reconcile.fetch_add(1, Ordering::Relaxed);
        let key = format!(
            "{}/{}",
            cx.object().namespace().unwrap_or_default(),
            cx.object().name_any()
        );
        c.reconciles.write(format_args!(
            "start {} {reconcile} {key} {what}",
            c.incarnation
        ));
        let end = ReconcileEnd(c, reconcile);
        let mut rng = fastrand::Rng::with_seed(
            c.seed ^ u64::from(c.incarnation).rotate_left(32) ^ reconcile.wrapping_mul(0x9e37_79b9),
        );
        let roll = rng.f64();
        if roll < c.panic_rate {
            c.reconciles
                .write(format_args!("fault panic {} {reconcile}", c.incarnation));
            panic!("chaos: an injected provisioner bug in {key}");
        }
        if roll < c.panic_rate + c.hang_rate {
            c.reconciles
                .write(format_args!("fault hang {} {reconcile}", c.incarnation));
            std::future::pending::<()>().await;
        }
        end
    }
}

#[async_trait]
impl<P: Provisioner<ChaosItem>> Provisioner<ChaosItem> for Chaotic<P> {
    fn name(&self) -> &str {
        "chaotic"
    }
    async fn provision(&self, cx: &Context<ChaosItem>) -> Outcome {
        let _end = self.enter(cx, "provision").await;
        self.inner.provision(cx).await
    }
    async fn deprovision(&self, cx: &Context<ChaosItem>) -> Outcome {
        let _end = self.enter(cx, "deprovision").await;
        self.inner.deprovision(cx).await
    }
    fn rules(&self) -> Vec<actorcile::rbac::StepRule> {
        self.inner.rules()
    }
}

/// The line of one execution of the side effect.
fn effect(chaos: &Chaos, cx: &Context<ChaosItem>, intent: &str) {
    let o = cx.object();
    chaos.effects.write(format_args!(
        "effect {} {} {} {intent} {}/{}",
        chaos.incarnation,
        o.uid().unwrap_or_default(),
        o.metadata.generation.unwrap_or_default(),
        o.namespace().unwrap_or_default(),
        o.name_any()
    ));
}

fn tree(chaos: Arc<Chaos>) -> impl Provisioner<ChaosItem> {
    let (provision, deprovision) = (chaos.clone(), chaos.clone());
    let teardown = chaos.clone();
    let inner = serial![
        // Last in deprovision order and unguarded: it runs once per deletion unless the
        // process stops between it and the finalizer's removal.
        step("teardown", |_cx: Context<ChaosItem>| async {
            Outcome::Done
        })
        .on_delete(move |cx: Context<ChaosItem>| {
            let chaos = teardown.clone();
            async move {
                effect(&chaos, &cx, "teardown");
                Outcome::Done
            }
        }),
        step("uses", |cx: Context<ChaosItem>| async move {
            let Some(uses) = cx.object().spec.uses.clone() else {
                return Outcome::Done;
            };
            let target = Target::new(
                "chaos.actorcile.dev/v1",
                "ChaosItem",
                cx.object().namespace().as_deref(),
                uses,
            );
            if let Some(wait) = cx.require_ready(&target).await {
                return wait;
            }
            match cx.add_reference(&target).await {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::failed(
                    Reason::new("Reference", "cannot reference the item it uses"),
                    e,
                ),
            }
        }),
        step("credentials", |cx: Context<ChaosItem>| async move {
            let ns = cx.object().namespace().unwrap_or_default();
            let secrets: Api<Secret> = Api::namespaced(cx.client().clone(), &ns);
            match secrets.get_opt(SECRET).await {
                Ok(Some(s)) if s.data.as_ref().is_some_and(|d| d.contains_key("token")) => {
                    Outcome::Done
                }
                Ok(_) => Outcome::UserActionRequired(Reason::new(
                    "CredentialsMissing",
                    format!("the Secret {SECRET} with a key `token` is needed"),
                )),
                Err(e) => Outcome::failed(
                    Reason::new("Credentials", "cannot read the credentials Secret"),
                    e,
                ),
            }
        })
        .needs(rule_for::<Secret>(&["get"])),
        resource("child", |item: &ChaosItem| ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{}{CHILD_SUFFIX}", item.name_any())),
                ..Default::default()
            },
            data: Some([("revision".to_string(), item.spec.revision.to_string())].into()),
            ..Default::default()
        }),
        guard(EFFECT, move |cx: Context<ChaosItem>| {
            let chaos = provision.clone();
            async move {
                effect(&chaos, &cx, "provision");
                // Long enough that a kill can land between the effect and its Done.
                tokio::time::sleep(Duration::from_millis(20)).await;
                Outcome::Done
            }
        })
        .deprovision_with(move |cx: Context<ChaosItem>| {
            let chaos = deprovision.clone();
            async move {
                effect(&chaos, &cx, "deprovision");
                Outcome::Done
            }
        }),
    ];
    Chaotic { chaos, inner }
}

/// The runtime builder of the chaos operator on `client`, recording into `dir` as incarnation
/// `incarnation` (the driver builds one too, to read the ClusterRole it needs).
pub fn builder(
    client: kube::Client,
    args: &OperatorArgs,
) -> anyhow::Result<actorcile::runtime::RuntimeBuilder> {
    let record = |name: &str| {
        let path = args.dir.join(name);
        Lines::open(&path).with_context(|| format!("opening {}", path.display()))
    };
    let chaos = Arc::new(Chaos {
        incarnation: args.incarnation,
        seed: args.seed,
        panic_rate: args.panic_rate,
        hang_rate: args.hang_rate,
        reconciles: record("reconciles")?,
        effects: record("effects")?,
        next_reconcile: AtomicU64::new(0),
    });
    let builder = Runtime::builder(client, names())
        .policy(policy(args.hang_rate > 0.0))
        .finalizer(format!("chaos.actorcile.dev/{NAME}"))
        .events(NAME)
        .controller(Controller::<ChaosItem>::new(tree(chaos)));
    Ok(if args.shards > 0 {
        let (namespace, prefix) = SHARD_LEASES;
        builder.sharding(
            actorcile::sharding::Sharding::new(args.shards, namespace)
                .lease_prefix(prefix)
                .identity(format!("{IDENTITY_PREFIX}{}", args.incarnation)),
        )
    } else {
        builder
    })
}

/// `actorcile chaos-operator`: the operator, until SIGTERM.
pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    super::lines::set_skew(args.clock_skew);
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("the kubeconfig")?;
    let faults = ApiFaults::new(
        args.api,
        args.seed ^ u64::from(args.incarnation).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    )
    .record(Lines::open(&args.dir.join("api-faults"))?, args.incarnation);
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&faults)
        .build();
    builder(client, &args)?.run().await?;
    Ok(())
}
