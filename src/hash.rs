//! The hashes behind the identifiers the runtime persists in the cluster: reference annotation
//! keys, long label values and object names of the CD drivers, shard numbers.
//!
//! A persisted identifier must be computed the same way by every later version of the operator,
//! or a newer operator no longer finds what an older one wrote (a reference it cannot release
//! blocks a deletion for good). `std`'s `DefaultHasher` does not promise that: its algorithm may
//! change with any Rust release. These functions are specified here, byte for byte:
//!
//! - [`sip13`]: SipHash-1-3 with both keys zero, over the given byte strings, each followed by
//!   one `0xff` byte. It is what `DefaultHasher` computed for strings when identifiers were first
//!   written with it, so identifiers already in clusters keep their values.
//! - [`target_hash`]: [`sip13`] framing of a [`Target`] (its `apiVersion`, `kind`, a namespace
//!   marker as 8 little-endian bytes (`0` none, `1` some) followed by the namespace when there is
//!   one, and its name), again what the first versions wrote.
//! - [`fnv1a`]: 64-bit FNV-1a over the bytes (the shard of a key).
//!
//! Beside them, [`FastMap`], the hash map of per-object data in memory (nothing persisted).

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

/// Hash map of per-object data (ahash: object names are hashed on every event and message).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// The hash of an object's namespace and name: how the manager's entries and the kind's cache
/// find an object.
pub(crate) fn name_hash(hasher: &ahash::RandomState, namespace: Option<&str>, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

use crate::references::Target;

/// SipHash-1-3 (keys `0`, `0`) of `parts`, each part followed by a `0xff` byte.
pub(crate) fn sip13(parts: &[&str]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0, 0);
    for p in parts {
        h.write(p.as_bytes());
        h.write_u8(0xff);
    }
    h.finish()
}

/// The hash of a [`Target`] behind its reference annotation's key.
pub(crate) fn target_hash(t: &Target) -> u64 {
    let mut h = SipHasher13::new_with_keys(0, 0);
    let mut text = |s: &str| {
        h.write(s.as_bytes());
        h.write_u8(0xff);
    };
    text(&t.api_version);
    text(&t.kind);
    match &t.namespace {
        None => h.write(&0u64.to_le_bytes()),
        Some(ns) => {
            h.write(&1u64.to_le_bytes());
            h.write(ns.as_bytes());
            h.write_u8(0xff);
        }
    }
    h.write(t.name.as_bytes());
    h.write_u8(0xff);
    h.finish()
}

/// 64-bit FNV-1a of `s`'s bytes.
pub(crate) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The expected values were computed by the identifiers' first implementation
    // (`BuildHasherDefault::<DefaultHasher>::default().hash_one(..)` on Rust 1.89 to 1.95): they are
    // what clusters hold, and must never change.

    #[test]
    fn target_hashes_are_the_ones_already_written() {
        let namespaced = Target::new("example.com/v1", "App", Some("team-a"), "web");
        let cluster = Target::new("v1", "Node", None, "n1");
        assert_eq!(target_hash(&namespaced), 0xac28_bcf4_b534_f7ca);
        assert_eq!(target_hash(&cluster), 0x47f7_8fe6_e14a_c7ca);
    }

    #[test]
    fn string_hashes_are_the_ones_already_written() {
        let long = format!("{}-tenant", "x".repeat(70));
        assert_eq!(sip13(&[&long]), 0xbeef_952e_249c_f6df);
    }

    #[test]
    fn fnv1a_is_the_published_function() {
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
    }
}
