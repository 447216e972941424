//! API Priority and Fairness for a test: one user's requests in a small priority level of their
//! own, so that the user meets the server as a busy cluster's (requests queue past its seats,
//! 429 past its queue) while the admin's requests go on as before.

use std::time::{Duration, Instant};

use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use kube::api::{Api, Patch, PatchParams};

use super::{Envtest, EnvtestError, FIELD_MANAGER};

/// A priority level for one user's requests ([`Envtest::limit_user`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityLevel {
    /// Its nominal concurrency shares. kube-apiserver splits its seats (600 by default) across
    /// the levels by their shares (245 in the built-in levels): 1 share gets 3 seats, 4 get 10.
    pub shares: u32,
    /// How many requests wait for a seat in its one queue; the server answers 429 past that.
    pub queue: u32,
}

/// The header in which kube-apiserver names the priority level that served a request.
const LEVEL_HEADER: &str = "X-Kubernetes-PF-PriorityLevel-UID";

/// The objects' name for `user`: a DNS label of its letters and digits.
fn object_name(user: &str) -> String {
    let safe: String = user
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("envtest-{safe}");
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_string()
}

impl Envtest {
    /// Sends `user`'s requests (the user after authentication and impersonation, as
    /// [`user_name`](Self::user_name) is) to a priority level of their own that neither lends
    /// seats nor borrows them, with one queue of `level.queue` requests; waits until the server
    /// classifies them there. Returns the seats the server gave the level. Applying it again
    /// changes it. The user still needs RBAC permissions for what it does.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use actorcile_envtest::{Envtest, PriorityLevel};
    ///
    /// let env = Envtest::start().await?;
    /// let seats = env
    ///     .limit_user(env.user_name(), PriorityLevel { shares: 1, queue: 4 })
    ///     .await?;
    /// // env.user_client() now meets a server of `seats` seats and a queue of 4 for it.
    /// # let _ = seats;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn limit_user(&self, user: &str, level: PriorityLevel) -> Result<u64, EnvtestError> {
        let name = object_name(user);
        let admin = self.client();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let wanted: PriorityLevelConfiguration = serde_json::from_value(serde_json::json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": { "name": name },
            "spec": { "type": "Limited", "limited": {
                "nominalConcurrencyShares": level.shares,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": { "type": "Queue", "queuing": {
                    "queues": 1, "handSize": 1, "queueLengthLimit": level.queue,
                }},
            }},
        }))
        .map_err(kube::Error::SerdeError)?;
        let applied = Api::<PriorityLevelConfiguration>::all(admin.clone())
            .patch(&name, &params, &Patch::Apply(&wanted))
            .await?;
        let schema: FlowSchema = serde_json::from_value(serde_json::json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": { "name": name },
            "spec": {
                "priorityLevelConfiguration": { "name": name },
                // Before the built-in schemas that would match an ordinary user (1000 and up).
                "matchingPrecedence": 900,
                "distinguisherMethod": { "type": "ByUser" },
                "rules": [{
                    "subjects": [{ "kind": "User", "user": { "name": user } }],
                    "resourceRules": [{
                        "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                        "clusterScope": true, "namespaces": ["*"],
                    }],
                    "nonResourceRules": [{ "verbs": ["*"], "nonResourceURLs": ["*"] }],
                }],
            },
        }))
        .map_err(kube::Error::SerdeError)?;
        Api::<FlowSchema>::all(admin.clone())
            .patch(&name, &params, &Patch::Apply(&schema))
            .await?;
        let uid = applied.metadata.uid.unwrap_or_default();
        let mut as_user = self.config();
        as_user.auth_info.impersonate = Some(user.to_string());
        let as_user = kube::Client::try_from(as_user)?;
        let deadline = Instant::now() + self.startup_timeout;
        loop {
            let req = http::Request::get("/version")
                .body(kube::client::Body::empty())
                .map_err(kube::Error::HttpError)?;
            let served_by = as_user.send(req).await.ok().and_then(|r| {
                let level = r.headers().get(LEVEL_HEADER)?.to_str().ok()?;
                Some(level.to_string())
            });
            if served_by.as_deref() == Some(uid.as_str()) {
                break;
            }
            if Instant::now() > deadline {
                return Err(EnvtestError::PriorityLevelNotApplied {
                    name,
                    timeout: self.startup_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let metrics = admin.request_text(req).await?;
        let label = format!("priority_level=\"{name}\"");
        Ok(metrics
            .lines()
            .find(|l| {
                l.starts_with("apiserver_flowcontrol_nominal_limit_seats{") && l.contains(&label)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map_or(0, |seats| seats as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_name_becomes_a_dns_label() {
        assert_eq!(object_name("actorcile-user"), "envtest-actorcile-user");
        assert_eq!(
            object_name("system:serviceaccount:ns:Op"),
            "envtest-system-serviceaccount-ns-op"
        );
        assert!(object_name(&"x".repeat(100)).len() <= 63);
    }
}
