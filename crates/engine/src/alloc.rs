//! A counting global allocator: bytes live now, the high-water mark since the
//! last reset, and an optional limit that makes an allocation fail.
//!
//! Written by hand because it must sit under everything (burn's CPU tensors are
//! ordinary heap allocations) and do nothing but count: the allocator crates on
//! crates.io either replace the system allocator or profile with overhead.
//!
//! An allocation over the limit returns null, which Rust turns into an abort
//! ("memory allocation of N bytes failed"). That is why each measured step runs
//! in a child process (see `worker`): out-of-memory ends the child, and the
//! parent records it as a result.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator with counters.
pub struct CountingAllocator;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size() as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size() as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size() as u64;
        let new = new_size as u64;
        if new > old && !reserve(new - old) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new > old {
                LIVE.fetch_sub(new - old, Ordering::Relaxed);
            }
        } else if new < old {
            LIVE.fetch_sub(old - new, Ordering::Relaxed);
        }
        p
    }
}

/// Counts `n` more bytes unless that crosses the limit.
fn reserve(n: u64) -> bool {
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    if live > LIMIT.load(Ordering::Relaxed) {
        LIVE.fetch_sub(n, Ordering::Relaxed);
        return false;
    }
    PEAK.fetch_max(live, Ordering::Relaxed);
    true
}

/// Whether this process counts its allocations (the binary installed the allocator).
pub fn counting() -> bool {
    LIVE.load(Ordering::Relaxed) > 0
}

/// High-water mark since the last [`reset_peak`].
pub fn peak_bytes() -> u64 {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new high-water mark at the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Makes allocations fail once live bytes would exceed `limit`.
pub fn set_limit(limit: Option<u64>) {
    LIMIT.store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Keeps freed memory in the process for reuse instead of returning it to
/// the system. glibc serves blocks over 32 MiB with a fresh `mmap` and unmaps
/// them on free, so every step of a large batch page-faults and zero-fills its
/// big tensors again (measured: a third of a seed2-dual step at batch 8192).
/// Counted bytes and the limit are unaffected; the resident size stays near
/// the step's peak between steps.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation policy; called before
    // the process allocates tensors.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Peak resident set size of this process (VmHWM), from /proc.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
