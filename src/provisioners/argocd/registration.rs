//! Cluster registrations: Argo CD's declarative cluster Secrets, each named by a hash of the
//! exact id, marked as this driver's, and shared by their users (read-modify-write under
//! resourceVersion preconditions).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Preconditions};

use super::{ArgoCd, IN_CLUSTER_SERVER, SECRET_TYPE_LABEL, dns_label};
use crate::names::OperatorNames;
use crate::provisioners::cd::{CdError, ClusterRegistration, label_value, labels};

/// The keys with which the driver marks a cluster Secret as a registration it wrote, under one
/// domain: the cluster label (`app.<domain>/cluster`), the annotation that lists its users (a
/// JSON array of strings, `app.<domain>/users`) and the one that holds the exact id of the
/// registration (`app.<domain>/cluster-id`). The label and the id together mark the Secrets
/// this driver wrote, the only ones it updates or deletes.
#[derive(Clone, Debug)]
pub(super) struct Marks {
    pub(super) cluster: String,
    pub(super) users: String,
    pub(super) id: String,
}

impl Marks {
    pub(super) fn under(names: &OperatorNames) -> Self {
        let p = names.app_label_prefix();
        Self {
            cluster: format!("{p}{}", labels::CLUSTER),
            users: format!("{p}users"),
            id: format!("{p}cluster-id"),
        }
    }

    /// Whether `s` carries these marks of a registration of exactly `id`.
    pub(super) fn mark(&self, s: &Secret, id: &str) -> bool {
        s.labels().get(&self.cluster) == Some(&label_value(id))
            && s.annotations().get(&self.id).map(String::as_str) == Some(id)
    }
}

/// How often a registration update is retried when another user changed the Secret meanwhile.
const CONFLICT_RETRIES: usize = 5;

impl ArgoCd {
    /// The marks of both domains, the current one first.
    fn all_marks(&self) -> impl Iterator<Item = &Marks> {
        std::iter::once(&self.marks).chain(&self.former)
    }

    /// Whether `s` is a registration of exactly `id` that this driver wrote (under either
    /// domain).
    fn is_registration_of(&self, s: &Secret, id: &str) -> bool {
        self.all_marks().any(|m| m.mark(s, id))
    }

    /// Whether `s`, under the old name, registers exactly `id` (its data names it) and has no id
    /// annotation (a Secret with one is a current registration, never a legacy one).
    fn is_legacy_of(&self, s: &Secret, id: &str) -> bool {
        self.all_marks()
            .any(|m| s.labels().get(&m.cluster) == Some(&label_value(id)))
            && !self
                .all_marks()
                .any(|m| s.annotations().contains_key(&m.id))
            && s.data
                .as_ref()
                .and_then(|d| d.get("name"))
                .is_some_and(|n| n.0 == id.as_bytes())
    }

    /// The users a registration Secret lists (under either domain).
    pub(super) fn users_of(&self, secret: &Secret) -> BTreeSet<String> {
        self.all_marks()
            .filter_map(|m| secret.annotations().get(&m.users))
            .filter_map(|v| serde_json::from_str::<BTreeSet<String>>(v).ok())
            .flatten()
            .collect()
    }

    /// The name earlier versions gave the Secret of `id` (without the hash); a registration
    /// found there is moved to [`ArgoCd::cluster_secret_name`].
    fn legacy_secret_name(id: &str) -> String {
        format!("cluster-{}", dns_label(id))
    }

