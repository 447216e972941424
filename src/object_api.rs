//! A typed object API that works for namespaced and cluster-scoped kinds alike.
//!
//! kube 5's `Api<K>` checks a kind's scope at compile time (`Api::namespaced` needs
//! `K: Resource<Scope = NamespaceResourceScope>`), which a runtime generic over every kind cannot
//! name. This wrapper builds the same requests with kube's own `Request` builder from
//! `K::url_path(&(), namespace)` and sends them through the same `Client`.
//!
//! Also the helpers every write of the runtime's own shares: its patch parameters, and
//! [`bounded`], the policy's `write_timeout` around it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::api::{DeleteParams, GetParams, Patch, PatchParams};
use kube::core::Request;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `metadata.resourceVersion` as a number. Kubernetes calls resource versions opaque, but every
/// real server (etcd revisions) and the in-process cluster use integers; the runtime only uses
/// this to tell its own writes' echoes from newer changes and never fails when it is not one.
pub(crate) fn version_of<K: Resource>(obj: &K) -> Option<u64> {
    meta_version(obj.meta())
}

/// [`version_of`] of an object's metadata (an object the kind's type cannot hold has no `K`).
pub(crate) fn meta_version(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// Patch parameters that name `field_manager`: every write of the runtime carries its own.
pub(crate) fn patch_params(field_manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(field_manager.to_string()),
        ..PatchParams::default()
    }
}

/// Whether `K` is cluster-scoped. k8s-openapi's scopes are marker types without methods, and a
/// `TypeId` comparison would need `K::Scope: 'static` bounds everywhere; the type's name is
/// enough to tell the two concrete scopes apart.
pub(crate) fn is_cluster_scoped<K: Resource>() -> bool {
    std::any::type_name::<K::Scope>().ends_with("ClusterResourceScope")
}

/// How the runtime builds a kind's [`Api`](kube::Api) from the kind's scope (`K::Scope`):
/// kube's `Api::namespaced` checks at compile time that a kind is namespaced, which code generic
/// over every kind cannot, so each of kube's three scopes says how. Every
/// [`ManagedResource`](crate::ManagedResource)'s scope implements it.
pub trait KindScope: kube::core::ResourceScope {
    /// An `Api` of `K` in `namespace`, or in every namespace for `None` (a cluster-scoped kind
    /// has no namespace: `namespace` is ignored).
    fn api<K>(client: Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>;
}

impl KindScope for kube::core::NamespaceResourceScope {
    fn api<K>(client: Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => kube::Api::namespaced(client, ns),
            None => kube::Api::all(client),
        }
    }
}

impl KindScope for kube::core::ClusterResourceScope {
    fn api<K>(client: Client, _namespace: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        kube::Api::all(client)
    }
}

impl KindScope for kube::core::DynamicResourceScope {
    fn api<K>(client: Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => kube::Api::namespaced_with(client, ns, &()),
            None => kube::Api::all_with(client, &()),
        }
    }
}

/// An `Api` of the managed kind `K` in `namespace` (every namespace: `None`).
pub(crate) fn kind_api<K: crate::ManagedResource>(
    client: Client,
    namespace: Option<&str>,
) -> kube::Api<K> {
    <K::Scope as KindScope>::api(client, namespace)
}

/// A write of the runtime's own that the API server did not answer within the policy's
/// `write_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {0:?} (the policy's write_timeout)")]
pub(crate) struct WriteTimedOut(pub(crate) Duration);

/// `write`, abandoned once it has waited `limit` for its answer: it then fails as a
/// transient error ([`kube::Error::Service`] with a [`WriteTimedOut`]), which every caller
/// already retries. Without a bound, a request would hold its object, and its actor, for as long
/// as kube's client retries it (429, 503 and 504 answers, for minutes in all) or, for a request
/// the server never answers, for good (the client sets no read timeout).
/// Each abandoned write counts one in `timeouts` (the runtime's `write_timeouts`).
pub(crate) async fn bounded<T, E: From<kube::Error>>(
    limit: Option<Duration>,
    timeouts: &AtomicU64,
    write: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let Some(limit) = limit else {
        return write.await;
    };
    match tokio::time::timeout(limit, write).await {
        Ok(answered) => answered,
        Err(_) => {
            timeouts.fetch_add(1, Ordering::Relaxed);
            Err(kube::Error::Service(Box::new(WriteTimedOut(limit))).into())
        }
    }
}

/// Whether the API server serves `K`'s status subresource: its discovery document lists
/// `<plural>/status` (a CRD has one only with `subresources: {status: {}}`).
pub(crate) async fn serves_status<K: Resource<DynamicType = ()>>(
    client: &Client,
) -> Result<bool, kube::Error> {
    let resources = if K::group(&()).is_empty() {
        client.list_core_api_resources(&K::version(&())).await?
    } else {
        client
            .list_api_group_resources(&K::api_version(&()))
            .await?
    };
    let status = format!("{}/status", K::plural(&()));
    Ok(resources.resources.iter().any(|r| r.name == status))
}

/// Typed requests for one kind in one namespace (or cluster scope).
pub(crate) struct ObjectApi<K> {
    client: Client,
    request: Request,
    _k: std::marker::PhantomData<fn() -> K>,
}

impl<K> ObjectApi<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    /// The API for `namespace` (ignored for cluster-scoped kinds).
    pub(crate) fn new(client: Client, namespace: Option<&str>) -> Self {
        let namespace = if is_cluster_scoped::<K>() {
            None
        } else {
            namespace
        };
        Self {
            client,
            request: Request::new(K::url_path(&(), namespace)),
            _k: std::marker::PhantomData,
        }
    }

    pub(crate) async fn patch<P: Serialize + std::fmt::Debug>(
        &self,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, kube::Error> {
        let req = self
            .request
            .patch(name, pp, patch)
            .map_err(kube::Error::BuildRequest)?;
        self.client.request(req).await
    }

    pub(crate) async fn patch_status<P: Serialize + std::fmt::Debug>(
        &self,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, kube::Error> {
        let req = self
            .request
            .patch_subresource("status", name, pp, patch)
            .map_err(kube::Error::BuildRequest)?;
        self.client.request(req).await
    }

    pub(crate) async fn create<P: Serialize>(&self, obj: &P) -> Result<K, kube::Error> {
        let body = serde_json::to_vec(obj).map_err(kube::Error::SerdeError)?;
        let req = self
            .request
            .create(&kube::api::PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        self.client.request(req).await
    }

    pub(crate) async fn get_opt(&self, name: &str) -> Result<Option<K>, kube::Error> {
        let req = self
            .request
            .get(name, &GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        match self.client.request(req).await {
            Ok(o) => Ok(Some(o)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Delete. `Ok(true)` when the server answered with a success `Status`: the object is gone
    /// (kube-apiserver answers so for most kinds once it deleted the object at once).
    /// `Ok(false)` when it answered with the object: marked for deletion (finalizers, grace
    /// period), or gone but of a kind that answers with the deleted object (pods, namespaces,
    /// CRDs); look again to tell.
    pub(crate) async fn delete(&self, name: &str, dp: &DeleteParams) -> Result<bool, kube::Error> {
        let req = self
            .request
            .delete(name, dp)
            .map_err(kube::Error::BuildRequest)?;
        self.client
            .request_status::<serde_json::Value>(req)
            .await
            .map(|answer| answer.is_right())
    }
}
