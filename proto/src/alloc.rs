//! glibc's allocator, kept to a small resident set (ARCHITECTURE.md,
//! "Memory"): [`tune`] first thing in every role, [`after_large`] once a
//! large message has been written.

/// A message at least this large is followed by [`after_large`].
pub const LARGE_MESSAGE: usize = 16 * 1024;

/// One allocator arena for the few threads a role has, instead of one
/// reserved per thread; set before anything else runs. No fast bins: a
/// freed small block that finds its thread cache full goes to the ordinary
/// bins at once, instead of waiting in a fast bin until the next request
/// of 1 KiB or more gathers them all (`malloc_consolidate`). The network
/// executor makes such a request on every call (the call's future), and
/// found fast-bin blocks to gather every time (PERFORMANCE.md, "Latency
/// and throughput", the thirteenth sitting). glibc's thresholds
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
        nix::libc::mallopt(nix::libc::M_MXFAST, 0);
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

/// Once per process, after its start-up is over (its first answer): drop
/// this process's mappings of the executable's code and read-only data.
/// The kernel maps file pages 64 KiB at a time around each page a process
/// touches (fault-around), so start-up code (argument parsing,
/// confinement, the handshakes) would stay mapped, and counted in the
/// process's PSS, for the whole session. Afterwards only what the calls
/// touch comes back, as minor faults from the page cache. Only segments
/// without write permission are dropped (never RELRO or data, whose pages
/// hold values written since exec), and only whole pages inside each.
///
/// Each segment's mapping is also cut into [`PIECE`]-sized mappings, every
/// other one marked `MADV_NOHUGEPAGE` so that neighbours never merge again.
/// Since Linux 6.18 a fault maps the whole large folio that holds the page,
/// when the folio lies within one mapping, not only the 64 KiB around it;
/// and the page cache holds a file just written or read (an install, a
/// copy, a `cat`) in large folios. Without the cut, the calls of a docs
/// session mapped ~1.4 MiB more of the binary (docs tree 8.6–9.2 MiB
/// against 7.2–7.6 with the file read in by faults); with it, no fault
/// maps more than the piece it falls in. The pages themselves stay shared
/// in the page cache; only what this process maps changes. Cutting costs
/// ~3 µs a piece (~250 µs for this binary), so a process calls this once
/// its start-up is over, never on the way to its first answer.
pub fn after_start() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (start, len) in read_only_segments() {
            drop_segment(start, len);
            cut_into_pieces(start, len);
        }
    });
}

/// [`after_start`] without the cut, for the spawner: it touches little of
/// the binary (~0.3 MiB more mapped without the cut, with the whole binary
/// in the page cache), and its first spawn is in the middle of the cold start,
/// where the cut's CPU would delay the workers' start.
pub fn after_start_uncut() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (start, len) in read_only_segments() {
            drop_segment(start, len);
        }
    });
}

/// The executable's segments without write permission, as page-aligned
/// `(start, len)` ranges of this process's memory.
fn read_only_segments() -> Vec<(usize, usize)> {
    use nix::libc;
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid dl_phdr_info for each loaded
        // object, the executable first, and `out` is the Vec handed to
        // dl_iterate_phdr below, alive for the whole call.
        let (info, out) = unsafe { (&*info, &mut *out.cast::<(usize, Vec<(usize, usize)>)>()) };
        let (page, out) = (out.0, &mut out.1);
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_W != 0 {
                continue;
            }
            let (Ok(base), Ok(vaddr), Ok(size)) =
                (usize::try_from(info.dlpi_addr), usize::try_from(ph.p_vaddr), usize::try_from(ph.p_memsz))
            else {
                continue;
            };
            let start = base.wrapping_add(vaddr);
            let (first, end) = (start.next_multiple_of(page), start.wrapping_add(size) / page * page);
            if end > first {
                out.push((first, end - first));
            }
        }
        // Stop after the first object: the executable.
        1
    }
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096);
    let mut out: (usize, Vec<(usize, usize)>) = (page, Vec::new());
    // SAFETY: `each` only reads what the loader hands it and pushes onto
    // `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut out).cast()) };
    out.1
}

/// The most of the executable's read-only segments one fault maps after
/// [`after_start`]: the kernel's fault-around window.
pub const PIECE: usize = 64 * 1024;

/// Drop this process's mappings of `start..start + len`, a read-only
/// segment of the executable.
fn drop_segment(start: usize, len: usize) {
    // SAFETY: the range is whole pages of a mapped segment of the
    // executable without write permission: they hold the file's bytes
    // unchanged, so dropping them only makes the next access map them
    // again from the page cache.
    unsafe { nix::libc::madvise(start as *mut nix::libc::c_void, len, nix::libc::MADV_DONTNEED) };
}

