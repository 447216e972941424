//! The same admission handlers, called by the in-process API server (feature `cluster`).

use std::sync::Arc;

use actorcile_apiserver::{ApiServer, Webhook};

use super::{FailurePolicy, Webhooks};

impl Webhooks {
    /// Makes `server` call these handlers as a real API server calls the webhooks, in process
    /// and without TLS: the admission handlers before it stores a create or update of their
    /// kinds (the same reviews, the same answers, the same denials, `admission webhook "<name>"
    /// denied the request: …`), and the conversions whenever an object is read or written in
    /// a version other than the one it is stored in (the CRD's storage version).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use actorcile::cluster::ApiServer;
    /// use actorcile::webhooks::{Denial, Request, Validator, Warnings, Webhooks};
    /// use kube::{Api, CustomResourceExt, api::PostParams};
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
    /// # struct AppSpec { replicas: u32 }
    /// struct AtMostTen;
    /// impl Validator<App> for AtMostTen {
    ///     async fn validate(&self, new: &App, _: Option<&App>, _: &Request) -> Result<Warnings, Denial> {
    ///         match new.spec.replicas {
    ///             0..=10 => Ok(Warnings::new()),
    ///             n => Err(Denial::invalid(format!("spec.replicas: {n} is more than 10"))),
    ///         }
    ///     }
    /// }
    ///
    /// let server = ApiServer::new();
    /// server.install_crd(&App::crd()).unwrap();
    /// Webhooks::new("app-operator").validate::<App>(AtMostTen).install_in(&server);
    ///
    /// let apps: Api<App> = Api::namespaced(server.client(), "default");
    /// let error = apps.create(&PostParams::default(), &App::new("big", AppSpec { replicas: 11 }))
    ///     .await
    ///     .unwrap_err();
    /// assert!(error.to_string().contains(
    ///     r#"admission webhook "vapp.example.com" denied the request: spec.replicas: 11 is more than 10"#
    /// ));
    /// # }
    /// ```
    pub fn install_in(&self, server: &ApiServer) {
        let deadline = self.handler_deadline();
        for webhook in &self.admission {
            let handler = webhook.handler.clone();
            server.register_webhook(Webhook {
                name: webhook.name(),
                mutating: webhook.mutating,
                group: webhook.kind.group.clone(),
                resource: webhook.kind.plural.clone(),
                version: Some(webhook.kind.version.clone()),
                operations: webhook.operations.iter().map(|o| o.to_string()).collect(),
                timeout: self.timeout,
                fail_closed: self.failure_policy == FailurePolicy::Fail,
                hook: Arc::new(move |review: Vec<u8>| handler(review, deadline)),
            });
        }
        for conversion in &self.conversions {
            let converter = conversion.clone();
            server.register_conversion(
                conversion.group(),
                conversion.kind(),
                Arc::new(move |review: Vec<u8>| converter.review(&review)),
            );
        }
    }
}
