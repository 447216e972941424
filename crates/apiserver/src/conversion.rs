//! CRD conversion called in process: a CRD with a hook registered for its group and kind
//! ([`ApiServer::register_conversion`]; the registration stands for the CRD's `conversion`
//! stanza, whose address the in-process server does not call) stores its objects in its storage
//! version and answers each read in the version asked for, converting by a
//! `ConversionReview` (as JSON, as the real server sends it, but by a call instead of HTTPS).
//!
//! A write in another version is converted to the storage version before it is stored; an object
//! stored in an older storage version is converted when it is read or written, so a write stores
//! it in the current one (as the real server does). A hook that fails, or changes what a conversion
//! must keep (the name, namespace, uid or kind), is a 500 `conversion webhook for … failed: …`.
//! Without a hook every version reads the stored object with only `apiVersion` rewritten
//! (as strategy `None` does).
//!
//! The hook is called with the store locked, so it must be quick and must not call the server:
//! conversions are pure functions of the object.
//!
//! [`ApiServer::register_conversion`]: crate::ApiServer::register_conversion

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use super::error::ApiError;
use super::kinds::Kind;

/// A conversion webhook called in process, with a `ConversionReview`'s JSON; it answers the
/// review with its `response`.
pub trait ConversionHook: Send + Sync + 'static {
    /// The answer to `review`.
    fn convert(&self, review: Vec<u8>) -> Value;
}

impl<F> ConversionHook for F
where
    F: Fn(Vec<u8>) -> Value + Send + Sync + 'static,
{
    fn convert(&self, review: Vec<u8>) -> Value {
        self(review)
    }
}

/// How the versions of one CRD convert: its storage version and the hook.
#[derive(Clone)]
pub(crate) struct Converter {
    /// The storage version's `apiVersion` (`group/version`).
    pub(crate) storage: String,
    pub(crate) hook: Arc<dyn ConversionHook>,
}

impl std::fmt::Debug for Converter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Converter")
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

/// The hooks registered, by (group, kind).
#[derive(Default)]
pub(crate) struct ConversionHooks(HashMap<(String, String), Arc<dyn ConversionHook>>);

impl ConversionHooks {
    pub(crate) fn get(&self, group_kind: &(String, String)) -> Option<&Arc<dyn ConversionHook>> {
        self.0.get(group_kind)
    }

    pub(crate) fn insert(&mut self, group: &str, kind: &str, hook: Arc<dyn ConversionHook>) {
        self.0.insert((group.into(), kind.into()), hook);
    }
}

impl std::fmt::Debug for ConversionHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

static UIDS: AtomicU64 = AtomicU64::new(1);

impl Converter {
    /// `object` in `api_version`, by the hook.
    fn convert(&self, kind: &Kind, object: &Value, api_version: &str) -> Result<Value, ApiError> {
        let uid = format!(
            "in-process-conversion-{}",
            UIDS.fetch_add(1, Ordering::Relaxed)
        );
        let review = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": api_version, "objects": [object]},
        });
        let failed = |why: &str| {
            ApiError::internal(format!(
                "conversion webhook for {}, Kind={} failed: {why}",
                object
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                kind.kind
            ))
        };
        let answer = self
            .hook
            .convert(serde_json::to_vec(&review).unwrap_or_default());
        let response = answer
            .get("response")
            .filter(|r| r.get("uid") == Some(&json!(uid)))
            .ok_or_else(|| failed("the answer has no response for the request's uid"))?;
        if response.pointer("/result/status") != Some(&json!("Success")) {
            let message = response
                .pointer("/result/message")
                .and_then(Value::as_str)
                .unwrap_or("the conversion failed without a message");
            return Err(failed(message));
        }
        let converted = match response.get("convertedObjects").and_then(Value::as_array) {
            Some(objects) if objects.len() == 1 => objects[0].clone(),
            _ => return Err(failed("expected 1 converted object")),
        };
        if converted.get("apiVersion").and_then(Value::as_str) != Some(api_version) {
            return Err(failed(&format!(
                "the converted object is not in the desired version {api_version}"
            )));
        }
        for field in [
            "/kind",
            "/metadata/name",
            "/metadata/namespace",
            "/metadata/uid",
        ] {
            if converted.pointer(field) != object.pointer(field) {
                return Err(failed(&format!("the conversion changed {field}")));
            }
        }
        Ok(converted)
    }
}

