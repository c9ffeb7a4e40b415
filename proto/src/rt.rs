//! What std's runtime set-up does before `main` and after it, for the
//! binary's own C `main` (`supervisor/src/main.rs`, `no_main`).

use std::process::ExitCode;

/// Before anything else: descriptors 0, 1 and 2 opened on `/dev/null` if
/// they are closed (so that nothing opened later takes their numbers, as
/// std does), and `SIGPIPE` ignored (a write to a closed pipe or socket is
/// an `EPIPE` error, not death; ignored signals stay ignored across exec,
/// as every role expects).
pub fn start() {
    use nix::libc;
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd { fd, events: 0, revents: 0 });
    // SAFETY: poll reads and writes the three pollfd entries of a live
    // local array, whose length is passed.
    let polled = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
    if polled < 0 {
        // No answer (EINTR, ENOMEM): check each descriptor with fcntl.
        for p in &mut fds {
            // SAFETY: F_GETFD takes no pointer.
            if unsafe { libc::fcntl(p.fd, libc::F_GETFD) } == -1 {
                p.revents = libc::POLLNVAL;
            }
        }
    }
    for p in fds {
        if p.revents & libc::POLLNVAL != 0 {
            // SAFETY: open with a NUL-terminated literal path; the lowest
            // free number is the closed one (lower ones are open by now).
            let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
            if fd != p.fd {
                // /dev/null missing, or another number: no safe way on.
                std::process::abort();
            }
        }
    }
    // SAFETY: sets the disposition of SIGPIPE to "ignore"; no handler.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// After `main`: stdout's buffer flushed, and the exit status as a number.
pub fn finish(code: ExitCode) -> std::ffi::c_int {
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // ExitCode keeps its number private; every one this binary returns is
    // made from a u8 (or is SUCCESS / FAILURE, 0 and 1).
    (0..=u8::MAX).find(|n| ExitCode::from(*n) == code).map_or(1, std::ffi::c_int::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_their_numbers() {
        assert_eq!(finish(ExitCode::SUCCESS), 0);
        assert_eq!(finish(ExitCode::FAILURE), 1);
        assert_eq!(finish(ExitCode::from(2)), 2);
        assert_eq!(finish(ExitCode::from(255)), 255);
    }
}
