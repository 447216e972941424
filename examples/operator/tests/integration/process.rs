//! The example operator as a separate OS process on a real etcd + kube-apiserver
//! (`actorcile::envtest`), confined to one namespace as a user that holds only the roles it
//! renders (Roles there, and its CRDs by name): it installs its CRDs, its probes answer, `/metrics` parses as
//! OpenMetrics text and its counters match what happened, Events tell the story of a deletion
//! blocked by a reference, SIGTERM exits 0 with nothing left half-done, and an admin address
//! that cannot be bound fails start-up.
//!
//! One control plane for the whole binary: the cases run in order in one test.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use actorcile::envtest::Envtest;
use actorcile::status::ResourceStatus;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;

use crate::common::*;

/// The replicas' lease duration: a failover after `kill -9` takes at most two, a takeover
/// after a graceful release (no expiry to wait for) less than one.
const LEASE: Duration = Duration::from_secs(4);

/// The operator confined to namespace `default`, as envtest's non-admin user (which
/// [`grant_roles`] gave the operator's roles), with the RBAC preflight on.
fn spawn(kubeconfig: &Path, port: u16) -> Operator {
    let args = [
        "--install-crds",
        "--namespace",
        "default",
        "--preflight-rbac",
        "--log-format",
        "json",
        "--log",
        "info",
    ];
    spawn_with(kubeconfig, port, &args)
}

/// Grant envtest's user the roles the operator renders for what [`spawn`] runs: Roles in
/// `default`, and cluster-wide only the CRDs it installs (by name).
async fn grant_roles(env: &Envtest) {
    use actorcile::runtime::Runtime;
    use example_operator::operator::{self, Cluster, Network};
    use kube::CustomResourceExt;
    let admin = env.client();
    let provider = std::sync::Arc::new(actorcile::providers::simulated::SimulatedProvider::new(
        0,
        Default::default(),
    ));
    let builder = operator::register(
        Runtime::builder(admin.clone(), operator::names())
            .namespace("default")
            .install_crds([Network::crd(), Cluster::crd()]),
        provider,
        &[operator::DEFAULT_IMAGE_PREFIX.into()],
    );
    let roles = builder.roles(operator::NAME);
    let cluster_wide: Vec<String> = roles
        .cluster_role
        .iter()
        .flat_map(|c| c.rules.iter().flatten())
        .flat_map(|r| r.resources.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        cluster_wide,
        ["customresourcedefinitions"],
        "cluster-wide: only the CRDs it installs"
    );
    let user = k8s_openapi::api::rbac::v1::Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: env.user_name().into(),
        namespace: None,
    };
    roles
        .apply(&admin, user, "process-test")
        .await
        .expect("apply the operator's roles");
    let checker = kube::Client::try_from(env.user_config()).unwrap();
    let rules = roles.rules();
    eventually("the operator's roles in force", || async {
        let missing = actorcile::rbac::missing_scoped_permissions(&checker, &rules)
            .await
            .ok()?;
        missing.is_empty().then_some(())
    })
    .await;
}

/// The samples of an OpenMetrics text, as `name{labels}` → value; panics on a line that is not
/// a comment, a sample or the closing `# EOF`.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    assert!(text.trim_end().ends_with("# EOF"), "no # EOF:\n{text}");
    let mut samples = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        samples.insert(series.to_string(), value);
    }
    samples
}

