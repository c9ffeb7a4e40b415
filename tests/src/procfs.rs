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
