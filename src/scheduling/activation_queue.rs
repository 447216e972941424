//! The manager's activation queue: objects waiting for a live actor, as plain data.
//!
//! An object gets a live actor only when it can run (see the glossary in `mod.rs`), so
//! activations wait here for a reconcile slot, in three first-in-first-out queues:
//!
//! - *Again*: objects that ran before and are re-activated (a change, a notification, a due
//!   wake-up, a restart after a failure) come first. They are making progress, like the reconciles
//!   of live actors, and a burst of new objects would otherwise delay each step of the ones
//!   already going by the whole burst (a readiness hop down a dependency chain waited for
//!   every first reconcile queued before it). While new objects wait too, every
//!   [`NEW_OBJECT_EVERY`]-th of these starts goes to a new object.
//! - *New*: objects created while the runtime runs (their first activation).
//! - *Listed*: the first activation of every object found by the start-up list (or in a shard
//!   just acquired), which mostly confirms that the object is as it should be. They wait behind
//!   real changes: a user who changes one object while thousands are being listed should not
//!   wait behind the list. An object listed and then changed before its turn moves to *again*.
//!
//! Listed objects are never starved, whatever the rate of changes (the failure of a strict
//! priority queue: its low-priority items wait as long as higher ones keep arriving): from the
//! moment listed objects wait until none does, they get at least one start in
//! [`LISTED_EVERY`], counted over the whole time. So the list is through in at most
//! [`LISTED_EVERY`] times the starts it takes alone. Within that bound changes go first: the
//! starts the list took while nothing else waited are credit that a burst of changes (every
//! change made while the runtime was listing arrives at once, when its watch begins) spends
//! before the list gets its next start.

use super::fair::{FairQueue, Share};

/// While objects that ran before and new objects both wait, every this-many-th start of the
/// two goes to a new object.
pub(crate) const NEW_OBJECT_EVERY: u32 = 4;

/// While listed objects wait, at least one start in this many (counted since they began to
/// wait) goes to them: the list takes at most this many times the starts it takes alone,
/// whatever the rate of changes.
pub(crate) const LISTED_EVERY: u64 = 2;

/// Keys waiting for activation, in three queues, each fair across tenants ([`FairQueue`]: a
/// burst of one tenant's objects waits its turns behind other tenants' objects of the same
/// queue; a tenant's own objects wait oldest first).
///
/// A key may be queued more than once (or stop waiting, e.g. deleted): the manager says which
/// entries still wait ([`ActivationQueue::skip_stale`]) before it takes one.
pub(crate) struct ActivationQueue<T> {
    /// Objects that ran before (or changed while listed).
    again: FairQueue<T>,
    /// New objects (their first activation).
    new: FairQueue<T>,
    /// First activations of listed objects.
    listed: FairQueue<T>,
    /// Starts taken while `again` and `new` both waited.
    new_turn: u32,
    /// Starts of listed objects since listed objects began to wait.
    listed_starts: u64,
    /// Starts of other objects since listed objects began to wait.
    other_starts: u64,
}

impl<T> Default for ActivationQueue<T> {
    fn default() -> Self {
        Self {
            again: FairQueue::default(),
            new: FairQueue::default(),
            listed: FairQueue::default(),
            new_turn: 0,
            listed_starts: 0,
            other_starts: 0,
        }
    }
}

impl<T> ActivationQueue<T> {
    /// Queue the re-activation of an object that ran before, or of a listed object that
    /// changed while it waited.
    pub(crate) fn push_again(&mut self, share: Share, key: T) {
        self.again.push(share, key);
    }

    /// Queue the first activation of an object created while the runtime runs.
    pub(crate) fn push_new(&mut self, share: Share, key: T) {
        self.new.push(share, key);
    }

    /// Queue the first activation of an object found by a list.
    pub(crate) fn push_listed(&mut self, share: Share, key: T) {
        if self.listed.is_empty() {
            // Listed objects begin to wait: their share is counted from here.
            self.listed_starts = 0;
            self.other_starts = 0;
        }
        self.listed.push(share, key);
    }

    /// Drop entries at the queues' heads that no longer wait (`waits` says which do); `true`
    /// if a waiting one is at any head.
    pub(crate) fn skip_stale(&mut self, waits: impl Fn(&T) -> bool) -> bool {
        for queue in [&mut self.again, &mut self.new, &mut self.listed] {
            while queue.front().is_some_and(|key| !waits(key)) {
                queue.drop_front();
            }
        }
        !(self.again.is_empty() && self.new.is_empty() && self.listed.is_empty())
    }