async fn events_with(client: &kube::Client, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The rendered Deployment's Pod is admitted (server-side dry run) in a namespace that enforces
/// Pod Security `restricted`, where the same Pod without its security settings is refused.
async fn manifests_are_admitted_by_pod_security_restricted(client: &kube::Client) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    let ns = "restricted";
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.into());
    namespace.metadata.labels = Some(
        [(
            "pod-security.kubernetes.io/enforce".to_string(),
            "restricted".to_string(),
        )]
        .into(),
    );
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the restricted namespace");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_example-operator"))
        .args(["manifests", "--namespace", ns])
        .output()
        .expect("run example-operator manifests");
    assert!(out.status.success(), "{out:?}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    let deployment: Deployment = yaml
        .split("\n---\n")
        .find(|d| d.contains("kind: Deployment"))
        .map(|d| serde_saphyr::from_str(d).expect("the Deployment parses"))
        .expect("a Deployment among the manifests");
    // The NetworkPolicy is one the API server admits.
    let policy: k8s_openapi::api::networking::v1::NetworkPolicy = yaml
        .split("\n---\n")
        .find(|d| d.contains("kind: NetworkPolicy"))
        .map(|d| serde_saphyr::from_str(d).expect("the NetworkPolicy parses"))
        .expect("a NetworkPolicy among the manifests");
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), ns)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &policy,
        )
        .await
        .expect("the NetworkPolicy is admitted");
    let template = deployment.spec.expect("spec").template;
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("operator".into()),
            namespace: Some(ns.into()),
            labels: template.metadata.and_then(|m| m.labels),
            ..Default::default()
        },
        spec: template.spec,
        ..Default::default()
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    if let Err(e) = pods.create(&dry_run, &pod).await {
        panic!("Pod Security restricted refused the operator's Pod: {e}");
    }
    // The namespace does enforce: the same Pod without its security settings is refused.
    let mut bare = pod.clone();
    let spec = bare.spec.as_mut().unwrap();
    spec.security_context = None;
    spec.containers[0].security_context = None;
    match pods.create(&dry_run, &bare).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(s.message.contains("restricted"), "{s:?}");
        }
        other => panic!("a Pod without security settings was not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_process_on_a_real_apiserver() {
    tokio::time::timeout(Duration::from_secs(240), run())
        .await
        .expect("the test took over 240 s");
}

