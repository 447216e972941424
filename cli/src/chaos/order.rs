//! Deletion order as the API reports it: a watch of the items, in resourceVersion order, and at
//! every item's disappearance a look at whether an item using it still exists.
//!
//! A watch broken by a restart of kube-apiserver or etcd relists: the list is a consistent
//! snapshot, so an item missing from it while an item that uses it is in it is a violation too.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

use super::operator::ChaosItem;

/// The running watch.
pub struct Watch {
    violations: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// The items that exist (name → the item it uses), as the watch last reported.
#[derive(Default)]
struct Known(HashMap<String, Option<String>>);

impl Known {
    /// `gone` disappeared: how many items that use it are still there.
    fn users_left(&self, gone: &str) -> usize {
        self.0
            .iter()
            .filter(|(name, uses)| uses.as_deref() == Some(gone) && name.as_str() != gone)
            .count()
    }
}

impl Watch {
    /// Starts watching `items`.
    pub fn start(items: Api<ChaosItem>) -> Self {
        let violations = Arc::new(AtomicUsize::new(0));
        let counter = violations.clone();
        let task = tokio::spawn(async move {
            let mut known = Known::default();
            let mut relist: Option<Known> = None;
            let mut events = watcher(items, watcher::Config::default())
                .default_backoff()
                .boxed();
            let report = |gone: &str, known: &Known| {
                let left = known.users_left(gone);
                if left > 0 {
                    eprintln!("chaos: {gone} is gone while {left} item(s) using it exist");
                    counter.fetch_add(left, Ordering::Relaxed);
                }
            };
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(i)) => {
                        known.0.insert(i.name_any(), i.spec.uses.clone());
                    }
                    Ok(watcher::Event::Delete(i)) => {
                        let name = i.name_any();
                        known.0.remove(&name);
                        report(&name, &known);
                    }
                    Ok(watcher::Event::Init) => relist = Some(Known::default()),
                    Ok(watcher::Event::InitApply(i)) => {
                        if let Some(r) = relist.as_mut() {
                            r.0.insert(i.name_any(), i.spec.uses.clone());
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(new) = relist.take() {
                            let gone: HashSet<String> = known
                                .0
                                .keys()
                                .filter(|n| !new.0.contains_key(*n))
                                .cloned()
                                .collect();
                            known = new;
                            for name in gone {
                                report(&name, &known);
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "the order watch: retrying"),
                }
            }
        });
        Self { violations, task }
    }

    /// Stops the watch: the violations it saw.
    pub async fn stop(self) -> usize {
        self.task.abort();
        let _ = self.task.await;
        self.violations.load(Ordering::Relaxed)
    }
}
