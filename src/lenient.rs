//! Objects that the API server accepts but the operator's Rust type cannot hold.
//!
//! A value the CRD schema allows and `K` does not (an `integer` without a format where the
//! field is `i32`, a string outside a Rust enum, an object stored under an older schema) must
//! not halt its kind: kube's typed watcher fails a whole list on one such object (no object of
//! the kind converges) and, when lists stream, skips it (so at the next relist it counts as
//! deleted while it still exists). The runtime's watches decode each object as [`Lenient<K>`]
//! instead: the typed object, or its metadata and the path of the field the decoder stopped at
//! ([`Undecodable`]). An undecodable object is *present*: it is cached, it keeps what it holds,
//! and its status says why it is not reconciled.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An object as a watch of kind `K` received it: decoded, or not decodable as `K`.
#[derive(Clone, Debug)]
pub(crate) enum Lenient<K> {
    Decoded(K),
    Undecodable(Box<Undecodable>),
}

/// An object of a kind that could not be decoded as the kind's Rust type: its metadata (without
/// `managedFields`), its status as the runtime reads it, and where decoding failed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Undecodable {
    pub(crate) meta: ObjectMeta,
    /// The object's `status` (the runtime's conditions among it), when it has one the runtime
    /// can read: what the runtime compares its own status with before writing it again.
    pub(crate) status: Option<crate::status::ResourceStatus>,
    /// The path of the field the decoder named (`spec.replicas`, `spec.ports[2].protocol`; `.`
    /// for the object as a whole). Never the value: a Secret's content or a tenant's text must
    /// not reach a status or an Event through it.
    pub(crate) field: String,
}

impl Undecodable {
    /// Why the object is not reconciled, for its status and Event (no value quoted).
    pub(crate) fn message(&self) -> String {
        format!(
            "the operator cannot read this object: the value at `{}` does not fit its type for the kind (the CRD's schema allows values the operator cannot hold, or the object was stored under another schema); it is not reconciled until it is changed to one it can read",
            self.field
        )
    }
}

impl fmt::Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "undecodable at `{}`", self.field)
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta(),
            Lenient::Undecodable(u) => &u.meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta_mut(),
            Lenient::Undecodable(u) => &mut u.meta,
        }
    }
}

/// What is read of an object that `K` cannot hold.
#[derive(Deserialize)]
struct Remains {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<serde_json::Value>,
}

/// `raw` (the JSON of one object) as `K`, or as much of it as says which object it is and
/// where it failed. An error only when even its metadata cannot be read (the API server
/// validates metadata: not an object of any kind).
pub(crate) fn decode<K: DeserializeOwned>(raw: &str) -> Result<Lenient<K>, serde_json::Error> {
    match serde_json::from_str::<K>(raw) {
        Ok(k) => Ok(Lenient::Decoded(k)),
        Err(_) => {
            // The cold path: once more, tracking the path, to name the field.
            let mut de = serde_json::Deserializer::from_str(raw);
            let field = match serde_path_to_error::deserialize::<_, K>(&mut de) {
                Err(e) => e.path().to_string(),
                // Decodes as a whole but not from the text alone: name the object.
                Ok(_) => ".".to_string(),
            };
            let Remains {
                mut metadata,
                status,
            } = serde_json::from_str(raw)?;
            metadata.managed_fields = None;
            let status = status.and_then(|s| serde_json::from_value(s).ok());
            Ok(Lenient::Undecodable(Box::new(Undecodable {
                meta: metadata,
                status,
                field,
            })))
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The object's text as it came (kube decodes lists and watch events from text, so this
        // borrows it): decoded as `K`, and read again on the rare failure.
        let raw = <&serde_json::value::RawValue>::deserialize(d)?;
        decode(raw.get()).map_err(D::Error::custom)
    }
}

impl<K: Serialize> Serialize for Lenient<K> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Lenient::Decoded(k) => k.serialize(s),
            Lenient::Undecodable(u) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("metadata", &u.meta)?;
                m.end()
            }
        }
    }
}

