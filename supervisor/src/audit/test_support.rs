//! What the audit unit tests share: a scratch directory and small logs.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::AuditLog;
use super::key::{Key, KeySource, key_path, read_key};

pub(super) struct Dir(pub(super) PathBuf);
impl Dir {
    pub(super) fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("snowluma-audit-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn intent(n: i64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("phase".into(), json!("intent"));
    m.insert("n".into(), json!(n));
    m
}

pub(super) fn key_of(path: &Path) -> Result<Key, String> {
    read_key(&key_path(path)).map_err(|e| e.to_string())
}

/// A log with `extra` intents after its open record, the log closed.
pub(super) fn written(dir: &Dir, extra: i64) -> PathBuf {
    let path = dir.0.join("audit.log");
    let log = AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
    for i in 0..extra {
        log.append_blocking(intent(i)).unwrap();
    }
    path
}

pub(super) fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

pub(super) fn write_lines(path: &Path, ls: &[String], tail: &str) {
    let text = if ls.is_empty() { String::new() } else { format!("{}{tail}", ls.join("\n")) };
    std::fs::write(path, text).unwrap();
}
