//! Patches (JSON merge, JSON patch, strategic merge, server-side apply) and replacements of an
//! existing ConfigMap and of a custom resource with a schema, its spec and its status.

#![no_main]

#[path = "common/mod.rs"]
mod common;

use arbitrary::Arbitrary;
use http::Method;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    target: u8,
    kind: u8,
    apply_params: bool,
    body: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let f = common::fixture();
    let targets = [common::PATHS[1], common::PATHS[3], common::PATHS[4]];
    let path = targets[usize::from(input.target) % targets.len()];
    let (method, ct) = match input.kind % 5 {
        0 => (Method::PATCH, "application/merge-patch+json"),
        1 => (Method::PATCH, "application/json-patch+json"),
        2 => (Method::PATCH, "application/strategic-merge-patch+json"),
        3 => (Method::PATCH, "application/apply-patch+yaml"),
        _ => (Method::PUT, "application/json"),
    };
    let uri = if input.apply_params {
        format!("{path}?fieldManager=fuzz&force=true")
    } else {
        path.to_string()
    };
    f.send(&method, &uri, ct, input.body);
});
