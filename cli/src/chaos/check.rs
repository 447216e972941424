//! What a chaos run checks from its records: reconciles of one object never overlap, and the guarded
//! side effect ran once per intent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use super::lines;

/// One reconcile as recorded: object, start and end (microseconds).
#[derive(Debug, Clone)]
pub struct Reconcile {
    /// `namespace/name`.
    pub key: String,
    /// The operator incarnation that ran it.
    pub incarnation: u32,
    /// Its start.
    pub start: u64,
    /// Its end: the `end` line, or the death of its process.
    pub end: u64,
    /// Ended by the death of its process (no `end` line).
    pub cut: bool,
}

/// The reconciles recorded in `dir`, an unfinished one ending when its process died (`deaths`:
/// incarnation → when it was killed or exited).
pub fn reconciles(dir: &Path, deaths: &HashMap<u32, u64>) -> std::io::Result<Vec<Reconcile>> {
    let mut open: HashMap<(u32, u64), (String, u64)> = HashMap::new();
    let mut done = Vec::new();
    for (at, words) in lines::read(&dir.join("reconciles"))? {
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["start", inc, id, key, ..] => {
                if let (Ok(inc), Ok(id)) = (inc.parse(), id.parse()) {
                    open.insert((inc, id), (key.to_string(), at));
                }
            }
            ["end", inc, id] => {
                if let (Ok(inc), Ok(id)) = (inc.parse(), id.parse())
                    && let Some((key, start)) = open.remove(&(inc, id))
                {
                    done.push(Reconcile {
                        key,
                        incarnation: inc,
                        start,
                        end: at,
                        cut: false,
                    });
                }
            }
            _ => {}
        }
    }
    for ((inc, _), (key, start)) in open {
        done.push(Reconcile {
            key,
            incarnation: inc,
            start,
            end: deaths.get(&inc).copied().unwrap_or(u64::MAX),
            cut: true,
        });
    }
    Ok(done)
}

/// Pairs of reconciles of one object that overlap in time, as `(object, earlier incarnation, later
/// incarnation, start of the later reconcile)`.
pub fn overlaps(reconciles: &[Reconcile]) -> Vec<(String, u32, u32, u64)> {
    let mut by_key: BTreeMap<&str, Vec<&Reconcile>> = BTreeMap::new();
    for p in reconciles {
        by_key.entry(&p.key).or_default().push(p);
    }
    let mut found = Vec::new();
    for (key, mut ps) in by_key {
        ps.sort_by_key(|p| (p.start, p.end));
        let mut latest: Option<&Reconcile> = None;
        for p in ps {
            if let Some(l) = latest
                && p.start < l.end
            {
                found.push((key.to_string(), l.incarnation, p.incarnation, p.start));
            }
            if latest.is_none_or(|l| p.end > l.end) {
                latest = Some(p);
            }
        }
    }
    found
}

/// Executions of the guarded side effect, by intent, and of the unguarded teardown step: each
/// by its incarnation, at its time (wall-clock microseconds).
#[derive(Debug, Default)]
pub struct Effects {
    /// `(uid, generation)` → incarnations that provisioned it, in order.
    pub provisioned: HashMap<(String, i64), Vec<(u32, u64)>>,
    /// `uid` → incarnations that deprovisioned it, in order.
    pub deprovisioned: HashMap<String, Vec<(u32, u64)>>,
    /// `uid` → incarnations that ran its unguarded teardown step (the last of its deprovision
    /// tree), in order: the runtime runs a deletion's tree to its end once, unless the process
    /// that did stopped, or its replica gave up the item's shard, before the finalizer's
    /// removal.
    pub torn_down: HashMap<String, Vec<(u32, u64)>>,
    /// `uid` → the item's `namespace/name`.
    pub keys: HashMap<String, String>,
}

impl Effects {
    /// The effects recorded in `dir`.
    pub fn read(dir: &Path) -> std::io::Result<Self> {
        let mut e = Effects::default();
        for (at, w) in lines::read(&dir.join("effects"))? {
            if let [tag, inc, uid, generation, intent, rest @ ..] = w.as_slice()
                && tag == "effect"
                && let (Ok(inc), Ok(generation)) = (inc.parse(), generation.parse())
            {
                if let Some(key) = rest.first() {
                    e.keys.insert(uid.clone(), key.clone());
                }
                let run = (inc, at);
                match intent.as_str() {
                    "provision" => e
                        .provisioned
                        .entry((uid.clone(), generation))
                        .or_default()
                        .push(run),
                    "teardown" => e.torn_down.entry(uid.clone()).or_default().push(run),
                    _ => e.deprovisioned.entry(uid.clone()).or_default().push(run),
                }
            }
        }
        Ok(e)
    }