    /// The next key to activate: objects that ran before first, then new objects (every
    /// [`NEW_OBJECT_EVERY`]-th start of the two while both wait), then listed objects (whenever
    /// their share, one start in [`LISTED_EVERY`] since they began to wait, calls for it).
    pub(crate) fn pop_next(&mut self) -> Option<T> {
        let others = !(self.again.is_empty() && self.new.is_empty());
        if !self.listed.is_empty() {
            let owed = self.other_starts >= self.listed_starts * (LISTED_EVERY - 1);
            if !others || owed {
                self.listed_starts += 1;
                return self.listed.pop_front();
            }
            self.other_starts += 1;
        }
        let new_object = match (self.again.is_empty(), self.new.is_empty()) {
            (true, true) => return None,
            (false, true) => false,
            (true, false) => true,
            (false, false) => {
                self.new_turn = self.new_turn.wrapping_add(1);
                self.new_turn.is_multiple_of(NEW_OBJECT_EVERY)
            }
        };
        if new_object {
            self.new.pop_front()
        } else {
            self.again.pop_front()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One tenant: each queue is first in, first out.
    const T: Share = Share {
        tenant: 0,
        weight: 1,
    };

    #[test]
    fn a_tenants_burst_of_new_objects_waits_its_turns_behind_other_tenants() {
        let (burst, small) = (Share::of("burst", 1), Share::of("small", 1));
        let mut q = ActivationQueue::default();
        (1..=100).for_each(|k| q.push_new(burst, k));
        (901..=902).for_each(|k| q.push_new(small, k));
        let first: Vec<u32> = (0..5).map(|_| q.pop_next().unwrap()).collect();
        assert_eq!(first, vec![1, 901, 2, 902, 3]);
    }

    #[test]
    fn objects_that_ran_before_come_first_and_new_ones_get_every_fourth_start() {
        assert_eq!(NEW_OBJECT_EVERY, 4, "the expected order below assumes 4");
        let mut q = ActivationQueue::default();
        (1..=3).for_each(|k| q.push_new(T, k));
        (101..=106).for_each(|k| q.push_again(T, k));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_next()).collect();
        assert_eq!(order, vec![101, 102, 103, 1, 104, 105, 106, 2, 3]);
    }

    #[test]
    fn changes_and_the_list_share_the_starts_while_both_wait_from_the_start() {
        assert_eq!(LISTED_EVERY, 2, "the expected order below assumes 2");
        let mut q = ActivationQueue::default();
        (1..=4).for_each(|k| q.push_listed(T, k));
        q.push_new(T, 51);
        (101..=102).for_each(|k| q.push_again(T, k));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_next()).collect();
        assert_eq!(order, vec![1, 101, 2, 102, 3, 51, 4]);
    }

    #[test]
    fn starts_the_list_took_alone_let_a_burst_of_changes_go_first() {
        let mut q = ActivationQueue::default();
        (1..=10).for_each(|k| q.push_listed(T, k));
        let alone: Vec<u32> = (0..4).map(|_| q.pop_next().unwrap()).collect();
        assert_eq!(alone, vec![1, 2, 3, 4]);
        (101..=106).for_each(|k| q.push_again(T, k));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_next()).collect();
        // Four starts of credit, then one in two again.
        assert_eq!(order, vec![101, 102, 103, 104, 5, 105, 6, 106, 7, 8, 9, 10]);
    }

    #[test]
    fn the_share_is_counted_afresh_when_listed_objects_wait_again() {
        let mut q = ActivationQueue::default();
        (1..=3).for_each(|k| q.push_listed(T, k));
        while q.pop_next().is_some() {}
        // A shard acquired later: the credit of the first list does not carry over.
        (11..=12).for_each(|k| q.push_listed(T, k));
        (101..=102).for_each(|k| q.push_again(T, k));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_next()).collect();
        assert_eq!(order, vec![11, 101, 12, 102]);
    }

    #[test]
    fn a_steady_stream_of_changes_does_not_starve_the_list() {
        // Two changes arrive for every start: the other queues never empty.
        let mut q = ActivationQueue::default();
        (0..1_000).for_each(|k| q.push_listed(T, k));
        let mut change = 1_000_000;
        let mut starts = 0u64;
        let mut listed_left = 1_000;
        while listed_left > 0 {
            q.push_again(T, change);
            q.push_new(T, change + 1);
            change += 2;
            let key = q.pop_next().expect("every queue waits");
            starts += 1;
            if key < 1_000_000 {
                listed_left -= 1;
            }
        }
        assert!(
            starts <= 1_000 * LISTED_EVERY,
            "{starts} starts for 1000 listed"
        );
    }

    #[test]
    fn stale_heads_are_skipped_in_every_queue() {
        let mut q = ActivationQueue::default();
        [1, 2, 3].into_iter().for_each(|k| q.push_new(T, k));
        [10, 11].into_iter().for_each(|k| q.push_again(T, k));
        [20, 21].into_iter().for_each(|k| q.push_listed(T, k));
        // 1, 10 and 20 no longer wait (deleted, or activated through a newer entry)
        assert!(q.skip_stale(|k| ![1, 10, 20].contains(k)));
        assert_eq!(q.pop_next(), Some(21));
        assert_eq!(q.pop_next(), Some(11));
        assert_eq!(q.pop_next(), Some(2));
        assert!(!q.skip_stale(|k| *k != 3), "nothing that waits is left");
        assert_eq!(q.pop_next(), None);
    }
}
