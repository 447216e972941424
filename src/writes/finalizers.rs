//! The runtime's own finalizers on its objects: the current one and the former ones it
//! migrates from, and the guarded JSON patch operations that claim and remove them.

use std::sync::Arc;

use serde_json::{Value, json};

/// The runtime's finalizer and the ones it used to put on its objects
/// ([`RuntimeBuilder::migrate_finalizer`](crate::runtime::RuntimeBuilder::migrate_finalizer)):
/// a former one counts as the runtime's own, is replaced by the current one at the next claim,
/// and is removed with it.
#[derive(Clone, Debug)]
pub(crate) struct OwnFinalizers {
    pub(crate) current: String,
    pub(crate) former: Arc<[String]>,
}

impl OwnFinalizers {
    /// Whether `f` is the runtime's finalizer or a former one.
    pub(crate) fn owns(&self, f: &str) -> bool {
        f == self.current || self.is_former(f)
    }

    fn is_former(&self, f: &str) -> bool {
        self.former.iter().any(|o| o == f)
    }

    /// The indexes of `finalizers` that hold a former finalizer, highest first (the order in
    /// which a JSON patch removes them without moving the others).
    fn former_indexes(&self, finalizers: &[String]) -> Vec<usize> {
        let mut at: Vec<usize> = finalizers
            .iter()
            .enumerate()
            .filter(|(_, f)| self.is_former(f))
            .map(|(i, _)| i)
            .collect();
        at.reverse();
        at
    }

    /// Whether the claim of `finalizers` must write: the current finalizer is missing (and
    /// `wanted`), or a former one is still there.
    pub(crate) fn needs_claim(&self, finalizers: &[String], wanted: bool) -> bool {
        (wanted && !finalizers.contains(&self.current))
            || finalizers.iter().any(|f| self.is_former(f))
    }

    /// The JSON patch operations that leave `finalizers` (the list the reconcile saw) with
    /// the current finalizer (when `wanted`) and no former one: a former one is replaced in
    /// place by the current (or removed when the current is there already), each guarded by a
    /// `test` of its index.
    pub(super) fn claim_ops(
        &self,
        finalizers: Option<&[String]>,
        wanted: bool,
    ) -> Vec<serde_json::Value> {
        let list = finalizers.unwrap_or_default();
        let mut former = self.former_indexes(list);
        let has_current = list.contains(&self.current);
        let mut ops = Vec::new();
        // The lowest former index becomes the current finalizer when that is missing.
        let replace = if wanted && !has_current {
            former.pop()
        } else {
            None
        };
        for i in former {
            ops.extend(at_index(i, &list[i], json!({"op": "remove"})));
        }
        if let Some(i) = replace {
            ops.extend(at_index(
                i,
                &list[i],
                json!({"op": "replace", "value": &self.current}),
            ));
        } else if wanted && !has_current {
            ops.push(if finalizers.is_none() {
                json!({"op": "add", "path": "/metadata/finalizers", "value": [&self.current]})
            } else {
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": &self.current})
            });
        }
        ops
    }

    /// The JSON patch operations that remove the current and every former finalizer from
    /// `finalizers`, highest index first, each guarded by a `test` of its index.
    pub(super) fn remove_ops(&self, finalizers: &[String]) -> Vec<serde_json::Value> {
        let mut ops = Vec::new();
        for (i, f) in finalizers.iter().enumerate().rev() {
            if self.owns(f) {
                ops.extend(at_index(i, f, json!({"op": "remove"})));
            }
        }
        ops
    }
}

