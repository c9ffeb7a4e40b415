//! `snowluma-mcp audit verify`: the whole log checked against its chain,
//! MACs and head.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::head::{HeadState, head_path, read_head};
use super::key::Key;
use super::record::{GENESIS_PREV, parse_line};
use super::sha256_tag;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VerifyError {
    /// A record is damaged: the first bad line (1-based).
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    /// The log as a whole (its head, its length).
    #[error("{0}")]
    Log(String),
}

impl VerifyError {
    fn line(line: usize, reason: impl Into<String>) -> VerifyError {
        VerifyError::Line { line, reason: reason.into() }
    }
}

#[derive(Debug, PartialEq)]
pub enum MacCheck {
    Checked,
    /// Why not (the key could not be read).
    NotChecked(String),
}

#[derive(Debug, PartialEq)]
pub enum HeadCheck {
    /// An empty log and no anchor yet.
    Fresh,
    /// The head anchors the last record.
    Matches,
    /// The head anchors an earlier record; `after` records followed it
    /// (their MACs were checked when the key was available).
    Lags { anchored: u64, after: u64 },
}

/// What `verify` found in an intact log.
#[derive(Debug, PartialEq)]
pub struct Report {
    pub records: usize,
    /// Version-1 records (without MAC), all before the first version-2 one.
    pub legacy: usize,
    pub macs: MacCheck,
    pub head: HeadCheck,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.head == HeadCheck::Fresh {
            return write!(f, "{} records (an empty log, no head anchor yet)", self.records);
        }
        write!(f, "{} records, chain intact", self.records)?;
        if self.macs == MacCheck::Checked {
            f.write_str(", MACs valid")?;
        }
        if self.legacy > 0 {
            write!(f, " ({} earlier records predate MACs)", self.legacy)?;
        }
        match &self.head {
            HeadCheck::Matches => f.write_str(", head matches")?,
            HeadCheck::Lags { anchored, after } => write!(
                f,
                ", head matches record {anchored} ({after} later records written after the last head update)"
            )?,
            HeadCheck::Fresh => {}
        }
        if let MacCheck::NotChecked(why) = &self.macs {
            write!(
                f,
                "; MACs NOT checked ({why}): without the key, an edited, forged or re-chained record cannot be detected"
            )?;
        }
        Ok(())
    }
}

pub(super) struct Chain {
    legacy: usize,
    /// Index of the first version-2 record.
    first_sealed: Option<usize>,
}

/// Check seq, prev and (with a key) the MAC of every line.
pub(super) fn check_chain(lines: &[&[u8]], key: Option<&Key>) -> Result<Chain, VerifyError> {
    let mut prev = GENESIS_PREV.to_owned();
    let mut chain = Chain { legacy: 0, first_sealed: None };
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let rec = parse_line(line).map_err(|why| VerifyError::line(n, why))?;
        match &rec.sealed {
            None if chain.first_sealed.is_some() => {
                return Err(VerifyError::line(
                    n,
                    "a record without a MAC after records with MACs: it was not written by this server",
                ));
            }
            None => chain.legacy += 1,
            Some((covered, tag)) => {
                chain.first_sealed.get_or_insert(i);
                if let Some(k) = key
                    && !k.record_mac_ok(covered, tag)
                {
                    return Err(VerifyError::line(
                        n,
                        "its MAC does not match: the record was edited or forged (or the key is not this log's)",
                    ));
                }
            }
        }
        if rec.prev != prev {
            return Err(VerifyError::line(
                n,
                if i == 0 {
                    "does not start the chain (earlier lines were removed)"
                } else {
                    "prev does not match the previous line (a line was edited, removed or moved)"
                },
            ));
        }
        if rec.seq != i as u64 {
            return Err(VerifyError::line(n, "seq out of order"));
        }
        prev = sha256_tag(line);
    }
    Ok(chain)
}

/// Complete lines (without their newlines) and the length of a torn tail.
pub(super) fn split_lines(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let lines = if complete == 0 { Vec::new() } else { bytes[..complete - 1].split(|b| *b == b'\n').collect() };
    (lines, bytes.len() - complete)
}

/// Check the whole log: chain, seq, MACs (when `key` is readable) and the
/// head file. `key` is the key, or why it could not be read.
pub fn verify(path: &Path, key: Result<Key, String>) -> Result<Report, VerifyError> {
    let cannot = |e: std::io::Error| VerifyError::Log(format!("cannot read {}: {e}", path.display()));
    let log = File::open(path).map_err(cannot)?;
    // A shared lock: no server appends (and moves the head) while the log
    // and then its head are read.
    log.lock_shared().map_err(cannot)?;
    let result = verify_locked(path, &log, key);
    let _ = log.unlock();
    result
}

