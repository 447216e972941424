//! A passive object's cached copy, encoded: its JSON behind its namespace and name.

use super::table::names;
use crate::ManagedResource;
use crate::status::ResourceStatus;

/// An object encoded as JSON behind its namespace and name (so the table finds it without
/// decoding it): `[namespace length: u16 LE, u16::MAX for none][name length: u16 LE]
/// [namespace][name][JSON]`.
///
/// A passive object's cached copy is held so: its bytes as JSON are a third to a half of the
/// decoded object's memory (every field of `ObjectMeta` takes its place in a decoded object,
/// set or not). It is decoded on the rare reads of a passive object (its actor re-activated by
/// a timer or a message, a reference check); a watch event brings a new version, held whole.
/// The layout is this module's own: no crate encodes a value behind a search key in one
/// allocation, and the key must be readable without a decoder.
#[derive(Clone)]
pub(super) struct Encoded(Box<[u8]>);

impl Encoded {
    pub(super) const NO_NAMESPACE: u16 = u16::MAX;
    /// In the name's length: the JSON lacks its [`type_prefix`].
    pub(super) const TYPE_STRIPPED: u16 = 1 << 15;
    pub(super) const HEADER: usize = 4;

    /// `obj` encoded, if it encodes and its encoding decodes to the same object again (a type
    /// whose `Deserialize` refuses or changes what its `Serialize` writes stays whole).
    pub(super) fn new<K: ManagedResource>(obj: &K) -> Option<Self> {
        let prefix = type_prefix::<K>();
        let (ns, name) = names(obj);
        let ns_len = match ns {
            None => Self::NO_NAMESPACE,
            Some(ns) => u16::try_from(ns.len())
                .ok()
                .filter(|l| *l != Self::NO_NAMESPACE)?,
        };
        // Kubernetes names are at most 253 bytes; a longer one (not from an API server) stays
        // whole rather than reach the flag bit.
        let name_len = u16::try_from(name.len())
            .ok()
            .filter(|l| *l < Self::TYPE_STRIPPED)?;
        let encoded = SCRATCH.with_borrow_mut(|json| {
            json.clear();
            serde_json::to_writer(&mut *json, obj).ok()?;
            // Most types write their `apiVersion` and `kind` first: the same for every object
            // of the kind, so not kept (decoding puts them back).
            let rest = json.strip_prefix(prefix.as_bytes());
            let (flag, body) = match rest {
                Some(rest) => (Self::TYPE_STRIPPED, rest),
                None => (0, &json[..]),
            };
            let mut bytes =
                Vec::with_capacity(Self::HEADER + ns.map_or(0, str::len) + name.len() + body.len());
            bytes.extend_from_slice(&ns_len.to_le_bytes());
            bytes.extend_from_slice(&(name_len | flag).to_le_bytes());
            bytes.extend_from_slice(ns.unwrap_or("").as_bytes());
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(body);
            Some(Self(bytes.into_boxed_slice()))
        })?;
        // Decoding must give back the object itself, not only some object: a type whose
        // `Deserialize` drops or changes what its `Serialize` wrote (a defaulted field, a
        // lossy number) would hand a reconcile another object than the one cached.
        let again = serde_json::to_vec(&encoded.parse::<K>(prefix.as_bytes())?).ok()?;
        let body = encoded.json();
        let same_bytes = match again.strip_prefix(prefix.as_bytes()) {
            Some(rest) if encoded.type_stripped() => rest == body,
            _ => !encoded.type_stripped() && again == body,
        };
        // Maps whose order is not fixed (a `HashMap` field) write the same object in another
        // order: compared as JSON values then.
        let same = same_bytes || {
            let original: Option<serde_json::Value> = encoded.parse(prefix.as_bytes());
            original.is_some()
                && serde_json::from_slice::<serde_json::Value>(&again).ok() == original
        };
        same.then_some(encoded)
    }

