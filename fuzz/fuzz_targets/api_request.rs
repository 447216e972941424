//! Any request to the in-process API server: a method, one of its paths (or any path) with
//! any suffix and query, a content type, any body.

#![no_main]

#[path = "common/mod.rs"]
mod common;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    method: u8,
    path: u8,
    suffix: String,
    query: String,
    content_type: u8,
    body: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let f = common::fixture();
    let method = &common::METHODS[usize::from(input.method) % common::METHODS.len()];
    let path = match common::PATHS.get(usize::from(input.path)) {
        Some(p) => format!("{p}{}", input.suffix),
        None => input.suffix.clone(),
    };
    let uri = if input.query.is_empty() {
        path
    } else {
        format!("{path}?{}", input.query)
    };
    let ct = common::CONTENT_TYPES[usize::from(input.content_type) % common::CONTENT_TYPES.len()];
    f.send(method, &uri, ct, input.body);
});
