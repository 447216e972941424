//! The `actorcile-envtest` binary (feature `cli`) against the real etcd and kube-apiserver
//! (installed by scripts/install-test-deps.sh), in a state directory of the test's own: `up`
//! starts a control plane that outlives it, `status` reports it, `down` stops it.

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn envtest(cache: &Path, args: &[&str]) -> Output {
    let binaries = actorcile_envtest::binaries().expect("etcd and kube-apiserver installed");
    let assets = binaries.kube_apiserver.parent().expect("a folder");
    Command::new(env!("CARGO_BIN_EXE_actorcile-envtest"))
        .args(args)
        .env("ACTORCILE_CACHE_DIR", cache)
        .env_remove(actorcile_envtest::KUBEBUILDER_ASSETS)
        .env(actorcile_envtest::ACTORCILE_KUBE_ASSETS, assets)
        .env_remove(actorcile_envtest::USE_EXISTING_CLUSTER)
        .stdin(Stdio::null())
        .output()
        .expect("run actorcile-envtest")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn up_status_and_down_from_the_light_binary() {
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path();
    let none = envtest(cache, &["status"]);
    assert!(!none.status.success(), "{}", text(&none));
    assert!(text(&none).contains("not running"), "{}", text(&none));

    let up = envtest(cache, &["up", "--timeout", "60s"]);
    assert!(up.status.success(), "{}", text(&up));
    let out = String::from_utf8_lossy(&up.stdout).into_owned();
    let kubeconfig = out
        .lines()
        .find_map(|l| l.strip_prefix("export KUBECONFIG="))
        .unwrap_or_else(|| panic!("no export line: {out}"));
    assert!(Path::new(kubeconfig).is_file(), "{out}");

    let status = envtest(cache, &["status"]);
    let down = envtest(cache, &["down"]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(
        text(&status).contains("running, ready"),
        "{}",
        text(&status)
    );
    assert!(down.status.success(), "{}", text(&down));
    assert!(text(&down).contains("stopped"), "{}", text(&down));
    assert!(!cache.join("envtest").exists());

    // A bad duration is refused by the flags' parser, naming the flag.
    let bad = envtest(cache, &["up", "--timeout", "soon"]);
    assert!(
        !bad.status.success() && text(&bad).contains("--timeout"),
        "{}",
        text(&bad)
    );
}
