//! Where an automatic upload's `execution.input_file` points, lexically.
//!
//! The Node server resolves the path with `path.resolve` (which removes
//! `.`, empty components and `..` as text) and then `realpath`, and accepts
//! it when the result lies inside the upload root. This module is the
//! lexical half, shared by the supervisor (for the path as given) and the
//! file-transfer worker (for the absolute targets of symlinks it meets):
//! nothing here touches the file system. The worker follows symlinks and
//! opens the file beneath the root's descriptor (`files.rs`), so whatever
//! these functions say, the kernel decides what can be opened.

use std::ffi::OsString;
use std::path::{Component, Path};

/// The components of `path` after `/`, normalized as Node's `path.resolve`
/// does: `.` and empty components dropped, `..` removing the component
/// before it (at `/` it stays at `/`).
pub fn normalize(path: &Path) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s.to_owned()),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The components of `path` beneath the upload root: `path` (absolute, or
/// relative to the first of `roots`, the canonical root) normalized, minus
/// the first of `roots` it starts with. `None` when it starts with none of
/// them (outside the root); empty for the root itself.
pub fn beneath(path: &Path, roots: &[&Path]) -> Option<Vec<OsString>> {
    let base = roots.first()?;
    let full = if path.is_absolute() { normalize(path) } else { normalize(&base.join(path)) };
    roots.iter().find_map(|r| {
        let r = normalize(r);
        full.starts_with(&r).then(|| full[r.len()..].to_vec())
    })
}

/// `beneath` as a `/`-joined relative path (what the supervisor sends the
/// worker); `None` for the root itself, a place outside it, or a path that
/// is not valid UTF-8.
pub fn relative_to_root(path: &str, roots: &[&Path]) -> Option<String> {
    let parts = beneath(Path::new(path), roots)?;
    if parts.is_empty() {
        return None;
    }
    let parts: Option<Vec<&str>> = parts.iter().map(|p| p.to_str()).collect();
    Some(parts?.join("/"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_resolve_lexically_as_node_does() {
        let roots = [Path::new("/data/up"), Path::new("/srv/up")];
        let rel = |p: &str| relative_to_root(p, &roots);
        assert_eq!(rel("/data/up/a/b.txt").as_deref(), Some("a/b.txt"));
        assert_eq!(rel("/srv/up/./c").as_deref(), Some("c"));
        assert_eq!(rel("/data/up/sub/../small.txt").as_deref(), Some("small.txt"));
        assert_eq!(rel("/data/up//x///y/").as_deref(), Some("x/y"));
        assert_eq!(rel("/data/up/../up/x").as_deref(), Some("x"));
        // Relative paths resolve against the (canonical) root.
        assert_eq!(rel("small.txt").as_deref(), Some("small.txt"));
        assert_eq!(rel("./sub/../small.txt").as_deref(), Some("small.txt"));
        assert_eq!(rel("../up/x").as_deref(), Some("x"));
        // Outside, or the root itself.
        assert_eq!(rel("../outside/x"), None);
        assert_eq!(rel("/data/up/../secret.txt"), None);
        assert_eq!(rel("/etc/passwd"), None);
        assert_eq!(rel("/data/upper/x"), None);
        assert_eq!(rel("/data/up"), None);
        assert_eq!(rel("/data/up/sub/.."), None);
        assert_eq!(rel("."), None);
        assert_eq!(beneath(Path::new("/data/up"), &roots).unwrap(), Vec::<OsString>::new());
        assert_eq!(normalize(Path::new("/../../a")), vec![OsString::from("a")]);
    }
}