/// `object` as read through `kind`'s version: converted by the kind's hook, or with only
/// `apiVersion` rewritten when there is none; borrowed when it is stored in that version.
pub(crate) fn view<'a>(kind: &Kind, object: &'a Value) -> Result<Cow<'a, Value>, ApiError> {
    if object.get("apiVersion").and_then(Value::as_str) == Some(kind.api_version.as_str()) {
        return Ok(Cow::Borrowed(object));
    }
    match &kind.conversion {
        Some(converter) => converter
            .convert(kind, object, &kind.api_version)
            .map(Cow::Owned),
        None => {
            let mut rewritten = object.clone();
            rewritten["apiVersion"] = json!(kind.api_version);
            Ok(Cow::Owned(rewritten))
        }
    }
}

/// `object`, written through `kind`'s version, in the version it is stored in: the storage
/// version when the kind converts, else as written.
pub(crate) fn to_storage(kind: &Kind, object: Value) -> Result<Value, ApiError> {
    match &kind.conversion {
        Some(converter)
            if object.get("apiVersion").and_then(Value::as_str)
                != Some(converter.storage.as_str()) =>
        {
            converter.convert(kind, &object, &converter.storage)
        }
        _ => Ok(object),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::super::store::Store;
    use super::super::testing::*;
    use super::*;

    /// Widgets in v1 (`spec.size`, the storage version) and v2 (`spec.count`), converted by a
    /// hook, which counts its calls.
    fn converting_store(hook: Arc<dyn ConversionHook>) -> (Store, Arc<Kind>, Arc<Kind>) {
        let mut s = store();
        s.register_conversion("example.com", "Widget", hook);
        s.install_crd(open_widget_crd())
            .expect("the widget CRD is valid");
        let v1 = kind(&s, "example.com", "v1", "widgets");
        let v2 = kind(&s, "example.com", "v2", "widgets");
        (s, v1, v2)
    }

    /// Widgets in v1 (the storage version) and v2, keeping any field of their `spec`.
    fn open_widget_crd() -> Value {
        let mut crd = widget_crd(&[("v1", true, true, false), ("v2", true, false, false)]);
        for v in crd["spec"]["versions"].as_array_mut().unwrap() {
            v["schema"]["openAPIV3Schema"]["properties"]["spec"] =
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        }
        crd
    }

    /// v1 `size` ⇄ v2 `count`, as a conversion webhook answers.
    fn size_count(calls: Arc<AtomicUsize>) -> Arc<dyn ConversionHook> {
        Arc::new(move |review: Vec<u8>| {
            calls.fetch_add(1, Ordering::Relaxed);
            let review: Value = serde_json::from_slice(&review).unwrap();
            let desired = review["request"]["desiredAPIVersion"].as_str().unwrap();
            let objects: Vec<Value> = review["request"]["objects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| {
                    let mut o = o.clone();
                    let spec = o["spec"].take();
                    o["spec"] = match desired {
                        "example.com/v2" => json!({"count": spec["size"]}),
                        _ => json!({"size": spec["count"]}),
                    };
                    o["apiVersion"] = json!(desired);
                    o
                })
                .collect();
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                "response": {"uid": review["request"]["uid"], "convertedObjects": objects,
                    "result": {"status": "Success"}}})
        })
    }

    fn v2_widget(name: &str, count: i64) -> Value {
        json!({"apiVersion": "example.com/v2", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"count": count}})
    }

    #[test]
    fn objects_are_stored_in_the_storage_version_and_read_in_the_one_asked_for() {
        let calls = Arc::new(AtomicUsize::new(0));
        let (mut s, v1, v2) = converting_store(size_count(calls.clone()));
        let created = create(&mut s, &v2, Some("default"), v2_widget("w", 3));
        assert_eq!(created["apiVersion"], "example.com/v2");
        assert_eq!(created["spec"], json!({"count": 3}));
        let stored = s.lookup(&Store::objref(&v1, Some("default"), "w")).unwrap();
        assert_eq!(stored.value["apiVersion"], "example.com/v1");
        assert_eq!(stored.value["spec"], json!({"size": 3}));
        assert_eq!(
            get(&s, &v1, Some("default"), "w").unwrap()["spec"],
            json!({"size": 3})
        );
        let before = calls.load(Ordering::Relaxed);
        let as_v2 = get(&s, &v2, Some("default"), "w").unwrap();
        assert_eq!(as_v2["spec"], json!({"count": 3}));
        assert_eq!(calls.load(Ordering::Relaxed), before + 1);
        let before = calls.load(Ordering::Relaxed);
        get(&s, &v1, Some("default"), "w").unwrap();
        assert_eq!(
            calls.load(Ordering::Relaxed),
            before,
            "a read in the storage version calls no hook"
        );
        let list = parse(&s.list(&v2, None, &Default::default()).unwrap());
        assert_eq!(list["items"][0]["spec"], json!({"count": 3}));
    }

    #[test]
    fn an_update_through_another_version_bumps_the_generation_only_when_the_spec_changes() {
        let (mut s, _, v2) = converting_store(size_count(Arc::default()));
        let created = create(&mut s, &v2, Some("default"), v2_widget("w", 3));
        let mut watch = watch_all(&mut s, &v2);
        let same = put(&mut s, &v2, Some("default"), created.clone(), false).unwrap();
        assert_eq!(same["metadata"]["generation"], 1);
        assert_eq!(
            same["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );
        let mut bigger = created;
        bigger["spec"]["count"] = json!(4);
        let updated = put(&mut s, &v2, Some("default"), bigger, false).unwrap();
        assert_eq!(updated["metadata"]["generation"], 2);
        assert_eq!(updated["spec"], json!({"count": 4}));
        let (ty, event) = watch.try_recv().expect("one event, for the change");
        assert_eq!(ty, super::super::watch::EvType::Modified);
        assert_eq!(parse(&event)["spec"], json!({"count": 4}));
        assert!(watch.try_recv().is_err(), "the no-op write sent no event");
    }

    #[test]
    fn a_failing_or_dishonest_hook_is_a_conversion_error() {
        let failing: Arc<dyn ConversionHook> = Arc::new(|review: Vec<u8>| {
            let review: Value = serde_json::from_slice(&review).unwrap();
            json!({"response": {"uid": review["request"]["uid"],
                "result": {"status": "Failure", "message": "no way from here"}}})
        });
        let (mut s, _, v2) = converting_store(failing);
        let error = s
            .create(&v2, Some("default"), v2_widget("w", 1), None)
            .unwrap_err();
        assert_eq!(error.code, 500);
        assert!(
            error.message.ends_with(
                "conversion webhook for example.com/v2, Kind=Widget failed: no way from here"
            ),
            "{}",
            error.message
        );
        assert!(
            get(&s, &v2, Some("default"), "w").is_none(),
            "nothing stored"
        );

        let renaming: Arc<dyn ConversionHook> = Arc::new(|review: Vec<u8>| {
            let review: Value = serde_json::from_slice(&review).unwrap();
            let mut object = review["request"]["objects"][0].clone();
            object["apiVersion"] = review["request"]["desiredAPIVersion"].clone();
            object["metadata"]["name"] = json!("other");
            json!({"response": {"uid": review["request"]["uid"], "convertedObjects": [object],
                "result": {"status": "Success"}}})
        });
        let (mut s, _, v2) = converting_store(renaming);
        let error = s
            .create(&v2, Some("default"), v2_widget("w", 1), None)
            .unwrap_err();
        assert!(
            error
                .message
                .ends_with("the conversion changed /metadata/name"),
            "{}",
            error.message
        );
    }

    #[test]
    fn without_a_hook_versions_only_rewrite_the_api_version() {
        let mut s = store();
        s.register_conversion("example.com", "Gadget", size_count(Arc::default()));
        s.install_crd(widget_crd(&[
            ("v1", true, true, false),
            ("v2", true, false, false),
        ]))
        .unwrap();
        let v1 = kind(&s, "example.com", "v1", "widgets");
        let v2 = kind(&s, "example.com", "v2", "widgets");
        create(
            &mut s,
            &v1,
            Some("default"),
            widget("w", json!({"size": 3})),
        );
        let as_v2 = get(&s, &v2, Some("default"), "w").unwrap();
        assert_eq!(as_v2["apiVersion"], "example.com/v2");
        assert_eq!(as_v2["spec"], json!({"size": 3}));
    }

    #[test]
    fn a_hook_registered_after_the_crd_converts_from_then_on() {
        let mut s = store();
        s.install_crd(open_widget_crd()).unwrap();
        s.register_conversion("example.com", "Widget", size_count(Arc::default()));
        let v1 = kind(&s, "example.com", "v1", "widgets");
        let v2 = kind(&s, "example.com", "v2", "widgets");
        create(
            &mut s,
            &v1,
            Some("default"),
            widget("w", json!({"size": 5})),
        );
        assert_eq!(
            get(&s, &v2, Some("default"), "w").unwrap()["spec"],
            json!({"count": 5})
        );
    }
}
