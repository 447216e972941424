//! The shard keeper: this replica's side of the shard Leases (see the module docs of
//! [`crate::sharding`]). A task, not an actor: it only reads and writes Leases and flips the
//! [`Shards`] the actors consult.
//!
//! Each round (every `lease_retry_period`) lists the group's Leases once, renews this
//! replica's member Lease and the shards it holds, gives up what exceeds its fair share and
//! takes free or expired shards up to it. Between rounds it wakes at the earliest fencing
//! deadline, so a shard that could not be renewed in time is dropped at that deadline even if
//! the API does not answer.
//!
//! Written on the Lease API directly, like [`crate::leader`]: the maintained Lease crates
//! (`kube-lease-manager`) manage one Lease per manager and keep the time of the last successful
//! renewal to themselves, and fencing needs it; a group of Leases is listed here in one request
//! per round instead of one request per Lease.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::lease::Observed;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use tokio::sync::watch;
use tokio::time::Instant;

use super::follow::sleep_until;
use super::{Sharding, Shards, fnv1a};
use crate::policy::SupervisorPolicy;

/// Why a Lease write did not take.
enum WriteError {
    /// Someone else wrote it since it was listed (another replica, or a write of ours whose
    /// answer was lost): the next round reads who holds it.
    Conflict,
    /// The API failed, or did not answer within the write bound.
    Failed(String),
}

/// One replica's keeper of its shard Leases.
pub(crate) struct Keeper {
    api: Api<Lease>,
    cfg: Sharding,
    shards: Arc<Shards>,
    duration: Duration,
    renew_deadline: Duration,
    retry: Duration,
    /// Every Lease of the group, by name.
    observed: HashMap<String, Observed>,
    /// Held shards, with when their last successful write was sent.
    held: BTreeMap<u32, Instant>,
    /// Shards this replica gave up, and when: it does not take them back as orphans for two
    /// lease durations (another replica under its share takes them first; the others see an
    /// unreleased one expire later than this replica, which wrote it last).
    given_up: HashMap<u32, Instant>,
    /// Replicas seen alive in the last round (this one included).
    replicas: usize,
    /// Whether a round wrote this replica's member Lease yet.
    announced: bool,
}

