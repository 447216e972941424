//! The deploy kit, checked by the tools its users run: the Helm chart (`chart/`) lints and
//! renders with Helm, its generated parts (RBAC, CRDs, dashboard) are the code's, it installs
//! on a real kube-apiserver under Pod Security `restricted`, and the image of the Containerfile
//! runs the operator as the chart's ServiceAccount, with the Deployment's arguments, until it
//! converges objects and its probes answer. The scrape of that run is then what the alert rules'
//! unit tests (`promtool test rules`) and the dashboard's check read.
//!
//! Helm and promtool come from `~/.cache/actorcile/tools/` (scripts/install-test-deps.sh builds
//! them from Go modules); the image's base is assembled here from the host's C library (no image
//! can be pulled).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use actorcile::envtest::Envtest;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use serde_json::{Value, json};

use crate::common::*;

use example_operator::manifests::{self, Leases};

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("chart")
}

/// A tool of the deploy kit from the cache; panics, saying what to run, when it is missing.
fn tool(name: &str) -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cache =
        std::env::var("ACTORCILE_CACHE_DIR").unwrap_or_else(|_| format!("{home}/.cache/actorcile"));
    let path = Path::new(&cache).join("tools").join(name).join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-test-deps.sh",
        path.display()
    );
    path
}

/// Run `program args`, fail the test with its output unless it succeeds; its stdout.
fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{text}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `helm template` of the chart with `values` (`key=value`), as JSON documents.
fn template(namespace: &str, values: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec!["template", "ex", chart.to_str().unwrap(), "-n", namespace];
    for v in values {
        args.extend(["--set", v]);
    }
    let text = run(&tool("helm"), &args);
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn kind_of(d: &Value) -> &str {
    d["kind"].as_str().unwrap_or_default()
}

/// The RBAC objects among `docs`, keyed by kind, namespace and name, without the labels Helm's
/// templates add (the runtime renders none).
fn rbac(docs: &[Value]) -> BTreeMap<(String, String, String), Value> {
    docs.iter()
        .filter(|d| {
            ["ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"].contains(&kind_of(d))
        })
        .map(|d| {
            let key = (
                kind_of(d).to_string(),
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            (key, d.clone())
        })
        .collect()
}

/// The operator container of the chart's Deployment among `docs`.
fn container(docs: &[Value]) -> Value {
    let deployment = docs
        .iter()
        .find(|d| kind_of(d) == "Deployment")
        .expect("a Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0].clone()
}

/// What `run` makes of the Deployment's arguments: the Leases it takes and the namespace it
/// watches, as the runtime's flags parse them.
fn leases_and_watch(args: &[String]) -> (Leases, Option<String>) {
    use clap::Parser;
    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        runtime: actorcile::cli::RuntimeArgs,
    }
    assert_eq!(args[0], "run");
    let parsed =
        Run::try_parse_from(std::iter::once("run".to_string()).chain(args[1..].iter().cloned()))
            .unwrap_or_else(|e| panic!("the Deployment's arguments {args:?}: {e}"))
            .runtime;
    let leases = if parsed.shards.is_some() {
        Leases::Sharding
    } else if parsed.leader_elect {
        Leases::LeaderElection
    } else {
        Leases::None
    };
    (leases, parsed.namespace)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The chart's generated files are what the code generates now, it passes `helm lint --strict`
/// with every part on, and for each way it runs the operator its RBAC is exactly the roles the
/// runtime renders for the Deployment's arguments.
#[test]
fn the_chart_is_the_code_s_and_its_rbac_is_the_runtime_s() {
    let chart = chart_dir();
    let read = |p: &str| std::fs::read_to_string(chart.join(p)).unwrap();
    let regenerate = "regenerate with `cargo run -p example-operator -- chart-rbac > examples/operator/chart/templates/rbac.yaml` (chart-dashboard > chart/files/dashboard.json, crds > chart/crds/crds.yaml)";
    assert!(
        read("templates/rbac.yaml") == manifests::chart_rbac().unwrap(),
        "templates/rbac.yaml is stale: {regenerate}"
    );
    assert!(
        read("files/dashboard.json") == example_operator::dashboard::to_json(),
        "files/dashboard.json is stale: {regenerate}"
    );
    {
        use example_operator::operator::{Cluster, Network};
        use kube::CustomResourceExt;
        let crds = actorcile::crds::to_yaml(&[Network::crd(), Cluster::crd()]).unwrap();
        assert!(
            read("crds/crds.yaml") == crds,
            "crds/crds.yaml is stale: {regenerate}"
        );
    }
    let helm = tool("helm");
    run(&helm, &["lint", "--strict", chart.to_str().unwrap()]);
    run(
        &helm,
        &[
            "lint",
            "--strict",
            chart.to_str().unwrap(),
            "--set",
            "serviceMonitor.enabled=true,prometheusRule.enabled=true,dashboard.enabled=true,sharding.shards=4,watchNamespace=tenants",
        ],
    );
    let cases: [&[&str]; 7] = [
        &[],
        &["watchNamespace=ops"],
        &["watchNamespace=tenants"],
        &["sharding.shards=4"],
        &["sharding.shards=4", "watchNamespace=tenants"],
        &["leaderElection.enabled=false", "replicas=1"],
        &[
            "leaderElection.enabled=false",
            "replicas=1",
            "watchNamespace=ops",
        ],
    ];
    let mut seen = BTreeSet::new();
    for values in cases {
        let docs = template("ops", values);
        let args = strings(&container(&docs)["args"]);
        let (leases, watch) = leases_and_watch(&args);
        seen.insert(format!("{leases:?}"));
        let roles = manifests::roles(leases, watch.as_deref(), "ops");
        let bindings = roles.bindings(actorcile::rbac::service_account("ops", "example-operator"));
        let rendered = format!(
            "{}---\n{}",
            roles.to_yaml().unwrap(),
            bindings.to_yaml().unwrap()
        );
        let runtime: Vec<Value> = serde_saphyr::from_multiple(&rendered).unwrap();
        let mut chart_rbac = rbac(&docs);
        for objects in chart_rbac.values_mut() {
            if let Some(m) = objects["metadata"].as_object_mut() {
                m.remove("labels");
            }
        }
        assert_eq!(
            chart_rbac,
            rbac(&runtime),
            "values {values:?}, arguments {args:?}: the chart's RBAC is not the runtime's"
        );
        // The PodDisruptionBudget only where it can be honoured.
        let replicas: u32 = values
            .iter()
            .find_map(|v| v.strip_prefix("replicas=")?.parse().ok())
            .unwrap_or(2);
        assert_eq!(
            docs.iter().any(|d| kind_of(d) == "PodDisruptionBudget"),
            replicas > 1,
            "{values:?}"
        );
    }
    assert_eq!(
        seen.len(),
        3,
        "every way of taking Leases is covered: {seen:?}"
    );
    // Every optional part renders, with the rules and the dashboard the files hold.
    let docs = template(
        "ops",
        &[
            "serviceMonitor.enabled=true",
            "prometheusRule.enabled=true",
            "dashboard.enabled=true",
        ],
    );
    let kinds: BTreeSet<&str> = docs.iter().map(kind_of).collect();
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ServiceAccount",
        "Deployment",
    ] {
        assert!(kinds.contains(kind), "{kind} not rendered: {kinds:?}");
    }
    let rule = docs
        .iter()
        .find(|d| kind_of(d) == "PrometheusRule")
        .unwrap();
    let file: Value = serde_saphyr::from_str(&read("files/alerts.yaml")).unwrap();
    assert_eq!(rule["spec"], file);
    let dashboard = docs.iter().find(|d| kind_of(d) == "ConfigMap").unwrap();
    let json: Value =
        serde_json::from_str(dashboard["data"]["example-operator.json"].as_str().unwrap()).unwrap();
    assert_eq!(json, example_operator::dashboard::dashboard());
}

/// `podman` with the configuration scripts/install-test-deps.sh writes.
fn podman() -> Command {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let conf = Path::new(&home).join(".cache/actorcile/podman");
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", conf.join("containers.conf"))
        .env("CONTAINERS_STORAGE_CONF", conf.join("storage.conf"));
    c
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman()
        .args(args)
        .output()
        .expect("podman (run scripts/install-test-deps.sh)");
    assert!(
        out.status.success(),
        "podman {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The image of the Containerfile, its runtime stage on a base assembled here in the shape of
/// distroless's `cc` (the C library and loader the binary links, `/etc/passwd` naming 65532, an
/// empty `/tmp`), and the binary of this build in place of the build stage's.
fn build_image(dir: &Path, tag: &str) {
    let binary = Path::new(env!("CARGO_BIN_EXE_example-operator"));
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    let ldd = run(Path::new("ldd"), &[binary.to_str().unwrap()]);
    for line in ldd.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = line
            .split("=>")
            .last()
            .unwrap()
            .trim()
            .split(' ')
            .next()
            .unwrap();
        if path.starts_with('/') {
            let to = rootfs.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(path, &to).unwrap();
        }
    }
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
    let tar = dir.join("base.tar");
    run(
        Path::new("tar"),
        &[
            "-C",
            rootfs.to_str().unwrap(),
            "-cf",
            tar.to_str().unwrap(),
            ".",
        ],
    );
    let base = format!("{tag}-base");
    podman_ok(&["import", tar.to_str().unwrap(), &base]);
    let context = dir.join("build");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::copy(binary, context.join("example-operator")).unwrap();
    let containerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("Containerfile");
    podman_ok(&[
        "build",
        "--quiet",
        "-f",
        containerfile.to_str().unwrap(),
        "--build-context",
        &format!("build={}", context.display()),
        "--build-arg",
        &format!("RUNTIME_IMAGE={base}"),
        "-t",
        tag,
        context.to_str().unwrap(),
    ]);
}

/// Removes a container when dropped, even when the test panicked.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "-f", "-t", "0", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// What a Pod of the Deployment is given, written to `dir/serviceaccount`: the ServiceAccount's
/// token (from the TokenRequest API), the cluster's CA and the namespace, as the kubelet mounts
/// them at /var/run/secrets/kubernetes.io/serviceaccount.
async fn service_account_mount(env: &Envtest, namespace: &str, dir: &Path) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request("example-operator", &PostParams::default(), &request)
        .await
        .expect("a token of the chart's ServiceAccount")
        .status
        .expect("the token")
        .token;
    let mount = dir.join("serviceaccount");
    std::fs::create_dir_all(&mount).unwrap();
    let kubeconfig: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(env.kubeconfig_path()).unwrap()).unwrap();
    let ca = kubeconfig["clusters"][0]["cluster"]["certificate-authority"]
        .as_str()
        .unwrap();
    std::fs::copy(ca, mount.join("ca.crt")).unwrap();
    std::fs::write(mount.join("token"), token).unwrap();
    std::fs::write(mount.join("namespace"), namespace).unwrap();
    // Readable by the container's user, as the kubelet's mount is.
    for f in ["ca.crt", "token", "namespace"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(mount.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&mount, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    mount
}

/// The Deployment's container run in the image: its arguments as they are; its environment as
/// they are but the fieldRefs (the Pod's name and namespace) and the admin addresses (loopback
/// ports of their own: the container shares the host's network, where the API server listens);
/// the ServiceAccount's mount, and the in-cluster variables a Pod gets.
fn run_container(
    image: &str,
    name: &str,
    container: &Value,
    mount: &Path,
    apiserver_port: u16,
    ports: (u16, u16),
) -> Container {
    let args = strings(&container["args"]);
    let mut env = vec![
        "KUBERNETES_SERVICE_HOST=127.0.0.1".to_string(),
        format!("KUBERNETES_SERVICE_PORT={apiserver_port}"),
    ];
    for e in container["env"].as_array().unwrap() {
        let key = e["name"].as_str().unwrap();
        let value = match (key, e["value"].as_str()) {
            ("ACTORCILE_ADMIN_ADDR", Some(_)) => format!("127.0.0.1:{}", ports.0),
            ("ACTORCILE_METRICS_ADDR", Some(_)) => format!("127.0.0.1:{}", ports.1),
            (_, Some(v)) => v.to_string(),
            ("POD_NAME", None) => name.to_string(),
            ("POD_NAMESPACE", None) => std::fs::read_to_string(mount.join("namespace")).unwrap(),
            (other, None) => panic!("an env var the test does not know how to fill: {other}"),
        };
        env.push(format!("{key}={value}"));
    }
    let mut cmd: Vec<String> = [
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--user",
        "65532:65532",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cmd.push("-v".into());
    cmd.push(format!(
        "{}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
        mount.display()
    ));
    for e in env {
        cmd.push("-e".into());
        cmd.push(e);
    }
    cmd.push(image.into());
    cmd.extend(args);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    podman_ok(&cmd);
    Container(name.to_string())
}

fn container_logs(name: &str) -> String {
    let out = podman().args(["logs", name]).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The chart installed on a real kube-apiserver (Pod Security `restricted` enforced on its
/// namespace), and the operator run from the image as the chart's ServiceAccount, with the
/// Deployment's arguments: with leader election (the chart's defaults), then upgraded to
/// sharding. Each converges objects (its RBAC suffices: `--preflight-rbac` checks it at start,
/// and a missing verb would fail a write), its probes answer, and its scrape feeds the alert
/// rules' unit tests and the dashboard's check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_image_converges_objects_as_the_chart_s_service_account() {
    let env = Envtest::start()
        .await
        .expect("a control plane (run scripts/install-test-deps.sh)");
    let client = env.client();
    let namespace = "example-operator";
    // Pod Security `restricted`, enforced: the namespace admits only Pods that meet it.
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": namespace, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }},
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    let helm = tool("helm");
    let kubeconfig = env.kubeconfig_path().to_str().unwrap().to_string();
    let chart = chart_dir();
    let image = format!(
        "localhost/example-operator:deploy-test-{}",
        std::process::id()
    );
    let (repository, tag) = image.rsplit_once(':').unwrap();
    let image_values = format!("image.repository={repository},image.tag={tag}");
    // `helm install` or `helm upgrade` of the release, with the test's image and `values`.
    let release = |verb: &str, values: &[&str]| {
        let mut args = vec![
            verb,
            "ex",
            chart.to_str().unwrap(),
            "-n",
            namespace,
            "--kubeconfig",
            &kubeconfig,
            "--set",
            &image_values,
        ];
        for v in values {
            args.extend(["--set", v]);
        }
        run(&helm, &args);
    };
    release("install", &[]);

    // A Pod of the Deployment as the ReplicaSet controller would make it is admitted; one that
    // drops the security context is not (the enforcement is on).
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let pod_of = |d: &Deployment| -> Pod {
        let template = d.spec.clone().unwrap().template;
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("example-operator-dry-run".into()),
                labels: template.metadata.and_then(|m| m.labels),
                ..Default::default()
            },
            spec: template.spec,
            ..Default::default()
        }
    };
    let deployment = deployments.get("example-operator").await.unwrap();
    pods.create(&dry_run, &pod_of(&deployment))
        .await
        .expect("the chart's Pod meets Pod Security restricted");
    let mut careless = pod_of(&deployment);
    careless.spec.as_mut().unwrap().security_context = None;
    careless.spec.as_mut().unwrap().containers[0].security_context = None;
    let refused = pods
        .create(&dry_run, &careless)
        .await
        .expect_err("restricted is enforced");
    assert!(refused.to_string().contains("restricted"), "{refused}");

    let dir = tempfile::tempdir().unwrap();
    build_image(dir.path(), &image);
    let _image = scopeguard(image.clone());
    let mount = service_account_mount(&env, namespace, dir.path()).await;
    let apiserver_port: u16 = env
        .server_url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    let mut scrapes = String::new();
    for (round, upgrade) in [(0, None), (1, Some("sharding.shards=2"))] {
        if let Some(values) = upgrade {
            release("upgrade", &[values]);
        }
        let rendered =
            serde_json::to_value(deployments.get("example-operator").await.unwrap()).unwrap();
        let container = rendered["spec"]["template"]["spec"]["containers"][0].clone();
        let (probes, metrics) = (free_port(), free_port());
        let name = format!("example-operator-{}-{round}", std::process::id());
        let running = run_container(
            &image,
            &name,
            &container,
            &mount,
            apiserver_port,
            (probes, metrics),
        );
        let answered = eventually_or(&name, "/readyz to answer 200", || async {
            get(probes, "/readyz")
                .await
                .filter(|(code, _)| *code == 200)
        })
        .await;
        assert_eq!(get(probes, "/healthz").await.map(|(c, _)| c), Some(200));
        // Objects converge: a Network and a Cluster on it, Ready.
        let net = format!("net-{round}");
        let cluster = format!("cluster-{round}");
        let networks = api(&client, "Network");
        let clusters = api(&client, "Cluster");
        let o: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Network",
            "metadata": {"name": net}, "spec": {"cidr": format!("10.{round}.0.0/16")}}),
        )
        .unwrap();
        networks.create(&PostParams::default(), &o).await.unwrap();
        let o: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "example.actorcile.dev/v1", "kind": "Cluster",
            "metadata": {"name": cluster}, "spec": {"network": net, "workers": 2}}),
        )
        .unwrap();
        clusters.create(&PostParams::default(), &o).await.unwrap();
        for (objects, name_) in [(&networks, &net), (&clusters, &cluster)] {
            eventually_or(&name, &format!("{name_} Ready"), || async {
                objects.get(name_).await.ok().filter(ready).map(|_| ())
            })
            .await;
        }
        let (code, scrape) = get(metrics, "/metrics").await.expect("/metrics answers");
        assert_eq!(code, 200);
        assert!(scrape.contains("actorcile_build_info"), "{scrape}");
        if round == 1 {
            assert!(
                answered.1.contains("shards held"),
                "sharded: {}",
                answered.1
            );
            assert!(scrape.contains("actorcile_shards_held"), "{scrape}");
        }
        scrapes.push_str(&scrape);
        drop(running);
    }

    check_dashboard(&scrapes);
    alert_tests(&scrapes, dir.path());
}

