//! The `actorcile` command's integration tests, as one test binary: `bench` in process
//! (`bench`) and on a real control plane (`bench_real`), `chaos`, and `envtest`
//! (`envtest_cmd`).

mod common;

mod bench;
mod bench_real;
mod chaos;
mod envtest_cmd;