async fn run() {
    let env = Envtest::builder().start().await.expect("start envtest");
    let client = env.client();
    manifests_are_admitted_by_pod_security_restricted(&client).await;
    let port = free_port();
    grant_roles(&env).await;
    let mut op = spawn(env.user_kubeconfig_path(), port);

    // Probes: live while starting, ready once the CRDs are installed and both kinds listed.
    eventually("/healthz to answer 200", || async {
        get(port, "/healthz").await.filter(|(s, _)| *s == 200)
    })
    .await;
    eventually("/readyz to answer 200", || async {
        get(port, "/readyz").await.filter(|(s, _)| *s == 200)
    })
    .await;

    // Two networks, three clusters on net-a, one on net-b.
    let (networks, clusters) = (api(&client, "Network"), api(&client, "Cluster"));
    let pp = PostParams::default();
    for (name, cidr) in [("net-a", "10.1.0.0/16"), ("net-b", "10.2.0.0/16")] {
        let o = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Network",
            "metadata": {"name": name}, "spec": {"cidr": cidr}});
        networks
            .create(&pp, &serde_json::from_value(o).unwrap())
            .await
            .unwrap();
    }
    for (name, net) in [
        ("c1", "net-a"),
        ("c2", "net-a"),
        ("c3", "net-a"),
        ("c4", "net-b"),
    ] {
        let o = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Cluster",
            "metadata": {"name": name}, "spec": {"network": net, "workers": 2}});
        clusters
            .create(&pp, &serde_json::from_value(o).unwrap())
            .await
            .unwrap();
    }
    // An invalid network: Terminal, with its reason.
    let bad = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Network",
        "metadata": {"name": "net-bad"}, "spec": {"cidr": "banana"}});
    networks
        .create(&pp, &serde_json::from_value(bad).unwrap())
        .await
        .unwrap();

    eventually("every valid object Ready", || async {
        let n = networks.list(&ListParams::default()).await.ok()?;
        let c = clusters.list(&ListParams::default()).await.ok()?;
        let ok = n.items.iter().filter(|o| ready(o)).count() == 2
            && c.items.iter().filter(|o| ready(o)).count() == 4;
        ok.then_some(())
    })
    .await;
    // Each cluster's tree wrote where it is reached into its status.
    for c in clusters.list(&ListParams::default()).await.unwrap().items {
        let endpoint = c.data["status"]["endpoint"].as_str().unwrap_or_default();
        assert!(
            !endpoint.is_empty(),
            "{} has no status.endpoint: {:?}",
            c.name_any(),
            c.data["status"]
        );
    }
    eventually("net-bad Terminal with InvalidCIDR", || async {
        let o = networks.get("net-bad").await.ok()?;
        let s = ResourceStatus::of(&o);
        (s.ready()?.reason == "InvalidCIDR").then_some(())
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["net-a-network", "c1-cluster", "c4-cluster"] {
        cms.get(name)
            .await
            .unwrap_or_else(|e| panic!("ConfigMap {name}: {e}"));
    }
    // A ConfigMap deleted by hand: its owner watches it (`owns`) and puts it back, with no
    // poll configured.
    let before = cms.get("c1-cluster").await.unwrap().metadata.uid;
    cms.delete("c1-cluster", &Default::default()).await.unwrap();
    eventually("c1's ConfigMap back", || async {
        let again = cms.get_opt("c1-cluster").await.ok()??;
        (again.metadata.uid != before).then_some(())
    })
    .await;

    // Metrics: OpenMetrics text whose counters match what happened.
    let (status, text) = get(port, "/metrics").await.expect("/metrics answers");
    assert_eq!(status, 200);
    let m = parse_metrics(&text);
    let v = |k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("{k} missing:\n{text}"))
    };
    assert_eq!(v(r#"actorcile_objects{controller="Network"}"#), 3.0);
    assert_eq!(v(r#"actorcile_objects{controller="Cluster"}"#), 4.0);
    assert!(v(r#"actorcile_reconciles_total{controller="Cluster",result="done"}"#) >= 4.0);
    assert!(v(r#"actorcile_reconciles_total{controller="Network",result="done"}"#) >= 2.0);
    assert!(v(r#"actorcile_reconciles_total{controller="Network",result="terminal"}"#) >= 1.0);
    // Each Ready object's status was written at least once (7 objects with a status).
    assert!(v("actorcile_status_writes_total") >= 7.0);
    assert!(
        v(r#"actorcile_events_total{controller="Cluster"}"#) >= 4.0,
        "a Provisioned Event per cluster"
    );
    assert!(v(r#"actorcile_reconcile_duration_seconds_count{controller="Cluster"}"#) >= 4.0);
    assert!(v(r#"actorcile_api_requests_total{verb="patch",code="200"}"#) >= 7.0);
    assert!(v(r#"actorcile_api_requests_total{verb="watch",code="200"}"#) >= 2.0);
    assert_eq!(v("actorcile_restarts_total"), 0.0);
    let provisioned = events_with(&client, "Provisioned").await;
    assert!(
        provisioned.len() >= 6,
        "Provisioned Events: {}",
        provisioned.len()
    );

    // c3 moves from net-a to net-b: its reference moves too, net-a's is released.
    clusters
        .patch(
            "c3",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"network": "net-b"}})),
        )
        .await
        .unwrap();
    let referrers = |net: &'static str| {
        let networks = networks.clone();
        async move {
            let n = networks.get(net).await.ok()?;
            let names: Vec<String> =
                actorcile::references::referrers_of(&n, &example_operator::operator::names())
                    .into_iter()
                    .map(|t| t.name)
                    .collect();
            Some(names)
        }
    };
    eventually("c3's reference moved to net-b", || async {
        let (a, b) = (referrers("net-a").await?, referrers("net-b").await?);
        (!a.contains(&"c3".to_string()) && b.contains(&"c3".to_string())).then_some(())
    })
    .await;

    // Deleting net-a while its clusters use it: InUse, then Released once they are gone.
    networks
        .delete("net-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually("an InUse Event for net-a", || async {
        let e = events_with(&client, "InUse").await;
        e.iter()
            .any(|e| e.involved_object.name.as_deref() == Some("net-a"))
            .then_some(())
    })
    .await;
    assert!(
        networks.get("net-a").await.is_ok(),
        "net-a is held while in use"
    );
    for c in ["c1", "c2", "c3"] {
        clusters.delete(c, &DeleteParams::default()).await.unwrap();
    }
    eventually("net-a and its clusters gone", || async {
        let gone = networks.get_opt("net-a").await.ok()?.is_none()
            && clusters
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len()
                == 1;
        gone.then_some(())
    })
    .await;
    let released = events_with(&client, "Released").await;
    assert!(released.len() >= 4, "Released Events: {}", released.len());

    // SIGTERM while clusters are provisioning: exit 0, and nothing half-done (every object
    // still has its finalizer, and a Ready cluster has its connection ConfigMap).
    for i in 0..5 {
        let o = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Cluster",
            "metadata": {"name": format!("late-{i}")}, "spec": {"network": "net-b", "workers": 3}});
        clusters
            .create(&pp, &serde_json::from_value(o).unwrap())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    unsafe { libc::kill(op.0.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(45);
    let code = loop {
        if let Some(status) = op.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 45 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(code.success(), "SIGTERM exit: {code:?}");
    for o in clusters.list(&ListParams::default()).await.unwrap().items {
        let name = o.metadata.name.clone().unwrap();
        let has_finalizer = o
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f.starts_with("example.actorcile.dev/"));
        let has_status = o.data.get("status").is_some_and(|s| !s.is_null());
        assert!(
            !has_status || has_finalizer,
            "{name} has a status but no finalizer"
        );
        if ready(&o) {
            cms.get(&format!("{name}-cluster"))
                .await
                .unwrap_or_else(|e| panic!("{name} Ready without its ConfigMap: {e}"));
        }
    }

    // A restarted operator finishes what the stopped one left, from what is persisted.
    let op = spawn(env.user_kubeconfig_path(), port);
    eventually("the restarted operator's /healthz", || async {
        get(port, "/healthz").await.filter(|(s, _)| *s == 200)
    })
    .await;
    eventually("every cluster Ready after the restart", || async {
        let c = clusters.list(&ListParams::default()).await.ok()?;
        (c.items.len() == 6 && c.items.iter().all(ready)).then_some(())
    })
    .await;

    // A second operator on the same admin address: a start-up error, not a silent skip.
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_example-operator"))
        .args(["run", "--admin-addr", &format!("127.0.0.1:{port}")])
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(LIMIT, second)
        .await
        .expect("a second operator on a taken admin address exits")
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("admin server cannot listen"), "{stderr}");

    let status = terminate(op).await;
    assert!(status.success(), "{status:?}");

    leader_election(&env, &clusters).await;
}

fn spawn_elected(
    kubeconfig: &Path,
    port: u16,
    identity: &str,
    policy: &Path,
    cold: bool,
) -> Operator {
    let policy = policy.to_str().expect("a UTF-8 temp path");
    let mut args = vec!["--leader-elect", "--leader-elect-namespace", "default"];
    args.extend(["--identity", identity, "--policy", policy]);
    if cold {
        args.push("--cold-standby");
    }
    spawn_with(kubeconfig, port, &args)
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let lease = leases
        .get_opt(&example_operator::operator::names().leader_lease())
        .await
        .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Create Cluster `name` on network `net`, and wait until it is Ready.
async fn cluster_ready(clusters: &Api<DynamicObject>, name: &str, net: &str, workers: usize) {
    let o = json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Cluster",
        "metadata": {"name": name}, "spec": {"network": net, "workers": workers}});
    let o: DynamicObject = serde_json::from_value(o).unwrap();
    clusters.create(&PostParams::default(), &o).await.unwrap();
    eventually(&format!("{name} Ready"), || async {
        clusters.get(name).await.ok().filter(ready)
    })
    .await;
}

/// Wait until `identity` holds the leader Lease.
async fn wait_holder(client: &kube::Client, identity: &str) {
    eventually(&format!("{identity} leads"), || async {
        (holder(client).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
}

/// Two replicas with leader election (4 s leases): only the leader runs; `kill -9` of the
/// leader hands over within 2 × the lease duration; a graceful stop releases the Lease, and a
/// new candidate takes it at once.
async fn leader_election(env: &Envtest, clusters: &Api<DynamicObject>) {
    let client = env.client();
    let dir = std::env::temp_dir().join(format!("example-operator-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "lease_duration = \"{}s\"\nlease_renew_deadline = \"3s\"\nlease_retry_period = \"200ms\"\n",
            LEASE.as_secs()
        ),
    )
    .unwrap();
    let (port_a, port_b, port_c) = (free_port(), free_port(), free_port());
    let mut a = spawn_elected(env.kubeconfig_path(), port_a, "replica-a", &policy, false);
    wait_holder(&client, "replica-a").await;
    let b = spawn_elected(env.kubeconfig_path(), port_b, "replica-b", &policy, false);
    let (_, body) = eventually("replica-b ready, standing by", || async {
        get(port_b, "/readyz").await.filter(|(s, _)| *s == 200)
    })
    .await;
    assert!(body.contains("standby"), "{body}");
    cluster_ready(clusters, "elected-1", "net-b", 1).await;
    // Only the leader runs. The warm standby (the default) watches and caches every cluster
    // but has run no reconcile.
    let text_b = eventually("the warm standby's cache has every cluster", || async {
        let (_, text) = get(port_b, "/metrics").await?;
        let cached = sample(&text, r#"actorcile_objects{controller="Cluster"}"#)?;
        (cached == 7.0).then_some(text)
    })
    .await;
    assert_eq!(sample(&text_b, "actorcile_leader"), Some(0.0), "{text_b}");
    let runs: f64 = text_b
        .lines()
        .filter(|l| l.starts_with("actorcile_reconciles_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(runs, 0.0, "the standby ran reconciles:\n{text_b}");
    let (_, text_a) = get(port_a, "/metrics").await.unwrap();
    assert_eq!(sample(&text_a, "actorcile_leader"), Some(1.0), "{text_a}");

    // kill -9 the leader: the standby takes over within 2 × the lease duration.
    unsafe { libc::kill(a.0.id() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let _ = a.0.wait();
    wait_holder(&client, "replica-b").await;
    let failover = killed.elapsed();
    assert!(failover < 2 * LEASE, "failover took {failover:?}");
    eprintln!("leader failover after kill -9: {failover:?}");
    cluster_ready(clusters, "elected-2", "net-b", 1).await;

    // A graceful stop releases the Lease: a new candidate takes it at once, not after expiry.
    // This one stands by cold: no controller until it leads.
    let c = spawn_elected(env.kubeconfig_path(), port_c, "replica-c", &policy, true);
    eventually("replica-c standing by", || async {
        get(port_c, "/readyz").await.filter(|(s, _)| *s == 200)
    })
    .await;
    let (_, text_c) = get(port_c, "/metrics").await.unwrap();
    assert!(
        !text_c.contains("actorcile_objects{"),
        "a cold standby watches nothing:\n{text_c}"
    );
    let stopped = Instant::now();
    let status = terminate(b).await;
    assert!(status.success(), "{status:?}");
    wait_holder(&client, "replica-c").await;
    let takeover = stopped.elapsed();
    assert!(
        takeover < LEASE,
        "takeover after a release took {takeover:?}"
    );
    eprintln!("takeover after a graceful stop: {takeover:?}");
    cluster_ready(clusters, "elected-3", "net-b", 1).await;
    let status = terminate(c).await;
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