/// Removes the test's image (and its base) when dropped.
fn scopeguard(image: String) -> impl Drop {
    struct Image(String);
    impl Drop for Image {
        fn drop(&mut self) {
            for i in [format!("{}-base", self.0), self.0.clone()] {
                let _ = podman()
                    .args(["rmi", "-f", &i])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    Image(image)
}

/// [`eventually`], with the container's logs when it times out.
async fn eventually_or<T, F, Fut>(container: &str, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}; the container's logs:\n{}",
                container_logs(container)
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Each sample's name and labels in a scrape (`name{labels} value`), comments left out.
fn samples(scrape: &str) -> Vec<(String, BTreeMap<String, String>)> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let series = l.rsplit_once(' ')?.0;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.trim_matches('"').to_string()))
                })
                .collect();
            Some((name.to_string(), labels))
        })
        .collect()
}

/// Every metric the dashboard's queries read is in the scrape, and every histogram's `+Inf`
/// bucket is its count (the quantile panels read the buckets).
fn check_dashboard(scrape: &str) {
    let values: BTreeMap<&str, &str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .collect();
    let mut histograms = 0;
    for (series, value) in &values {
        if let Some((name, labels)) = series.split_once("_bucket{le=\"+Inf\"") {
            let rest = labels.trim_start_matches(',');
            let count = if rest == "}" {
                format!("{name}_count")
            } else {
                format!("{name}_count{{{rest}")
            };
            assert_eq!(
                values.get(count.as_str()),
                Some(value),
                "{series} is not {count}"
            );
            histograms += 1;
        }
    }
    assert!(histograms >= 3, "{histograms} histograms checked");
    let names: BTreeSet<String> = samples(scrape).into_iter().map(|(n, _)| n).collect();
    let read = example_operator::dashboard::metrics_read();
    assert!(read.len() >= 15, "{read:?}");
    for metric in read {
        assert!(
            names.contains(&metric),
            "the dashboard reads {metric}, which the operator does not expose"
        );
    }
}

