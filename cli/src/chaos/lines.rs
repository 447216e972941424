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
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
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

/// The lines of `path` as (micros, the words after it); a missing file has none.
pub fn read(path: &Path) -> std::io::Result<Vec<(u64, Vec<String>)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut words = l.split(' ');
            let micros = words.next()?.parse().ok()?;
            Some((micros, words.map(str::to_string).collect()))
        })
        .collect())
}
