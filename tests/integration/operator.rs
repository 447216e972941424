//! What an operator binary gets from the runtime, on the in-process cluster: start-up hooks in
//! order and their failure, the admin server (probes, `/metrics` with the operator's own
//! metrics, a bind failure), the ClusterRole derived from the tree, and per-object Event
//! budgets.
//!
//! Run with `cargo test --release --features operator --test integration operator::`.
#![cfg(feature = "operator")]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::runtime::ReconcileResult;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(30);

fn terminal_when_negative() -> impl Provisioner<Widget> {
    step("validate", |cx: Context<Widget>| async move {
        if cx.object().spec.size < 0 {
            return Outcome::Terminal(Reason::new("NegativeSize", "size must be >= 0"));
        }
        Outcome::Done
    })
}

#[tokio::test]
async fn metrics_on_an_address_of_their_own_leave_the_admin_address_the_probes() {
    let (_cluster, client) = cluster();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(terminal_when_negative()))
        .admin("127.0.0.1:0".parse().unwrap())
        .metrics_addr("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let probes = rt.admin_addr().expect("an admin server");
    let metrics = rt.metrics_addr().expect("a metrics server");
    assert_ne!(probes, metrics);
    assert_eq!(get(probes, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(get(probes, "/metrics").await.0, 404);
    assert_eq!(get(metrics, "/healthz").await.0, 404);
    let (status, text) = get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert!(text.contains("actorcile_status_writes_total"), "{text}");
    rt.shutdown().await;
}

#[tokio::test]
async fn slow_or_crowding_clients_cannot_hold_the_admin_server() {
    use actorcile::admin::{AdminLimits, AdminServer, Endpoints};
    use tokio::net::TcpStream;
    let health = Arc::new(actorcile::health::Health::default());
    let registry = Arc::new(actorcile::metrics::Registry::default());
    let local = "127.0.0.1:0".parse().unwrap();
    // What a closed connection reads: nothing more (a reset counts as closed too).
    async fn closed(mut s: TcpStream) -> Vec<u8> {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the server never closed the connection");
        buf
    }

    // Two connections that send half a request hold the two slots (no header timeout comes
    // in the way: an hour); a third is closed at once, unanswered.
    let crowded = AdminServer::bind_with(
        local,
        registry.clone(),
        health.clone(),
        Endpoints::All,
        AdminLimits {
            header_read_timeout: Duration::from_secs(3600),
            connection_lifetime: Duration::from_secs(3600),
            max_connections: 2,
            max_connections_per_peer: 4,
        },
    )
    .await
    .unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(crowded.local_addr()).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    let third = TcpStream::connect(crowded.local_addr()).await.unwrap();
    assert!(closed(third).await.is_empty(), "no answer past the cap");
    // Once they go, the server answers again.
    drop(held);
    eventually("answered once the slots are free", LIMIT, || async {
        let mut s = TcpStream::connect(crowded.local_addr()).await.ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        buf.starts_with("HTTP/1.1 200").then_some(())
    })
    .await;

    // A client that never finishes its headers is cut at the header timeout, and one that
    // keeps its connection alive at the connection's lifetime.
    let strict = AdminServer::bind_with(
        local,
        registry,
        health,
        Endpoints::All,
        AdminLimits {
            header_read_timeout: Duration::from_millis(100),
            connection_lifetime: Duration::from_millis(500),
            max_connections: 64,
            ..AdminLimits::default()
        },
    )
    .await
    .unwrap();
    let mut slow = TcpStream::connect(strict.local_addr()).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    closed(slow).await;
    let mut kept = TcpStream::connect(strict.local_addr()).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answered = String::from_utf8(closed(kept).await).unwrap();
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");

    // One peer crowding the server (connections from 127.0.0.2 that never finish a request)
    // holds its share only: a probe from another address is answered.
    let shared_server = AdminServer::bind_with(
        "0.0.0.0:0".parse().unwrap(),
        Arc::new(actorcile::metrics::Registry::default()),
        Arc::new(actorcile::health::Health::default()),
        Endpoints::All,
        AdminLimits {
            header_read_timeout: Duration::from_secs(3600),
            connection_lifetime: Duration::from_secs(3600),
            max_connections: 8,
            max_connections_per_peer: 4,
        },
    )
    .await
    .unwrap();
    let port = shared_server.local_addr().port();
    let mut crowd = Vec::new();
    for _ in 0..12 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = socket.connect(([127, 0, 0, 2], port).into()).await.unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n").await;
        crowd.push(s);
    }
    let mut probe = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answered = String::from_utf8(closed(probe).await).unwrap();
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    drop(crowd);
}

#[tokio::test]
async fn hooks_run_in_order_before_the_watch_and_a_failing_hook_fails_start() {
    let (_cluster, client) = cluster();
    create(&client, "w0", 1).await;
    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let (o1, o2, o3) = (order.clone(), order.clone(), order.clone());
    let tree = step("run", move |_cx: Context<Widget>| {
        let o = o3.clone();
        async move {
            o.lock().unwrap().push("reconcile".into());
            Outcome::Done
        }
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .controller(
            Controller::<Widget>::new(tree)
                .on_initialize(move |_c| async move {
                    o2.lock().unwrap().push("initialize".into());
                    Ok(())
                })
                .on_upgrade(move |_c| async move {
                    o1.lock().unwrap().push("upgrade".into());
                    Ok(())
                }),
        )
        .start()
        .await
        .unwrap();
    wait_ready(&client, "w0", LIMIT).await;
    let seen = order.lock().unwrap().clone();
    assert_eq!(
        seen[..3],
        ["upgrade", "initialize", "reconcile"],
        "{seen:?}"
    );
    rt.shutdown().await;

    let failed = Runtime::builder(client.clone(), crate::common::names())
        .controller(
            Controller::<Widget>::new(terminal_when_negative())
                .on_upgrade(|_c| async { Err("the v1 labels cannot be migrated".into()) }),
        )
        .start()
        .await;
    match failed {
        Err(actorcile::Error::Hook {
            controller,
            hook,
            message,
        }) => {
            assert_eq!((controller.as_str(), hook), ("Widget", "upgrade"));
            assert_eq!(message, "the v1 labels cannot be migrated");
        }
        Err(other) => panic!("expected a hook error, got {other}"),
        Ok(_) => panic!("a failing hook must fail start-up"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_serves_probes_and_metrics_and_a_taken_address_fails_start() {
    let (_cluster, client) = cluster();
    let mut registry = actorcile::metrics::Registry::default();
    let backups = Counter::<u64>::default();
    registry.register("myoperator_backups", "Backups taken", backups.clone());
    backups.inc_by(3);
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(terminal_when_negative()))
        .admin("127.0.0.1:0".parse().unwrap())
        .metrics_registry(registry)
        .service(actorcile::names::ServiceDescriptor::new(
            "widget-operator",
            "2.0.1",
            "abc123",
        ))
        .start()
        .await
        .unwrap();
    let addr = rt.admin_addr().expect("an admin server");
    create(&client, "ok", 1).await;
    create(&client, "bad", -1).await;
    wait_ready(&client, "ok", LIMIT).await;
    wait_reason(&client, "bad", "NegativeSize", LIMIT).await;

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
    let (status, _) = eventually("ready", LIMIT, || async {
        let answer = get(addr, "/readyz").await;
        (answer.0 == 200).then_some(answer)
    })
    .await;
    assert_eq!(status, 200);
    assert_eq!(get(addr, "/nowhere").await.0, 404);

    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "myoperator_backups_total 3",
        r#"actorcile_reconciles_total{controller="Widget",result="done"} 1"#,
        r#"actorcile_reconciles_total{controller="Widget",result="terminal"} 1"#,
        r#"actorcile_objects{controller="Widget"} 2"#,
        r#"actorcile_reconcile_duration_seconds_count{controller="Widget"} 2"#,
        "actorcile_status_writes_total 2",
        "actorcile_write_timeouts_total 0",
        &format!(
            r#"actorcile_build_info{{application="widget-operator",version="2.0.1",revision="abc123",actorcile_version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        ),
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    // The Events are the application's.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    eventually("an Event reported by the application", LIMIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| e.reporting_controller.as_deref() == Some("widget-operator"))
            .then_some(())
    })
    .await;
    let k = &rt.kind_metrics()[0];
    assert_eq!(k.reconciles_with(ReconcileResult::Done), 1);
    assert_eq!(
        k.due_to_start.count, 2,
        "each reconcile was due, then started"
    );

    // The same address again: a start-up error naming it.
    let taken = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(terminal_when_negative()))
        .admin(addr)
        .start()
        .await;
    match taken {
        Err(e @ actorcile::Error::Admin { .. }) => {
            assert!(e.to_string().contains(&addr.to_string()), "{e}")
        }
        Err(other) => panic!("expected an admin error, got {other}"),
        Ok(_) => panic!("a taken admin address must fail start-up"),
    }

    let health = rt.health();
    rt.shutdown().await;
    assert!(!health.ready().ok, "not ready once shut down");
}

/// Rendered from an offline builder: no client, no cluster, no Tokio runtime. Starting it is
/// refused.
#[test]
fn the_roles_cover_what_the_tree_touches_naming_steps_each_where_it_is_needed() {
    use actorcile::rbac::{Roles, RuleScope};
    use k8s_openapi::api::core::v1::Namespace;
    let tree = || {
        serial![
            resource("config", |w: &Widget| ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: w.metadata.name.clone(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            step("password", |_cx: Context<Widget>| async { Outcome::Done })
                .needs(actorcile::rbac::rule_for::<Secret>(&["get"]))
                .needs_in(
                    RuleScope::Cluster,
                    actorcile::rbac::rule_for::<Namespace>(&["get"])
                ),
        ]
    };
    let steps: Vec<_> = tree().rules().into_iter().map(|r| r.step).collect();
    assert_eq!(steps, ["config", "password", "password"]);
    // The verbs on `resource` of the rules granted in `scope`.
    let of = |roles: &Roles, scope: RuleScope, res: &str| {
        roles
            .rules()
            .into_iter()
            .filter(|r| r.scope == scope)
            .filter(|r| {
                r.rule
                    .resources
                    .as_ref()
                    .is_some_and(|rs| rs.iter().any(|x| x == res))
            })
            .flat_map(|r| r.rule.verbs)
            .collect::<Vec<_>>()
    };

    // Watching every namespace: all of it cluster-wide.
    let all = Runtime::offline_builder(crate::common::names())
        .controller(Controller::<Widget>::new(tree()))
        .roles("op");
    let yaml = all.to_yaml().unwrap();
    assert!(all.roles.is_empty(), "{yaml}");
    let cluster = RuleScope::Cluster;
    assert_eq!(
        of(&all, cluster.clone(), "configmaps"),
        ["get", "create", "patch", "delete"],
        "{yaml}"
    );
    assert_eq!(of(&all, cluster.clone(), "secrets"), ["get"], "{yaml}");
    assert_eq!(of(&all, cluster.clone(), "namespaces"), ["get"], "{yaml}");
    assert_eq!(
        of(&all, cluster.clone(), "widgets/status"),
        ["patch"],
        "{yaml}"
    );
    assert_eq!(
        of(&all, cluster.clone(), "events"),
        ["create", "patch"],
        "{yaml}"
    );

    // Confined to team-a: a Role there, and only what is cluster-scoped in the ClusterRole.
    let confined = Runtime::offline_builder(crate::common::names())
        .namespace("team-a")
        .controller(Controller::<Widget>::new(tree()))
        .roles("op");
    let yaml = confined.to_yaml().unwrap();
    let team_a = RuleScope::namespace("team-a");
    assert_eq!(confined.roles.len(), 1, "{yaml}");
    assert_eq!(
        of(&confined, team_a.clone(), "widgets"),
        ["get", "list", "watch", "patch"],
        "{yaml}"
    );
    assert_eq!(
        of(&confined, team_a.clone(), "configmaps"),
        ["get", "create", "patch", "delete"],
        "{yaml}"
    );
    assert_eq!(of(&confined, team_a.clone(), "secrets"), ["get"], "{yaml}");
    assert_eq!(
        of(&confined, team_a, "events"),
        ["create", "patch"],
        "{yaml}"
    );
    let cluster_wide: Vec<_> = confined
        .rules()
        .into_iter()
        .filter(|r| r.scope == cluster)
        .flat_map(|r| r.rule.resources.unwrap_or_default())
        .collect();
    assert_eq!(cluster_wide, ["namespaces"], "{yaml}");

    let offline = Runtime::offline_builder(crate::common::names())
        .controller(Controller::<Widget>::new(tree()));
    offline.validate().expect("an offline builder validates");
    let refused = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(offline.start())
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            &refused,
            actorcile::runtime::Error::Invalid {
                field: actorcile::runtime::Setting::Client,
                ..
            }
        ),
        "{refused}"
    );
}

#[tokio::test]
async fn a_flapping_object_publishes_at_most_its_event_budget() {
    let (_cluster, client) = cluster();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(terminal_when_negative()))
        .events("flapper")
        .start()
        .await
        .unwrap();
    create(&client, "flap", 1).await;
    wait_ready(&client, "flap", LIMIT).await;
    // 40 transitions, each seen in the status before the next (a barrier per transition).
    let transitions = 40;
    for i in 0..transitions {
        let (size, reason) = if i % 2 == 0 {
            (-1, "NegativeSize")
        } else {
            (1, "Provisioned")
        };
        widgets(&client)
            .patch(
                "flap",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"size": size}})),
            )
            .await
            .unwrap();
        wait_reason(&client, "flap", reason, LIMIT).await;
    }
    let k = eventually("every transition's Event counted", LIMIT, || async {
        let k = rt.kind_metrics().remove(0);
        (k.events + k.events_dropped == transitions + 1).then_some(k)
    })
    .await;
    assert_eq!(k.events, 25, "the burst of one object");
    assert_eq!(k.events_dropped, transitions + 1 - 25);
    rt.shutdown().await;
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `run()` on a SIGTERM: a graceful shutdown that lets the reconcile in flight finish (`Ok`); on a
/// second signal during it: everything stops at once (`Error::Interrupted`), long before the
/// shutdown timeout. The process signals itself: tokio's handler, registered by `run()` before
/// it starts, takes the signals (nextest runs each test in a process of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_shuts_down_gracefully_on_sigterm_and_at_once_on_a_second_signal() {
    for second_signal in [false, true] {
        let (_cluster, client) = cluster();
        create(&client, "slow", 1).await;
        let started = Arc::new(tokio::sync::Notify::new());
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, f) = (started.clone(), finished.clone());
        // The reconcile takes 2 s when only one signal comes (it must finish), 120 s otherwise.
        let reconcile = if second_signal { 120 } else { 2 };
        let tree = step("slow", move |_cx: Context<Widget>| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                s.notify_one();
                tokio::time::sleep(Duration::from_secs(reconcile)).await;
                f.store(true, std::sync::atomic::Ordering::SeqCst);
                Outcome::Done
            }
        });
        let port = free_port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let policy = SupervisorPolicy {
            runtime: actorcile::policy::RuntimePolicy {
                shutdown_timeout: Duration::from_secs(60),
                ..Default::default()
            },
            ..SupervisorPolicy::default()
        };
        let run = tokio::spawn(
            Runtime::builder(client.clone(), crate::common::names())
                .policy(policy)
                .controller(Controller::<Widget>::new(tree))
                .admin(addr)
                .run(),
        );
        tokio::time::timeout(LIMIT, started.notified())
            .await
            .expect("the reconcile started");
        unsafe { libc::raise(libc::SIGTERM) };
        // The runtime took the first signal once it reports shutting down.
        eventually("shutting down", LIMIT, || async {
            let (status, body) = tokio::time::timeout(Duration::from_secs(1), get(addr, "/readyz"))
                .await
                .ok()?;
            (status == 503 && body.contains("shutting down")).then_some(())
        })
        .await;
        if second_signal {
            unsafe { libc::raise(libc::SIGINT) };
        }
        let result = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("run() returned within 20 s")
            .unwrap();
        let reconcile_finished = finished.load(std::sync::atomic::Ordering::SeqCst);
        if second_signal {
            assert!(
                matches!(result, Err(actorcile::Error::Interrupted)),
                "{result:?}"
            );
            assert!(
                !reconcile_finished,
                "the 120 s reconcile was stopped, not awaited"
            );
        } else {
            assert!(result.is_ok(), "{result:?}");
            assert!(
                reconcile_finished,
                "the reconcile in flight finished before run() returned"
            );
        }
    }
}