/// `op` on the finalizer at index `i`, guarded by a `test` that it still is `seen`.
fn at_index(i: usize, seen: &str, mut op: Value) -> [Value; 2] {
    let path = format!("/metadata/finalizers/{i}");
    op["path"] = json!(path);
    [json!({"op": "test", "path": path, "value": seen}), op]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn own(current: &str, former: &[&str]) -> OwnFinalizers {
        OwnFinalizers {
            current: current.into(),
            former: former.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// The finalizers `ops` leave on an object that carries `list` (`None`: no field).
    fn apply(list: Option<&[&str]>, ops: Vec<serde_json::Value>) -> Vec<String> {
        let mut doc = json!({"metadata": {}});
        if let Some(list) = list {
            doc["metadata"]["finalizers"] = json!(list);
        }
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        json_patch::patch(&mut doc, &patch).expect("the patch applies to the list it was made for");
        serde_json::from_value(doc["metadata"]["finalizers"].clone()).unwrap_or_default()
    }

    fn strings(l: &[&str]) -> Vec<String> {
        l.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn a_claim_adds_the_finalizer_and_replaces_a_former_one_in_place() {
        let f = own(
            "new.example.com/finalizer",
            &["actorcile.dev/finalizer", "old.example.com/x"],
        );
        // No field, an empty list, other finalizers: added at the end.
        assert_eq!(
            apply(None, f.claim_ops(None, true)),
            ["new.example.com/finalizer"]
        );
        assert_eq!(
            apply(Some(&["a/b"]), f.claim_ops(Some(&strings(&["a/b"])), true)),
            ["a/b", "new.example.com/finalizer"]
        );
        // A former one: replaced where it stood; a second former one removed.
        let list = ["a/b", "actorcile.dev/finalizer", "c/d", "old.example.com/x"];
        assert!(f.needs_claim(&strings(&list), true));
        assert_eq!(
            apply(Some(&list), f.claim_ops(Some(&strings(&list)), true)),
            ["a/b", "new.example.com/finalizer", "c/d"]
        );
        // The current one and a former one: the former one goes.
        let list = ["actorcile.dev/finalizer", "new.example.com/finalizer"];
        assert!(f.needs_claim(&strings(&list), true));
        assert_eq!(
            apply(Some(&list), f.claim_ops(Some(&strings(&list)), true)),
            ["new.example.com/finalizer"]
        );
        // The current one alone: nothing to claim.
        let list = ["a/b", "new.example.com/finalizer"];
        assert!(!f.needs_claim(&strings(&list), true));
        assert!(f.claim_ops(Some(&strings(&list)), true).is_empty());
        // A controller without a finalizer drops a former one and adds none.
        let list = ["actorcile.dev/finalizer", "a/b"];
        assert!(f.needs_claim(&strings(&list), false));
        assert_eq!(
            apply(Some(&list), f.claim_ops(Some(&strings(&list)), false)),
            ["a/b"]
        );
        assert!(!f.needs_claim(&strings(&["a/b"]), false));
    }

    #[test]
    fn a_claim_made_for_another_list_does_not_apply() {
        let f = own("new.example.com/finalizer", &["actorcile.dev/finalizer"]);
        let seen = strings(&["actorcile.dev/finalizer", "a/b"]);
        let ops = f.claim_ops(Some(&seen), true);
        // Someone removed the former finalizer meanwhile: the test of its index fails.
        let mut doc = json!({"metadata": {"finalizers": ["a/b"]}});
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        assert!(json_patch::patch(&mut doc, &patch).is_err());
    }

    #[test]
    fn removal_takes_the_current_and_every_former_finalizer_and_keeps_the_others() {
        let f = own("new.example.com/finalizer", &["actorcile.dev/finalizer"]);
        let list = [
            "actorcile.dev/finalizer",
            "a/b",
            "new.example.com/finalizer",
            "c/d",
        ];
        assert_eq!(
            apply(Some(&list), f.remove_ops(&strings(&list))),
            ["a/b", "c/d"]
        );
        assert!(f.remove_ops(&strings(&["a/b"])).is_empty());
        assert!(f.owns("actorcile.dev/finalizer") && f.owns("new.example.com/finalizer"));
        assert!(!f.owns("a/b"));
    }
}
