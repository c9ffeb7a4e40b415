//! What the tests read about processes from `/proc`.

/// The direct children of `pid` (every thread's).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out
}

/// The name (`comm`) of `pid`, from `/proc/<pid>/stat`; None once it is gone.
pub fn name(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(n, _)| n.to_owned())
}

/// The CPU time (user + system) `pid` has used, in seconds: its CPU-time
/// clock (to the nanosecond, its exited threads included). Where that clock
/// cannot be read, `/proc/<pid>/stat`'s ticks (10 ms: over a few thousand
/// calls, steps of a microsecond or more per call). None once it is gone.
pub fn cpu_secs(pid: i32) -> Option<f64> {
    if let Ok(clock) = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid))
        && let Ok(t) = nix::time::clock_gettime(clock)
    {
        return Some(t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Some((ticks(11) + ticks(12)) / 100.0)
}

/// Every descendant of `pid`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = children(pid);
    while let Some(p) = queue.pop() {
        queue.extend(children(p));
        out.push(p);
    }
    out
}

/// A process's proportional set size from `/proc/<pid>/smaps_rollup`, in
/// KiB: (total, anonymous, file-backed), with its name.
pub fn pss_kib(pid: i32) -> Option<(String, u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim().to_owned();
    Some((name, field("Pss:"), field("Pss_Anon:"), field("Pss_File:")))
}

/// A process's command line, arguments joined by spaces ("" once it is gone).
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')).unwrap_or(false))
        .unwrap_or(false)
}

/// One field of `/proc/<pid>/status`, trimmed.
pub fn status_field(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Whether `needle` is in a process's readable, writable mappings (its heap
/// and stacks); `None` when none of them could be read.
pub fn memory_contains(pid: i32, needle: &[u8]) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut read_any = false;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else { continue };
        if !perms.starts_with("rw") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b, 16).unwrap());
        if b - a > 256 << 20 {
            continue;
        }
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        read_any = true;
        if buf.windows(needle.len()).any(|w| w == needle) {
            return Some(true);
        }
    }
    read_any.then_some(false)
}

#[cfg(test)]
mod tests {
    fn own_clock() -> f64 {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).unwrap();
        t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
    }

    /// A process's CPU time is its CPU-time clock: read between two readings
    /// of this process's own, it lies between them (10 ms ticks would lag
    /// behind the first). A process that is gone has none.
    #[test]
    fn cpu_secs_reads_the_process_clock() {
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let before = own_clock();
        let read = super::cpu_secs(std::process::id() as i32).unwrap();
        let after = own_clock();
        assert!(before > 0.0 && before <= read && read <= after, "{before} <= {read} <= {after}");
        // Above the kernel's largest pid (2^22), and small enough that the
        // clock id it encodes keeps every bit of it.
        assert_eq!(super::cpu_secs(1 << 27), None);
    }
}