/// Mark every other [`PIECE`] of `start..start + len` (aligned on `PIECE`
/// in memory, as fault-around windows are) `MADV_NOHUGEPAGE`: the mapping
/// splits at each piece's edge, and no folio larger than a piece fits in
/// one mapping any more. Best effort, as the drop: a refused call only
/// leaves a larger mapping.
fn cut_into_pieces(start: usize, len: usize) {
    let end = start.saturating_add(len);
    let mut at = start / PIECE * PIECE;
    while at < end {
        if (at / PIECE) % 2 == 1 {
            let (from, to) = (at.max(start), (at + PIECE).min(end));
            // SAFETY: whole pages of a mapped read-only segment of the
            // executable (`start` and `len` are page-aligned, and so is
            // every piece edge); the advice only sets a flag on their
            // mapping (no transparent huge pages for it), which splits it,
            // and changes no byte of memory.
            unsafe { nix::libc::madvise(from as *mut nix::libc::c_void, to - from, nix::libc::MADV_NOHUGEPAGE) };
        }
        at += PIECE;
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Read-only data of this test binary that nothing else reads.
    static MARKER: [u8; 256 * 1024] = {
        let mut a = [0u8; 256 * 1024];
        let mut i = 0;
        while i < a.len() {
            a[i] = (i % 251) as u8 + 1;
            i += 1;
        }
        a
    };

    fn double(x: u32) -> u32 {
        x * 2
    }
    fn triple(x: u32) -> u32 {
        x * 3
    }
    /// Function pointers: relocated at exec, so they live in RELRO.
    static TABLE: [fn(u32) -> u32; 2] = [double, triple];

    /// Whether the page at `addr` is in this process's page tables
    /// (`/proc/self/pagemap`, bit 63).
    fn present(addr: usize) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap().unwrap() as usize;
        f.seek(SeekFrom::Start((addr / page * 8) as u64)).unwrap();
        let mut entry = [0u8; 8];
        f.read_exact(&mut entry).unwrap();
        u64::from_le_bytes(entry) >> 63 == 1
    }

    /// After the drop, read-only pages are no longer mapped, read back
    /// unchanged, and relocated data (RELRO) is untouched.
    #[test]
    fn read_only_pages_are_dropped_and_come_back_unchanged() {
        let probe = &MARKER[128 * 1024] as *const u8 as usize;
        let segments = read_only_segments();
        assert!(segments.iter().any(|&(s, l)| (s..s + l).contains(&probe)), "the marker is in a read-only segment");
        assert_eq!(std::hint::black_box(&MARKER)[128 * 1024], (128 * 1024 % 251) as u8 + 1);
        assert!(present(probe), "a page just read is mapped");
        after_start();
        assert!(!present(probe), "dropped");
        assert_eq!(std::hint::black_box(&MARKER)[128 * 1024], (128 * 1024 % 251) as u8 + 1, "read back unchanged");
        assert!(present(probe), "mapped again by the read");
        let pick = std::hint::black_box(1usize);
        assert_eq!(TABLE[pick](14), 42, "relocated pointers still work");
        after_start();
        after_start();
        assert_eq!(TABLE[0](21), 42);

        // Every mapping of the read-only segments is one piece at most,
        // and neighbours differ (every other one is `nh`), so none merge.
        // (A kernel without transparent huge pages refuses the advice.)
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            return;
        }
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut vmas: Vec<(usize, usize, bool)> = Vec::new();
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                vmas.push((a, b, false));
            } else if let Some(flags) = line.strip_prefix("VmFlags:") {
                vmas.last_mut().unwrap().2 = flags.split_whitespace().any(|f| f == "nh");
            }
        }
        let mut pieces = 0;
        for &(s, l) in &segments {
            let inside: Vec<_> = vmas.iter().filter(|v| v.0 >= s && v.1 <= s + l).collect();
            assert!(!inside.is_empty());
            for v in &inside {
                assert!(v.1 - v.0 <= PIECE, "a mapping of {} KiB", (v.1 - v.0) / 1024);
            }
            for w in inside.windows(2) {
                assert_ne!(w[0].2, w[1].2, "neighbouring mappings differ");
            }
            pieces += inside.len();
        }
        let whole: usize = segments.iter().map(|&(_, l)| l.div_ceil(PIECE)).sum();
        assert!(pieces + 2 * segments.len() >= whole, "the segments are cut: {pieces} mappings for {whole} pieces");
        assert_eq!(std::hint::black_box(&MARKER)[200 * 1024], (200 * 1024 % 251) as u8 + 1, "still readable");
    }
}
