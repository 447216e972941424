//! Supervisor policies from TOML: any text is a policy or a typed error, never a panic, and a
//! policy that loads validates and round-trips.

#![no_main]

use actorcile::policy::SupervisorPolicy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(policy) = SupervisorPolicy::from_toml(text) {
        let again = toml_round_trip(&policy);
        assert_eq!(again.as_ref(), Some(&policy), "{text:?}");
    }
});

/// The policy written as TOML and read back.
fn toml_round_trip(p: &SupervisorPolicy) -> Option<SupervisorPolicy> {
    let text = toml::to_string(p).ok()?;
    SupervisorPolicy::from_toml(&text).ok()
}