    pub(super) fn lengths(&self) -> (Option<usize>, usize) {
        let b = &self.0;
        let ns = u16::from_le_bytes([b[0], b[1]]);
        let name = u16::from_le_bytes([b[2], b[3]]) & !Self::TYPE_STRIPPED;
        (
            (ns != Self::NO_NAMESPACE).then_some(usize::from(ns)),
            usize::from(name),
        )
    }

    pub(super) fn type_stripped(&self) -> bool {
        u16::from_le_bytes([self.0[2], self.0[3]]) & Self::TYPE_STRIPPED != 0
    }

    pub(super) fn names(&self) -> (Option<&str>, &str) {
        let (ns, name) = self.lengths();
        let ns_len = ns.unwrap_or(0);
        let text = |from: usize, len: usize| {
            std::str::from_utf8(&self.0[from..from + len]).unwrap_or_default()
        };
        (
            ns.map(|len| text(Self::HEADER, len)),
            text(Self::HEADER + ns_len, name),
        )
    }

    pub(super) fn json(&self) -> &[u8] {
        let (ns, name) = self.lengths();
        &self.0[Self::HEADER + ns.unwrap_or(0) + name..]
    }

    /// The object. Checked when it was encoded, so `None` only for a type whose decoding is
    /// not a function of its bytes.
    pub(super) fn decode<K: ManagedResource>(&self) -> Option<K> {
        self.parse(type_prefix::<K>().as_bytes())
    }

    /// Some fields of the object, read into `T` without decoding the rest (the JSON without
    /// its type prefix is still the object's members, after its `{`).
    pub(super) fn read<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        self.parse(b"{")
    }

    /// The JSON parsed into `T`, `prefix` put back first if the type prefix was stripped.
    pub(super) fn parse<T: serde::de::DeserializeOwned>(&self, prefix: &[u8]) -> Option<T> {
        if !self.type_stripped() {
            return serde_json::from_slice(self.json()).ok();
        }
        SCRATCH.with_borrow_mut(|buf| {
            buf.clear();
            buf.extend_from_slice(prefix);
            buf.extend_from_slice(self.json());
            serde_json::from_slice(buf).ok()
        })
    }

    /// The object's metadata fields that the cache reads without decoding it.
    pub(super) fn metadata(&self) -> Option<PartialMeta> {
        #[derive(serde::Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: PartialMeta,
        }
        Some(self.read::<Object>()?.metadata)
    }

    /// Whether the object is being deleted, its status as [`ResourceStatus::of`] reads it, and
    /// its generation.
    pub(super) fn readiness(&self) -> Option<(bool, ResourceStatus, Option<i64>)> {
        #[derive(serde::Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: PartialMeta,
            #[serde(default)]
            status: Option<serde_json::Value>,
        }
        let o = self.read::<Object>()?;
        let status = o
            .status
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        Some((
            o.metadata.deletion_timestamp.is_some(),
            status,
            o.metadata.generation,
        ))
    }
}

/// What the cache reads of an encoded object's metadata.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct PartialMeta {
    #[serde(default)]
    pub(super) resource_version: Option<String>,
    #[serde(default)]
    pub(super) deletion_timestamp: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub(super) uid: Option<String>,
    #[serde(default)]
    pub(super) generation: Option<i64>,
}

thread_local! {
    /// Each thread's buffer for encoding and decoding (the encoded bytes are copied out at
    /// their exact length; a shrunk buffer would keep its whole allocation).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How the JSON of an object of kind `K` begins when its type writes `apiVersion` and `kind`
/// first, as kube's derived custom resources and k8s-openapi's types do.
pub(super) fn type_prefix<K: ManagedResource>() -> String {
    format!(
        "{{\"apiVersion\":{},\"kind\":{},",
        serde_json::Value::from(K::api_version(&()).as_ref()),
        serde_json::Value::from(K::kind(&()).as_ref()),
    )
}