/// A lenient watch's events with the objects `R` cannot hold left out (each logged, naming the
/// field): for watches whose consumers need the typed object (a user's mapper). The watch goes
/// on for every other object.
pub(crate) fn decoded_only<R, E>(
    events: impl futures::Stream<Item = Result<Event<Lenient<R>>, E>>,
) -> impl futures::Stream<Item = Result<Event<R>, E>>
where
    R: kube::Resource<DynamicType = ()>,
{
    use futures::StreamExt;
    events.filter_map(|event| {
        let decoded = |obj: Lenient<R>| match obj {
            Lenient::Decoded(r) => Some(r),
            Lenient::Undecodable(u) => {
                tracing::warn!(
                    kind = %R::kind(&()),
                    namespace = u.meta.namespace.as_deref().unwrap_or(""),
                    name = u.meta.name.as_deref().unwrap_or(""),
                    field = %u.field,
                    "an object cannot be decoded as its type; it is left out of this watch until it can"
                );
                None
            }
        };
        let event = match event {
            Err(e) => Some(Err(e)),
            Ok(Event::Apply(o)) => decoded(o).map(|r| Ok(Event::Apply(r))),
            Ok(Event::InitApply(o)) => decoded(o).map(|r| Ok(Event::InitApply(r))),
            Ok(Event::Delete(o)) => decoded(o).map(|r| Ok(Event::Delete(r))),
            Ok(Event::Init) => Some(Ok(Event::Init)),
            Ok(Event::InitDone) => Some(Ok(Event::InitDone)),
        };
        std::future::ready(event)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
    struct Spec {
        replicas: i32,
        #[serde(default)]
        ports: Vec<Port>,
    }
    #[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
    enum Protocol {
        Tcp,
        Udp,
    }
    #[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
    struct Port {
        protocol: Protocol,
    }
    #[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
    struct Widget {
        metadata: ObjectMeta,
        spec: Spec,
    }

    fn widget(spec: serde_json::Value) -> String {
        serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "team", "uid": "u1", "resourceVersion": "7",
                "generation": 3, "finalizers": ["example.com/finalizer"],
                "managedFields": [{"manager": "kubectl"}]},
            "spec": spec,
            "status": {"phase": "Ready", "conditions": []}
        })
        .to_string()
    }

    #[test]
    fn an_object_the_type_holds_decodes_as_it() {
        let raw = widget(serde_json::json!({"replicas": 2}));
        let Lenient::Decoded(w) = decode::<Widget>(&raw).unwrap() else {
            panic!("decodable")
        };
        assert_eq!(w.spec.replicas, 2);
    }

    #[test]
    fn an_object_the_type_cannot_hold_names_the_field_never_the_value() {
        let cases = [
            (
                serde_json::json!({"replicas": 1_099_511_627_776_i64}),
                "spec.replicas",
            ),
            (
                serde_json::json!({"replicas": "secret-value-1"}),
                "spec.replicas",
            ),
            (
                serde_json::json!({"replicas": 1, "ports": [{"protocol": "Tcp"}, {"protocol": "secret-value-2"}]}),
                "spec.ports[1].protocol",
            ),
            (serde_json::json!({}), "spec"),
        ];
        for (spec, field) in cases {
            let raw = widget(spec.clone());
            let Lenient::Undecodable(u) = decode::<Widget>(&raw).unwrap() else {
                panic!("{spec} is not a Widget")
            };
            assert_eq!(u.field, field, "{spec}");
            assert!(!u.message().contains("secret-value"), "{}", u.message());
            assert!(!u.message().contains("1099511627776"), "{}", u.message());
            assert_eq!(u.meta.name.as_deref(), Some("w"));
            assert_eq!(u.meta.uid.as_deref(), Some("u1"));
            assert_eq!(u.meta.generation, Some(3));
            assert_eq!(
                u.meta.finalizers.as_deref(),
                Some(&["example.com/finalizer".to_string()][..])
            );
            assert!(
                u.meta.managed_fields.is_none(),
                "managedFields are not kept"
            );
            assert!(u.status.is_some());
        }
    }

    #[test]
    fn lists_and_watch_events_decode_each_object_on_its_own() {
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{}},"items":[{},{}]}}"#,
            widget(serde_json::json!({"replicas": 1})),
            widget(serde_json::json!({"replicas": "x"})),
        );
        let list: kube::core::ObjectList<Lenient<Widget>> = serde_json::from_str(&list).unwrap();
        assert!(matches!(list.items[0], Lenient::Decoded(_)));
        assert!(matches!(list.items[1], Lenient::Undecodable(_)));
        let event = format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            widget(serde_json::json!({"replicas": "x"}))
        );
        let event: kube::core::WatchEvent<Lenient<Widget>> = serde_json::from_str(&event).unwrap();
        assert!(matches!(
            event,
            kube::core::WatchEvent::Modified(Lenient::Undecodable(_))
        ));
        // Metadata that no object has: the error it always was.
        assert!(decode::<ConfigMap>(r#"{"metadata":{"name":7}}"#).is_err());
    }

    #[tokio::test]
    async fn a_watch_for_typed_consumers_leaves_out_only_what_does_not_decode() {
        use futures::StreamExt;
        let good = || decode::<ConfigMap>(r#"{"metadata":{"name":"a"},"data":{"k":"v"}}"#).unwrap();
        let bad = || decode::<ConfigMap>(r#"{"metadata":{"name":"b"},"data":{"k":5}}"#).unwrap();
        assert!(matches!(bad(), Lenient::Undecodable(u) if u.field == "data.k"));
        let events: Vec<Result<Event<Lenient<ConfigMap>>, ()>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(bad())),
            Ok(Event::InitApply(good())),
            Ok(Event::InitDone),
            Ok(Event::Apply(bad())),
            Err(()),
            Ok(Event::Delete(good())),
        ];
        let out: Vec<_> = decoded_only(futures::stream::iter(events)).collect().await;
        let shapes: Vec<&str> = out
            .iter()
            .map(|e| match e {
                Ok(Event::Init) => "init",
                Ok(Event::InitApply(_)) => "listed",
                Ok(Event::InitDone) => "done",
                Ok(Event::Apply(_)) => "applied",
                Ok(Event::Delete(_)) => "deleted",
                Err(()) => "error",
            })
            .collect();
        assert_eq!(shapes, ["init", "listed", "done", "error", "deleted"]);
    }
}