    /// Read-modify-write of the registration Secret of `id`, retried on conflicts: `change`
    /// edits the current users (empty when the Secret does not exist); with `registration`,
    /// the Secret is created or updated to it, and without, it is deleted once no user is left.
    pub(super) async fn update_registration(
        &self,
        id: &str,
        registration: Option<&ClusterRegistration>,
        change: impl Fn(&mut BTreeSet<String>),
    ) -> Result<(), CdError> {
        if let Some(r) = registration {
            refuse_in_cluster(id, &r.server)?;
        }
        let name = Self::cluster_secret_name(id);
        let api = self.secrets();
        let mut last = None;
        for _ in 0..CONFLICT_RETRIES {
            let mut current = api.get_opt(&name).await?;
            if let Some(s) = &current
                && !self.is_registration_of(s, id)
            {
                if registration.is_none() {
                    // Nothing of ours is there to unregister; theirs is left alone.
                    return Ok(());
                }
                return Err(CdError::NotOurs {
                    object: format!("Secret {}/{name}", self.namespace),
                    why: format!("it does not carry the registration marks of cluster {id}"),
                });
            }
            // A registration under the name earlier versions used: its users move here.
            let legacy = match current {
                Some(_) => None,
                None => self.legacy_registration(id).await?,
            };
            let mut users = current
                .as_ref()
                .or(legacy.as_ref())
                .map(|s| self.users_of(s))
                .unwrap_or_default();
            let before = users.clone();
            change(&mut users);
            if let Some(r) = registration
                && current.as_ref().is_none_or(|s| !same_server(s, &r.server))
            {
                self.refuse_taken_server(id, &name, &r.server).await?;
            }
            if current.is_none() && legacy.is_some() && registration.is_none() {
                // Unregistering a registration kept under its old name: it is updated there, as
                // the Secret it is.
                current = legacy.clone();
            }
            let result = match (current, registration) {
                // Unregistering what is not registered.
                (None, None) => return Ok(()),
                (Some(s), _) if users.is_empty() => {
                    api.delete(&s.name_any(), &exactly(&s)).await.map(|_| ())
                }
                (None, Some(r)) => {
                    let secret = self.registration_secret(&name, id, r, &users)?;
                    match api.create(&self.post_params(), &secret).await {
                        Ok(_) => match &legacy {
                            Some(old) => self.delete_exactly(old).await,
                            None => Ok(()),
                        },
                        Err(e) => Err(e),
                    }
                }
                (Some(mut s), r) => {
                    // Only a registration rewrites the data; an unregistration keeps it.
                    let wanted = r
                        .map(|r| self.registration_secret(&name, id, r, &users))
                        .transpose()?;
                    let same_data = wanted.as_ref().is_none_or(|w| same_data(&s, w));
                    let current_marks = self.marks.mark(&s, id);
                    if users == before && same_data && current_marks {
                        return Ok(());
                    }
                    if let Some(wanted) = wanted {
                        s.string_data = wanted.string_data;
                        s.data = None;
                    }
                    // The marks of the former domain move to the current one.
                    if let Some(f) = &self.former {
                        s.labels_mut().remove(&f.cluster);
                        s.annotations_mut()
                            .retain(|k, _| *k != f.users && *k != f.id);
                    }
                    s.labels_mut()
                        .insert(self.marks.cluster.clone(), label_value(id));
                    s.annotations_mut()
                        .insert(self.marks.users.clone(), users_value(&users));
                    s.annotations_mut()
                        .insert(self.marks.id.clone(), id.to_string());
                    api.replace(&s.name_any(), &self.post_params(), &s)
                        .await
                        .map(|_| ())
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    last = Some(kube::Error::Api(s));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(last
            .map(CdError::Api)
            .unwrap_or_else(|| CdError::Invalid(format!("registration {name} kept changing"))))
    }
}

impl ArgoCd {
    /// The registration of `id` under the name earlier versions used, when it is one: the
    /// cluster label and the exact id in its data (the old name was shared by ids that read
    /// alike; only the one whose data names this id is taken).
    async fn legacy_registration(&self, id: &str) -> Result<Option<Secret>, CdError> {
        let old = self
            .secrets()
            .get_opt(&Self::legacy_secret_name(id))
            .await?;
        Ok(old.filter(|s| self.is_legacy_of(s, id)))
    }

    /// Delete `secret`, and only that object (its uid and resourceVersion as preconditions).
    async fn delete_exactly(&self, secret: &Secret) -> Result<(), kube::Error> {
        match self
            .secrets()
            .delete(&secret.name_any(), &exactly(secret))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Refuse registering `server` for `id` when another cluster Secret than `ours` registers it
    /// already (Argo CD keys clusters by server: a second registration would take it over).
    async fn refuse_taken_server(&self, id: &str, ours: &str, server: &str) -> Result<(), CdError> {
        let lp = ListParams::default().labels(&format!("{SECRET_TYPE_LABEL}=cluster"));
        let legacy = Self::legacy_secret_name(id);
        for s in self.secrets().list(&lp).await? {
            let name = s.name_any();
            if name == ours || (name == legacy && self.is_legacy_of(&s, id)) {
                continue;
            }
            if same_server(&s, server) {
                // The other registration's name stays in the log: the message reaches the
                // status of an object whose author may not know of it.
                tracing::warn!(
                    cluster = id, secret = %format!("{}/{name}", self.namespace),
                    "refusing a registration of a server another Secret registers"
                );
                return Err(CdError::NotRegistrable {
                    id: id.to_string(),
                    why: "its server is registered already by another cluster Secret".into(),
                });
            }
        }
        Ok(())
    }
}

/// Delete parameters that delete `secret` as read and nothing else (its uid and
/// resourceVersion as preconditions).
fn exactly(secret: &Secret) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: secret.resource_version(),
            uid: secret.uid(),
        }),
        ..DeleteParams::default()
    }
}

