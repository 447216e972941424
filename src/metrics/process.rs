//! The process's own figures under client_golang's names (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, …), which every dashboard for a Go operator reads, from
//! [`sysinfo`] (Linux's `/proc`, and the other systems' own interfaces).
//!
//! Written here: the maintained collectors of these names are for other metrics crates
//! (`metrics-process` for `metrics`) or another version of prometheus-client
//! (`kubert-prometheus-process`), and a collector of one crate's version cannot register in
//! another's registry.

use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use super::gauge;

/// The operator process's CPU, memory, file descriptors, threads and start time, read at each
/// scrape. The runtime registers one in its registry; register it yourself in a registry the
/// runtime does not serve.
///
/// | name | type | what it is |
/// |---|---|---|
/// | `process_cpu_seconds_total` | counter | user and system CPU time |
/// | `process_resident_memory_bytes` | gauge | resident memory |
/// | `process_virtual_memory_bytes` | gauge | virtual memory |
/// | `process_open_fds` | gauge | open file descriptors (where the system tells) |
/// | `process_max_fds` | gauge | the limit of open file descriptors (where the system tells) |
/// | `process_threads` | gauge | OS threads (where the system tells) |
/// | `process_start_time_seconds` | gauge | when the process started, in seconds since the Unix epoch |
///
/// ```
/// use actorcile::metrics::{ProcessCollector, Registry};
///
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(ProcessCollector::new()));
/// let mut text = String::new();
/// actorcile::metrics::prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("process_resident_memory_bytes"));
/// ```
#[derive(Debug)]
pub struct ProcessCollector {
    pid: Pid,
    system: Mutex<System>,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessCollector {
    /// A collector of this process's figures.
    pub fn new() -> Self {
        Self {
            pid: Pid::from_u32(std::process::id()),
            system: Mutex::new(System::new()),
        }
    }

    /// The figures now, `None` where the system could not be read.
    fn read(&self) -> Option<Figures> {
        let mut system = self.system.lock().unwrap_or_else(|e| e.into_inner());
        system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[self.pid]),
            false,
            ProcessRefreshKind::nothing()
                .with_cpu()
                .with_memory()
                .with_tasks(),
        );
        let process = system.process(self.pid)?;
        Some(Figures {
            cpu_seconds: process.accumulated_cpu_time() as f64 / 1000.0,
            resident: process.memory(),
            virtual_memory: process.virtual_memory(),
            open_fds: process.open_files().map(|n| n as u64),
            max_fds: process.open_files_limit().map(|n| n as u64),
            threads: process.tasks().map(|t| t.len() as u64 + 1),
            start_time: process.start_time(),
        })
    }
}

struct Figures {
    cpu_seconds: f64,
    resident: u64,
    virtual_memory: u64,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
    threads: Option<u64>,
    start_time: u64,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(f) = self.read() else {
            // The process cannot read its own figures (a /proc not mounted): no series rather
            // than made-up ones.
            return Ok(());
        };
        let e = &mut encoder;
        ConstCounter::new(f.cpu_seconds).encode(e.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            MetricType::Counter,
        )?)?;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            f.resident,
        )?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            f.virtual_memory,
        )?;
        if let Some(n) = f.open_fds {
            gauge(e, "process_open_fds", "Number of open file descriptors", n)?;
        }
        if let Some(n) = f.max_fds {
            gauge(
                e,
                "process_max_fds",
                "Maximum number of open file descriptors",
                n,
            )?;
        }
        if let Some(n) = f.threads {
            gauge(
                e,
                "process_threads",
                "Number of OS threads in the process",
                n,
            )?;
        }
        gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            f.start_time,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(scrape: &str, name: &str) -> f64 {
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in\n{scrape}"))
    }

    #[test]
    fn the_process_figures_are_this_processs() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let file = std::fs::File::open("Cargo.toml").unwrap();
        let mut scrape = String::new();
        prometheus_client::encoding::text::encode(&mut scrape, &registry).unwrap();
        assert!(value(&scrape, "process_resident_memory_bytes") > 1e6);
        assert!(
            value(&scrape, "process_virtual_memory_bytes")
                >= value(&scrape, "process_resident_memory_bytes")
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value(&scrape, "process_start_time_seconds");
        assert!(start <= now && start > now - 86_400.0, "{start} vs {now}");
        // CPU time only grows.
        let cpu = value(&scrape, "process_cpu_seconds_total");
        let mut spin = 0u64;
        for i in 0..20_000_000u64 {
            spin = spin.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(spin);
        let mut later = String::new();
        prometheus_client::encoding::text::encode(&mut later, &registry).unwrap();
        assert!(value(&later, "process_cpu_seconds_total") >= cpu);
        #[cfg(target_os = "linux")]
        {
            assert!(value(&scrape, "process_open_fds") >= 1.0);
            assert!(value(&scrape, "process_max_fds") >= value(&scrape, "process_open_fds"));
            assert!(value(&scrape, "process_threads") >= 1.0);
        }
        drop(file);
    }
}
