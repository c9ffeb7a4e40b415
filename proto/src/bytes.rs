//! Byte helpers every process uses: lower-case hex and kernel randomness.

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

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
