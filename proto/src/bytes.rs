//! Byte helpers every process uses: lower-case hex and kernel randomness.

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// [`hex`], appended to `out`.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

/// Fill `buf` from the kernel's random source (`getrandom`, blocking until
/// the pool is initialised). Interrupted calls and short reads continue;
/// any other error is returned, never retried.
pub fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`,
        // which we own; no other memory is touched.
        let n = unsafe { nix::libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(())
}

/// `N` random bytes. The kernel's random source does not fail on the
/// kernels this server runs on (Linux ≥ 3.17) unless something forbids the
/// call; then there is no safe way on (identifiers and keys would be
/// predictable), so the process stops loudly instead of spinning or going on.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    if let Err(e) = fill_random(&mut buf) {
        eprintln!("snowluma-mcp: the kernel's random source failed ({e}); stopping");
        std::process::abort();
    }
    buf
}

/// Bytes [`random_ids`] hands out per `getrandom`.
const ID_POOL: usize = 4096;

/// Bumped in every child a `fork` makes (`pthread_atfork`), so that a child
/// never hands out the bytes its parent will also hand out.
static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn forked() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

struct IdPool {
    bytes: [u8; ID_POOL],
    used: usize,
    forks: u64,
}

/// `N` random bytes for the identifiers every call needs (trace and span
/// ids), from the same kernel source as [`random_bytes`] but fetched
/// [`ID_POOL`] bytes at a time, so a call costs no system call. Each byte
/// is handed out once and wiped; a forked child refills before its first
/// use. Keys and secrets use [`random_bytes`], which keeps nothing.
pub fn random_ids<const N: usize>() -> [u8; N] {
    use std::sync::atomic::Ordering;
    static POOL: std::sync::Mutex<IdPool> =
        std::sync::Mutex::new(IdPool { bytes: [0; ID_POOL], used: ID_POOL, forks: 0 });
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    if N > ID_POOL {
        return random_bytes();
    }
    AT_FORK.call_once(|| {
        // SAFETY: registers a child handler that only bumps an atomic
        // (async-signal-safe, allocation-free), as a child after fork needs.
        unsafe { nix::libc::pthread_atfork(None, None, Some(forked)) };
    });
    let mut pool = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let forks = FORKS.load(Ordering::Relaxed);
    if pool.used + N > ID_POOL || pool.forks != forks {
        pool.bytes = random_bytes();
        pool.used = 0;
        pool.forks = forks;
    }
    let mut out = [0u8; N];
    let at = pool.used;
    out.copy_from_slice(&pool.bytes[at..at + N]);
    pool.bytes[at..at + N].fill(0);
    pool.used += N;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pooled ids: never repeated, across refills, and a forked child does
    /// not hand out what its parent will.
    #[test]
    fn pooled_ids_are_never_handed_out_twice() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..(3 * ID_POOL / 16) {
            assert!(seen.insert(random_ids::<16>()), "a repeated id");
        }
        let parent_next = {
            // SAFETY: test only; the child only computes, writes to a pipe
            // and exits without unwinding.
            let (rd, wr) = nix::unistd::pipe().unwrap_or_else(|e| panic!("{e}"));
            match unsafe { nix::unistd::fork() }.unwrap_or_else(|e| panic!("{e}")) {
                nix::unistd::ForkResult::Child => {
                    let id = random_ids::<16>();
                    let _ = nix::unistd::write(&wr, &id);
                    // SAFETY: leave the forked test process at once.
                    unsafe { nix::libc::_exit(0) };
                }
                nix::unistd::ForkResult::Parent { child } => {
                    drop(wr);
                    let mut child_id = [0u8; 16];
                    let mut f = std::fs::File::from(rd);
                    std::io::Read::read_exact(&mut f, &mut child_id).unwrap_or_else(|e| panic!("{e}"));
                    let _ = nix::sys::wait::waitpid(child, None);
                    (child_id, random_ids::<16>())
                }
            }
        };
        assert_ne!(parent_next.0, parent_next.1, "the child refilled its pool");
        assert!(!seen.contains(&parent_next.0) && !seen.contains(&parent_next.1));
    }

    #[test]
    fn hex_is_lower_case_and_complete() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn random_bytes_fill_large_buffers() {
        let mut big = vec![0u8; 4096];
        fill_random(&mut big).unwrap_or_else(|e| panic!("{e}"));
        assert!(big.iter().any(|b| *b != 0));
        assert_ne!(random_bytes::<16>(), random_bytes::<16>());
    }
}
