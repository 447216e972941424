//! The tests of `provisioners/remote.rs`.

use super::*;
use k8s_openapi::ByteString;
use kube::api::PostParams;

fn kubeconfig(user: &str, cluster_extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: remote
  cluster:
    server: https://127.0.0.1:6443
{cluster_extra}
users:
- name: admin
  user:
{user}
contexts:
- name: remote
  context: {{cluster: remote, user: admin}}
current-context: remote
"
    )
}

async fn access_with(
    text: &str,
    remote: KubeconfigSecret,
) -> Result<RemoteAccess, RemoteClusterError> {
    let cluster = crate::cluster::ApiServer::new();
    let mut secret = Secret::default();
    secret.metadata.name = Some("remote-kubeconfig".into());
    secret.data = Some([("value".to_string(), ByteString(text.as_bytes().to_vec()))].into());
    Api::<Secret>::namespaced(cluster.client(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    remote.access(&cluster.client()).await
}

#[tokio::test]
async fn link_local_metadata_and_the_authors_refused_servers_are_refused() {
    let with_server =
        |server: &str| kubeconfig("    token: abc", "").replace("https://127.0.0.1:6443", server);
    let remote = || KubeconfigSecret::new("default", "remote-kubeconfig");
    for server in [
        "http://169.254.169.254",
        "https://169.254.10.1:6443",
        "https://[fe80::1]:6443",
        "https://[fd00:ec2::254]",
        "https://metadata.google.internal.",
        "https://[::ffff:169.254.169.254]",
    ] {
        let e = access_with(&with_server(server), remote())
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RemoteClusterError::Invalid { what } if what.contains("refused")),
            "{server}: {e:?}"
        );
    }
    let access = access_with(&with_server("https://10.0.0.7:6443"), remote())
        .await
        .expect("a private address is the author's to refuse");
    let config = access.kube_config().unwrap();
    assert_eq!(config.read_timeout, Some(REMOTE_IO_TIMEOUT));
    assert_eq!(config.connect_timeout, Some(REMOTE_CONNECT_TIMEOUT));
    let only_example = remote().refuse_servers(|uri| {
        (uri.host() != Some("edge.example.com")).then(|| "not edge.example.com".into())
    });
    let e = access_with(&with_server("https://10.0.0.7:6443"), only_example.clone())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not edge.example.com"), "{e}");
    access_with(&with_server("https://edge.example.com"), only_example)
        .await
        .expect("the author's rule lets it through");
}

#[tokio::test]
async fn a_kubeconfig_from_a_secret_may_not_run_commands_or_read_files() {
    let remote = || KubeconfigSecret::new("default", "remote-kubeconfig");
    // What the plugin would create if it ran.
    let marker = std::env::temp_dir().join(format!("actorcile-exec-marker-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let exec = format!(
        "    exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'touch {}']}}",
        marker.display()
    );
    let refused = [
        (exec.as_str(), "", "users[admin].exec"),
        (
            "    auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}",
            "",
            "users[admin].auth-provider",
        ),
        (
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
            "",
            "users[admin].tokenFile",
        ),
        (
            "    client-certificate: /etc/passwd\n    client-key: /etc/shadow",
            "",
            "users[admin].client-certificate",
        ),
        (
            "    token: abc",
            "    certificate-authority: /etc/hosts",
            "clusters[remote].certificate-authority",
        ),
    ];
    for (user, cluster, field) in refused {
        let err = access_with(&kubeconfig(user, cluster), remote())
            .await
            .expect_err(field);
        match &err {
            RemoteClusterError::Invalid { what } => {
                assert!(what.contains(field), "{what}");
                assert!(what.contains("remote-kubeconfig"), "{what}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    assert!(!marker.exists(), "the exec plugin ran");
    // Inline credentials are what a Secret may hold.
    access_with(&kubeconfig("    token: abc", ""), remote())
        .await
        .expect("an inline token is accepted");
    // The author may opt in for a Secret only the trusted can write.
    let with_file = kubeconfig("    tokenFile: /nonexistent/token", "");
    let opted_in = access_with(&with_file, remote().allow_local_credentials()).await;
    assert!(
        !matches!(&opted_in, Err(RemoteClusterError::Invalid { what }) if what.contains("refused")),
        "{opted_in:?}"
    );
}

/// A remote server that answers an error with a body of any length: the runtime reads 64 KiB
/// of it at most, and the error it reports carries none of the rest.
#[tokio::test]
async fn a_remote_servers_error_body_is_read_to_a_bound() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    const BODY: usize = 16 * 1024 * 1024;
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = conn.read(&mut request).await;
        let head = format!(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {BODY}\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        while sent < BODY {
            if conn.write_all(&chunk).await.is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = bounded_client(config).unwrap();
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let e = api.get("x").await.unwrap_err();
    assert!(!matches!(e, kube::Error::Api(_)), "{e}");
    assert!(
        e.to_string().len() < REMOTE_ERROR_BODY_LIMIT,
        "the error holds the body"
    );
    drop(api);
    let sent = server.await.unwrap();
    assert!(sent < BODY, "the whole body was read ({sent} bytes)");
}
