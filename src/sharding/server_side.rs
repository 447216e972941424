//! Server-side sharded lists and watches ([`ShardWatch::ServerSide`](super::ShardWatch::ServerSide)):
//! the API server sends a replica only the objects of the shards it holds.
//!
//! Kubernetes 1.36 added the `shardSelector` list option (alpha, feature gate
//! `ShardedListAndWatch`): `shardRange(object.metadata.uid, '<start>', '<end>')` terms joined by
//! `||` select the objects whose uid's 64-bit FNV-1a hash falls in one of the half-open ranges,
//! on lists and watches alike, and a list answer of a built-in kind names the selector it
//! applied in `metadata.shardInfo` (a custom resource's list answer does not: its list type has
//! no such field). A server without the gate ignores the option and answers with every object
//! and no `shardInfo`; [`probe`] tells the two apart by listing the shard Leases.
//!
//! In this mode shard `i` of `n` is the `i`-th of `n` equal ranges of the hash space
//! ([`shard_of_uid`]), so the server's selection and the runtime's placement agree object by
//! object. kube's `watcher::Config` has no field for the option, so [`selecting_client`] puts it
//! on every read request of the client the watch uses.

use http::{Method, Uri};
use kube::Client;

/// The shard of an object whose uid is `uid`, of `shards`: which of `shards` equal ranges of
/// the 64-bit space its FNV-1a hash falls in (the ranges a replica asks the server for with
/// [`ShardWatch::ServerSide`](super::ShardWatch::ServerSide)).
///
/// ```
/// use actorcile::sharding::shard_of_uid;
/// let shard = shard_of_uid("6f1f0a4e-8c2b-4b7e-9a55-0d3c2e1f7a10", 12);
/// assert!(shard < 12);
/// ```
pub fn shard_of_uid(uid: &str, shards: u32) -> u32 {
    let shards = u128::from(shards.max(1));
    ((u128::from(super::fnv1a(uid)) * shards) >> 64) as u32
}

/// The first hash of shard `shard` of `shards` (`2^64` for `shard == shards`): the smallest `h`
/// with `h × shards ≥ shard × 2^64`, so that `h` is in shard `shard` exactly when
/// [`shard_of_uid`] says so.
fn range_start(shard: u32, shards: u32) -> u128 {
    let shards = u128::from(shards.max(1));
    (u128::from(shard) << 64).div_ceil(shards)
}

/// A bound as the server reads it: `0x` and 16 lowercase hex digits, or `0x10000000000000000`
/// for `2^64` (the server compares bounds as strings of equal length).
fn hex(bound: u128) -> String {
    format!("0x{bound:016x}")
}

/// The `shardSelector` of the objects of the `held` shards of `shards`: one `shardRange` per run
/// of consecutive shards. `None` when every shard is held (no selector: everything) or none is
/// (the server cannot be asked for nothing; the caller does not watch).
pub(crate) fn selector(held: &[u32], shards: u32) -> Option<String> {
    let mut held: Vec<u32> = held.iter().copied().filter(|s| *s < shards).collect();
    held.sort_unstable();
    held.dedup();
    if held.is_empty() || held.len() == shards as usize {
        return None;
    }
    let mut terms = Vec::new();
    let mut i = 0;
    while i < held.len() {
        let first = held[i];
        let mut last = first;
        while i + 1 < held.len() && held[i + 1] == last + 1 {
            i += 1;
            last = held[i];
        }
        terms.push(format!(
            "shardRange(object.metadata.uid, '{}', '{}')",
            hex(range_start(first, shards)),
            hex(range_start(last + 1, shards))
        ));
        i += 1;
    }
    Some(terms.join(" || "))
}

/// Whether a list answer (its JSON) was filtered by a shard selector: it carries
/// `metadata.shardInfo.selector`.
pub(crate) fn server_applies(list: &serde_json::Value) -> bool {
    list.pointer("/metadata/shardInfo/selector")
        .and_then(|s| s.as_str())
        .is_some_and(|s| !s.is_empty())
}

