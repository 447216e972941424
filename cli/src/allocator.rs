//! The binary's memory allocator, chosen once when the process starts: mimalloc (the default,
//! where the binary is built with it) or the system's (glibc), by the environment variable
//! [`VAR`]` = system`. `bench --allocator` sets it for its child processes, so that both
//! allocators can be measured with one binary.
//!
//! Written here because the choice must be made at run time and `#[global_allocator]` takes one
//! static: no maintained crate dispatches between two allocators by the environment.

use std::alloc::{GlobalAlloc, Layout, System};

/// The environment variable naming the allocator: `system`, else mimalloc.
pub const VAR: &str = "ACTORCILE_ALLOCATOR";

/// The choice, read from the environment at the first allocation (on the main thread, before
/// any other thread exists) and never changed after: every block is freed by the allocator that
/// gave it.
#[cfg(feature = "mimalloc")]
mod choice {
    use std::sync::atomic::{AtomicU8, Ordering};

    const UNKNOWN: u8 = 0;
    const MIMALLOC: u8 = 1;
    const SYSTEM: u8 = 2;

    static CHOICE: AtomicU8 = AtomicU8::new(UNKNOWN);

    /// Whether the process allocates with mimalloc.
    pub fn mimalloc() -> bool {
        let chosen = match CHOICE.load(Ordering::Relaxed) {
            UNKNOWN => {
                // SAFETY: `getenv` (which does not allocate) with a NUL-terminated name; the
                // value is read at once, before anything could change the environment (this
                // is the first allocation of the process).
                let system = unsafe {
                    let value = libc::getenv(c"ACTORCILE_ALLOCATOR".as_ptr());
                    !value.is_null() && std::ffi::CStr::from_ptr(value) == c"system"
                };
                let chosen = if system { SYSTEM } else { MIMALLOC };
                CHOICE.store(chosen, Ordering::Relaxed);
                chosen
            }
            chosen => chosen,
        };
        chosen == MIMALLOC
    }
}

/// Whether this process allocates with mimalloc.
pub fn is_mimalloc() -> bool {
    #[cfg(feature = "mimalloc")]
    return choice::mimalloc();
    #[cfg(not(feature = "mimalloc"))]
    false
}

/// The global allocator: mimalloc or the system's, as [`VAR`] says.
pub struct Chosen;

#[cfg(feature = "mimalloc")]
static MI: mimalloc::MiMalloc = mimalloc::MiMalloc;

macro_rules! dispatch {
    ($method:ident($($arg:expr),*)) => {{
        #[cfg(feature = "mimalloc")]
        if is_mimalloc() {
            return MI.$method($($arg),*);
        }
        System.$method($($arg),*)
    }};
}

// SAFETY: every call goes to one of two allocators that uphold `GlobalAlloc`'s contract, and
// always to the same one within a process (`CHOICE` is set once), so a block is reallocated and
// freed by the allocator that gave it.
unsafe impl GlobalAlloc for Chosen {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { dispatch!(alloc(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { dispatch!(alloc_zeroed(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { dispatch!(dealloc(ptr, layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { dispatch!(realloc(ptr, layout, new_size)) }
    }
}

/// Returns the free memory the allocator holds to the OS, as far as the calling thread can:
/// mimalloc's free pages of this thread's heap (`mi_collect`), or glibc's free memory of every
/// arena (`malloc_trim`; other C libraries have no such call, and their allocator keeps it).
pub fn return_free_memory() {
    if is_mimalloc() {
        // SAFETY: mi_collect only returns the calling thread's free allocator memory to the OS.
        #[cfg(feature = "mimalloc")]
        unsafe {
            libmimalloc_sys::mi_collect(true)
        };
    } else {
        // SAFETY: malloc_trim only returns free memory of glibc's arenas to the OS.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether mimalloc gave the block at `p`.
    #[cfg(feature = "mimalloc")]
    fn from_mimalloc(p: *const u8) -> bool {
        // SAFETY: only asks whether an address lies in mimalloc's reserved memory.
        unsafe { libmimalloc_sys::mi_is_in_heap_region(p.cast()) }
    }

    #[cfg(not(feature = "mimalloc"))]
    fn from_mimalloc(_: *const u8) -> bool {
        false
    }

    /// The allocator the environment names serves every allocation, grown ones too; run again
    /// with `ACTORCILE_ALLOCATOR=system` it is glibc's (the name checked below is the one
    /// `getenv` reads).
    #[test]
    fn the_named_allocator_serves_every_allocation() {
        let wanted = cfg!(feature = "mimalloc") && std::env::var(VAR).as_deref() != Ok("system");
        assert_eq!(is_mimalloc(), wanted);
        let small = Box::new(7u64);
        let mut grown = Vec::with_capacity(1);
        grown.extend(0..100_000u64);
        let zeroed = vec![0u8; 1 << 20];
        for p in [
            (&*small as *const u64).cast::<u8>(),
            grown.as_ptr().cast(),
            zeroed.as_ptr(),
        ] {
            assert_eq!(from_mimalloc(p), wanted, "a block from the other allocator");
        }
        assert_eq!(VAR, "ACTORCILE_ALLOCATOR");
    }

    /// The test above, in a process of its own started with `ACTORCILE_ALLOCATOR=system`.
    #[test]
    fn a_process_started_with_the_system_allocator_uses_it() {
        if std::env::var(VAR).is_ok() {
            return; // the run below itself
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "allocator::tests::the_named_allocator_serves_every_allocation",
                "--nocapture",
            ])
            .env(VAR, "system")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("1 passed"),
            "the test did not run: {stdout}"
        );
    }
}
