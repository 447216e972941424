//! `actorcile envtest up|status|restart|down` against the real etcd and kube-apiserver
//! (installed by scripts/install-test-deps.sh), in a state directory of the test's own: a
//! component killed and restarted by hand is recognised, `restart` brings one back with its data,
//! and `down` leaves no process behind.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use actorcile::envtest::DetachedEnvtest;

/// Runs `actorcile envtest <args>` with the state under `cache` (the binaries are still the
/// machine's, named by `$ACTORCILE_KUBE_ASSETS`).
fn envtest(cache: &Path, args: &[&str]) -> Output {
    let binaries = actorcile::envtest::binaries().expect("etcd and kube-apiserver installed");
    let assets = binaries.kube_apiserver.parent().expect("a folder");
    let mut child = Command::new(env!("CARGO_BIN_EXE_actorcile"))
        .arg("envtest")
        .args(args)
        .env("ACTORCILE_CACHE_DIR", cache)
        .env_remove(actorcile::envtest::KUBEBUILDER_ASSETS)
        .env(actorcile::envtest::ACTORCILE_KUBE_ASSETS, assets)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start actorcile");
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("actorcile envtest {args:?} did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

fn wait_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) with a pid and a signal number has no memory effects.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
    wait_dead(pid);
}

/// The state file as `up`/`status`/`restart` left it.
fn state(cache: &Path) -> DetachedEnvtest {
    DetachedEnvtest::load(&cache.join("envtest"))
        .unwrap()
        .expect("a state file")
}

/// Stops the control plane (and any pid given) if the test fails half-way.
struct Cleanup<'a>(&'a Path, Vec<u32>);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = envtest(self.0, &["down"]);
            for pid in &self.1 {
                // SAFETY: kill(2) with a pid and a signal number has no memory effects.
                unsafe {
                    libc::kill(*pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
    }
}

#[test]
fn a_restarted_component_is_recognised_restart_brings_one_back_and_down_leaves_nothing() {
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path();
    let mut cleanup = Cleanup(cache, Vec::new());
    let up = envtest(cache, &["up", "--controller-manager"]);
    assert!(up.status.success(), "{}", text(&up));
    let first = state(cache);
    // It says which release it started, as the binary reports it.
    let binaries = actorcile::envtest::binaries().unwrap();
    let version = actorcile::envtest::KubeVersion::of_binary(&binaries.kube_apiserver).unwrap();
    assert_eq!(first.version, version.to_string());
    assert!(
        String::from_utf8_lossy(&up.stdout).contains(&format!("Kubernetes {version} at ")),
        "{}",
        text(&up)
    );
    let cm = first
        .controller_manager_pid
        .expect("--controller-manager records its pid");
    assert!(alive(cm), "{}", text(&up));
    let mut pids = vec![first.etcd_pid, first.apiserver_pid, cm];

    // kill -9 of the apiserver: status says which component is down, and how to recover.
    let argv = std::fs::read(format!("/proc/{}/cmdline", first.apiserver_pid)).unwrap();
    kill9(first.apiserver_pid);
    let down = envtest(cache, &["status"]);
    assert!(!down.status.success(), "{}", text(&down));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(
        err.contains(&format!(
            "kube-apiserver (pid {} gone)",
            first.apiserver_pid
        )) && err.contains("envtest restart"),
        "{}",
        text(&down)
    );

    // Restarted by hand with the same flags (as from a shell): status recognises and records it.
    let args: Vec<String> = argv
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8(a.to_vec()).unwrap())
        .collect();
    let by_hand = {
        use std::os::unix::process::CommandExt;
        Command::new(&args[0])
            .args(&args[1..])
            .current_dir(&first.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    pids.push(by_hand.id());
    cleanup.1.push(by_hand.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s = envtest(cache, &["status"]);
        if String::from_utf8_lossy(&s.stdout).contains("running, ready") {
            break s;
        }
        assert!(Instant::now() < deadline, "{}", text(&s));
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.status.success(), "{}", text(&status));
    assert_eq!(
        state(cache).apiserver_pid,
        by_hand.id(),
        "{}",
        text(&status)
    );

    // `restart etcd` (kill -9) keeps the data; `restart kube-apiserver --graceful` too.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = || {
        let path = state(cache).kubeconfig;
        rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(config).unwrap()
        })
    };
    let cms = |c: kube::Client| {
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c, "default")
    };
    let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
    cm.metadata.name = Some("kept".into());
    rt.block_on(cms(client()).create(&Default::default(), &cm))
        .unwrap();
    for args in [
        &["restart", "etcd"][..],
        &["restart", "kube-apiserver", "--graceful"][..],
    ] {
        let before = state(cache);
        let out = envtest(cache, args);
        assert!(out.status.success(), "{}", text(&out));
        let after = state(cache);
        let (old, new) = if args[1] == "etcd" {
            (before.etcd_pid, after.etcd_pid)
        } else {
            (before.apiserver_pid, after.apiserver_pid)
        };
        assert_ne!(old, new, "{}", text(&out));
        assert!(!alive(old) && alive(new), "{}", text(&out));
        pids.push(new);
        let kept = rt.block_on(cms(client()).get_opt("kept")).unwrap();
        assert!(kept.is_some(), "data lost by {args:?}");
    }

    // `down` stops whatever runs now, the by-hand and restarted processes included.
    let out = envtest(cache, &["down"]);
    assert!(out.status.success(), "{}", text(&out));
    for pid in pids {
        wait_dead(pid);
    }
    assert!(!cache.join("envtest").exists());
    let gone = envtest(cache, &["status"]);
    assert!(!gone.status.success(), "{}", text(&gone));
}
