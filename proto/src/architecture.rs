//! The figures ARCHITECTURE.md states in its "Numbers" table, read back so
//! that each crate's tests can hold them against the constants they
//! describe (every crate checks its own: `check(DOC, &[…])`).

use std::time::Duration;

/// The value the "Numbers" table of `doc` states for `figure` (the row's
/// first cell), if there is such a row.
pub fn stated<'a>(doc: &'a str, figure: &str) -> Option<&'a str> {
    let table = doc.split("\n## Numbers\n").nth(1)?;
    let table = table.split("\n## ").next().unwrap_or(table);
    table.lines().find_map(|line| {
        let mut cells = line.trim().strip_prefix('|')?.split('|').map(str::trim);
        (cells.next()? == figure).then(|| cells.next()).flatten()
    })
}

/// A size as the table writes it: `16 MiB`, `256 KiB`, or a plain count.
pub fn size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    match bytes {
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= KIB && b % KIB == 0 => format!("{} KiB", b / KIB),
        b => b.to_string(),
    }
}

/// A duration as the table writes it: `50 ms`, `10 s`, `10 min`, `1 h`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        ms if ms % 3_600_000 == 0 && ms > 0 => format!("{} h", ms / 3_600_000),
        ms if ms % 60_000 == 0 && ms >= 600_000 => format!("{} min", ms / 60_000),
        ms if ms % 1000 == 0 && ms > 0 => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

/// Every `(figure, value)` must be a row of the table with that value;
/// panics naming each one that is missing or differs (tests only).
pub fn check(doc: &str, figures: &[(&str, String)]) {
    let wrong: Vec<String> = figures
        .iter()
        .filter_map(|(figure, value)| match stated(doc, figure) {
            Some(s) if s == value => None,
            Some(s) => Some(format!("{figure:?}: ARCHITECTURE.md says {s:?}, the code {value:?}")),
            None => Some(format!("{figure:?}: no row in ARCHITECTURE.md's Numbers table (the code: {value:?})")),
        })
        .collect();
    assert!(wrong.is_empty(), "ARCHITECTURE.md's Numbers table is out of date:\n{}", wrong.join("\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = include_str!("../../ARCHITECTURE.md");

    #[test]
    fn figures_are_read_from_the_numbers_table_only() {
        let doc = "# A\n| x | 1 |\n## Numbers\n\n| figure | value | defined in |\n|---|---|---|\n| x | 2 | a.rs |\n## Tests\n| y | 3 |\n";
        assert_eq!(stated(doc, "x"), Some("2"));
        assert_eq!(stated(doc, "y"), None);
        assert_eq!(size(16 * 1024 * 1024), "16 MiB");
        assert_eq!(size(256 * 1024), "256 KiB");
        assert_eq!(size(256), "256");
        assert_eq!(duration(Duration::from_millis(50)), "50 ms");
        assert_eq!(duration(Duration::from_secs(10)), "10 s");
        assert_eq!(duration(Duration::from_secs(600)), "10 min");
        assert_eq!(duration(Duration::from_secs(3600)), "1 h");
    }

    #[test]
    fn the_architecture_numbers_of_proto_are_the_code_s() {
        check(
            DOC,
            &[
                ("IPC frame", size(crate::MAX_FRAME_BYTES as u64)),
                ("descriptor unclaimed after", duration(crate::fdpass::UNCLAIMED_TTL)),
                ("launcher↔front message", size(crate::front::MAX_MESSAGE as u64)),
            ],
        );
    }
}
