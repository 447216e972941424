//! What admission webhooks add to a write: two kinds of the same shape on a real etcd +
//! kube-apiserver, one with a validating and a mutating webhook served by
//! `actorcile::webhooks`, one without; rounds of creates alternate between them, and each
//! round reports the latency of its writes (p50, p99), its rate, and this process's CPU
//! seconds (the writer's, and for the webhooked kind the webhook server's too; the difference
//! is what the webhooks cost the operator).
//!
//! ```text
//! cargo run --release --example webhook_latency --features envtest,webhooks -- --objects 2000 --concurrency 16 --rounds 3
//! ```

use std::time::{Duration, Instant};

use actorcile::webhooks::{
    Certificates, Defaulter, Denial, Endpoint, Request, Validator, Warnings, WebhookLimits,
    WebhookServer, Webhooks,
};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod plain {
    /// The kind without webhooks.
    #[derive(
        kube::CustomResource,
        Clone,
        Debug,
        serde::Deserialize,
        serde::Serialize,
        schemars::JsonSchema,
    )]
    #[kube(
        group = "latency.actorcile.dev",
        version = "v1",
        kind = "Plain",
        namespaced
    )]
    pub struct PlainSpec {
        pub replicas: u32,
        pub image: Option<String>,
    }
}

/// The kind with a validating and a mutating webhook.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "latency.actorcile.dev",
    version = "v1",
    kind = "Guarded",
    namespaced
)]
struct GuardedSpec {
    replicas: u32,
    image: Option<String>,
}

struct Rules;

impl Validator<Guarded> for Rules {
    async fn validate(
        &self,
        new: &Guarded,
        _: Option<&Guarded>,
        _: &Request,
    ) -> Result<Warnings, Denial> {
        if new.spec.replicas > 1000 {
            return Err(Denial::invalid("spec.replicas: at most 1000"));
        }
        Ok(Warnings::new())
    }
}

impl Defaulter<Guarded> for Rules {
    async fn default(&self, object: &mut Guarded, _: &Request) -> Result<(), Denial> {
        object.spec.image.get_or_insert_with(|| "app:stable".into());
        Ok(())
    }
}

#[derive(Parser)]
struct Args {
    /// Creates per round.
    #[arg(long, default_value_t = 2000)]
    objects: u32,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Rounds of each kind, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
}

/// This process's user + system CPU seconds (`getrusage`).
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Creates `objects` objects named `<prefix>-<i>`, `concurrency` at once; their latencies.
async fn round<K>(
    api: &Api<K>,
    make: impl Fn(String) -> K,
    prefix: &str,
    args: &Args,
) -> Vec<Duration>
where
    K: kube::Resource + Clone + Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let objects: Vec<K> = (0..args.objects)
        .map(|i| make(format!("{prefix}-{i}")))
        .collect();
    let mut latencies: Vec<Duration> = futures::stream::iter(objects)
        .map(|object| async move {
            let started = Instant::now();
            api.create(&PostParams::default(), &object)
                .await
                .expect("create");
            started.elapsed()
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    latencies.sort();
    latencies
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let crds = vec![plain::Plain::crd(), Guarded::crd()];
    let env = actorcile::envtest::Envtest::builder()
        .crds(crds.clone())
        .start()
        .await
        .expect("start envtest");
    let client = env.client();
    actorcile::envtest::wait_for_openapi(client.clone(), &crds, Duration::from_secs(60))
        .await
        .expect("the CRDs' OpenAPI published");

    let certificates = Certificates::generated("latency", &["127.0.0.1"]).expect("certificates");
    let Certificates::Generated { ca, .. } = &certificates else {
        unreachable!("generated certificates")
    };
    let ca = ca.ca_pem();
    let webhooks = || {
        Webhooks::new("latency")
            .validate::<Guarded>(Rules)
            .defaults::<Guarded>(Rules)
    };
    let server = WebhookServer::bind(
        ([127, 0, 0, 1], 0).into(),
        webhooks(),
        certificates,
        WebhookLimits::default(),
        None,
    )
    .await
    .expect("serve the webhooks");
    let endpoint = Endpoint::Url(format!("https://{}", server.local_addr()));
    let validating = webhooks()
        .validating_configuration(&endpoint, Some(&ca))
        .unwrap();
    let mutating = webhooks()
        .mutating_configuration(&endpoint, Some(&ca))
        .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .expect("install the validating configuration");
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .expect("install the mutating configuration");

    let plain_api: Api<plain::Plain> = Api::namespaced(client.clone(), "default");
    let guarded_api: Api<Guarded> = Api::namespaced(client.clone(), "default");
    // The API server reads webhook configurations from its informer: writes go on until one
    // is defaulted, so every measured write goes through the webhooks.
    for attempt in 0.. {
        let probe = Guarded::new(
            &format!("probe-{attempt}"),
            GuardedSpec {
                replicas: 1,
                image: None,
            },
        );
        let created = guarded_api
            .create(&PostParams::default(), &probe)
            .await
            .expect("probe");
        if created.spec.image.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    println!("kind       round  writes/s   p50 ms   p99 ms   cpu s");
    for r in 0..args.rounds {
        for guarded in [false, true] {
            let cpu = cpu_seconds();
            let started = Instant::now();
            let latencies = if guarded {
                let make = |name: String| {
                    Guarded::new(
                        &name,
                        GuardedSpec {
                            replicas: 1,
                            image: None,
                        },
                    )
                };
                round(&guarded_api, make, &format!("g{r}"), &args).await
            } else {
                let make = |name: String| {
                    plain::Plain::new(
                        &name,
                        plain::PlainSpec {
                            replicas: 1,
                            image: None,
                        },
                    )
                };
                round(&plain_api, make, &format!("p{r}"), &args).await
            };
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{:<10} {:>5}  {:>8.0}  {:>7.2}  {:>7.2}  {:>6.2}",
                if guarded { "webhooks" } else { "none" },
                r + 1,
                f64::from(args.objects) / secs,
                percentile(&latencies, 0.50),
                percentile(&latencies, 0.99),
                cpu_seconds() - cpu,
            );
        }
    }
}
