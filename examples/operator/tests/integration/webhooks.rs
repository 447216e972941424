//! The operator's webhooks on a real etcd + kube-apiserver and on the in-process server, with
//! the same answers: a Cluster naming a Network that does not exist is denied, one naming a
//! Network that does is admitted, and a Network written as v1alpha1 reads as v1 and back.

use actorcile::cluster::ApiServer;
use actorcile::envtest::Envtest;
use example_operator::operator::{Cluster, ClusterSpec, Network, NetworkSpec};
use example_operator::webhooks::{crds, v1alpha1, webhooks};
use kube::api::{Api, PostParams};
use kube::{Client, Resource};

use crate::common::LIMIT;

fn cluster(name: &str, network: &str) -> Cluster {
    Cluster::new(
        name,
        ClusterSpec {
            network: network.into(),
            workers: 1,
            image: "example/node:1.33".into(),
        },
    )
}

/// What a client sees of writes and reads through the webhooks.
async fn transcript(client: &Client) -> Vec<String> {
    fn seen<K: Resource<DynamicType = ()>>(
        result: Result<K, kube::Error>,
        what: impl Fn(&K) -> String,
    ) -> String {
        match result {
            Ok(k) => format!("{} {}", K::version(&()), what(&k)),
            Err(kube::Error::Api(s)) => format!("{} {}", s.code, s.message),
            Err(e) => format!("error {e}"),
        }
    }
    let post = PostParams::default();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), "default");
    let old: Api<v1alpha1::Network> = Api::namespaced(client.clone(), "default");
    let new: Api<Network> = Api::namespaced(client.clone(), "default");
    let network = |c: &Cluster| c.spec.network.clone();
    let alpha = v1alpha1::Network::new(
        "old-net",
        v1alpha1::NetworkSpec {
            subnet: "10.1.0.0/16".into(),
        },
    );
    let v1 = Network::new(
        "new-net",
        NetworkSpec {
            cidr: "10.2.0.0/16".into(),
        },
    );
    vec![
        seen(
            clusters.create(&post, &cluster("lost", "nowhere")).await,
            network,
        ),
        seen(old.create(&post, &alpha).await, |n| n.spec.subnet.clone()),
        seen(new.get("old-net").await, |n| n.spec.cidr.clone()),
        seen(new.create(&post, &v1).await, |n| n.spec.cidr.clone()),
        seen(old.get("new-net").await, |n| n.spec.subnet.clone()),
        seen(
            clusters.create(&post, &cluster("found", "old-net")).await,
            network,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_deny_a_missing_network_and_convert_networks_on_both_servers() {
    tokio::time::timeout(LIMIT * 2, async {
        let env = Envtest::builder().start().await.expect("start envtest");
        let client = env.client();
        let _served = webhooks(client.clone())
            .local()
            .crds(crds())
            .sample(&cluster("barrier", "nowhere"))
            .install(&client)
            .await
            .expect("serve the webhooks");
        let real = transcript(&client).await;
        assert_eq!(
            real,
            [
                "422 admission webhook \"vcluster.example.actorcile.dev\" denied the request: \
                 spec.network: Network \"nowhere\" does not exist in namespace \"default\"",
                "v1alpha1 10.1.0.0/16",
                "v1 10.1.0.0/16",
                "v1 10.2.0.0/16",
                "v1alpha1 10.2.0.0/16",
                "v1 old-net",
            ]
        );

        let server = ApiServer::new();
        for crd in crds() {
            server.install_crd(&crd).expect("install a CRD");
        }
        webhooks(server.client()).install_in(&server);
        assert_eq!(
            transcript(&server.client()).await,
            real,
            "the in-process server answers as the real one"
        );
    })
    .await
    .expect("the webhook test finishes in time");
}
