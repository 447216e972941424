//! The `coordination.k8s.io/v1` Lease record as both Lease users read it: leader election
//! ([`crate::leader`], feature `operator`) and shard keeping ([`crate::sharding`]).
//!
//! Both follow client-go's rule: a Lease's holder is judged by when *this replica* last saw its
//! record change, never by the times written in it (another replica's clock may be skewed).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

/// A Lease's record as last observed, and when it last changed (by this replica's clock).
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// The holder (`None`: no holder, or an empty one).
    pub(crate) holder: Option<String>,
    pub(crate) renew: Option<MicroTime>,
    /// The Lease's duration (at least 1 s).
    pub(crate) duration: Duration,
    /// When this replica saw the record change.
    pub(crate) at: Instant,
}

impl Observed {
    /// `previous` moved on by `spec` as seen at `now`: the observation time moves only when the
    /// holder or the renew time changed.
    pub(crate) fn update(
        previous: Option<&Observed>,
        spec: Option<&LeaseSpec>,
        now: Instant,
    ) -> Observed {
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let renew = spec.and_then(|s| s.renew_time.clone());
        let duration = Duration::from_secs(
            spec.and_then(|s| s.lease_duration_seconds)
                .unwrap_or(1)
                .max(1) as u64,
        );
        match previous {
            Some(o) if o.holder == holder && o.renew == renew => o.clone(),
            _ => Observed {
                holder,
                renew,
                duration,
                at: now,
            },
        }
    }

    /// No holder, or the record has not changed for its duration.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.holder.is_none() || self.at + self.duration <= now
    }
}

/// `leaseTransitions` after a change of holder: one more, from 0 again past `i32::MAX` (the API
/// server refuses a negative count, and a Lease's fields are anyone's to write: an overflow must
/// not make every later write of the Lease fail, nor panic).
pub(crate) fn next_lease_transitions(current: Option<i32>) -> i32 {
    current
        .filter(|n| *n >= 0)
        .unwrap_or(0)
        .checked_add(1)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_transitions_count_on_without_overflowing() {
        assert_eq!(next_lease_transitions(None), 1);
        assert_eq!(next_lease_transitions(Some(4)), 5);
        assert_eq!(next_lease_transitions(Some(i32::MAX)), 0);
        assert_eq!(next_lease_transitions(Some(-3)), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_observation_time_moves_only_when_the_record_changes() {
        let spec = LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(10),
            ..Default::default()
        };
        let first = Observed::update(None, Some(&spec), Instant::now());
        tokio::time::advance(Duration::from_secs(4)).await;
        let same = Observed::update(Some(&first), Some(&spec), Instant::now());
        assert_eq!(same.at, first.at);
        let moved = LeaseSpec {
            holder_identity: Some("b".into()),
            ..spec.clone()
        };
        let changed = Observed::update(Some(&same), Some(&moved), Instant::now());
        assert_eq!(changed.at, Instant::now());
        assert!(!changed.expired(Instant::now()));
        assert!(changed.expired(Instant::now() + Duration::from_secs(10)));
        let none = Observed::update(None, None, Instant::now());
        assert!(none.expired(Instant::now()));
        assert_eq!(none.duration, Duration::from_secs(1));
    }
}
