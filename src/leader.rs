//! Leader election on a `coordination.k8s.io/v1` Lease (feature `operator`): of the replicas of
//! an operator, the one that holds the Lease runs every controller; the others wait, ready to
//! take over ([`RuntimeBuilder::leader_election`](crate::runtime::RuntimeBuilder::leader_election)).
//!
//! The protocol is client-go's (what controller-runtime uses), with its defaults as policy knobs
//! ([`SupervisorPolicy`]): `lease_duration` 15 s,
//! `lease_renew_deadline` 10 s, `lease_retry_period` 2 s.
//!
//! - A candidate takes the Lease when it has no holder, or when its record has not changed for
//!   `lease_duration` *as this replica observed it* (its own clock, not the holder's timestamps:
//!   clocks of two machines may disagree).
//! - The holder renews every `lease_retry_period`. Every write is optimistic (the Lease's
//!   resourceVersion as a precondition): two candidates never both win.
//! - **Fencing**: the holder stops every run (they are aborted, not awaited) once it has not
//!   renewed for `lease_renew_deadline` since it *sent* its last successful renewal. No other
//!   replica can take the Lease before `lease_duration` after that renewal was written, which
//!   is later than the send: the holder has stopped by then, with `lease_duration -
//!   lease_renew_deadline` to spare. The runtime then returns
//!   [`Error::LeadershipLost`]: the process exits and restarts
//!   as a candidate (as controller-runtime's managers do).
//! - A standby is warm by default ([`LeaderElection::warm_standby`]): its controllers watch and
//!   cache, with no reconcile slot, so nothing runs and nothing is written until it leads.
//! - On a graceful shutdown the holder releases the Lease (no holder, a duration of 1 s), so a
//!   candidate takes over at its next try instead of after expiry.
//!
//! Written on the Lease API directly rather than with a Lease crate: fencing needs the time the
//! last successful renewal was sent, which `kube-lease-manager` (the maintained crate that fits
//! kube 5) keeps to itself.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::lease::{Observed, next_lease_transitions};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

use crate::Error;
use crate::policy::SupervisorPolicy;

/// Which Lease a runtime's replicas elect their leader on, and this replica's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// The Lease's name.
    pub lease: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// This replica's identity (the Lease's `holderIdentity` while it leads): unique among the
    /// replicas.
    pub identity: String,
    /// While it stands by, the replica watches and caches every kind (without running
    /// anything), so a takeover starts reconciling at once instead of listing first. Default:
    /// on.
    pub warm_standby: bool,
}

impl LeaderElection {
    /// Elect on Lease `namespace/lease`, as [`default_identity`].
    pub fn new(lease: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            lease: lease.into(),
            namespace: namespace.into(),
            identity: default_identity(),
            warm_standby: true,
        }
    }

    /// Whether the standby watches and caches while it waits (default: on).
    pub fn warm_standby(mut self, warm: bool) -> Self {
        self.warm_standby = warm;
        self
    }

    /// This replica's identity.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// Check the names and that the policy's lease timings fit together.
    pub fn validate(&self, policy: &SupervisorPolicy) -> Result<(), Error> {
        let invalid = |option: &'static str, problem: String| Error::Invalid {
            field: crate::runtime::Setting::LeaderElection { option },
            problem,
        };
        if !crate::names::is_dns_subdomain(&self.lease) {
            return Err(invalid(
                "lease",
                format!("{:?} is not a valid name", self.lease),
            ));
        }
        if !crate::names::is_dns_subdomain(&self.namespace) {
            return Err(invalid(
                "namespace",
                format!("{:?} is not a valid namespace", self.namespace),
            ));
        }
        if self.identity.is_empty() {
            return Err(invalid("identity", "must not be empty".into()));
        }
        policy
            .lease
            .check_timings()
            .map_err(|(field, problem)| invalid(field, problem))
    }
}

/// `POD_NAME` (set it from the Pod's name with the downward API), else `HOSTNAME`, else
/// `actorcile`; followed by the process id, so two processes on one machine differ.
pub fn default_identity() -> String {
    crate::names::replica_identity()
}

