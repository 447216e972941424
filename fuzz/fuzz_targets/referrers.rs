//! Who references an object (`references::referrers_of`), read from its annotations: anyone who
//! can annotate the object writes them, so any annotations give a list of referrers, never a
//! panic, and every referrer read is one the annotation's value states.

#![no_main]

use std::collections::BTreeMap;

use actorcile::names::OperatorNames;
use actorcile::references::{Target, referrers_of};
use k8s_openapi::api::core::v1::ConfigMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|annotations: Vec<(String, String)>| {
    let names = OperatorNames::new("op", "example.com");
    let prefix = names.reference_prefix();
    let mut cm = ConfigMap::default();
    let mut map = BTreeMap::new();
    for (key, value) in annotations {
        // Half the keys under the runtime's prefix, so that their values are read.
        let key = if key.len() % 2 == 0 {
            format!("{prefix}{key}")
        } else {
            key
        };
        map.insert(key, value);
    }
    cm.metadata.annotations = Some(map.clone());
    let referrers = referrers_of(&cm, &names);
    for target in &referrers {
        let stated = map.iter().any(|(k, v)| {
            k.starts_with(&prefix)
                && serde_json::from_str::<Target>(v).is_ok_and(|t| t == *target)
        });
        assert!(stated, "{target:?} is stated by no annotation");
    }
    assert!(referrers.len() <= map.len());
});