/// A resource actor that keeps failing: a `Restarted` Warning Event per restart (kube's
/// recorder folds the repeats into one Event with a series count), then one `Quarantined` once
/// past the restart intensity.
#[tokio::test(start_paused = true)]
async fn restarts_and_quarantine_are_events() {
    let (_cluster, client) = cluster();
    let tree = step("panics", |_cx: Context<Widget>| async move {
        if true {
            panic!("a provisioner bug");
        }
        Outcome::Done
    });
    let mut policy = SupervisorPolicy::default();
    policy.kind.restart.max_restarts = 2;
    policy.kind.restart.backoff.min = Duration::from_millis(10);
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree))
        .events("restarts")
        .start()
        .await
        .unwrap();
    create(&client, "bad", 1).await;
    wait_reason(&client, "bad", "Quarantined", LIMIT).await;
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client.clone(), "default");
    // (reason, how many times it happened)
    let seen = eventually("the Restarted and Quarantined Events", LIMIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        let mut seen: Vec<(String, i32)> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad"))
            .map(|e| {
                let times = e.series.as_ref().map_or(1, |s| s.count);
                (e.reason.clone().unwrap_or_default(), times)
            })
            .collect();
        seen.sort();
        (seen == [("Quarantined".to_string(), 1), ("Restarted".to_string(), 2)]).then_some(seen)
    })
    .await;
    assert_eq!(seen.len(), 2);
    assert_eq!(rt.metrics().restarts, 2);
    assert_eq!(
        rt.kind_metrics()[0].events,
        3,
        "two restarts and a quarantine"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_controller_whose_crd_is_missing_waits_says_so_and_starts_when_it_appears() {
    use kube::CustomResourceExt;
    // Virtual time: the watch retries with kube's backoff (up to half a minute apart).
    const WAIT: Duration = Duration::from_secs(600);
    // A cluster without the Widget CRD.
    let cluster = actorcile::cluster::ApiServer::new();
    let client = cluster.client();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .controller(Controller::<Widget>::new(terminal_when_negative()))
        .start()
        .await
        .expect("starts without the CRD");
    let health = rt.health();
    let detail = eventually("readiness says which kind waits", WAIT, || async {
        let probe = health.ready();
        (!probe.ok && probe.detail.contains("does not serve")).then_some(probe.detail)
    })
    .await;
    assert!(
        detail.contains("Widget") && detail.contains("test.actorcile.dev/v1"),
        "{detail}"
    );
    // The CRD is installed: the controller lists its kind and runs its objects.
    cluster.install_crd(&Widget::crd()).unwrap();
    create(&client, "late", 1).await;
    wait_ready(&client, "late", WAIT).await;
    eventually("ready", WAIT, || async { health.ready().ok.then_some(()) }).await;
    rt.shutdown().await;
}
