//! The record a chaos run is checked against: append-only text files, one line per fact,
//! each prefixed with the wall-clock time in microseconds.
//!
//! Every line is one unbuffered `write` to a file opened for appending, so an operator killed
//! with SIGKILL leaves every line it had written, and processes that share a file (each operator
//! incarnation appends to the same one) never interleave within a line.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How far this process's wall clock is set off on purpose ([`super::process::skew_of`]), in
/// microseconds: subtracted from every record, so that records of processes whose clocks
/// disagree still compare.
static SKEW_MICROS: AtomicI64 = AtomicI64::new(0);

/// Tell the records that this process's wall clock runs `skew_seconds` ahead (behind, if
/// negative).
pub fn set_skew(skew_seconds: i64) {
    SKEW_MICROS.store(skew_seconds.saturating_mul(1_000_000), Ordering::Relaxed);
}

/// Microseconds since the Unix epoch, on the machine's clock (the process's, less its skew).
pub fn wall_micros() -> u64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    micros
        .saturating_sub(SKEW_MICROS.load(Ordering::Relaxed))
        .max(0) as u64
}

/// An append-only file of timestamped lines.
pub struct Lines(Mutex<File>);

impl Lines {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(Self(Mutex::new(file)))
    }

    /// Appends `<micros> <text>`. A failed write is reported on stderr and otherwise ignored:
    /// the checker then finds the fact missing and says so.
    pub fn write(&self, text: std::fmt::Arguments<'_>) {
        let line = format!("{} {text}\n", wall_micros());
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("chaos: cannot record {line:?}: {e}");
        }
    }
}

/// One line as (micros, the words after it); `None` for a line that is not one of ours.
fn parse(line: &str) -> Option<(u64, Vec<String>)> {
    let mut words = line.split(' ');
    let micros = words.next()?.parse().ok()?;
    Some((micros, words.map(str::to_string).collect()))
}

/// The lines of `path` as (micros, the words after it); a missing file has none.
pub fn read(path: &Path) -> std::io::Result<Vec<(u64, Vec<String>)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text.lines().filter_map(parse).collect())
}

/// The lines appended to a file since the last look, for a reader that polls a growing record
/// (reading it whole at every poll would cost more the longer a run goes).
pub struct Tail {
    file: File,
    /// The end of a line still being written at the last look.
    partial: String,
}

impl Tail {
    /// Follows `path` from its beginning.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: File::open(path)?,
            partial: String::new(),
        })
    }

    /// The complete lines appended since the last call.
    pub fn new_lines(&mut self) -> std::io::Result<Vec<(u64, Vec<String>)>> {
        use std::io::Read as _;
        self.file.read_to_string(&mut self.partial)?;
        let complete = self.partial.rfind('\n').map_or(0, |i| i + 1);
        let lines = self.partial[..complete].lines().filter_map(parse).collect();
        self.partial.drain(..complete);
        Ok(lines)
    }
}