/// `uri` with `shardSelector=<selector>` added to its query.
fn with_selector(uri: &Uri, selector: &str) -> Result<Uri, tower::BoxError> {
    let param: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("shardSelector", selector)
        .finish();
    let path = uri.path();
    let path_and_query = match uri.query() {
        Some(q) if !q.is_empty() => format!("{path}?{q}&{param}"),
        _ => format!("{path}?{param}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse()?);
    Ok(Uri::from_parts(parts)?)
}

/// A client whose lists and watches (every `GET`) ask the server for `selector`'s objects only.
pub(crate) fn selecting_client(base: &Client, selector: String) -> Client {
    super::fence::rewriting_client(base, move |mut req| {
        if *req.method() == Method::GET {
            *req.uri_mut() = with_selector(req.uri(), &selector)?;
        }
        Ok(req)
    })
}

/// Asks the server for one object of `url` (a collection of a built-in kind) through `client`
/// with `selector`, and tells whether the answer says the selector was applied. `Err` when the
/// list failed.
pub(crate) async fn probe(client: &Client, url: &str, selector: &str) -> Result<bool, kube::Error> {
    let list = kube::api::ListParams::default().limit(1);
    let req = kube::core::Request::new(url)
        .list(&list)
        .map_err(kube::Error::BuildRequest)?;
    let client = selecting_client(client, selector.to_string());
    let answer: serde_json::Value = client.request(req).await?;
    Ok(server_applies(&answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shard of a hash as the server decides it: the term whose range holds it.
    fn served_shard(hash: u64, shards: u32) -> u32 {
        (0..shards)
            .find(|s| {
                let h = u128::from(hash);
                range_start(*s, shards) <= h && h < range_start(s + 1, shards)
            })
            .unwrap()
    }

    #[test]
    fn ranges_cover_the_hash_space_and_agree_with_shard_of_uid() {
        for shards in [1, 2, 3, 7, 12, 64, 1000] {
            assert_eq!(range_start(0, shards), 0);
            assert_eq!(range_start(shards, shards), 1u128 << 64);
            for s in 0..shards {
                assert!(range_start(s, shards) < range_start(s + 1, shards));
            }
            for uid in ["", "a", "6f1f0a4e-8c2b-4b7e-9a55-0d3c2e1f7a10", "zzzz"] {
                let h = crate::hash::fnv1a(uid);
                assert_eq!(shard_of_uid(uid, shards), served_shard(h, shards), "{uid}");
            }
            // The edges: the first and last hash of every range.
            for s in 0..shards {
                let first = range_start(s, shards);
                let last = range_start(s + 1, shards) - 1;
                for h in [first, last] {
                    let by_mul = ((h * u128::from(shards)) >> 64) as u32;
                    assert_eq!(by_mul, s, "hash {h:#x} of {shards}");
                }
            }
        }
    }

    #[test]
    fn the_selector_joins_runs_of_held_shards() {
        assert_eq!(selector(&[], 4), None);
        assert_eq!(selector(&[0, 1, 2, 3], 4), None);
        assert_eq!(
            selector(&[1], 4).unwrap(),
            "shardRange(object.metadata.uid, '0x4000000000000000', '0x8000000000000000')"
        );
        assert_eq!(
            selector(&[3, 0, 1], 4).unwrap(),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || \
             shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
        );
        // Not a power of two: bounds rounded up, so each hash is in one range only.
        assert_eq!(
            selector(&[1], 3).unwrap(),
            "shardRange(object.metadata.uid, '0x5555555555555556', '0xaaaaaaaaaaaaaaab')"
        );
    }

    #[test]
    fn the_selector_goes_on_the_query() {
        let uri: Uri = "https://h/apis/g/v1/things?watch=true&labelSelector=a%3Db"
            .parse()
            .unwrap();
        let with = with_selector(&uri, "shardRange(object.metadata.uid, '0x0', '0x1')").unwrap();
        assert_eq!(
            with.to_string(),
            "https://h/apis/g/v1/things?watch=true&labelSelector=a%3Db&shardSelector=\
             shardRange%28object.metadata.uid%2C+%270x0%27%2C+%270x1%27%29"
        );
        let bare: Uri = "/api/v1/pods".parse().unwrap();
        assert!(
            with_selector(&bare, "x")
                .unwrap()
                .to_string()
                .ends_with("/api/v1/pods?shardSelector=x")
        );
    }

    #[test]
    fn only_an_answer_that_names_its_selector_was_filtered() {
        let filtered =
            serde_json::json!({"metadata": {"shardInfo": {"selector": "shardRange(..)"}}});
        assert!(server_applies(&filtered));
        assert!(!server_applies(&serde_json::json!({"metadata": {}})));
        assert!(!server_applies(
            &serde_json::json!({"metadata": {"shardInfo": {"selector": ""}}})
        ));
        assert!(!server_applies(&serde_json::json!([])));
    }
}