    /// Intents run more than once: `(not explained, explained)`. A repeat is explained when an
    /// incarnation that ran it before was killed (the guard's documented window: the effect
    /// ran, its holder died before recording it done, and the lock expired; for a teardown: its
    /// process died before removing the finalizer), or when the item's shard changed hands
    /// around an earlier run and before this one (`moved(key, from, to)`: the replica that ran
    /// it lost the shard before it recorded the result or removed the finalizer, and its fenced
    /// writes were refused).
    pub fn repeats(
        &self,
        killed: &HashSet<u32>,
        moved: impl Fn(&str, u64, u64) -> bool,
    ) -> (usize, usize) {
        let (mut unexplained, mut explained) = (0, 0);
        let mut count = |runs: &[(u32, u64)], key: Option<&str>| {
            for (i, &(_, at)) in runs.iter().enumerate().skip(1) {
                let by_kill = runs[..i].iter().any(|(before, _)| killed.contains(before));
                let by_move =
                    key.is_some_and(|key| runs[..i].iter().any(|&(_, then)| moved(key, then, at)));
                if by_kill || by_move {
                    explained += 1;
                } else {
                    unexplained += 1;
                }
            }
        };
        let key = |uid: &str| self.keys.get(uid).map(String::as_str);
        for ((uid, _), runs) in &self.provisioned {
            count(runs, key(uid));
        }
        for (uid, runs) in self.deprovisioned.iter().chain(&self.torn_down) {
            count(runs, key(uid));
        }
        (unexplained, explained)
    }
}

/// Lines of `kind` (`panic`, `hang`, `api-500`, …) among the `fault` lines of `file` in `dir`.
pub fn faults(dir: &Path, file: &str) -> std::io::Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    for (_, w) in lines::read(&dir.join(file))? {
        if w.first().map(String::as_str) == Some("fault")
            && let Some(kind) = w.get(1)
        {
            *counts.entry(kind.clone()).or_default() += 1;
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reconcile(key: &str, inc: u32, start: u64, end: u64) -> Reconcile {
        Reconcile {
            key: key.into(),
            incarnation: inc,
            start,
            end,
            cut: false,
        }
    }

    #[test]
    fn overlapping_reconciles_of_one_object_are_found_and_others_are_not() {
        let ps = [
            reconcile("a", 0, 0, 10),
            reconcile("a", 0, 10, 20),
            reconcile("b", 0, 5, 30),
            reconcile("a", 1, 15, 25),
            reconcile("b", 1, 31, 40),
        ];
        assert_eq!(overlaps(&ps), vec![("a".to_string(), 0, 1, 15)]);
    }

    #[test]
    fn a_repeat_is_explained_only_by_a_killed_incarnation_or_a_shard_moved_in_between() {
        let mut e = Effects::default();
        e.provisioned.insert(("u".into(), 1), vec![(0, 1), (1, 2)]);
        e.provisioned.insert(("v".into(), 1), vec![(2, 1), (2, 2)]);
        e.deprovisioned.insert("w".into(), vec![(3, 1)]);
        let never = |_: &str, _: u64, _: u64| false;
        assert_eq!(e.repeats(&HashSet::from([0]), never), (1, 1));
        e.torn_down.insert("w".into(), vec![(3, 10), (3, 20)]);
        e.torn_down.insert("x".into(), vec![(0, 10), (4, 20)]);
        e.torn_down
            .insert("y".into(), vec![(5, 10), (6, 20), (5, 30)]);
        for (uid, key) in [("w", "ns/w"), ("x", "ns/x"), ("y", "ns/y")] {
            e.keys.insert(uid.into(), key.into());
        }
        assert_eq!(e.repeats(&HashSet::from([0]), never), (4, 2));
        // y's shard moved at 15 and 25: both of its repeats are explained, and w's (by the same
        // incarnation, which lost the shard in between); v's shard never moved.
        let moved = |key: &str, from: u64, to: u64| {
            key != "ns/v" && [15, 25].iter().any(|t| from < *t && *t <= to)
        };
        e.provisioned
            .insert(("v".into(), 1), vec![(2, 10), (2, 20)]);
        e.keys.insert("v".into(), "ns/v".into());
        assert_eq!(e.repeats(&HashSet::from([0]), moved), (1, 5));
    }
}
