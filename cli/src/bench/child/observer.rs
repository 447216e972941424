//! The observer: a watch of the objects on the uncounted set-up client that tells the recorder
//! each version it sees (so an object is done when its Ready status is visible in the API).

use super::*;

/// The observer's watch events.
pub(super) type WatchEvents = BoxStream<'static, watcher::Result<watcher::Event<BenchObject>>>;

/// `status`: watches the objects (on the uncounted set-up client) and tells the recorder each
/// version it sees, so an object is done when its Ready status is visible in the API.
pub(super) async fn observe(api: Api<BenchObject>, recorder: Arc<Recorder>) {
    observe_events(observer_watch(api), recorder).await;
}

pub(super) fn observer_watch(api: Api<BenchObject>) -> WatchEvents {
    watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed()
}

/// `chain`: the observer's watch, consumed up to the end of its initial list (every object,
/// none Ready yet).
pub(super) async fn primed_watch(api: Api<BenchObject>) -> Result<WatchEvents> {
    let mut stream = observer_watch(api);
    let listed = async {
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => return true,
                Ok(_) => {}
                Err(err) => tracing::debug!(error = %err, "observer watch error"),
            }
        }
        false
    };
    match tokio::time::timeout(Duration::from_secs(60), listed).await {
        Ok(true) => Ok(stream),
        Ok(false) => bail!("the observer's watch ended before its first list"),
        Err(_) => bail!("the observer's first list took longer than 60 s"),
    }
}

/// Tells the recorder every object version the watch `events` delivers.
pub(super) async fn observe_events(mut events: WatchEvents, recorder: Arc<Recorder>) {
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                recorder.observe(&obj);
            }
            Ok(watcher::Event::Delete(obj)) => recorder.observe_deleted(&obj),
            Ok(_) => {}
            Err(err) => tracing::debug!(error = %err, "observer watch error"),
        }
    }
}
