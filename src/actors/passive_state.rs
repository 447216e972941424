//! What the manager keeps of a passive object: at a million idle objects this is most of the
//! manager's memory, so the common case — nothing pending, no failures, at most one of the
//! actor's own writes still to recognise — is kept inline in 32 bytes, and only the rest boxed.

use crate::messages::{Cause, PassiveState, Trigger};

/// A passive object's [`PassiveState`], as the manager keeps it.
#[derive(Debug)]
pub(crate) enum Kept {
    /// Nothing pending and no failures: the version the last reconcile ran on, and the one own
    /// write whose echo is not news.
    Settled {
        last_reconciled_version: Option<u64>,
        own_write: Option<u64>,
    },
    /// Anything else, with the token of its pending wake-up (held by the passive timers).
    Other(Box<PassiveState>, Option<u64>),
}

impl Default for Kept {
    fn default() -> Self {
        Kept::Settled {
            last_reconciled_version: None,
            own_write: None,
        }
    }
}

impl Kept {
    /// Keeps `ps` of an object whose cached version is `version`, with the token of its wake-up
    /// (`timer`). Own writes older than `version` are dropped: the object's versions only grow,
    /// so no later version is one of them (after a re-list served from an older cache, the
    /// worst case is one reconcile that was not needed).
    pub(crate) fn keep(mut ps: PassiveState, version: Option<u64>, timer: Option<u64>) -> Self {
        if let Some(v) = version {
            ps.own_writes.retain(|w| *w >= v);
        }
        let settled = timer.is_none()
            && ps.wake_in.is_none()
            && !ps.reconcile_due
            && ps.error_attempts == 0
            && ps.own_writes.len() <= 1;
        if settled {
            Kept::Settled {
                last_reconciled_version: ps.last_reconciled_version,
                own_write: ps.own_writes.first().copied(),
            }
        } else {
            Kept::Other(Box::new(ps), timer)
        }
    }

    /// The token of the pending wake-up, if any.
    pub(crate) fn timer(&self) -> Option<u64> {
        match self {
            Kept::Settled { .. } => None,
            Kept::Other(_, timer) => *timer,
        }
    }

    /// Whether the object at `version` is news (see [`super::is_news`]).
    pub(crate) fn is_news(&self, version: Option<u64>) -> bool {
        match self {
            Kept::Settled {
                last_reconciled_version,
                own_write,
            } => super::is_news(*last_reconciled_version, own_write.as_slice(), version),
            Kept::Other(ps, _) => {
                super::is_news(ps.last_reconciled_version, &ps.own_writes, version)
            }
        }
    }

    /// The state, for the object's next actor. What is left is empty but for the wake-up's
    /// token, so that the activation that follows cancels the wake-up.
    pub(crate) fn take(&mut self) -> PassiveState {
        match self {
            Kept::Settled {
                last_reconciled_version,
                own_write,
            } => {
                let ps = PassiveState {
                    last_reconciled_version: *last_reconciled_version,
                    own_writes: own_write.iter().copied().collect(),
                    ..PassiveState::default()
                };
                *self = Kept::default();
                ps
            }
            Kept::Other(ps, _) => std::mem::take(&mut **ps),
        }
    }

    /// If `token` is the pending wake-up's: it has fired (nothing left to cancel), and the
    /// state is handed out to run.
    pub(crate) fn fired(&mut self, token: u64) -> Option<PassiveState> {
        (self.timer() == Some(token)).then(|| {
            let mut ps = self.take();
            *self = Kept::default();
            ps.reconcile_due = true;
            ps.due = Some(Cause::of(ps.wake_for.take().unwrap_or(Trigger::Requeue)));
            ps.wake_in = None;
            ps
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ps(last: u64, own: &[u64]) -> PassiveState {
        PassiveState {
            last_reconciled_version: Some(last),
            own_writes: own.to_vec(),
            ..PassiveState::default()
        }
    }

    /// A settled object is kept inline and comes back as it went in, less the own writes its
    /// cached version has passed; what is news stays news and what is not stays not.
    #[test]
    fn a_settled_object_is_kept_inline_and_decides_news_alike() {
        let mut k = Kept::keep(ps(10, &[9, 11]), Some(11), None);
        assert!(matches!(
            k,
            Kept::Settled {
                own_write: Some(11),
                ..
            }
        ));
        for v in [9, 10, 11] {
            assert!(!k.is_news(Some(v)), "{v}");
        }
        assert!(k.is_news(Some(12)));
        assert!(k.is_news(None), "an unreadable version is news");
        assert_eq!(k.timer(), None);
        let back = k.take();
        assert_eq!(back.last_reconciled_version, Some(10));
        assert_eq!(back.own_writes, [11]);
        assert!(!back.reconcile_due);
        assert!(matches!(
            k,
            Kept::Settled {
                last_reconciled_version: None,
                own_write: None
            }
        ));
        // An unreadable cached version drops no own write.
        assert!(matches!(
            Kept::keep(ps(1, &[2, 3]), None, None),
            Kept::Other(..)
        ));
    }

    /// Anything pending or failed is kept whole, with its wake-up, which fires once and only
    /// for its own token.
    #[test]
    fn the_rest_is_kept_whole_and_fires_for_its_own_token() {
        let mut failing = ps(5, &[]);
        failing.error_attempts = 2;
        let mut k = Kept::keep(failing, Some(5), None);
        assert!(matches!(&k, Kept::Other(p, None) if p.error_attempts == 2));
        assert_eq!(k.take().error_attempts, 2);

        let mut waiting = ps(5, &[]);
        waiting.wake_in = Some(Duration::from_secs(60));
        let mut k = Kept::keep(waiting.clone(), Some(5), Some(7));
        assert_eq!(k.take().wake_in, waiting.wake_in);
        assert_eq!(
            k.timer(),
            Some(7),
            "taken, its wake-up is still there to cancel"
        );
        let mut k = Kept::keep(waiting, Some(5), Some(7));
        assert_eq!(k.timer(), Some(7));
        assert!(k.fired(6).is_none(), "a stale token");
        let run = k.fired(7).expect("its own token");
        assert!(run.reconcile_due);
        assert_eq!(run.wake_in, None);
        assert_eq!(run.last_reconciled_version, Some(5));
        assert_eq!(k.timer(), None, "fired once");
    }
}
