//! Other processes, as a detached control plane needs to see them: whether a pid names a live
//! process, whether it runs a given binary, which live process runs a binary with a given flag,
//! and (on Linux) a handle that tells when a process has exited.
//!
//! Linux reads `/proc` and uses a pidfd; other Unixes ask sysinfo (the BSDs' `sysctl`, macOS's
//! `libproc`), which has no pidfd, so waiting there asks [`pid_alive`] again.

use std::path::Path;

/// A handle that says when a process has exited, whatever pid it had: a pidfd
/// (`pidfd_open(2)`, Linux 5.3+).
#[cfg(target_os = "linux")]
pub(crate) struct PidFd(std::os::fd::OwnedFd);

#[cfg(target_os = "linux")]
impl PidFd {
    /// `None` where the kernel has no pidfds; callers fall back to [`pid_alive`].
    #[allow(unsafe_code)] // pidfd_open(2), and owning the descriptor it returns
    pub(crate) fn open(pid: u32) -> Option<PidFd> {
        use std::os::fd::FromRawFd;
        let pid = libc::pid_t::try_from(pid).ok()?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new file descriptor or -1; no
        // memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = libc::c_int::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
        Some(PidFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the process has exited (all of its threads): the pidfd polls readable.
    #[allow(unsafe_code)] // poll(2) on the pidfd
    pub(crate) fn exited(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// Where there are no pidfds: never opened, so callers ask [`pid_alive`].
#[cfg(not(target_os = "linux"))]
pub(crate) enum PidFd {}

#[cfg(not(target_os = "linux"))]
impl PidFd {
    pub(crate) fn open(_pid: u32) -> Option<PidFd> {
        None
    }

    pub(crate) fn exited(&self) -> bool {
        match *self {}
    }
}

/// Whether `argv0`'s file name is `binary`'s.
fn same_binary(argv0: &std::ffi::OsStr, binary: &Path) -> bool {
    binary
        .file_name()
        .is_some_and(|name| Path::new(argv0).file_name() == Some(name))
}

#[cfg(target_os = "linux")]
mod imp {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// The state letter of `/proc/<pid>/stat` (`pid (comm) state ...`; comm may hold spaces or
    /// parentheses, so the state follows the last `)`).
    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 1..];
        after.trim_start().chars().next()
    }

    fn cmdline(pid: u32) -> Option<Vec<u8>> {
        std::fs::read(format!("/proc/{pid}/cmdline")).ok()
    }

    pub(crate) fn pid_alive(pid: u32) -> bool {
        !matches!(state(pid), Some('Z' | 'X') | None)
    }

    pub(crate) fn process_is(pid: u32, binary: &Path) -> bool {
        if !pid_alive(pid) {
            return false;
        }
        let Some(cmdline) = cmdline(pid) else {
            return false;
        };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        super::same_binary(OsStr::from_bytes(argv0), binary)
    }

    pub(crate) fn find_process(binary: &Path, flag: &str) -> Option<u32> {
        let entries = std::fs::read_dir("/proc").ok()?;
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                process_is(pid, binary)
                    && cmdline(pid)
                        .is_some_and(|c| c.split(|b| *b == 0).any(|a| a == flag.as_bytes()))
            })
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::path::Path;

    use sysinfo::{Pid, Process, ProcessRefreshKind, ProcessStatus, ProcessesToUpdate, System};

    /// The processes `which` names, with their command lines.
    fn processes(which: ProcessesToUpdate<'_>) -> System {
        let mut system = System::new();
        system.refresh_processes_specifics(
            which,
            true,
            ProcessRefreshKind::nothing().with_cmd(sysinfo::UpdateKind::Always),
        );
        system
    }

    fn live(p: &Process) -> bool {
        !matches!(p.status(), ProcessStatus::Zombie | ProcessStatus::Dead)
    }

    fn runs(p: &Process, binary: &Path) -> bool {
        live(p)
            && p.cmd()
                .first()
                .is_some_and(|argv0| super::same_binary(argv0, binary))
    }

    pub(crate) fn pid_alive(pid: u32) -> bool {
        let pid = Pid::from_u32(pid);
        processes(ProcessesToUpdate::Some(&[pid]))
            .process(pid)
            .is_some_and(live)
    }

    pub(crate) fn process_is(pid: u32, binary: &Path) -> bool {
        let pid = Pid::from_u32(pid);
        processes(ProcessesToUpdate::Some(&[pid]))
            .process(pid)
            .is_some_and(|p| runs(p, binary))
    }

    pub(crate) fn find_process(binary: &Path, flag: &str) -> Option<u32> {
        let system = processes(ProcessesToUpdate::All);
        system
            .processes()
            .iter()
            .find(|(_, p)| runs(p, binary) && p.cmd().iter().any(|a| a == flag))
            .map(|(pid, _)| pid.as_u32())
    }
}

/// Whether `pid` names a process that has not exited (it is there and not a zombie), whatever
/// it runs.
pub(crate) fn pid_alive(pid: u32) -> bool {
    imp::pid_alive(pid)
}

/// Whether `pid` is a live (not zombie) process running `binary` (compared by file name).
pub(crate) fn process_is(pid: u32, binary: &Path) -> bool {
    imp::process_is(pid, binary)
}

/// A live process running `binary` (by file name) with `flag` among its arguments.
pub(crate) fn find_process(binary: &Path, flag: &str) -> Option<u32> {
    imp::find_process(binary, flag)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn process_is_checks_liveness_and_name() {
        // An argument no other process has, for `find_process` to find it by.
        let arg = format!("30.{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg(&arg)
            .spawn()
            .unwrap();
        let pid = child.id();
        // Give the child time to finish exec under load.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !process_is(pid, Path::new("/bin/sleep")) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(process_is(pid, Path::new("/bin/sleep")), "pid {pid}");
        assert!(pid_alive(pid));
        assert_eq!(find_process(Path::new("sleep"), &arg), Some(pid));
        assert!(
            !process_is(pid, Path::new("etcd")),
            "a reused pid with another program is not ours"
        );
        child.kill().unwrap();
        // Killed but not reaped: a zombie counts as gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_is(pid, Path::new("/bin/sleep")) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!process_is(pid, Path::new("/bin/sleep")));
        assert!(!pid_alive(pid));
        child.wait().unwrap();
        assert!(!process_is(pid, Path::new("/bin/sleep")));
        assert_eq!(find_process(Path::new("sleep"), &arg), None);
    }
}
