//! Reading the log from its end and checking that end against the head.

use std::fs::File;
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

use super::head::{Anchor, HeadState, read_head, read_head_file};
use super::key::Key;
use super::record::{Parsed, parse_line};
use super::{AuditError, sha256_tag};
use crate::trace::hex;

/// Longer lines are not records (ours stay far below).
const MAX_LINE: u64 = 1024 * 1024;
/// Reads from the end of the log go back this much at a time.
const CHUNK: u64 = 8192;

/// Offset of the last `\n` before `len`.
pub(super) fn last_newline(f: &File, len: u64) -> std::io::Result<Option<u64>> {
    last_newline_above(f, len, 0)
}

/// Offset of the last `\n` in `floor..end`.
fn last_newline_above(f: &File, end: u64, floor: u64) -> std::io::Result<Option<u64>> {
    let mut end = end;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > floor {
        let start = end.saturating_sub(CHUNK).max(floor);
        let chunk = &mut buf[..(end - start) as usize];
        f.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
    }
    Ok(None)
}

/// The line whose newline is at offset `nl`: its start offset and bytes.
fn line_ending_at(f: &File, nl: u64) -> Result<(u64, Vec<u8>), AuditError> {
    let floor = nl.saturating_sub(MAX_LINE + 1);
    let start = match last_newline_above(f, nl, floor)? {
        Some(i) => i + 1,
        None if floor == 0 => 0,
        None => {
            return Err(AuditError::Damaged(format!("a line longer than {MAX_LINE} bytes ends at byte {nl}")));
        }
    };
    let mut line = vec![0u8; (nl - start) as usize];
    f.read_exact_at(&mut line, start)?;
    Ok((start, line))
}

/// The log's end, checked against its head.
pub(super) struct Tail {
    /// Bytes up to and including the last newline.
    pub(super) complete_len: u64,
    /// Bytes after it: a torn write.
    pub(super) torn: u64,
    /// The last complete record.
    pub(super) last: Option<Anchor>,
}

/// Check the end of the log against the head: the anchored record is still
/// there, unchanged, and every record after it carries a valid MAC and
/// chains. Refuses a log whose end was cut or rewritten.
pub(super) fn check_tail(log: &File, head: &File, key: &Key) -> Result<Tail, AuditError> {
    let len = log.metadata()?.len();
    let complete_len = last_newline(log, len)?.map_or(0, |i| i + 1);
    let torn = len - complete_len;
    let anchor = match read_head(&read_head_file(head)?, Some(key)) {
        HeadState::Blank if complete_len == 0 => return Ok(Tail { complete_len, torn, last: None }),
        HeadState::Anchored(a) if complete_len == 0 => {
            return Err(AuditError::Removed { head_seq: a.seq, last: None });
        }
        HeadState::Anchored(a) => a,
        HeadState::Blank | HeadState::Invalid => return Err(AuditError::HeadUnanchored),
    };
    let mut nl = complete_len - 1;
    let mut newer: Option<Parsed> = None;
    let mut last: Option<Anchor> = None;
    loop {
        let (start, line) = line_ending_at(log, nl)?;
        let hash = sha256_tag(&line);
        let rec = parse_line(&line).map_err(|why| {
            AuditError::Damaged(match &newer {
                Some(n) => format!("the line before record {} is {why}", n.seq),
                None => format!("the last line is {why}"),
            })
        })?;
        if let Some(n) = &newer
            && (n.prev != hash || rec.seq.checked_add(1) != Some(n.seq))
        {
            return Err(AuditError::Damaged(format!("record {} does not chain onto the line before it", n.seq)));
        }
        if last.is_none() {
            last = Some(Anchor { seq: rec.seq, hash: hash.clone() });
        }
        if rec.seq == anchor.seq {
            if hash != anchor.hash {
                return Err(AuditError::Changed { seq: rec.seq });
            }
            return Ok(Tail { complete_len, torn, last });
        }
        if rec.seq < anchor.seq {
            return Err(AuditError::Removed { head_seq: anchor.seq, last: last.map(|a| a.seq) });
        }
        // After the anchor (the head lags): only authenticated records.
        match &rec.sealed {
            Some((covered, tag)) if key.record_mac_ok(covered, tag) => {}
            Some(_) => {
                return Err(AuditError::Damaged(format!(
                    "record {}, after the head's anchor, has an invalid MAC: it was forged or edited",
                    rec.seq
                )));
            }
            None => {
                return Err(AuditError::Damaged(format!(
                    "record {}, after the head's anchor, has no MAC: it was not written by this server",
                    rec.seq
                )));
            }
        }
        if start == 0 {
            return Err(AuditError::Damaged(format!(
                "the log does not contain record {}, which its head file anchors",
                anchor.seq
            )));
        }
        nl = start - 1;
        newer = Some(rec);
    }
}

/// SHA-256 of the bytes of `f` from `from` to its end.
pub(super) fn sha256_from(f: &File, from: u64, len: u64) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = from;
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        f.read_exact_at(&mut buf[..n], at)?;
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditLog;
    use crate::audit::key::KeySource;
    use crate::audit::test_support::{Dir, key_of, lines_of, write_lines, written};
    use crate::audit::verify::{VerifyError, verify};

    #[test]
    fn removed_records_are_caught_by_verify_and_at_open() {
        let dir = Dir::new("removed");
        let path = written(&dir, 4);
        let lines = lines_of(&path);
        let key = || key_of(&path);
        for keep in [4usize, 3, 0] {
            write_lines(&path, &lines[..keep], "\n");
            let err = verify(&path, key()).unwrap_err().to_string();
            assert!(err.contains("removed"), "{keep}: {err}");
            let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
            assert!(
                matches!(err, AuditError::Removed { head_seq: 4, last } if last == keep.checked_sub(1).map(|l| l as u64)),
                "{keep}: {err}"
            );
            assert!(err.is_integrity() && err.to_string().contains("snowluma-mcp audit verify"));
            // Nothing was appended to the shortened log.
            assert_eq!(lines_of(&path).len(), keep);
        }
        // The last record replaced by a forged one with the same seq and a valid chain.
        let mut forged = lines[..4].to_vec();
        let fake = format!(
            r#"{{"v":2,"seq":4,"ts":"x","prev":"{}","phase":"intent","mac":"hmac-sha256:{}"}}"#,
            sha256_tag(lines[3].as_bytes()),
            "0".repeat(64)
        );
        forged.push(fake.clone());
        write_lines(&path, &forged, "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 5, .. }));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(err, AuditError::Changed { seq: 4 }), "{err}");
        // A forged record appended after the anchor.
        let appended = format!(
            r#"{{"v":2,"seq":5,"ts":"x","prev":"{}","phase":"intent","mac":"hmac-sha256:{}"}}"#,
            sha256_tag(lines[4].as_bytes()),
            "0".repeat(64)
        );
        let mut with = lines.clone();
        with.push(appended);
        write_lines(&path, &with, "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 6, .. }));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(&err, AuditError::Damaged(w) if w.contains("record 5") && w.contains("invalid MAC")), "{err}");
        // Without MAC at all (a version-1 line after version-2 ones).
        let v1 = format!(r#"{{"v":1,"seq":5,"ts":"x","prev":"{}","phase":"intent"}}"#, sha256_tag(lines[4].as_bytes()));
        with.pop();
        with.push(v1);
        write_lines(&path, &with, "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 6, .. }));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(&err, AuditError::Damaged(w) if w.contains("no MAC")), "{err}");
        // Restored, it opens again.
        write_lines(&path, &lines, "\n");
        AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        assert!(verify(&path, key()).is_ok());
    }
}
