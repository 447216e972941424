//! Small helpers of the simulator's files: seed mixing and the names of built-ins. (On their own,
//! so the scenario format can be compiled outside the binary: `fuzz/fuzz_targets/scenario_toml.rs`.)

/// The names of built-ins (`(name, TOML)` pairs), comma-separated, for error messages.
pub(crate) fn built_in_names(built_ins: &[(&str, &str)]) -> String {
    built_ins
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Mix numbers into one well-spread seed (splitmix64 steps).
pub(crate) fn mix(parts: &[u64]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    for p in parts {
        h ^= *p;
        h = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h = z ^ (z >> 31);
    }
    h
}
