//! The manager's activation queue: objects waiting for a live actor, as plain data.
//!
//! An object gets a live actor only when it can run (see the glossary in `mod.rs`), so
//! activations wait here for a run slot, in three first-in-first-out queues:
//!
//! - *Again*: objects that ran before and are re-activated (a change, a notification, a due
//!   wake-up, a restart after a failure) come first. They are making progress, like the passes
//!   of live actors, and a burst of new objects would otherwise delay each step of the ones
//!   already going by the whole burst (a readiness hop down a dependency chain waited for
//!   every first pass queued before it). While new objects wait too, every
//!   [`NEW_OBJECT_EVERY`]-th of these starts goes to a new object.
//! - *New*: objects created while the runtime runs (their first activation).
//! - *Listed*: the first activation of every object found by the start-up list (or in a shard
//!   just acquired), which mostly confirms that the object is as it should be. They wait behind
//!   real changes: a user who changes one object while thousands are being listed should not
//!   wait behind the list. An object listed and then changed before its turn moves to *again*.
//!
//! Listed objects are never starved, whatever the rate of changes (the failure of a strict
//! priority queue: its low-priority items wait as long as higher ones keep arriving): while
//! they wait behind others, every [`LISTED_EVERY`]-th start goes to the oldest listed object.
//! So the list is through in at most [`LISTED_EVERY`] times the starts it takes alone.

use std::collections::VecDeque;

/// While objects that ran before and new objects both wait, every this-many-th start of the
/// two goes to a new object.
pub(crate) const NEW_OBJECT_EVERY: u32 = 4;

/// While listed objects wait behind others, every this-many-th start goes to the oldest listed
/// object: the list takes at most this many times the starts it takes alone, whatever the rate
/// of changes.
pub(crate) const LISTED_EVERY: u32 = 2;

/// Keys waiting for activation, in three first-in-first-out queues.
///
/// A key may be queued more than once (or stop waiting, e.g. deleted): the manager says which
/// entries still wait ([`ActivationQueue::skip_stale`]) before it takes one.
pub(crate) struct ActivationQueue<T> {
    /// Objects that ran before (or changed while listed), oldest first.
    again: VecDeque<T>,
    /// New objects (their first activation), oldest first.
    new: VecDeque<T>,
    /// First activations of listed objects, oldest first.
    listed: VecDeque<T>,
    /// Starts taken while `again` and `new` both waited.
    new_turn: u32,
    /// Starts taken while `listed` waited behind others.
    listed_turn: u32,
}

impl<T> Default for ActivationQueue<T> {
    fn default() -> Self {
        Self {
            again: VecDeque::new(),
            new: VecDeque::new(),
            listed: VecDeque::new(),
            new_turn: 0,
            listed_turn: 0,
        }
    }
}

impl<T> ActivationQueue<T> {
    /// Queue the re-activation of an object that ran before, or of a listed object that
    /// changed while it waited.
    pub(crate) fn push_again(&mut self, key: T) {
        self.again.push_back(key);
    }

    /// Queue the first activation of an object created while the runtime runs.
    pub(crate) fn push_new(&mut self, key: T) {
        self.new.push_back(key);
    }

    /// Queue the first activation of an object found by a list.
    pub(crate) fn push_listed(&mut self, key: T) {
        self.listed.push_back(key);
    }

    /// Drop entries at the queues' heads that no longer wait (`waits` says which do); `true`
    /// if a waiting one is at any head.
    pub(crate) fn skip_stale(&mut self, waits: impl Fn(&T) -> bool) -> bool {
        for queue in [&mut self.again, &mut self.new, &mut self.listed] {
            while queue.front().is_some_and(|key| !waits(key)) {
                queue.pop_front();
            }
        }
        !(self.again.is_empty() && self.new.is_empty() && self.listed.is_empty())
    }

    /// The next key to activate: objects that ran before first, then new objects (every
    /// [`NEW_OBJECT_EVERY`]-th start of the two while both wait), then listed objects (every
    /// [`LISTED_EVERY`]-th start while they wait behind others).
    pub(crate) fn pop_next(&mut self) -> Option<T> {
        let others = !(self.again.is_empty() && self.new.is_empty());
        if !self.listed.is_empty() {
            if !others {
                return self.listed.pop_front();
            }
            self.listed_turn = self.listed_turn.wrapping_add(1);
            if self.listed_turn.is_multiple_of(LISTED_EVERY) {
                return self.listed.pop_front();
            }
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

    #[test]
    fn objects_that_ran_before_come_first_and_new_ones_get_every_fourth_start() {
        assert_eq!(NEW_OBJECT_EVERY, 4, "the expected order below assumes 4");
        let mut q = ActivationQueue::default();
        (1..=3).for_each(|k| q.push_new(k));
        (101..=106).for_each(|k| q.push_again(k));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_next()).collect();
        assert_eq!(order, vec![101, 102, 103, 1, 104, 105, 106, 2, 3]);
    }

    #[test]
    fn changes_come_before_the_list_which_gets_every_second_start() {
        assert_eq!(LISTED_EVERY, 2, "the expected order below assumes 2");
        let mut q = ActivationQueue::default();
        (1..=4).for_each(|k| q.push_listed(k));
        q.push_new(51);
        (101..=102).for_each(|k| q.push_again(k));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_next()).collect();
        assert_eq!(order, vec![101, 1, 102, 2, 51, 3, 4]);
    }

    #[test]
    fn a_steady_stream_of_changes_does_not_starve_the_list() {
        // Two changes arrive for every start: the other queues never empty.
        let mut q = ActivationQueue::default();
        (0..1_000).for_each(|k| q.push_listed(k));
        let mut change = 1_000_000;
        let mut starts = 0;
        let mut listed_left = 1_000;
        while listed_left > 0 {
            q.push_again(change);
            q.push_new(change + 1);
            change += 2;
            let key = q.pop_next().expect("every queue waits");
            starts += 1;
            if key < 1_000_000 {
                listed_left -= 1;
            }
        }
        assert_eq!(starts, 1_000 * LISTED_EVERY);
    }

    #[test]
    fn stale_heads_are_skipped_in_every_queue() {
        let mut q = ActivationQueue::default();
        [1, 2, 3].into_iter().for_each(|k| q.push_new(k));
        [10, 11].into_iter().for_each(|k| q.push_again(k));
        [20, 21].into_iter().for_each(|k| q.push_listed(k));
        // 1, 10 and 20 no longer wait (deleted, or activated through a newer entry)
        assert!(q.skip_stale(|k| ![1, 10, 20].contains(k)));
        assert_eq!(q.pop_next(), Some(11));
        assert_eq!(q.pop_next(), Some(21));
        assert_eq!(q.pop_next(), Some(2));
        assert!(!q.skip_stale(|k| *k != 3), "nothing that waits is left");
        assert_eq!(q.pop_next(), None);
    }
}
