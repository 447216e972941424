//! The tests of `bench/child.rs`.

use super::*;
use crate::bench::{counting::RequestCounter, workload::bench_crd};
use actorcile::{
    cluster::ApiServer,
    prelude::{Outcome, ResourceStatus},
};

/// `chain` on the in-process cluster without a runtime: objects laid out as chains, the
/// observer primed before any status is written, then Ready written head first, as a
/// runtime would. Every object is done and each link gives one hop sample.
#[tokio::test]
async fn chain_objects_and_primed_observer() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let cluster = ApiServer::new();
        cluster.install_crd(&bench_crd()).unwrap();
        let api: Api<BenchObject> = Api::namespaced(cluster.client(), "default");
        create_objects(&api, 7, Some(3), &ProgressBar::hidden())
            .await
            .unwrap();
        let listed = api.list(&Default::default()).await.unwrap().items;
        let deps: Vec<(String, Option<String>)> = listed
            .iter()
            .map(|o| (o.metadata.name.clone().unwrap(), o.spec.depends_on.clone()))
            .collect();
        let name = |i: u32| object_name(i);
        assert_eq!(
            deps,
            vec![
                (name(0), Some(name(1))),
                (name(1), Some(name(2))),
                (name(2), None),
                (name(3), Some(name(4))),
                (name(4), Some(name(5))),
                (name(5), None),
                (name(6), None),
            ],
            "listed dependents first"
        );

        let events = primed_watch(api.clone()).await.unwrap();
        let config = WorkloadConfig {
            workload: Workload::Chain,
            objects: 7,
            yields: 0,
            yield_interval: Duration::ZERO,
        };
        let recorder = Recorder::start(config, RequestCounter::new());
        let observer = tokio::spawn(observe_events(events, recorder.clone()));
        for i in [2, 5, 6, 1, 4, 0, 3] {
            let status = ResourceStatus::default().after_provision(&Outcome::Done, Some(1));
            api.patch_status(
                &object_name(i),
                &PatchParams::default(),
                &Patch::Merge(status.patch()),
            )
            .await
            .unwrap();
        }
        recorder.wait_done().await;
        observer.abort();
        assert_eq!(recorder.done_count(), 7);
        assert_eq!(
            recorder.latencies().len(),
            4,
            "one hop per link after a head"
        );
    })
    .await
    .expect("bounded");
}

/// The bench objects are created under their own field manager, not actorcile's nor none
/// (which the API server would record as `unknown`, like a runtime that names none).
#[tokio::test]
async fn objects_are_created_by_the_setup_field_manager() {
    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use std::sync::Mutex;
    let queries = Arc::new(Mutex::new(Vec::new()));
    let seen = queries.clone();
    let client = Client::new(
        tower::service_fn(move |req: Request<Body>| {
            let seen = seen.clone();
            async move {
                assert_eq!(req.method(), http::Method::POST);
                seen.lock()
                    .unwrap()
                    .push(req.uri().query().map(str::to_string));
                let body = http_body_util::BodyExt::collect(req.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                let answer = Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Body::from(body.to_vec()))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(answer)
            }
        }),
        "default",
    );
    let api: Api<BenchObject> = Api::namespaced(client, "default");
    tokio::time::timeout(
        Duration::from_secs(30),
        create_objects(&api, 3, None, &ProgressBar::hidden()),
    )
    .await
    .expect("bounded")
    .unwrap();
    let queries = queries.lock().unwrap();
    assert_eq!(queries.len(), 3);
    for query in queries.iter() {
        let query = query.as_deref().unwrap_or_default();
        assert!(
            query.contains("fieldManager=actorcile-bench-setup"),
            "{query}"
        );
    }
    assert_ne!(
        SETUP_FIELD_MANAGER,
        crate::bench::actorcile_rt::FIELD_MANAGER
    );
}