impl Keeper {
    pub(crate) fn new(
        client: kube::Client,
        cfg: Sharding,
        shards: Arc<Shards>,
        policy: &SupervisorPolicy,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            shards,
            duration: policy.lease.duration,
            renew_deadline: policy.lease.renew_deadline,
            retry: policy.lease.retry_period,
            observed: HashMap::new(),
            held: BTreeMap::new(),
            given_up: HashMap::new(),
            replicas: 1,
            announced: false,
        }
    }

    /// Keep shards until `stop` says so; returns the keeper, still holding its shards (release
    /// them with [`Keeper::release_all`] once the runs stopped).
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) -> Self {
        loop {
            let next = Instant::now() + self.retry;
            let fence = self.earliest_fence();
            tokio::select! {
                _ = self.round() => {}
                _ = sleep_until(fence) => {}
                _ = stop.wait_for(|s| *s) => return self,
            }
            self.enforce_fences();
            loop {
                let fence = self.earliest_fence();
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => break,
                    _ = sleep_until(fence) => self.enforce_fences(),
                    _ = stop.wait_for(|s| *s) => return self,
                }
            }
        }
    }

    /// The shards held, and the replicas seen alive in the last round.
    #[cfg(test)]
    pub(crate) fn state(&self) -> (Vec<u32>, usize) {
        (self.held.keys().copied().collect(), self.replicas)
    }

    fn earliest_fence(&self) -> Option<Instant> {
        self.held
            .values()
            .min()
            .map(|sent| *sent + self.renew_deadline)
    }

    /// How long one request of the keeper may wait for its answer: half the renew deadline,
    /// so that a request that hangs (or whose answer is lost) leaves room for another try
    /// before the fence, as client-go bounds each renewal by its renew deadline.
    fn request_bound(&self) -> Duration {
        self.renew_deadline / 2
    }

    /// Drop every shard whose renewal is older than the renew deadline.
    fn enforce_fences(&mut self) {
        let now = Instant::now();
        let lapsed: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, sent)| **sent + self.renew_deadline <= now)
            .map(|(s, _)| *s)
            .collect();
        for s in lapsed {
            tracing::error!(
                shard = s,
                "shard Lease not renewed within the renew deadline: shard lost"
            );
            self.lose(s);
        }
    }

    fn lose(&mut self, shard: u32) {
        self.held.remove(&shard);
        self.shards.lose(shard);
    }

    /// One round: see the module docs.
    async fn round(&mut self) {
        let sent = Instant::now();
        let listed = self.cfg.list_leases(&self.api, None);
        let leases = match tokio::time::timeout(self.request_bound(), listed).await {
            Ok(Ok(list)) => list,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "sharding: cannot list the Leases; retrying");
                return;
            }
            Err(_) => {
                tracing::warn!("sharding: listing the Leases got no answer in time; retrying");
                return;
            }
        };
        let now = Instant::now();
        let mut by_name = HashMap::new();
        for lease in leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            self.observe(&name, lease.spec.as_ref(), now);
            by_name.insert(name, lease);
        }
        self.observed.retain(|name, _| by_name.contains_key(name));
        let me = self.cfg.identity.clone();

        // Another holder on a shard we hold: it is not ours.
        let taken: Vec<u32> = self
            .held
            .keys()
            .copied()
            .filter(|s| {
                let holder = by_name
                    .get(&self.cfg.shard_lease_name(*s))
                    .and_then(|l| l.spec.as_ref()?.holder_identity.clone());
                holder.as_deref() != Some(me.as_str())
            })
            .collect();
        for s in taken {
            tracing::error!(
                shard = s,
                "another replica holds the shard's Lease: shard lost"
            );
            self.lose(s);
        }

        // A shard whose fence lapsed is lost before it could be renewed: the take below makes
        // it a new acquisition, as its reconciles have stopped.
        self.enforce_fences();
        // The member Lease and every held shard at once: one slow answer must not hold the
        // others past the fence.
        let member = self.cfg.member_lease();
        let renewals = self
            .held
            .keys()
            .map(|&s| (Some(s), self.cfg.shard_lease_name(s)))
            .chain([(None, member.clone())])
            .collect::<Vec<_>>();
        let written = futures::future::join_all(renewals.iter().map(|(s, name)| {
            let role = if s.is_some() { "shard" } else { "member" };
            self.write(by_name.get(name), name, role, false)
        }))
        .await;
        for ((shard, name), result) in renewals.into_iter().zip(written) {
            match (shard, result) {
                (_, Ok(lease)) => {
                    let now = Instant::now();
                    self.observe(&name, lease.spec.as_ref(), now);
                    match shard {
                        // Renewed, but after its fence: its reconciles stopped meanwhile (by the
                        // clock), so this is a loss, and the take below a new acquisition.
                        Some(s)
                            if self
                                .held
                                .get(&s)
                                .is_some_and(|at| *at + self.renew_deadline <= now) =>
                        {
                            tracing::warn!(
                                shard = s,
                                "shard Lease renewed only after the renew deadline: shard lost, taken again"
                            );
                            self.lose(s);
                        }
                        Some(s) => self.renewed(s, sent),
                        None => {}
                    }
                }
                (None, Err(WriteError::Conflict)) => {}
                (None, Err(WriteError::Failed(e))) => {
                    tracing::warn!(error = %e, "sharding: cannot renew this replica's member Lease")
                }
                // Not lost yet: the next round reads who holds it (another replica: lost; still
                // this one, its renewal landed with its answer lost: renewed again). The fence
                // drops it if no renewal takes within the renew deadline.
                (Some(s), Err(WriteError::Conflict)) => {
                    tracing::info!(
                        shard = s,
                        "the shard's Lease changed since it was listed; reading it again"
                    )
                }
                (Some(s), Err(WriteError::Failed(e))) => {
                    tracing::warn!(shard = s, error = %e, "could not renew a shard's Lease; retrying")
                }
            }
        }
        // The first round only announces this replica: replicas started together (a new
        // deployment, a restart) count each other before any takes shards, rather than the
        // first taking every shard and handing most of them on a round later, after it
        // started their reconciles and listed their objects.
        if !std::mem::replace(&mut self.announced, true) {
            return;
        }
        let members = self
            .observed
            .iter()
            .filter(|(name, o)| {
                by_name
                    .get(*name)
                    .is_some_and(|l| self.is_role(l, "member"))
                    && **name != member
                    && !o.expired(now)
            })
            .count();
        self.replicas = members + 1;
        let shards = self.shards.count() as usize;
        let fair = shards.div_ceil(self.replicas);

        let excess: Vec<u32> = self
            .held
            .keys()
            .rev()
            .take(self.held.len().saturating_sub(fair))
            .copied()
            .collect();
        if !excess.is_empty() {
            // Drained before the fence of this round's renewals.
            self.give_up(&excess, sent + self.renew_deadline / 2).await;
        }

        let offset = (fnv1a(&me) % shards as u64) as usize;
        self.given_up.retain(|_, at| now < *at + 2 * self.duration);
        for i in 0..shards {
            let s = ((offset + i) % shards) as u32;
            let name = self.cfg.shard_lease_name(s);
            if self.held.contains_key(&s) {
                continue;
            }
            let observed = self.observed.get(&name);
            // Free, expired, or still naming this replica (it lost the shard to its fence).
            let free =
                observed.is_none_or(|o| o.expired(now) || o.holder.as_deref() == Some(me.as_str()));
            if !free {
                continue;
            }
            // Up to the fair share; past it, orphans too: a shard whose holder stopped
            // renewing, or one released that nobody took for a lease duration, two retry
            // periods after that (a replica under its share, which takes it at once, goes
            // first). Replicas may count each other differently for a few rounds (one just
            // died, another just started), and a shard without a holder is worse than one
            // replica holding too many for a round: the excess is given up again once the
            // counts agree.
            let orphan = observed.is_some_and(|o| {
                let free_since = match o.holder {
                    Some(_) => o.at + o.duration,
                    None => o.at + self.duration,
                };
                free_since + 2 * self.retry <= now
            }) && !self.given_up.contains_key(&s);
            if self.held.len() >= fair && !orphan {
                continue;
            }
            match self.write(by_name.get(&name), &name, "shard", true).await {
                Ok(lease) => {
                    self.observe(&name, lease.spec.as_ref(), Instant::now());
                    self.renewed(s, sent);
                }
                Err(WriteError::Conflict) => {}
                Err(WriteError::Failed(e)) => {
                    tracing::warn!(shard = s, error = %e, "could not take a shard's Lease")
                }
            }
        }

        self.remove_dead_members(&by_name, now).await;
    }

    fn renewed(&mut self, shard: u32, sent: Instant) {
        self.held.insert(shard, sent);
        self.shards.hold_until(shard, sent + self.renew_deadline);
    }

    /// Note a Lease's record; its observation time moves only when it changed.
    fn observe(&mut self, name: &str, spec: Option<&LeaseSpec>, now: Instant) {
        let observed = Observed::update(self.observed.get(name), spec, now);
        self.observed.insert(name.to_string(), observed);
    }

    /// Renew Lease `name` (as listed: `current`; `None`: create it) for this replica, or, with
    /// `acquire`, take it: a new acquisition even if this replica was its last holder (it lost
    /// the shard meanwhile, and its reconciles stopped), as the Lease's `acquireTime` and
    /// `leaseTransitions` then say. At most [`Keeper::request_bound`] waiting for the answer.
    async fn write(
        &self,
        current: Option<&Lease>,
        name: &str,
        role: &str,
        acquire: bool,
    ) -> Result<Lease, WriteError> {
        let me = self.cfg.identity.clone();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let seconds = crate::policy::lease_seconds(self.duration);
        let request = async {
            match current {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.to_string()),
                            labels: Some(self.lease_labels(role)),
                            ..Default::default()
                        },
                        spec: Some(LeaseSpec {
                            holder_identity: Some(me),
                            lease_duration_seconds: Some(seconds),
                            acquire_time: Some(now.clone()),
                            renew_time: Some(now),
                            lease_transitions: Some(0),
                            ..Default::default()
                        }),
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
                Some(current) => {
                    let mut lease = current.clone();
                    // A Lease labelled under the former domain gets the current labels too.
                    lease
                        .metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .extend(self.lease_labels(role));
                    let spec = lease.spec.get_or_insert_with(Default::default);
                    if acquire || spec.holder_identity.as_deref() != Some(me.as_str()) {
                        spec.acquire_time = Some(now.clone());
                        spec.lease_transitions =
                            Some(crate::lease::next_lease_transitions(spec.lease_transitions));
                    }
                    spec.holder_identity = Some(me);
                    spec.lease_duration_seconds = Some(seconds);
                    spec.renew_time = Some(now);
                    self.api.replace(name, &PostParams::default(), &lease).await
                }
            }
        };
        match tokio::time::timeout(self.request_bound(), request).await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => Err(WriteError::Conflict),
            Ok(Err(e)) => Err(WriteError::Failed(e.to_string())),
            Err(_) => Err(WriteError::Failed(format!(
                "no answer within {:?}",
                self.request_bound()
            ))),
        }
    }

    /// Give `shards` up: start no new reconcile of theirs and let those in flight finish (until
    /// `deadline`), then release their Leases so that another replica takes them at its next
    /// round. A shard whose reconciles did not finish in time is dropped (they are abandoned)
    /// and its Lease expires instead of being released.
    async fn give_up(&mut self, shards: &[u32], deadline: Instant) {
        tracing::info!(
            ?shards,
            replicas = self.replicas,
            "giving shards up to rebalance"
        );
        for &s in shards {
            self.shards.drain(s);
        }
        let drained =
            futures::future::join_all(shards.iter().map(|&s| self.shards.drained(s, deadline)))
                .await;
        let now = Instant::now();
        for (&s, drained) in shards.iter().zip(drained) {
            self.lose(s);
            self.given_up.insert(s, now);
            if drained {
                self.release(&self.cfg.shard_lease_name(s)).await;
            } else {
                tracing::warn!(
                    shard = s,
                    "reconciles of the shard still ran: abandoned; its Lease expires instead of being released"
                );
            }
        }
    }

    /// Clear the holder of Lease `name` if it is ours (a duration of 1 s, as client-go's
    /// release).
    async fn release(&self, name: &str) {
        let release = async {
            let mut lease = self.api.get(name).await?;
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            self.api
                .replace(name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        };
        match tokio::time::timeout(2 * self.request_bound(), release).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = name, error = %e, "could not release a Lease; it expires instead")
            }
            Err(_) => tracing::warn!(
                lease = name,
                "releasing a Lease got no answer; it expires instead"
            ),
        }
    }

    /// At shutdown, once the runs stopped: release every shard and delete the member Lease, so
    /// the other replicas take the shards at their next round.
    pub(crate) async fn release_all(mut self) {
        for s in self.held.keys().copied().collect::<Vec<_>>() {
            self.lose(s);
            self.release(&self.cfg.shard_lease_name(s)).await;
        }
        let member = self.cfg.member_lease();
        let dp = DeleteParams::default();
        let delete = self.api.delete(&member, &dp);
        if !matches!(
            tokio::time::timeout(self.request_bound(), delete).await,
            Ok(Ok(_))
        ) {
            tracing::warn!("could not delete this replica's member Lease; it expires");
        }
        tracing::info!("released every shard");
    }

    /// Delete member Leases that stood still for three lease durations (replicas that died),
    /// so the group does not grow with every restart. Preconditioned on what was listed.
    async fn remove_dead_members(&self, by_name: &HashMap<String, Lease>, now: Instant) {
        for (name, lease) in by_name {
            let dead = self.is_role(lease, "member")
                && self
                    .observed
                    .get(name)
                    .is_some_and(|o| o.at + 3 * o.duration <= now);
            if dead {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: lease.metadata.resource_version.clone(),
                        uid: None,
                    }),
                    ..Default::default()
                };
                let _ =
                    tokio::time::timeout(self.request_bound(), self.api.delete(name, &dp)).await;
            }
        }
    }
}

impl Keeper {
    /// The labels of this group's Lease of `role`: under the domain and, while a former domain
    /// is named, under it too, so that replicas of the earlier version count this one's Leases
    /// during a rolling upgrade.
    fn lease_labels(&self, role: &str) -> BTreeMap<String, String> {
        let prefix = self.cfg.prefix().to_string();
        let mut labels = BTreeMap::from([
            (self.cfg.group_label_key(), prefix.clone()),
            (self.cfg.role_label_key(), role.to_string()),
        ]);
        if let Some((group, role_key)) = self.cfg.former_lease_label_keys() {
            labels.insert(group, prefix);
            labels.insert(role_key, role.to_string());
        }
        labels
    }

    /// Whether `lease` is labelled `role` (under the domain or the former domain).
    fn is_role(&self, lease: &Lease, role: &str) -> bool {
        let Some(labels) = lease.metadata.labels.as_ref() else {
            return false;
        };
        let former = self.cfg.former_lease_label_keys().map(|(_, r)| r);
        std::iter::once(self.cfg.role_label_key())
            .chain(former)
            .any(|k| labels.get(&k).is_some_and(|r| r == role))
    }
}

#[cfg(test)]
mod tests;
