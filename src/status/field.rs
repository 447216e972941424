//! Reading one top-level field out of any `Serialize` object without serializing the rest.
//!
//! [`ResourceStatus::of`](super::ResourceStatus::of) runs on every new object version a resource
//! actor sees, and the object type is only known to be `Serialize`. Serializing the whole object
//! to JSON to parse its `status` back cost more than the rest of a no-op reconcile (spec, metadata and
//! labels were written out only to be skipped). [`top_level_field`] drives the object's own
//! `Serialize` impl with a serializer that ignores every field but the one asked for, and turns
//! that one into a [`serde_json::Value`]. No crate offers this (serde's `Serializer` has no
//! "project one field" adapter; `serde_json::to_value` builds the whole tree), hence the ~100
//! lines here.

use serde::Serialize;
use serde::ser::{self, Impossible};
use serde_json::{Error, Value};

/// The top-level field `name` of `value`, if `value` serializes as a struct or map that has it.
/// Anything else (a scalar, a sequence, an error from the value's own `Serialize`) is `None`.
pub(super) fn top_level_field<T: Serialize + ?Sized>(
    value: &T,
    name: &'static str,
) -> Option<Value> {
    value.serialize(FieldOf { name }).ok().flatten()
}

/// The serializer for the object itself: only structs and maps can have the field.
struct FieldOf {
    name: &'static str,
}

/// Collects the field while the object's fields go by.
struct Collect {
    name: &'static str,
    found: Option<Value>,
    /// Map form: the key just serialized was `name`.
    next_is_it: bool,
}

fn not_an_object<T>() -> Result<T, Error> {
    Err(ser::Error::custom("not an object"))
}

macro_rules! no_field {
    ($($method:ident: $ty:ty),* $(,)?) => {
        $(fn $method(self, _: $ty) -> Result<Self::Ok, Error> { Ok(None) })*
    };
}

impl ser::Serializer for FieldOf {
    type Ok = Option<Value>;
    type Error = Error;
    type SerializeSeq = Impossible<Self::Ok, Error>;
    type SerializeTuple = Impossible<Self::Ok, Error>;
    type SerializeTupleStruct = Impossible<Self::Ok, Error>;
    type SerializeTupleVariant = Impossible<Self::Ok, Error>;
    type SerializeMap = Collect;
    type SerializeStruct = Collect;
    type SerializeStructVariant = Impossible<Self::Ok, Error>;

    no_field!(
        serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_f32: f32, serialize_f64: f64, serialize_char: char,
        serialize_str: &str, serialize_bytes: &[u8], serialize_unit_struct: &'static str,
    );

    fn serialize_none(self) -> Result<Self::Ok, Error> {
        Ok(None)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Self::Ok, Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<Self::Ok, Error> {
        Ok(None)
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<Self::Ok, Error> {
        Ok(None)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Self::Ok, Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Error> {
        Ok(None)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        not_an_object()
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        not_an_object()
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        not_an_object()
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        not_an_object()
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Collect, Error> {
        Ok(self.collect())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Collect, Error> {
        Ok(self.collect())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        not_an_object()
    }
}

impl FieldOf {
    fn collect(self) -> Collect {
        Collect {
            name: self.name,
            found: None,
            next_is_it: false,
        }
    }
}

impl ser::SerializeStruct for Collect {
    type Ok = Option<Value>;
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        if key == self.name {
            self.found = Some(serde_json::to_value(value)?);
        }
        Ok(())
    }

    fn end(self) -> Result<Self::Ok, Error> {
        Ok(self.found)
    }
}

impl ser::SerializeMap for Collect {
    type Ok = Option<Value>;
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // Keys are short; only a string key equal to the name matches (as in JSON).
        self.next_is_it = matches!(serde_json::to_value(key)?, Value::String(k) if k == self.name);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if std::mem::take(&mut self.next_is_it) {
            self.found = Some(serde_json::to_value(value)?);
        }
        Ok(())
    }

    fn end(self) -> Result<Self::Ok, Error> {
        Ok(self.found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Serialize)]
    struct Typed {
        metadata: BTreeMap<String, String>,
        spec: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        status: Option<Value>,
    }

    #[derive(Serialize)]
    struct Flattened {
        spec: u32,
        #[serde(flatten)]
        rest: BTreeMap<String, Value>,
    }

    #[test]
    fn takes_the_field_from_structs_maps_and_flattened_structs() {
        let status = serde_json::json!({"phase": "Ready", "conditions": [{"type": "Ready"}]});
        let typed = Typed {
            metadata: BTreeMap::new(),
            spec: serde_json::json!({"status": "not this one"}),
            status: Some(status.clone()),
        };
        assert_eq!(top_level_field(&typed, "status"), Some(status.clone()));
        let map = serde_json::json!({"spec": {"status": 1}, "status": status.clone()});
        assert_eq!(top_level_field(&map, "status"), Some(status.clone()));
        let flat = Flattened {
            spec: 1,
            rest: BTreeMap::from([("status".to_string(), status.clone())]),
        };
        assert_eq!(top_level_field(&flat, "status"), Some(status.clone()));
        // behind an Option or a newtype
        assert_eq!(top_level_field(&Some(&map), "status"), Some(status));
    }

    #[test]
    fn no_field_no_object_no_value() {
        let typed = Typed {
            metadata: BTreeMap::new(),
            spec: Value::Null,
            status: None,
        };
        assert_eq!(top_level_field(&typed, "status"), None);
        assert_eq!(
            top_level_field(&serde_json::json!({"a": 1}), "status"),
            None
        );
        assert_eq!(
            top_level_field(&serde_json::json!([{"status": 1}]), "status"),
            None
        );
        assert_eq!(top_level_field(&3u8, "status"), None);
        assert_eq!(top_level_field("status", "status"), None);
    }

    #[test]
    fn agrees_with_serializing_the_whole_object() {
        use proptest::prelude::*;
        let json = prop::collection::btree_map(
            prop::sample::select(vec!["status", "spec", "metadata", "x"]),
            prop_oneof![
                Just(Value::Null),
                any::<i64>().prop_map(Value::from),
                "[a-z]{0,8}".prop_map(Value::from),
                prop::collection::vec(any::<bool>().prop_map(Value::from), 0..3)
                    .prop_map(Value::from),
                prop::collection::btree_map("[a-z]{1,4}", any::<u32>().prop_map(Value::from), 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ],
            0..4,
        );
        proptest!(|(fields in json)| {
            let obj = Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
            let whole = serde_json::to_value(&obj).unwrap();
            prop_assert_eq!(top_level_field(&obj, "status"), whole.get("status").cloned());
        });
    }
}
