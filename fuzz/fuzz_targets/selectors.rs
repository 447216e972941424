//! Label and field selectors on lists of a built-in and a custom kind.

#![no_main]

#[path = "common/mod.rs"]
mod common;

use arbitrary::Arbitrary;
use http::Method;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    label: String,
    field: String,
    custom: bool,
}

fuzz_target!(|input: Input| {
    let f = common::fixture();
    let path = if input.custom {
        common::PATHS[2]
    } else {
        common::PATHS[0]
    };
    let uri = format!(
        "{path}?labelSelector={}&fieldSelector={}",
        common::encode(&input.label),
        common::encode(&input.field)
    );
    f.send(&Method::GET, &uri, "application/json", Vec::new());
});
