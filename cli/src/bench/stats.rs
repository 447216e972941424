//! Latency percentiles and memory figures read from `/proc/self/status`.

use std::time::Duration;

/// The `p`-th percentile (0 < p ≤ 100) of `samples` by the nearest-rank method, or `None` when
/// there are no samples. Sorts `samples` in place.
pub fn percentile(samples: &mut [Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    Some(samples[rank.clamp(1, samples.len()) - 1])
}

/// Duration in milliseconds as a float (for reports).
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A `kB` field (e.g. `VmHWM`, `VmRSS`) of a `/proc/<pid>/status` text, in bytes.
pub fn proc_status_field_bytes(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") => Some(value * 1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// A `kB` field of this process's `/proc/self/status`, in bytes (`None` where there is no procfs).
pub fn self_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    proc_status_field_bytes(&status, field)
}

/// Peak resident set size of this process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    self_status_bytes("VmHWM")
}

/// CPU time this process has used so far, user plus system, over all its threads (living and
/// exited), in seconds (`getrusage(RUSAGE_SELF)`; `None` if the call fails).
pub fn process_cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes a `rusage` to the pointer it is given, which points to one
    // (zero-initialised); the value is read only when the call reports success.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

/// Current resident set size of this process (`VmRSS`), in bytes.
pub fn current_rss_bytes() -> Option<u64> {
    self_status_bytes("VmRSS")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_millis(x)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = ms(&[15, 20, 35, 40, 50]);
        assert_eq!(percentile(&mut s, 5.0), Some(Duration::from_millis(15)));
        assert_eq!(percentile(&mut s, 30.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&mut s, 40.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&mut s, 50.0), Some(Duration::from_millis(35)));
        assert_eq!(percentile(&mut s, 100.0), Some(Duration::from_millis(50)));

        let mut hundred: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(
            percentile(&mut hundred, 50.0),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            percentile(&mut hundred, 99.0),
            Some(Duration::from_millis(99))
        );
        assert_eq!(
            percentile(&mut hundred, 99.9),
            Some(Duration::from_millis(100))
        );
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&mut [], 50.0), None);
        let mut one = ms(&[7]);
        assert_eq!(percentile(&mut one, 50.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&mut one, 99.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&mut one, 0.0), None);
        assert_eq!(percentile(&mut one, 101.0), None);
        assert_eq!(percentile(&mut one, f64::NAN), None);
    }

    #[test]
    fn parses_proc_status() {
        let text = "Name:\tactorcile\nVmPeak:\t  200000 kB\nVmHWM:\t   12345 kB\nVmRSS:\t    1000 kB\nThreads:\t3\n";
        assert_eq!(proc_status_field_bytes(text, "VmHWM"), Some(12345 * 1024));
        assert_eq!(proc_status_field_bytes(text, "VmRSS"), Some(1000 * 1024));
        assert_eq!(proc_status_field_bytes(text, "Threads"), Some(3));
        assert_eq!(proc_status_field_bytes(text, "VmSwap"), None);
        assert_eq!(proc_status_field_bytes("VmHWM:\tlots kB\n", "VmHWM"), None);
    }

    #[test]
    fn counts_own_cpu_time() {
        // Spin until 50 ms of CPU are counted: on a loaded machine (tests run in parallel)
        // 50 ms of wall time may get half that much CPU, so the wall clock only bounds it.
        let before = process_cpu_seconds().unwrap();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            let used = process_cpu_seconds().unwrap() - before;
            if used >= 0.05 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "20 s of spinning counted as {used} s"
            );
        }
    }

    #[test]
    fn reads_own_peak_rss() {
        // One snapshot: other tests of this process allocate concurrently.
        let status = std::fs::read_to_string("/proc/self/status").expect("procfs on Linux");
        let peak = proc_status_field_bytes(&status, "VmHWM").unwrap();
        let now = proc_status_field_bytes(&status, "VmRSS").unwrap();
        assert!(peak >= now && now > 0, "VmHWM {peak} < VmRSS {now}");
        assert!(
            peak_rss_bytes().unwrap() >= peak,
            "the peak never goes down"
        );
        assert!(current_rss_bytes().unwrap() > 0);
    }
}