/// Whether cluster Secret `s` registers `server` (trailing slashes aside).
fn same_server(s: &Secret, server: &str) -> bool {
    let norm = |v: &str| v.trim_end_matches('/').to_ascii_lowercase();
    let stored = s
        .data
        .as_ref()
        .and_then(|d| d.get("server"))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get("server"))
                .cloned()
        });
    stored.is_some_and(|v| norm(&v) == norm(server))
}

/// Refuse Argo CD's own in-cluster address (any name of the `kubernetes` Service of the
/// `default` namespace): a registration of it would replace Argo CD's own cluster.
fn refuse_in_cluster(id: &str, server: &str) -> Result<(), CdError> {
    let host = server
        .trim()
        .to_ascii_lowercase()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_string();
    let in_cluster = ["kubernetes.default.svc", "kubernetes.default", "kubernetes"]
        .iter()
        .any(|n| {
            host == *n
                || host.strip_prefix(n).is_some_and(|rest| {
                    rest.starts_with(".cluster.local") || rest == ".svc.cluster.local"
                })
        });
    if in_cluster {
        return Err(CdError::NotRegistrable {
            id: id.to_string(),
            why: format!("its server is Argo CD's own in-cluster address ({IN_CLUSTER_SERVER})"),
        });
    }
    Ok(())
}

fn users_value(users: &BTreeSet<String>) -> String {
    serde_json::to_string(users).expect("a set of strings serialises")
}

impl ArgoCd {
    /// The registration Secret `name` of `id` for `r`, listing `users`, with the current marks.
    pub(super) fn registration_secret(
        &self,
        name: &str,
        id: &str,
        r: &ClusterRegistration,
        users: &BTreeSet<String>,
    ) -> Result<Secret, CdError> {
        let config = serde_json::to_string(&r.config)
            .map_err(|e| CdError::Invalid(format!("cluster config of {id}: {e}")))?;
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([
                    (SECRET_TYPE_LABEL.to_string(), "cluster".to_string()),
                    (self.marks.cluster.clone(), label_value(id)),
                ])),
                annotations: Some(BTreeMap::from([
                    (self.marks.users.clone(), users_value(users)),
                    (self.marks.id.clone(), id.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".into()),
            string_data: Some(BTreeMap::from([
                ("name".to_string(), id.to_string()),
                ("server".to_string(), r.server.clone()),
                ("config".to_string(), config),
            ])),
            ..Secret::default()
        })
    }
}

/// Whether `current` (as stored: `data`) holds the `string_data` of `wanted`.
fn same_data(current: &Secret, wanted: &Secret) -> bool {
    let data = current.data.clone().unwrap_or_default();
    let wanted = wanted.string_data.clone().unwrap_or_default();
    data.len() == wanted.len()
        && wanted
            .iter()
            .all(|(k, v)| data.get(k).is_some_and(|d| d.0 == v.as_bytes()))
}
