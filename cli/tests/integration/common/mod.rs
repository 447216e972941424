//! Shared helpers of the command-line tests.
#![allow(dead_code)]

use std::{
    io::Read,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// Runs the binary with `args`, killing it after `limit`; returns (success, stdout, stderr).
pub fn run_bounded(args: &[&str], limit: Duration) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_actorcile"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start actorcile");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    match status {
        Some(status) => (status.success(), out, err),
        None => panic!(
            "actorcile {args:?} did not finish within {limit:?}\nstdout:\n{out}\nstderr:\n{err}"
        ),
    }
}

/// The JSON object on the last non-empty line of `out`.
pub fn last_json_line(out: &str) -> Value {
    let last = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("some output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"))
}
