//! What the last reconcile left, as a key: a reconcile whose outcome and object version match it needs
//! no status work (a yield loop's reconciles, an idle re-run).

use crate::provisioners::{Outcome, Reason};

fn variant_of(o: &Outcome) -> u8 {
    match o {
        Outcome::Done => 0,
        Outcome::Yield { .. } => 1,
        Outcome::Waiting { .. } => 2,
        Outcome::Terminal(_) => 3,
        Outcome::UserActionRequired(_) => 4,
        Outcome::Failed { .. } => 5,
    }
}

/// Everything the status of a reconcile depends on besides the object's current status.
///
/// It keeps the outcome's [`Reason`] itself, not copies of its strings: a reason built from
/// string literals (the usual case, e.g. every reconcile of a yield loop) is then compared by address
/// in [`OutcomeKey::matches`], without reading the strings. Copies were two heap strings per live
/// actor, cold by the next reconcile, and comparing them was a visible share of a yield reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutcomeKey {
    variant: u8,
    reason: Option<Reason>,
    generation: Option<i64>,
    deleting: bool,
    version: Option<u64>,
}

impl OutcomeKey {
    /// Whether `of(o, generation, deleting, version)` would equal this key (without allocating).
    pub(crate) fn matches(
        &self,
        o: &Outcome,
        generation: Option<i64>,
        deleting: bool,
        version: Option<u64>,
    ) -> bool {
        self.variant == variant_of(o)
            && self.generation == generation
            && self.deleting == deleting
            && self.version == version
            && match (&self.reason, o.reason()) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    same_str(a.code(), b.code()) && same_str(a.message(), b.message())
                }
                _ => false,
            }
    }

    pub(crate) fn of(
        o: &Outcome,
        generation: Option<i64>,
        deleting: bool,
        version: Option<u64>,
    ) -> Self {
        Self {
            variant: variant_of(o),
            reason: o.reason().cloned(),
            generation,
            deleting,
            version,
        }
    }
}

/// String equality that answers from the addresses when both are the same string (a literal's
/// reuse), and reads the bytes only otherwise.
fn same_str(a: &str, b: &str) -> bool {
    a.len() == b.len() && (std::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outcome_key_matches_by_value_and_by_address() {
        let literal =
            || Outcome::yield_after(Duration::from_millis(1), Reason::new("Wait", "later"));
        let key = OutcomeKey::of(&literal(), Some(1), false, Some(7));
        // the same literals (compared by address), and equal strings built at run time
        assert!(key.matches(&literal(), Some(1), false, Some(7)));
        let owned = Outcome::yield_after(
            Duration::from_secs(9),
            Reason::new(String::from("Wait"), format!("lat{}", "er")),
        );
        assert!(key.matches(&owned, Some(1), false, Some(7)));
        // anything else that shapes the status differs
        let other = Outcome::yield_after(Duration::from_millis(1), Reason::new("Wait", "sooner"));
        assert!(!key.matches(&other, Some(1), false, Some(7)));
        assert!(!key.matches(&literal(), Some(2), false, Some(7)));
        assert!(!key.matches(&literal(), Some(1), true, Some(7)));
        assert!(!key.matches(&literal(), Some(1), false, Some(8)));
        assert!(!key.matches(&Outcome::Done, Some(1), false, Some(7)));
        let done = OutcomeKey::of(&Outcome::Done, None, false, None);
        assert!(done.matches(&Outcome::Done, None, false, None));
        assert!(!done.matches(&literal(), None, false, None));
        assert!(!same_str("ab", "abc") && same_str("ab", &String::from("ab")));
    }
}
