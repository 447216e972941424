//! A Podman Docker-API service of the test's own, for the provider tests: started on a socket in
//! a temporary directory with the configuration `scripts/install-test-deps.sh` writes, and a
//! node image built locally from busybox-static (no pulls). Include with
//! `#[path = "common/podman.rs"] mod podman;`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actorcile::providers::docker::DockerProvider;
use actorcile::providers::{NodeRole, NodeSpec};

/// The node image every test container runs.
pub const IMAGE: &str = "localhost/actorcile-node:test";

/// A running `podman system service`; stopped on drop. One at a time in a test process: its
/// socket's folder is named by the process, and two services on one folder replace each other's
/// socket.
pub struct Podman {
    pub socket: PathBuf,
    dir: PathBuf,
    service: Child,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// Held by the one [`Podman`] of the process.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn podman() -> Command {
    let conf = dirs_cache().join("podman");
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", conf.join("containers.conf"))
        .env("CONTAINERS_STORAGE_CONF", conf.join("storage.conf"));
    c
}

fn dirs_cache() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(home).join(".cache/actorcile")
}

impl Podman {
    /// Start the service and make sure the node image exists. Panics, saying what to run, if
    /// Podman or its configuration is missing: these machines have both once
    /// `scripts/install-test-deps.sh` ran.
    pub fn start() -> Podman {
        // A test that failed holding it poisons it: the next one goes on.
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let conf = dirs_cache().join("podman/containers.conf");
        assert!(
            conf.exists(),
            "{} is missing: run scripts/install-test-deps.sh",
            conf.display()
        );
        ensure_image();
        let dir = std::env::temp_dir().join(format!("actorcile-podman-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the socket directory");
        let socket = dir.join("podman.sock");
        let service = podman()
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start podman system service (run scripts/install-test-deps.sh)");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "podman's socket did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
        Podman {
            socket,
            dir,
            service,
            _turn: turn,
        }
    }

    /// A provider on this service with label scheme `scheme`.
    pub fn provider(&self, scheme: &str) -> DockerProvider {
        DockerProvider::connect(self.socket.to_str().unwrap(), scheme).expect("connect")
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.service.kill();
        let _ = self.service.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes every container, network and volume carrying `label` when dropped, even when the
/// test panicked.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = format!("label={}", self.0);
        for args in [
            vec!["rm", "-f", "--filter", &filter],
            vec!["network", "prune", "-f", "--filter", &filter],
            vec!["volume", "prune", "-f", "--filter", &filter],
        ] {
            let _ = podman()
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The names of the networks (`what` = `network`) or volumes (`volume`) carrying `label`, as
/// Podman itself lists them.
pub fn listed_with(what: &str, label: &str) -> Vec<String> {
    let out = podman()
        .args([
            what,
            "ls",
            "--format",
            "{{.Name}}",
            "--filter",
            &format!("label={label}"),
        ])
        .output()
        .expect("podman ls");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect();
    names.sort();
    names
}

/// The containers carrying `label` (names), as Podman itself lists them.
pub fn containers_with(label: &str) -> Vec<String> {
    let out = podman()
        .args([
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            &format!("label={label}"),
        ])
        .output()
        .expect("podman ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// A node of `role` named `name`: the test image, no network, a shell that exits on TERM.
pub fn node(name: &str, role: NodeRole) -> NodeSpec {
    let mut spec = NodeSpec::new(name, role, IMAGE);
    spec.network_mode = Some("none".into());
    spec.command = vec![
        "sh".into(),
        "-c".into(),
        "trap 'exit 0' TERM; while :; do sleep 1; done".into(),
    ];
    spec
}

/// Build the node image from busybox-static if it is not there.
fn ensure_image() {
    let exists = podman()
        .args(["image", "exists", IMAGE])
        .status()
        .expect("podman (run scripts/install-test-deps.sh)");
    if exists.success() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("actorcile-node-image-{}", std::process::id()));
    let bin = dir.join("rootfs/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox"))
        .expect("/bin/busybox (busybox-static; run scripts/install-test-deps.sh)");
    for tool in ["sh", "sleep"] {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(tool));
    }
    let tar = dir.join("rootfs.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(dir.join("rootfs"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success(), "tar the node rootfs");
    let ok = podman()
        .arg("import")
        .arg(&tar)
        .arg(IMAGE)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "podman import the node image");
    let _ = std::fs::remove_dir_all(&dir);
}