fn verify_locked(path: &Path, log: &File, key: Result<Key, String>) -> Result<Report, VerifyError> {
    let mut bytes = Vec::new();
    let mut reader = log;
    reader.read_to_end(&mut bytes).map_err(|e| VerifyError::Log(format!("cannot read {}: {e}", path.display())))?;
    let (lines, torn) = split_lines(&bytes);
    let chain = check_chain(&lines, key.as_ref().ok())?;
    if torn > 0 {
        return Err(VerifyError::line(
            lines.len() + 1,
            "incomplete last line (the log was truncated, or a write was interrupted; the server drops it at its next append and writes a `recovered` record)",
        ));
    }
    let macs = match &key {
        Ok(_) => MacCheck::Checked,
        Err(why) => MacCheck::NotChecked(why.clone()),
    };
    let n = lines.len();
    let hp = head_path(path);
    let reanchor =
        format!("if the log is as expected, anchor it again with `snowluma-mcp audit reanchor {}`", path.display());
    let state = match std::fs::read(&hp) {
        Ok(b) => Some(read_head(&b, key.as_ref().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(VerifyError::Log(format!("cannot read the head file {}: {e}", hp.display()))),
    };
    let report = |head| Report { records: n, legacy: chain.legacy, macs, head };
    let anchor = match state {
        None | Some(HeadState::Blank) if n == 0 => return Ok(report(HeadCheck::Fresh)),
        None => {
            return Err(VerifyError::Log(format!(
                "{n} records and the chain is intact, but the head file {} is missing: records at the end may have been removed together with it (or the log predates head files); {reanchor}",
                hp.display()
            )));
        }
        Some(HeadState::Blank | HeadState::Invalid) => {
            return Err(VerifyError::Log(format!(
                "{n} records and the chain is intact, but the head file {} holds no valid anchor (damaged, emptied, or made with another key), so removed records cannot be ruled out; {reanchor}",
                hp.display()
            )));
        }
        Some(HeadState::Anchored(a)) => a,
    };
    if n == 0 {
        return Err(VerifyError::Log(format!(
            "the log is empty, but its head file anchors record {}: every record was removed (the log was truncated)",
            anchor.seq
        )));
    }
    let last = (n - 1) as u64;
    if anchor.seq > last {
        return Err(VerifyError::Log(format!(
            "the log ends at record {last}, but its head file anchors record {}: {} records were removed from the end",
            anchor.seq,
            anchor.seq - last
        )));
    }
    let at = anchor.seq as usize;
    if sha256_tag(lines[at]) != anchor.hash {
        return Err(VerifyError::line(
            at + 1,
            "does not match the hash its head file anchors: the record was changed (or the log rewritten)",
        ));
    }
    if let Some(i) = (at + 1..n).find(|i| chain.first_sealed.is_none_or(|f| *i < f)) {
        return Err(VerifyError::line(
            i + 1,
            "a record without a MAC after the head's anchor: it was not written by this server",
        ));
    }
    Ok(report(if anchor.seq == last {
        HeadCheck::Matches
    } else {
        HeadCheck::Lags { anchored: anchor.seq, after: last - anchor.seq }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::test_support::{Dir, key_of, lines_of, write_lines, written};

    #[test]
    fn chain_tamper_detection() {
        let dir = Dir::new("tamper");
        let path = written(&dir, 4);
        let lines = lines_of(&path);
        let key = || key_of(&path);
        // edit: its own MAC
        let mut edited = lines.clone();
        edited[2] = edited[2].replace("\"n\":1", "\"n\":9");
        write_lines(&path, &edited, "\n");
        assert_eq!(
            verify(&path, key()).unwrap_err(),
            VerifyError::line(
                3,
                "its MAC does not match: the record was edited or forged (or the key is not this log's)"
            )
        );
        // edit without the key: the chain breaks at the next line
        let err = verify(&path, Err("no key".into())).unwrap_err();
        assert!(matches!(err, VerifyError::Line { line: 4, .. }), "{err}");
        // delete
        write_lines(&path, &[lines[0].clone(), lines[1].clone(), lines[3].clone(), lines[4].clone()], "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 3, .. }));
        // reorder
        write_lines(
            &path,
            &[lines[0].clone(), lines[2].clone(), lines[1].clone(), lines[3].clone(), lines[4].clone()],
            "\n",
        );
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 2, .. }));
        // torn
        write_lines(&path, &[lines[0].clone(), lines[1].clone(), lines[2][..10].to_owned()], "");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 3, .. }));
        // restored
        write_lines(&path, &lines, "\n");
        assert!(verify(&path, key()).is_ok());
    }
}
