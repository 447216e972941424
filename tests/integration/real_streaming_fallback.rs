//! Streaming lists refused: a real kube-apiserver started without the WatchList feature answers
//! a watch with `sendInitialEvents=true` with `422`, and the runtime lists and watches instead,
//! from then on, and converges.
//!
//! Run with `cargo test --release --features envtest --test integration real_streaming_fallback::`.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::real::*;

use actorcile::envtest::Envtest;
use actorcile::prelude::*;
use common::Widget;

#[tokio::test]
async fn a_server_that_refuses_streaming_lists_is_listed_and_watched_instead() {
    bounded("streaming list fallback", async {
        let env = Envtest::builder()
            .crds(sample_crds())
            .feature_gates("WatchList=false")
            .start()
            .await
            .expect("start etcd + kube-apiserver without WatchList");
        let requests = common::Requests::default();
        let client = requests.client(
            kube::client::ClientBuilder::try_from(env.config()).expect("a client for envtest"),
        );
        let api = Ns::create(env.client(), "no-watchlist").await;
        let tree = step("done", |_cx: Context<Widget>| async { Outcome::Done });
        let rt = Runtime::builder(client, common::names())
            .policy(real_policy())
            .controller(Controller::<Widget>::new(tree).namespace(&api.ns))
            .start()
            .await
            .expect("start the runtime");
        api.create_widget("w", 1).await;
        api.wait_ready("w").await;
        let widgets = requests.matching("/widgets?");
        assert!(
            widgets.iter().any(|r| r.contains("sendInitialEvents=true")),
            "a streaming list was asked for first: {widgets:#?}"
        );
        let plain_lists = widgets
            .iter()
            .filter(|r| !r.contains("watch=") && !r.contains("sendInitialEvents"))
            .count();
        assert!(
            plain_lists >= 1,
            "then a plain list, the fallback: {widgets:#?}"
        );
        // Converged through the fallback: a change made now is seen by the plain watch.
        api.patch_spec("w", serde_json::json!({ "size": 2 })).await;
        api.wait_ready_at("w", 2).await;
        rt.shutdown().await;
        env.stop().await;
    })
    .await;
}
