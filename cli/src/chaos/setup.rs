//! Setting a chaos run up: the CRD, the namespace, the planted Secret, and the operator's
//! roles bound to the non-admin user it runs as.

use std::time::Duration;

use actorcile::envtest::Envtest;
use anyhow::{Context as _, Result};
use backon::{ConstantBuilder, Retryable};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::Subject;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, CustomResourceExt};

use super::operator::{self, ChaosItem, NAME, SECRET};
use super::{ApiFaultRates, ChaosArgs, NAMESPACE, create};

/// The planted values: what must never appear where the runtime writes.
pub(super) struct Planted {
    pub(super) secret: String,
    pub(super) token: String,
}

/// Installs the CRD, creates the namespace and the planted Secret, and binds the roles the
/// runtime renders to the non-admin user the operator runs as.
pub(super) async fn set_up(
    env: &Envtest,
    args: &ChaosArgs,
    records: &std::path::Path,
) -> Result<Planted> {
    let seed = args.seed;
    let admin = env.client();
    env.install_crds(&[ChaosItem::crd()])
        .await
        .context("installing the ChaosItem CRD")?;
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    create(&namespaces, &ns, "creating the namespace").await?;
    let secret_value = format!(
        "planted-secret-{:016x}",
        fastrand::Rng::with_seed(seed).u64(..)
    );
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            ..Default::default()
        },
        string_data: Some([("token".to_string(), secret_value.clone())].into()),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    create(&secrets, &secret, "creating the Secret").await?;

    // The operator runs as the non-admin user, bound to the roles the runtime renders.
    let probe = operator::OperatorArgs {
        kubeconfig: env.user_kubeconfig_path().to_path_buf(),
        dir: records.to_path_buf(),
        incarnation: 0,
        seed,
        panic_rate: 0.0,
        hang_rate: 0.0,
        shards: args.shards(),
        clock_skew: 0,
        api: ApiFaultRates::default(),
    };
    let roles = operator::builder(admin.clone(), &probe)?.roles(NAME);
    let user = Subject {
        kind: "User".into(),
        name: env.user_name().into(),
        ..Default::default()
    };
    roles
        .apply(&admin, user, "actorcile-chaos")
        .await
        .context("applying the operator's roles")?;
    // RBAC reaches the authorizer through an informer: wait until the user can list items.
    let user_items: Api<ChaosItem> = Api::namespaced(env.user_client(), NAMESPACE);
    // Forbidden until then: any error is retried, for a minute at most.
    (|| async {
        user_items
            .list(&ListParams::default().limit(1))
            .await
            .map(drop)
    })
    .retry(
        ConstantBuilder::default()
            .with_delay(Duration::from_millis(250))
            .with_max_times(240),
    )
    .await
    .context("waiting for the operator's roles to be in force")?;

    let kubeconfig = std::fs::read_to_string(env.user_kubeconfig_path())?;
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().trim_matches('"').to_string())
        .context("the user kubeconfig has no token")?;
    Ok(Planted {
        secret: secret_value,
        token,
    })
}
