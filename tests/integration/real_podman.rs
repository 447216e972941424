//! The Docker-API provider on a real Podman service (`podman system service`, installed by
//! `scripts/install-test-deps.sh`), and the `nodes` provisioner driving it from a runtime.
//! Every container a test makes is removed when the test ends, passed or not.
//!
//! Run with `cargo nextest run --release --all-features -E 'binary(real_podman)'`.
#![cfg(feature = "docker")]

use crate::common;
use crate::common::podman;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actorcile::providers::{ClusterPhase, NodeRole, NodeState, Provider, ProviderError};
use actorcile::provisioners::{NodeSet, nodes};
use common::*;
use kube::ResourceExt;
use podman::{Cleanup, Podman, containers_with, listed_with, node};

/// Everything the contract promises, under one label scheme.
async fn contract(podman: &Podman, scheme: &str, cluster_label: &str) {
    let p = podman.provider(scheme);
    let cluster = format!("c-{scheme}-{}", std::process::id());
    let _cleanup = Cleanup(format!("{cluster_label}={cluster}"));
    assert!(matches!(
        p.start_nodes(&cluster).await,
        Err(ProviderError::NoNodes { .. })
    ));
    assert!(matches!(
        p.stop_nodes(&cluster).await,
        Err(ProviderError::NoNodes { .. })
    ));
    assert!(
        p.cluster_status(&cluster).await.unwrap().is_none(),
        "not found, no error"
    );
    for (name, role) in [
        ("cp-0", NodeRole::ControlPlane),
        ("w-0", NodeRole::Worker),
        ("w-1", NodeRole::Worker),
    ] {
        let n = p
            .create_node(&cluster, &node(&format!("{cluster}-{name}"), role))
            .await
            .unwrap();
        assert_eq!(n.state, NodeState::Created);
    }
    // creating again is idempotent
    p.create_node(&cluster, &node(&format!("{cluster}-w-1"), NodeRole::Worker))
        .await
        .unwrap();
    let listed = p.list_nodes(&cluster).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[0].role, NodeRole::ControlPlane);
    assert!(listed[1..].iter().all(|n| n.role == NodeRole::Worker));
    assert_eq!(
        containers_with(&format!("{cluster_label}={cluster}")).len(),
        3,
        "labelled by the scheme"
    );
    assert!(p.list_clusters().await.unwrap().contains(&cluster));
    assert!(p.nodes_exist(&cluster).await.unwrap());

    p.start_nodes(&cluster).await.unwrap();
    let s = p.cluster_status(&cluster).await.unwrap().unwrap();
    assert_eq!(
        (s.phase, s.nodes_ready, s.nodes_total),
        (ClusterPhase::Ready, 3, 3)
    );
    p.stop_node(&listed[2]).await.unwrap();
    assert_eq!(
        p.cluster_status(&cluster).await.unwrap().unwrap().phase,
        ClusterPhase::Degraded
    );
    p.stop_nodes(&cluster).await.unwrap();
    assert_eq!(
        p.cluster_status(&cluster).await.unwrap().unwrap().phase,
        ClusterPhase::Stopped
    );
    p.start_nodes(&cluster).await.unwrap();
    assert!(p.cluster_status(&cluster).await.unwrap().unwrap().ready);
    p.delete_nodes(&cluster).await.unwrap();
    p.delete_nodes(&cluster)
        .await
        .expect("deleting twice is fine");
    assert!(p.cluster_status(&cluster).await.unwrap().is_none());
    assert!(containers_with(&format!("{cluster_label}={cluster}")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_api_provider_keeps_the_contract_on_podman_under_every_label_scheme() {
    let podman = Podman::start();
    contract(&podman, "kind", "io.x-k8s.kind.cluster").await;
    contract(&podman, "k3d", "k3d.cluster").await;
    contract(&podman, "talos", "talos.cluster.name").await;
    assert!(
        podman.provider("talos").is_available().await,
        "podman answers its ping"
    );
    contract(&podman, "actorcile", "actorcile.dev/cluster").await;

    // A scheme sees only its own clusters.
    let kind = podman.provider("kind");
    let k3d = podman.provider("k3d");
    let cluster = format!("only-kind-{}", std::process::id());
    let _cleanup = Cleanup(format!("io.x-k8s.kind.cluster={cluster}"));
    kind.create_node(
        &cluster,
        &node(&format!("{cluster}-cp"), NodeRole::ControlPlane),
    )
    .await
    .unwrap();
    assert!(!k3d.list_clusters().await.unwrap().contains(&cluster));
    kind.delete_nodes(&cluster).await.unwrap();

    assert!(matches!(
        actorcile::providers::docker::DockerProvider::connect(
            podman.socket.to_str().unwrap(),
            "minikube"
        ),
        Err(ProviderError::UnknownLabelScheme { .. })
    ));
}

// Paused time: the provider's bound is a tokio timer, so the silent socket's wait is exactly
// the bound, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn a_socket_with_nothing_or_no_answer_behind_it_is_unavailable_within_the_bound() {
    let dir = std::env::temp_dir().join(format!("actorcile-dead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // No socket file at all.
    let missing = dir.join("missing.sock");
    assert!(matches!(
        actorcile::providers::docker::DockerProvider::connect(missing.to_str().unwrap(), "kind"),
        Err(ProviderError::ProviderUnavailable { .. })
    ));
    // A socket nobody listens on any more: refused.
    let refused = dir.join("refused.sock");
    drop(std::os::unix::net::UnixListener::bind(&refused).unwrap());
    let p =
        actorcile::providers::docker::DockerProvider::connect(refused.to_str().unwrap(), "kind")
            .unwrap()
            .with_timeout(Duration::from_secs(2));
    let t = tokio::time::Instant::now();
    assert!(matches!(
        p.list_clusters().await,
        Err(ProviderError::ProviderUnavailable { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(!p.is_available().await);
    // A nodes step says so before it calls anything.
    let step = nodes(Arc::new(p), |_: &k8s_openapi::api::core::v1::ConfigMap| {
        NodeSet::new(
            "c",
            1,
            1,
            actorcile::providers::NodeSpec::new("", NodeRole::Worker, "busybox"),
        )
    });
    let cx = actorcile::provisioners::Context::new(
        Arc::new(k8s_openapi::api::core::v1::ConfigMap::default()),
        actorcile::cluster::ApiServer::new().client(),
    );
    let outcome = actorcile::provisioners::Provisioner::provision(&step, &cx).await;
    assert_eq!(
        outcome.reason().map(|r| r.code()),
        Some("ProviderUnavailable"),
        "{outcome:?}"
    );
    // A socket that accepts and never answers: the timeout bounds it.
    let silent = dir.join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let p = actorcile::providers::docker::DockerProvider::connect(silent.to_str().unwrap(), "kind")
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    let t = tokio::time::Instant::now();
    let e = p.list_nodes("c").await.unwrap_err();
    assert!(
        matches!(e, ProviderError::ProviderUnavailable { .. }),
        "{e}"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "unavailable after the 2 s bound: {took:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_objects_with_three_nodes_each_converge_on_podman_and_leave_nothing_behind() {
    let podman = Podman::start();
    let run = std::process::id();
    let _cleanup = Cleanup(format!("actorcile.dev/test-run={run}"));
    let provider: Arc<dyn Provider> = Arc::new(podman.provider("actorcile"));
    let tree = nodes(provider, move |w: &Widget| {
        let mut template = node("", NodeRole::Worker);
        template
            .labels
            .insert("actorcile.dev/test-run".into(), run.to_string());
        NodeSet::new(format!("{}-{run}", w.name_any()), 1, 2, template)
    });
    let (_cluster, client) = cluster();
    let mut policy = test_policy();
    policy.kind.yield_delay = Duration::from_millis(200);
    let rt = start_widgets(&client, policy, tree).await;
    let t = Instant::now();
    for i in 0..20 {
        create(&client, &format!("w{i}"), 1).await;
    }
    wait_all_ready(&client, 20, Duration::from_secs(180)).await;
    let ready = t.elapsed();
    let all = containers_with(&format!("actorcile.dev/test-run={run}"));
    assert_eq!(all.len(), 60, "3 containers per object");
    for i in 0..20 {
        let mine: Vec<_> = all
            .iter()
            .filter(|n| n.starts_with(&format!("w{i}-{run}-")))
            .collect();
        assert_eq!(mine.len(), 3, "w{i}: {mine:?}");
    }
    let p = podman.provider("actorcile");
    let s = p
        .cluster_status(&format!("w0-{run}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.phase, s.nodes_total), (ClusterPhase::Ready, 3));

    let t = Instant::now();
    for i in 0..20 {
        delete(&client, &format!("w{i}")).await;
    }
    for i in 0..20 {
        wait_gone(&client, &format!("w{i}"), Duration::from_secs(180)).await;
    }
    let deleted = t.elapsed();
    assert!(
        containers_with(&format!("actorcile.dev/test-run={run}")).is_empty(),
        "deletion leaves no container behind"
    );
    eprintln!(
        "20 objects × 3 nodes on Podman: Ready in {:.1} s, fully deleted in {:.1} s",
        ready.as_secs_f64(),
        deleted.as_secs_f64()
    );
    rt.shutdown().await;
}

/// A node's networks, volumes and ports: created with the cluster's labels, the API port the
/// cluster's endpoint, and removed with the cluster's last node, never before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networks_volumes_and_ports_come_with_the_cluster_and_go_with_its_last_node() {
    use actorcile::providers::{PortMapping, VolumeMount};
    let podman = Podman::start();
    let p = podman.provider("kind");
    let cluster = format!("net-{}", std::process::id());
    let label = format!("io.x-k8s.kind.cluster={cluster}");
    let _cleanup = Cleanup(label.clone());
    let (network, volume) = (format!("{cluster}-net"), format!("{cluster}-data"));
    let on_network = |name: &str, role| {
        let mut n = node(&format!("{cluster}-{name}"), role);
        n.network_mode = None;
        n.networks = vec![network.clone()];
        n.volumes = vec![VolumeMount::new(&volume, "/data")];
        n
    };
    let mut cp = on_network("cp", NodeRole::ControlPlane);
    cp.ports = vec![PortMapping::tcp(6443)];
    let worker = on_network("w", NodeRole::Worker);
    p.create_node(&cluster, &cp).await.unwrap();
    p.create_node(&cluster, &worker).await.unwrap();
    assert_eq!(
        listed_with("network", &label),
        std::slice::from_ref(&network)
    );
    assert_eq!(listed_with("volume", &label), std::slice::from_ref(&volume));

    p.start_nodes(&cluster).await.unwrap();
    let status = p.cluster_status(&cluster).await.unwrap().unwrap();
    assert_eq!(status.phase, ClusterPhase::Ready);
    let endpoint = status.endpoint.expect("the API port is published");
    let port: u16 = endpoint
        .strip_prefix("https://127.0.0.1:")
        .unwrap_or_else(|| panic!("published on loopback: {endpoint}"))
        .parse()
        .expect("a port");
    assert_ne!(port, 0);
    // Running already: the bulk start skips every node, the single start is a no-op.
    p.start_nodes(&cluster).await.unwrap();
    let nodes = p.list_nodes(&cluster).await.unwrap();
    p.start_node(&nodes[0]).await.unwrap();

    // The worker goes: the cluster still has a node, its network and volume stay.
    let w = nodes.iter().find(|n| n.role == NodeRole::Worker).unwrap();
    p.delete_node(w).await.unwrap();
    assert_eq!(listed_with("network", &label), [network]);
    assert_eq!(listed_with("volume", &label), [volume]);
    p.delete_nodes(&cluster).await.unwrap();
    assert!(listed_with("network", &label).is_empty());
    assert!(listed_with("volume", &label).is_empty());
    assert!(p.cluster_status(&cluster).await.unwrap().is_none());
}
