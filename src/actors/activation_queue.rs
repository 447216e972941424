//! The manager's activation queue: objects waiting for a live actor, as plain data.
//!
//! An object gets a live actor only when it can run (see the glossary in `mod.rs`), so
//! activations wait here for a run slot. Objects that ran before (re-activated by a
//! notification, a due wake-up or a change) wait in a queue of their own that comes first: they
//! are making progress, like the passes of live actors, and a burst of new objects (every object
//! of a kind at start-up) would otherwise delay each step of the ones already going by the whole
//! burst (a readiness hop down a dependency chain waited for every first pass queued before it).
//! While both wait, every [`NEW_OBJECT_EVERY`]-th start is a new object, so neither side
//! starves.

use std::collections::VecDeque;

/// While objects that ran before and new objects both wait, every this-many-th start goes to a
/// new object.
pub(crate) const NEW_OBJECT_EVERY: u32 = 4;

/// Keys waiting for activation, in two first-in-first-out queues.
///
/// A key may be queued more than once (or stop waiting, e.g. deleted): the manager says which
/// entries still wait ([`ActivationQueue::skip_stale`]) before it takes one.
pub(crate) struct ActivationQueue<T> {
    /// New objects (their first activation), oldest first.
    new: VecDeque<T>,
    /// Objects that ran before and passivated, oldest first.
    again: VecDeque<T>,
    /// Starts taken while both queues waited.
    turn: u32,
}

impl<T> Default for ActivationQueue<T> {
    fn default() -> Self {
        Self {
            new: VecDeque::new(),
            again: VecDeque::new(),
            turn: 0,
        }
    }
}

impl<T> ActivationQueue<T> {
    /// Queue a new object's first activation.
    pub(crate) fn push_new(&mut self, key: T) {
        self.new.push_back(key);
    }

    /// Queue the re-activation of an object that ran before.
    pub(crate) fn push_again(&mut self, key: T) {
        self.again.push_back(key);
    }

    /// Drop entries at the queues' heads that no longer wait (`waits` says which do); `true`
    /// if a waiting one is at either head.
    pub(crate) fn skip_stale(&mut self, waits: impl Fn(&T) -> bool) -> bool {
        for queue in [&mut self.again, &mut self.new] {
            while queue.front().is_some_and(|key| !waits(key)) {
                queue.pop_front();
            }
        }
        !(self.again.is_empty() && self.new.is_empty())
    }

    /// The next key to activate: objects that ran before first, and every
    /// [`NEW_OBJECT_EVERY`]-th start to a new object while both wait.
    pub(crate) fn pop_next(&mut self) -> Option<T> {
        let new_object = match (self.again.is_empty(), self.new.is_empty()) {
            (true, true) => return None,
            (false, true) => false,
            (true, false) => true,
            (false, false) => {
                self.turn = self.turn.wrapping_add(1);
                self.turn.is_multiple_of(NEW_OBJECT_EVERY)
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
    fn stale_heads_are_skipped_in_both_queues() {
        let mut q = ActivationQueue::default();
        [1, 2, 3].into_iter().for_each(|k| q.push_new(k));
        [10, 11].into_iter().for_each(|k| q.push_again(k));
        // 1 and 10 no longer wait (deleted, or activated through a newer entry)
        assert!(q.skip_stale(|k| *k != 1 && *k != 10));
        assert_eq!(q.pop_next(), Some(11));
        assert_eq!(q.pop_next(), Some(2));
        assert!(!q.skip_stale(|k| *k != 3), "nothing that waits is left");
        assert_eq!(q.pop_next(), None);
    }
}
