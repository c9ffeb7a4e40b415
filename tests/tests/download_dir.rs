#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The download directory nobody else can squat: the default is private to
//! the user (`$XDG_RUNTIME_DIR`, or a uid-named directory in `$TMPDIR`),
//! created without following symlinks, and any download directory must
//! belong to the server's user and be writable by nobody else. A configured
//! directory is created with its missing parents (0700), as Node's
//! `mkdir -p`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;
use snowluma_e2e::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snowluma-e2e-dldir-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Start in write mode with `env`; the startup error, if any.
fn start(env: &[(&str, &str)]) -> Result<Mcp, String> {
    let mut all = vec![("SNOWLUMA_MCP_ENDPOINT", "http://127.0.0.1:9/"), ("SNOWLUMA_MCP_MODE", "write")];
    all.extend_from_slice(env);
    let mut cmd = std::process::Command::new(bin_path());
    cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).stdin(std::process::Stdio::null());
    for (k, v) in &all {
        cmd.env(k, v);
    }
    let out = cmd.bounded_output().unwrap();
    if out.status.code() == Some(2) {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let mut s = Mcp::spawn(&all);
    s.initialize("2025-11-25");
    Ok(s)
}

fn tmpdir_env(dir: &Path) -> String {
    dir.display().to_string()
}

#[test]
fn a_squatted_default_directory_is_refused() {
    let base = scratch("squat");
    let top = base.join(format!("snowluma-mcp-{}", uid()));
    // Another user's world-writable directory where ours would go.
    std::fs::create_dir(&top).unwrap();
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o777)).unwrap();
    nix::unistd::chown(&top, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let t = tmpdir_env(&base);
    let err = start(&[("TMPDIR", &t)]).err().expect("refused");
    assert!(err.contains("SNOWLUMA_MCP_STREAM_DIR") && err.contains("belongs to uid 65534"), "{err}");
    // Ours, but open to everyone: refused too.
    nix::unistd::chown(&top, Some(nix::unistd::geteuid()), None).unwrap();
    let err = start(&[("TMPDIR", &t)]).err().expect("refused");
    assert!(err.contains("mode 777"), "{err}");
    // A symlink in its place (downloads would land elsewhere): refused.
    std::fs::remove_dir(&top).unwrap();
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &top).unwrap();
    let err = start(&[("TMPDIR", &t)]).err().expect("refused");
    assert!(err.contains("not a directory"), "{err}");
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none(), "nothing was created through the link");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn the_default_directory_is_private() {
    let base = scratch("default");
    let t = tmpdir_env(&base);
    let mut s = start(&[("TMPDIR", &t)]).unwrap();
    let info = s.call("get_runtime_info", json!({}));
    let dir = PathBuf::from(structured(&info)["result"]["transport"]["download_dir"].as_str().unwrap_or_default());
    let expect = std::fs::canonicalize(&base).unwrap().join(format!("snowluma-mcp-{}", uid())).join("downloads");
    assert_eq!(dir, expect, "{info}");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(expect.parent().unwrap()), 0o700);
    assert_eq!(mode(&expect), 0o700);
    drop(s);
    // With XDG_RUNTIME_DIR, there.
    let run = base.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let r = tmpdir_env(&run);
    let mut s = start(&[("TMPDIR", &t), ("XDG_RUNTIME_DIR", &r)]).unwrap();
    let info = s.call("get_runtime_info", json!({}));
    let dir = structured(&info)["result"]["transport"]["download_dir"].as_str().unwrap_or_default().to_owned();
    assert!(dir.ends_with("run/snowluma-mcp/downloads"), "{info}");
    let _ = std::fs::remove_dir_all(&base);
}

/// A configured directory is created with its missing parents, as the
/// Node server's `mkdir -p` does: each 0700 and ours, and downloads land
/// there. One that cannot be created stops startup with one line.
#[test]
fn a_configured_directory_is_created_with_its_missing_parents() {
    let base = scratch("configured");
    let dl = base.join("nonexistent").join("deeper").join("downloads");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let d = dl.display().to_string();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", d.as_str()),
    ];
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for p in [base.join("nonexistent"), base.join("nonexistent/deeper"), dl.clone()] {
        assert!(p.is_dir(), "{} was created", p.display());
        assert_eq!(mode(&p), 0o700, "{}", p.display());
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&p).unwrap()), uid());
    }
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    fake.fake.add_file("x.bin", data.clone());
    let r = s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "x.bin"}}));
    assert!(!is_error(&r), "{r}");
    let path = PathBuf::from(structured(&r)["result"]["file_path"].as_str().unwrap());
    assert_eq!(path.parent(), Some(std::fs::canonicalize(&dl).unwrap().as_path()), "{r}");
    assert_eq!(std::fs::read(&path).unwrap(), data);
    drop(s);
    // A file where a parent would go: startup stops, saying so.
    std::fs::write(base.join("a-file"), b"x").unwrap();
    let m = base.join("a-file").join("downloads").display().to_string();
    let err = start(&[("SNOWLUMA_MCP_STREAM_DIR", &m)]).err().expect("refused");
    assert!(err.contains("SNOWLUMA_MCP_STREAM_DIR") && err.contains("cannot be created"), "{err}");
    let _ = std::fs::remove_dir_all(&base);
}
