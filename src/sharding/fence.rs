//! The fenced clients: one per shard, each refusing writes while this replica does not hold its
//! shard. The actors give a reconcile of an object the client of the object's shard (for the
//! provisioners' context and for the runtime's own writes), so a reconcile that outlives its shard
//! cannot change anything, whatever it runs. Also the rewriting client both they and the
//! server-side shard selection are built on.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;

use super::Shards;

/// A write of a reconcile of an object whose shard this replica does not hold (any more): refused
/// before it was sent. It reaches a provisioner as [`kube::Error::Service`].
#[derive(Debug, thiserror::Error)]
#[error("shard {0} is not held by this replica: the write was refused")]
pub struct ShardNotHeld(pub u32);

/// A client that passes each request through `rewrite` (which may change it, or refuse it with
/// an error the caller sees as [`kube::Error::Service`]) and then sends it with `base`.
pub(crate) fn rewriting_client<F>(base: &Client, rewrite: F) -> Client
where
    F: Fn(Request<Body>) -> Result<Request<Body>, tower::BoxError> + Clone + Send + 'static,
{
    let rewriting = Rewriting {
        inner: base.clone(),
        rewrite,
    };
    Client::new(rewriting, base.default_namespace())
}

/// The service of [`rewriting_client`].
#[derive(Clone)]
struct Rewriting<F> {
    inner: Client,
    rewrite: F,
}

impl<F> tower::Service<Request<Body>> for Rewriting<F>
where
    F: Fn(Request<Body>) -> Result<Request<Body>, tower::BoxError> + Clone + Send + 'static,
{
    type Response = Response<Body>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, tower::BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let req = (self.rewrite)(req);
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(req?).await.map_err(Into::into) })
    }
}

/// One client per shard, in shard order, each in front of `base`, each refusing writes while
/// this replica does not hold its shard (checked as the request leaves, not when the reconcile
/// started).
pub(crate) fn fenced_clients(base: &Client, shards: &Arc<Shards>) -> Vec<Arc<Client>> {
    (0..shards.count())
        .map(|shard| {
            let shards = shards.clone();
            let fenced = rewriting_client(base, move |req| {
                let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
                if !reads && !shards.holds(shard) {
                    return Err(Box::new(ShardNotHeld(shard)));
                }
                Ok(req)
            });
            Arc::new(fenced)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ApiServer;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test]
    async fn writes_are_refused_while_the_shard_is_not_held_reads_reconcile() {
        let cluster = ApiServer::new();
        let shards = Arc::new(Shards::new(2));
        let clients = fenced_clients(&cluster.client(), &shards);
        let api: Api<ConfigMap> = Api::namespaced(Client::clone(&clients[1]), "default");
        let cm = |name: &str| ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = api
            .create(&PostParams::default(), &cm("a"))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("shard 1 is not held"),
            "refused with a clear error: {e}"
        );
        assert!(
            api.list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        shards.hold_until(1, Instant::now() + Duration::from_secs(60));
        api.create(&PostParams::default(), &cm("a")).await.unwrap();
        // Shard 0's client is still fenced.
        let other: Api<ConfigMap> = Api::namespaced(Client::clone(&clients[0]), "default");
        assert!(
            other
                .create(&PostParams::default(), &cm("b"))
                .await
                .is_err()
        );
        shards.lose(1);
        assert!(api.create(&PostParams::default(), &cm("c")).await.is_err());
        assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
    }
}
