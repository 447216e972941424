//! Latency percentiles, memory figures read from `/proc/self/status`, and CPU time: this
//! process's (`getrusage`) and other processes' (`/proc/<pid>/stat`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set while [`return_freed_memory`] wakes the workers: each tokio worker returns its
/// allocator's free pages when it parks ([`on_worker_park`]).
static RETURN_FREED: AtomicBool = AtomicBool::new(false);

/// Called by every tokio worker of a bench child when it parks (`on_thread_park`).
pub fn on_worker_park() {
    if RETURN_FREED.load(Ordering::Relaxed) {
        crate::allocator::return_free_memory();
    }
}

/// Returns the pages the allocator holds free to the OS, so that the resident memory read next
/// is the memory in use: read so before the runtime starts and when it is idle, it does not
/// count, for or against a runtime, what the set-up freed and the runtime reused, or what the
/// runtime freed and a parked thread has not returned yet. mimalloc keeps a heap per thread,
/// and only the thread itself returns its free pages: every worker is woken so that it parks
/// again and collects. glibc's `malloc_trim` trims every arena at once: one call.
pub async fn return_freed_memory() {
    if crate::allocator::is_mimalloc() {
        RETURN_FREED.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            let tasks: Vec<_> = (0..64).map(|_| tokio::spawn(async {})).collect();
            for t in tasks {
                let _ = t.await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        RETURN_FREED.store(false, Ordering::SeqCst);
    }
    crate::allocator::return_free_memory();
}

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

/// Resets this process's peak resident set size (`VmHWM`) to its current one, so that the peak
/// read later is the peak since now: the bench resets it when the runtime starts, so that
/// the set-up's own peak (creating the objects) is not counted as the runtime's. Linux only
/// (`/proc/self/clear_refs`, since 4.0); `false` where it cannot be reset.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
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

/// User plus system CPU time, in clock ticks, of a `/proc/<pid>/stat` text (fields 14 and 15,
/// counted after the command name, which may hold spaces and parentheses).
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields from the third (`state`) on: utime and stime are the 12th and 13th of them.
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// CPU time (user + system, all threads) `pids` have used so far, summed, in seconds; `None`
/// without pids or when one of them cannot be read (gone, or no procfs). Serves the control
/// plane's CPU on envtest, whose processes are this one's children.
pub fn processes_cpu_seconds(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    // SAFETY: `sysconf` only reads a configuration value.
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_sec <= 0 {
        return None;
    }
    let mut ticks = 0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        ticks += stat_cpu_ticks(&stat)?;
    }
    Some(ticks as f64 / ticks_per_sec as f64)
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
    fn parses_the_cpu_ticks_of_a_proc_stat() {
        // A command name with a space and a parenthesis; utime 1500, stime 250.
        let stat = "4242 (kube (api) x) S 1 4242 4242 0 -1 4194560 95 0 0 0 1500 250 0 0 20 0 12 0 \
                    1234 5678 910 18446744073709551615";
        assert_eq!(stat_cpu_ticks(stat), Some(1750));
        assert_eq!(stat_cpu_ticks("4242 (truncated) S 1 2"), None);
        assert_eq!(stat_cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn counts_another_process_cpu_time() {
        assert_eq!(processes_cpu_seconds(&[]), None);
        // This process through procfs, in clock ticks, against its own `getrusage`.
        let own = processes_cpu_seconds(&[std::process::id()]).unwrap();
        let rusage = process_cpu_seconds().unwrap();
        assert!(
            (own - rusage).abs() < 0.1,
            "procfs {own} s, getrusage {rusage} s"
        );
        // A pid that cannot exist (above the kernel's maximum of 2^22).
        assert_eq!(processes_cpu_seconds(&[std::process::id(), 1 << 23]), None);
    }

    #[test]
    fn reads_and_resets_own_peak_rss() {
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

        // Reset (in this test, not one of its own: the check above would race it).
        // Touch 64 MiB outside the allocator, unmap it, and see the peak come down once reset.
        const LEN: usize = 64 << 20;
        // SAFETY: an anonymous private mapping of LEN bytes, written within its bounds, then
        // unmapped once; nothing else refers to it.
        unsafe {
            let block = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(block, libc::MAP_FAILED);
            std::ptr::write_bytes(block.cast::<u8>(), 1, LEN);
            libc::munmap(block, LEN);
        }
        let before = peak_rss_bytes().unwrap();
        if !reset_peak_rss() {
            // A kernel without CONFIG_PROC_PAGE_MONITOR, or a sandbox: the bench then warns
            // that its peaks include the set-up's.
            eprintln!(
                "SKIPPED: the peak RSS cannot be reset here (/proc/self/clear_refs is not \
                 writable)"
            );
            return;
        }
        let after = peak_rss_bytes().unwrap();
        assert!(
            after + (32 << 20) < before,
            "the peak stayed at {after} after a reset from {before}"
        );
    }
}
