//! Stored objects: an object's JSON value with its bytes (serialized once per write and shared by every
//! reader and watcher), references to stored objects, reading an object through another apiVersion, and
//! the accessors of `metadata` that the other files use.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::conversion::view;
use super::error::ApiError;
use super::kinds::{Gr, Kind};

/// A stored object: its JSON value and its serialized bytes (serialized once per write).
#[derive(Debug, Clone)]
pub(super) struct Obj {
    pub(super) value: Arc<Value>,
    pub(super) bytes: Bytes,
}

impl Obj {
    /// An object and its serialized form (serialized once, shared with every watcher).
    pub(super) fn new(value: Value) -> Self {
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Obj {
            value: Arc::new(value),
            bytes,
        }
    }
}

/// Reference to a stored object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ObjRef {
    pub(super) gr: Gr,
    pub(super) ns: String,
    pub(super) name: String,
}

/// Serialized bytes of an object as seen through `kind`'s version (custom resources served in
/// several versions are stored once, and converted when read through another version; see
/// `conversion.rs`).
pub(super) fn render(value: &Value, bytes: &Bytes, kind: &Kind) -> Result<Bytes, ApiError> {
    Ok(match view(kind, value)? {
        Cow::Borrowed(_) => bytes.clone(),
        Cow::Owned(v) => Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
    })
}

/// The object's `metadata`, if it is an object.
pub(super) fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

/// A string field of the object's `metadata`.
pub(super) fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    meta(v).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// The object's `metadata`, made an (empty) object first if it is not one.
pub(super) fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    v["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_through_another_api_version_rewrites_only_that() {
        let obj = Obj::new(json!({"apiVersion": "x.io/v1", "kind": "K", "spec": {"a": 1}}));
        let same = render(&obj.value, &obj.bytes, &Kind::plain("x.io", "v1", "K")).unwrap();
        assert_eq!(
            same.as_ptr(),
            obj.bytes.as_ptr(),
            "the stored bytes are shared"
        );
        let other: Value = serde_json::from_slice(
            &render(&obj.value, &obj.bytes, &Kind::plain("x.io", "v2", "K")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            other,
            json!({"apiVersion": "x.io/v2", "kind": "K", "spec": {"a": 1}})
        );
    }

    #[test]
    fn metadata_accessors() {
        let mut v = json!({"metadata": {"name": "a", "generation": 1}});
        assert_eq!(meta_str(&v, "name"), Some("a"));
        assert_eq!(meta_str(&v, "generation"), None);
        meta_mut(&mut v).insert("uid".into(), json!("u"));
        assert_eq!(v["metadata"]["uid"], "u");
        let mut broken = json!({"metadata": "not an object"});
        assert!(meta(&broken).is_none());
        meta_mut(&mut broken).insert("name".into(), json!("b"));
        assert_eq!(broken, json!({"metadata": {"name": "b"}}));
    }
}
