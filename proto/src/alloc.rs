//! glibc's allocator, kept to a small resident set (ARCHITECTURE.md,
//! "Memory"): [`tune`] first thing in every role, [`after_large`] once a
//! large message has been written.

/// A message at least this large is followed by [`after_large`].
pub const LARGE_MESSAGE: usize = 16 * 1024;

/// One allocator arena for the few threads a role has, instead of one
/// reserved per thread; set before anything else runs. glibc's thresholds
/// stay dynamic on purpose: fixing them (tried) made every 512 KiB upload
/// chunk a fresh mapping, faulted in page by page (bench-transfer: 6.1–8.2
/// against 5.6–6.1 CPU s/GiB, and uploads below a plain client's speed),
/// while what a long session kept of its answers is given back by
/// [`after_large`] alone.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameters; it is called
    // first thing in main, while the process is single-threaded.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

/// Give the heap's free pages back to the kernel. A whole-catalog listing
/// builds and drops a few hundred KiB of small blocks; glibc keeps the
/// pages they leave free in the middle of the heap (only its top is ever
/// trimmed), so without this a process keeps the peak of its largest
/// answer for good. Costs a walk of the free lists, so it runs only after
/// a message of [`LARGE_MESSAGE`] bytes or more (`madvise` is in every
/// role's seccomp list).
pub fn after_large(len: usize) {
    if len < LARGE_MESSAGE {
        return;
    }
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages of the allocator's own
    // heap to the kernel; it is thread-safe and touches no live block.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}
