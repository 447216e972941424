//! Kubeconfigs read from Secrets (`KubeconfigSecret`): whoever can write the Secret writes
//! them, so any bytes give a configuration or a refusal, never a panic or a hang; a kubeconfig
//! that names a command or a local file anywhere (any user, any cluster, in any context) is
//! refused; and a configuration that is accepted carries only inline credentials.

#![no_main]

use std::sync::OnceLock;

use actorcile::fuzzing::kubeconfig_from_secret;
use actorcile::provisioners::KubeconfigSecret;
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// One user entry: inline credentials, and the fields that run a command or read a file.
#[derive(Arbitrary, Debug)]
struct User {
    name: u8,
    token: Option<String>,
    basic: Option<(String, String)>,
    client_data: bool,
    /// A command to run.
    exec: Option<String>,
    /// A (deprecated) auth provider, which may run commands.
    auth_provider: Option<String>,
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_key: Option<String>,
}

impl User {
    fn local(&self) -> bool {
        self.exec.is_some()
            || self.auth_provider.is_some()
            || self.token_file.is_some()
            || self.client_certificate.is_some()
            || self.client_key.is_some()
    }

    fn json(&self) -> Value {
        let mut u = serde_json::Map::new();
        if let Some(t) = &self.token {
            u.insert("token".into(), json!(t));
        }
        if let Some((name, password)) = &self.basic {
            u.insert("username".into(), json!(name));
            u.insert("password".into(), json!(password));
        }
        if self.client_data {
            u.insert("client-certificate-data".into(), json!("Y2VydA=="));
            u.insert("client-key-data".into(), json!("a2V5"));
        }
        if let Some(c) = &self.exec {
            u.insert(
                "exec".into(),
                json!({"apiVersion": "client.authentication.k8s.io/v1", "command": c, "args": ["x"], "interactiveMode": "Never"}),
            );
        }
        if let Some(p) = &self.auth_provider {
            u.insert(
                "auth-provider".into(),
                json!({"name": p, "config": {"cmd-path": "/bin/true"}}),
            );
        }
        for (key, value) in [
            ("tokenFile", &self.token_file),
            ("client-certificate", &self.client_certificate),
            ("client-key", &self.client_key),
        ] {
            if let Some(v) = value {
                u.insert(key.into(), json!(v));
            }
        }
        json!({"name": format!("u{}", self.name % 4), "user": Value::Object(u)})
    }
}

/// One cluster entry.
#[derive(Arbitrary, Debug)]
struct Cluster {
    name: u8,
    server: Option<String>,
    ca_data: bool,
    /// A local file with the certificate authority.
    ca_file: Option<String>,
    insecure: bool,
}

impl Cluster {
    fn json(&self) -> Value {
        let mut c = serde_json::Map::new();
        c.insert(
            "server".into(),
            json!(self.server.clone().unwrap_or_else(|| "https://127.0.0.1:6443".into())),
        );
        if self.ca_data {
            c.insert("certificate-authority-data".into(), json!("Y2E="));
        }
        if let Some(f) = &self.ca_file {
            c.insert("certificate-authority".into(), json!(f));
        }
        if self.insecure {
            c.insert("insecure-skip-tls-verify".into(), json!(true));
        }
        json!({"name": format!("c{}", self.name % 4), "cluster": Value::Object(c)})
    }
}

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any bytes.
    Raw(Vec<u8>),
    /// A kubeconfig made of entries, contexts pairing them, and which context to use.
    Built {
        users: Vec<User>,
        clusters: Vec<Cluster>,
        contexts: Vec<(u8, u8, u8)>,
        current: Option<u8>,
        asked: Option<u8>,
    },
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

fuzz_target!(|input: Input| {
    let secret = KubeconfigSecret::new("operators", "remote");
    let (bytes, local, secret) = match &input {
        Input::Raw(bytes) => (bytes.clone(), None, secret),
        Input::Built {
            users,
            clusters,
            contexts,
            current,
            asked,
        } => {
            let kubeconfig = json!({
                "apiVersion": "v1",
                "kind": "Config",
                "users": users.iter().map(User::json).collect::<Vec<_>>(),
                "clusters": clusters.iter().map(Cluster::json).collect::<Vec<_>>(),
                "contexts": contexts.iter().map(|(n, c, u)| json!({
                    "name": format!("x{}", n % 4),
                    "context": {"cluster": format!("c{}", c % 4), "user": format!("u{}", u % 4)},
                })).collect::<Vec<_>>(),
                "current-context": current.map(|n| format!("x{}", n % 4)).unwrap_or_default(),
            });
            let local = users.iter().any(User::local) || clusters.iter().any(|c| c.ca_file.is_some());
            let secret = match asked {
                Some(n) => secret.context(format!("x{}", n % 4)),
                None => secret,
            };
            (kubeconfig.to_string().into_bytes(), Some(local), secret)
        }
    };
    let result = runtime().block_on(kubeconfig_from_secret(secret, &bytes));
    if local == Some(true) {
        assert!(result.is_err(), "a local credential was accepted: {input:?}");
    }
    if let Ok(config) = result {
        let a = &config.auth_info;
        assert!(a.exec.is_none(), "{input:?}");
        assert!(a.auth_provider.is_none(), "{input:?}");
        assert!(a.token_file.is_none(), "{input:?}");
        assert!(a.client_certificate.is_none(), "{input:?}");
        assert!(a.client_key.is_none(), "{input:?}");
    }
});
