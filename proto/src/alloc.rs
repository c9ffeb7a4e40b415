//! glibc's allocator, kept to a small resident set (ARCHITECTURE.md,
//! "Memory"): [`tune`] first thing in every role, [`after_large`] once a
//! large message has been written.

/// A message at least this large is followed by [`after_large`].
pub const LARGE_MESSAGE: usize = 16 * 1024;

/// Fixed allocator thresholds, set before anything else runs. By default a
/// freed block larger than the mmap threshold raises that threshold to its
/// size, so every later answer of that size stays in the heap; fixed
/// thresholds keep blocks of 256 KiB and more mapped on their own (and
/// unmapped when freed) and return the heap's free top past 128 KiB. One
/// arena serves the few threads there are, instead of one per thread.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameters; it is called
    // first thing in main, while the process is single-threaded.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 256 * 1024);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 128 * 1024);
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
