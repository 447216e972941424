//! Simulator scenarios from TOML (`actorcile simulate --scenario FILE`): any text is a scenario
//! or a typed error, never a panic; a scenario that loads gives its fault settings and
//! round-trips through TOML.
//!
//! The scenario format lives in the `actorcile` binary (`cli/src/simulate/scenario.rs`); its
//! files are compiled in here as they are.

#![no_main]

#[path = "../../cli/src/simulate/common.rs"]
mod common;
#[path = "../../cli/src/simulate/scenario.rs"]
#[allow(dead_code)]
mod scenario;

use common::{built_in_names, mix};
use libfuzzer_sys::fuzz_target;
use scenario::Scenario;

fuzz_target!(|text: &str| {
    if let Ok(s) = Scenario::from_toml(text, "fuzz") {
        let _ = s.faults.to_faults(s.seed);
        let written = toml::to_string(&s).expect("a loaded scenario writes as TOML");
        let again = Scenario::from_toml(&written, "fuzz");
        assert_eq!(again.as_ref().ok(), Some(&s), "{text:?} wrote {written:?}");
    }
});
