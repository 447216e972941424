//! What the example operator's process tests share: the operator as a child process, the
//! admin server's answers, bounded waiting.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actorcile::status::ResourceStatus;
use kube::api::Api;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const LIMIT: Duration = Duration::from_secs(60);

/// The operator process; killed if the test fails before it exits.
pub struct Operator(pub Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `example-operator run` on the control plane of `kubeconfig`, its admin server on
/// `port`, with `args` besides.
pub fn spawn_with(kubeconfig: &Path, port: u16, args: &[&str]) -> Operator {
    let child = Command::new(env!("CARGO_BIN_EXE_example-operator"))
        .arg("run")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--admin-addr")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example operator");
    Operator(child)
}

/// `GET path` on the admin server: (status code, body); `None` while it does not answer.
pub async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.actorcile.dev", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
    Api::namespaced_with(client.clone(), "default", &ar)
}

pub fn ready(o: &DynamicObject) -> bool {
    ResourceStatus::of(o).is_ready()
}

/// SIGTERM `op` and wait for its exit status.
pub async fn terminate(mut op: Operator) -> std::process::ExitStatus {
    unsafe { libc::kill(op.0.id() as i32, libc::SIGTERM) };
    tokio::task::spawn_blocking(move || op.0.wait())
        .await
        .unwrap()
        .unwrap()
}

pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