/// A scraped series by name and label subset, and its values in promtool's notation.
type InputSeries = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// One alert's unit test: its input series (a scraped series by name and label subset, with
/// promtool's value notation), when it must fire, and the labels its result keeps (`None`:
/// every label of the series).
struct AlertCase {
    alert: &'static str,
    series: &'static [InputSeries],
    fires_at: &'static str,
    quiet_at: &'static str,
    keeps: Option<&'static [&'static str]>,
}

/// A series of one controller's.
const BY_CONTROLLER: &[(&str, &str)] = &[("controller", "Network")];

/// The labels Prometheus adds to a scraped target's series (the ServiceMonitor's, for the Pod).
const TARGET: [(&str, &str); 4] = [
    ("namespace", "example-operator"),
    ("job", "example-operator-metrics"),
    ("pod", "example-operator-7d9f-abcde"),
    ("instance", "10.0.0.7:8080"),
];

/// `promtool check rules` on the rule file, then `promtool test rules` with a test of every
/// alert, its series those of the scrape (with the target's labels Prometheus adds): a metric the
/// operator no longer exposes fails here.
fn alert_tests(scrape: &str, dir: &Path) {
    let promtool = tool("promtool");
    let rules = chart_dir().join("files/alerts.yaml");
    run(&promtool, &["check", "rules", rules.to_str().unwrap()]);
    let file: Value = serde_saphyr::from_str(&std::fs::read_to_string(&rules).unwrap()).unwrap();
    let defined: BTreeMap<String, Value> = file["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["alert"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    let cases = [
        AlertCase {
            alert: "ExampleOperatorReconcileErrors",
            series: &[
                (
                    "actorcile_reconciles_total",
                    &[("controller", "Network"), ("result", "failed")],
                    "0+5x40",
                ),
                (
                    "actorcile_reconciles_total",
                    &[("controller", "Network"), ("result", "done")],
                    "0+5x40",
                ),
            ],
            fires_at: "30m",
            quiet_at: "10m",
            keeps: Some(&["namespace", "job", "controller"]),
        },
        AlertCase {
            alert: "ExampleOperatorObjectsQuarantined",
            series: &[("actorcile_quarantined_total", &[], "0 0 0 1 1 1")],
            fires_at: "4m",
            quiet_at: "1m",
            keeps: None,
        },
        AlertCase {
            alert: "ExampleOperatorWatchDown",
            series: &[
                ("actorcile_kind_synced", BY_CONTROLLER, "1 1 0x20"),
                ("actorcile_watches_down", &[], "0x22"),
            ],
            fires_at: "15m",
            quiet_at: "5m",
            keeps: None,
        },
        AlertCase {
            alert: "ExampleOperatorNoLeader",
            series: &[("actorcile_leader", &[], "1 1 0x20")],
            fires_at: "10m",
            quiet_at: "4m",
            keeps: Some(&["namespace", "job"]),
        },
        AlertCase {
            alert: "ExampleOperatorShardsWithoutHolder",
            series: &[
                ("actorcile_shards", &[], "2x20"),
                ("actorcile_shards_held", &[], "2 2 1x18"),
            ],
            fires_at: "10m",
            quiet_at: "4m",
            keeps: Some(&["namespace", "job"]),
        },
        AlertCase {
            alert: "ExampleOperatorStatusWritesRefused",
            series: &[("actorcile_status_rejected_total", &[], "0x5 1+1x30")],
            fires_at: "25m",
            quiet_at: "10m",
            keeps: None,
        },
        AlertCase {
            alert: "ExampleOperatorQueueGrowing",
            series: &[("actorcile_reconciles_waiting", BY_CONTROLLER, "0+2x40")],
            fires_at: "30m",
            quiet_at: "10m",
            keeps: None,
        },
        AlertCase {
            alert: "ExampleOperatorReconcileStuck",
            series: &[(
                "actorcile_reconcile_longest_running_seconds",
                BY_CONTROLLER,
                "0+60x30",
            )],
            fires_at: "20m",
            quiet_at: "12m",
            keeps: None,
        },
    ];
    assert_eq!(
        cases
            .iter()
            .map(|c| c.alert.to_string())
            .collect::<BTreeSet<_>>(),
        defined.keys().cloned().collect::<BTreeSet<_>>(),
        "every alert has a test, and every test an alert"
    );
    let scraped = samples(scrape);
    let mut tests = Vec::new();
    for case in &cases {
        let mut input = Vec::new();
        let mut first_labels = BTreeMap::new();
        for (i, (metric, subset, values)) in case.series.iter().enumerate() {
            let (_, labels) = scraped
                .iter()
                .find(|(n, labels)| {
                    n == metric
                        && subset
                            .iter()
                            .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
                })
                .unwrap_or_else(|| {
                    panic!(
                        "{}: no series {metric}{subset:?} in the operator's scrape",
                        case.alert
                    )
                });
            let mut labels = labels.clone();
            for (k, v) in TARGET {
                labels.insert(k.into(), v.into());
            }
            if i == 0 {
                first_labels = labels.clone();
            }
            let text: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            input.push(
                json!({"series": format!("{metric}{{{}}}", text.join(",")), "values": values}),
            );
        }
        let rule = &defined[case.alert];
        let mut labels: BTreeMap<String, String> = match case.keeps {
            Some(keys) => keys
                .iter()
                .map(|k| (k.to_string(), first_labels[*k].clone()))
                .collect(),
            None => first_labels.clone(),
        };
        for (k, v) in rule["labels"].as_object().unwrap() {
            labels.insert(k.clone(), v.as_str().unwrap().to_string());
        }
        // The annotations name labels only: rendered here as Prometheus renders them.
        let annotations: BTreeMap<String, String> = rule["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let mut text = v.as_str().unwrap().to_string();
                while let Some(start) = text.find("{{ $labels.") {
                    let end = start + text[start..].find("}}").unwrap() + 2;
                    let key = text[start + "{{ $labels.".len()..end - 2].trim();
                    let value = labels.get(key).cloned().unwrap_or_default();
                    text.replace_range(start..end, &value);
                }
                (k.clone(), text)
            })
            .collect();
        tests.push(json!({
            "name": case.alert,
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": [
                {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
                {"eval_time": case.fires_at, "alertname": case.alert, "exp_alerts": [
                    {"exp_labels": labels, "exp_annotations": annotations},
                ]},
            ],
        }));
    }
    let test_file = dir.join("alerts_test.yaml");
    let doc = json!({"rule_files": [rules.to_str().unwrap()], "evaluation_interval": "1m", "tests": tests});
    std::fs::write(&test_file, serde_saphyr::to_string(&doc).unwrap()).unwrap();
    run(&promtool, &["test", "rules", test_file.to_str().unwrap()]);
}