fn timings(p: &SupervisorPolicy) -> (Duration, Duration, Duration) {
    (
        p.lease.duration,
        p.lease.renew_deadline,
        p.lease.retry_period,
    )
}

/// One replica's side of the election.
pub(crate) struct Elector {
    api: Api<Lease>,
    election: LeaderElection,
    duration: Duration,
    renew_deadline: Duration,
    retry: Duration,
    observed: Option<Observed>,
    /// When the last successful write of ours was sent.
    renewed: Option<Instant>,
}

impl Elector {
    pub(crate) fn new(
        client: kube::Client,
        election: LeaderElection,
        policy: &SupervisorPolicy,
    ) -> Self {
        let (duration, renew_deadline, retry) = timings(policy);
        Self {
            api: Api::namespaced(client, &election.namespace),
            election,
            duration,
            renew_deadline,
            retry,
            observed: None,
            renewed: None,
        }
    }

    /// The holder as last observed (`None`: no holder, or not read yet).
    pub(crate) fn holder(&self) -> Option<&str> {
        self.observed.as_ref().and_then(|o| o.holder.as_deref())
    }

    /// Try until this replica holds the Lease.
    pub(crate) async fn acquire(&mut self) {
        let mut announced = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(identity = %self.election.identity, lease = %self.election.lease, "leading");
                    return;
                }
                Ok(false) => {
                    let holder = self.holder().map(str::to_string);
                    if announced != holder {
                        tracing::info!(holder = ?holder, "standing by: another replica leads");
                        announced = holder;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the Lease")
                }
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Renew every retry period while the Lease is held; returns once it could not be renewed
    /// for the renew deadline (or another replica holds it): the caller must stop at once.
    pub(crate) async fn hold(&mut self) {
        loop {
            let since = self.renewed.unwrap_or_else(Instant::now);
            let deadline = since + self.renew_deadline;
            let next = (Instant::now() + self.retry).min(deadline);
            tokio::time::sleep_until(next).await;
            if Instant::now() >= deadline {
                tracing::error!(
                    identity = %self.election.identity,
                    "the Lease was not renewed within the renew deadline: leadership lost"
                );
                return;
            }
            // The attempt itself must not outlive the deadline.
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::error!(holder = ?self.holder(), "another replica holds the Lease: leadership lost");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "could not renew the Lease; retrying"),
                Err(_) => {}
            }
        }
    }

    /// Give the Lease up (graceful shutdown): a candidate takes it at its next try.
    pub(crate) async fn release(&mut self) {
        let Ok(mut lease) = self.api.get(&self.election.lease).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(&self.election.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        match self
            .api
            .replace(&self.election.lease, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!("released the Lease"),
            Err(e) => tracing::warn!(error = %e, "could not release the Lease; it expires instead"),
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`: `true` if this replica holds the Lease now.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let sent = Instant::now();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let me = self.election.identity.clone();
        let seconds = crate::policy::lease_seconds(self.duration);
        let Some(mut lease) = self.api.get_opt(&self.election.lease).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.election.lease.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.won(&created, sent)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        self.observe(&spec);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(me.as_str());
        if !ours
            && self
                .observed
                .as_ref()
                .is_some_and(|o| !o.expired(Instant::now()))
        {
            return Ok(false); // held by another, not expired as far as we saw
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        if !ours {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(next_lease_transitions(spec.lease_transitions));
        }
        spec.holder_identity = Some(me);
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.election.lease, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(self.won(&written, sent)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn won(&mut self, lease: &Lease, sent: Instant) -> bool {
        self.observe(&lease.spec.clone().unwrap_or_default());
        self.renewed = Some(sent);
        true
    }

    /// Note the record; its observation time moves only when it changed.
    fn observe(&mut self, spec: &LeaseSpec) {
        self.observed = Some(Observed::update(
            self.observed.as_ref(),
            Some(spec),
            Instant::now(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cluster::ApiServer;

    fn policy() -> SupervisorPolicy {
        SupervisorPolicy {
            lease: crate::policy::LeasePolicy {
                duration: Duration::from_secs(2),
                renew_deadline: Duration::from_millis(1500),
                retry_period: Duration::from_millis(200),
            },
            ..SupervisorPolicy::default()
        }
    }

    fn elector(client: &kube::Client, id: &str) -> Elector {
        Elector::new(
            client.clone(),
            LeaderElection::new("op", "default").identity(id),
            &policy(),
        )
    }

    #[tokio::test]
    async fn one_candidate_wins_the_other_takes_over_after_expiry_or_at_once_after_release() {
        let cluster = ApiServer::new();
        let client = cluster.client();
        let (mut a, mut b) = (elector(&client, "a"), elector(&client, "b"));
        a.acquire().await;
        assert!(!b.try_acquire_or_renew().await.unwrap(), "a holds it");
        assert_eq!(b.holder(), Some("a"));
        assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");

        // a stops renewing: b takes over once the record stood still for the lease duration,
        // not before.
        let stood_still = Instant::now();
        b.acquire().await;
        assert!(
            stood_still.elapsed() >= Duration::from_millis(1800),
            "{:?}",
            stood_still.elapsed()
        );
        let lease = Api::<Lease>::namespaced(client.clone(), "default")
            .get("op")
            .await
            .unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        // a finds out at its next renewal: another holds it.
        assert!(!a.try_acquire_or_renew().await.unwrap());

        // b releases: a takes it at once.
        b.release().await;
        let released = Instant::now();
        a.acquire().await;
        // At once: well before the 2 s lease could have expired.
        assert!(
            released.elapsed() < Duration::from_millis(1000),
            "{:?}",
            released.elapsed()
        );
    }

    #[tokio::test]
    async fn a_holder_that_cannot_renew_gives_up_within_the_renew_deadline() {
        let cluster = ApiServer::new();
        let client = cluster.client();
        let mut a = elector(&client, "a");
        a.acquire().await;
        let acquired = Instant::now();
        // Someone else overwrites the Lease: a's next renewal sees another holder.
        let api = Api::<Lease>::namespaced(client.clone(), "default");
        let mut lease = api.get("op").await.unwrap();
        lease.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
        api.replace("op", &PostParams::default(), &lease)
            .await
            .unwrap();
        a.hold().await;
        assert!(
            acquired.elapsed() < Duration::from_millis(1500),
            "{:?}",
            acquired.elapsed()
        );

        // The API refuses every write: a gives up at the renew deadline, not later.
        let mut c = elector(&client, "c");
        api.delete("op", &Default::default()).await.unwrap();
        c.acquire().await;
        let renewed = c.renewed.unwrap();
        cluster.set_faults(crate::cluster::Faults {
            error_rate: 1.0,
            ..Default::default()
        });
        c.hold().await;
        let gave_up = renewed.elapsed();
        // Not before the renew deadline, and before the lease could expire elsewhere.
        assert!(
            gave_up >= Duration::from_millis(1500) && gave_up < Duration::from_millis(2000),
            "{gave_up:?}"
        );
    }

    #[test]
    fn timings_must_fit() {
        let e = LeaderElection::new("op", "default");
        assert!(e.validate(&SupervisorPolicy::default()).is_ok());
        let bad = SupervisorPolicy {
            lease: crate::policy::LeasePolicy {
                renew_deadline: Duration::from_secs(15),
                ..Default::default()
            },
            ..SupervisorPolicy::default()
        };
        assert!(
            e.validate(&bad)
                .unwrap_err()
                .to_string()
                .contains("lease_renew_deadline")
        );
        let bad = SupervisorPolicy {
            lease: crate::policy::LeasePolicy {
                duration: Duration::from_millis(1500),
                ..Default::default()
            },
            ..SupervisorPolicy::default()
        };
        assert!(
            e.validate(&bad)
                .unwrap_err()
                .to_string()
                .contains("lease_duration")
        );
        assert!(
            LeaderElection::new("Not_A_Name", "default")
                .validate(&SupervisorPolicy::default())
                .is_err()
        );
    }
}
