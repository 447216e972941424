//! Fair shares across tenants, as plain data: a queue that serves its tenants in turn (weighted
//! round robin, deficit style: a tenant of weight `w` takes up to `w` items per turn), each
//! tenant's items oldest first. One tenant's burst then delays another tenant's next item by at
//! most one turn of every tenant waiting, not by the whole burst; with one tenant it is a
//! first-in-first-out queue.
//!
//! A tenant is the object's namespace unless its controller says otherwise
//! ([`Controller::tenant`](crate::runtime::Controller::tenant)); its weight is 1 unless set
//! ([`Controller::tenant_weight`](crate::runtime::Controller::tenant_weight)). Tenants are
//! told apart by a hash of their name: two names with one hash share a tenant's turn, which
//! costs fairness between them, never an item.

use std::collections::{HashMap, VecDeque};

/// Which tenant an item is queued for, and its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    /// The tenant's name, hashed.
    pub tenant: u64,
    /// Items it takes per turn (at least 1).
    pub weight: u32,
}

impl Share {
    /// The share of tenant `name` with `weight`.
    pub(crate) fn of(name: &str, weight: u32) -> Self {
        Self {
            tenant: ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(name),
            weight: weight.max(1),
        }
    }
}

/// The function that names an object's tenant ([`Controller::tenant`](crate::runtime::Controller::tenant)).
pub(crate) type TenantOf<K> = std::sync::Arc<dyn Fn(&K) -> String + Send + Sync>;

/// How a kind's objects are told apart by tenant: by namespace, or by its controller's
/// function; and the tenants' weights.
pub(crate) struct Tenants<K> {
    /// The controller's function (`None`: the namespace).
    pub(crate) by: Option<TenantOf<K>>,
    /// Weights by tenant name (1 for the others).
    pub(crate) weights: HashMap<String, u32>,
}

impl<K> Default for Tenants<K> {
    fn default() -> Self {
        Self {
            by: None,
            weights: HashMap::new(),
        }
    }
}

impl<K> Tenants<K> {
    /// Whether naming the tenant needs the object (else its namespace will do).
    pub(crate) fn needs_object(&self) -> bool {
        self.by.is_some()
    }

    /// The share of the object in `namespace` (`obj`: the object, when [`Tenants::needs_object`]
    /// and it is cached; without it, the namespace names the tenant).
    pub(crate) fn share(&self, namespace: Option<&str>, obj: Option<&K>) -> Share {
        let named;
        let name = match (&self.by, obj) {
            (Some(by), Some(obj)) => {
                named = by(obj);
                named.as_str()
            }
            _ => namespace.unwrap_or(""),
        };
        let weight = match self.weights.is_empty() {
            true => 1,
            false => self.weights.get(name).copied().unwrap_or(1),
        };
        Share::of(name, weight)
    }
}

/// Items waiting, by tenant, served in turn.
#[derive(Debug)]
pub(crate) struct FairQueue<T> {
    /// Each waiting tenant's weight and items, oldest first.
    tenants: HashMap<u64, (u32, VecDeque<T>), ahash::RandomState>,
    /// The waiting tenants, in turn order: the front one is served now.
    turns: VecDeque<u64>,
    /// Items the front tenant took in its current turn.
    taken: u32,
    len: usize,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            tenants: HashMap::default(),
            turns: VecDeque::new(),
            taken: 0,
            len: 0,
        }
    }
}

impl<T> FairQueue<T> {
    /// Queue `item` for `share`'s tenant (a tenant new to the queue takes its turn after
    /// every tenant waiting; its weight is the latest given).
    pub(crate) fn push(&mut self, share: Share, item: T) {
        let (weight, items) = self
            .tenants
            .entry(share.tenant)
            .or_insert_with(|| (share.weight, VecDeque::new()));
        *weight = share.weight;
        if items.is_empty() {
            self.turns.push_back(share.tenant);
        }
        items.push_back(item);
        self.len += 1;
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The item [`FairQueue::pop_front`] takes next.
    pub(crate) fn front(&self) -> Option<&T> {
        let tenant = self.turns.front()?;
        self.tenants.get(tenant)?.1.front()
    }

    /// Drop the next item without counting it against its tenant's turn (it no longer waits).
    pub(crate) fn drop_front(&mut self) {
        self.take(false);
    }

    /// Take the next item: the oldest of the tenant whose turn it is.
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        self.take(true)
    }

    fn take(&mut self, counted: bool) -> Option<T> {
        let tenant = *self.turns.front()?;
        let (weight, items) = self.tenants.get_mut(&tenant)?;
        let item = items.pop_front();
        self.len -= usize::from(item.is_some());
        if items.is_empty() {
            self.tenants.remove(&tenant);
            self.turns.pop_front();
            self.taken = 0;
        } else if counted {
            self.taken += 1;
            if self.taken >= *weight {
                self.turns.rotate_left(1);
                self.taken = 0;
            }
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut FairQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop_front()).collect()
    }

    #[test]
    fn a_burst_of_one_tenant_waits_its_turns_behind_others() {
        let (a, b, c) = (Share::of("a", 1), Share::of("b", 1), Share::of("c", 1));
        let mut q = FairQueue::default();
        for item in ["a1", "a2", "a3", "a4", "a5"] {
            q.push(a, item);
        }
        q.push(b, "b1");
        q.push(b, "b2");
        q.push(c, "c1");
        assert_eq!(q.front(), Some(&"a1"));
        assert_eq!(
            drain(&mut q),
            ["a1", "b1", "c1", "a2", "b2", "a3", "a4", "a5"]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn a_weight_takes_that_many_per_turn() {
        let (a, b) = (Share::of("a", 3), Share::of("b", 1));
        let mut q = FairQueue::default();
        for item in ["a1", "a2", "a3", "a4", "a5"] {
            q.push(a, item);
        }
        for item in ["b1", "b2", "b3"] {
            q.push(b, item);
        }
        assert_eq!(
            drain(&mut q),
            ["a1", "a2", "a3", "b1", "a4", "a5", "b2", "b3"]
        );
    }

    #[test]
    fn one_tenant_is_first_in_first_out_and_dropped_items_cost_no_turn() {
        let a = Share::of("a", 1);
        let b = Share::of("b", 1);
        let mut q = FairQueue::default();
        q.push(a, "a1");
        q.push(a, "a2");
        q.push(b, "b1");
        q.push(b, "b2");
        q.drop_front(); // a1 no longer waits: a keeps its turn
        assert_eq!(q.pop_front(), Some("a2"));
        assert_eq!(drain(&mut q), ["b1", "b2"]);
        let mut fifo = FairQueue::default();
        for item in ["1", "2", "3"] {
            fifo.push(a, item);
        }
        assert_eq!(drain(&mut fifo), ["1", "2", "3"]);
        assert_eq!(Share::of("x", 0).weight, 1, "a weight is at least 1");
    }
}
