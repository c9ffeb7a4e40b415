//! `snowluma-mcp audit verify|reanchor|keygen`: reports on stderr, nothing
//! on stdout.

use std::process::ExitCode;

use snowluma_config::AuditCommand;
use snowluma_logsink::eprintln_nb;

/// `snowluma-mcp audit ...`: reports on stderr, nothing on stdout.
/// `configured_key` is --audit-key / SNOWLUMA_MCP_AUDIT_KEY.
pub fn run(action: &AuditCommand, configured_key: Option<&str>) -> ExitCode {
    let key_file = |log: &std::path::Path, key: &Option<std::path::PathBuf>| {
        key.clone()
            .or_else(|| configured_key.filter(|k| !k.trim().is_empty()).map(std::path::PathBuf::from))
            .unwrap_or_else(|| super::key_path(log))
    };
    match action {
        AuditCommand::Verify { path, key } => {
            let key = super::read_key(&key_file(path, key)).map_err(|e| match e {
                super::AuditError::KeyUnreadable { path, source } => {
                    format!("no readable key at {}: {source}", path.display())
                }
                other => other.to_string(),
            });
            match super::verify(path, key) {
                Ok(report) => {
                    eprintln_nb!("audit log OK: {report}");
                    ExitCode::SUCCESS
                }
                Err(e @ super::VerifyError::Line { .. }) => {
                    eprintln_nb!("audit log BROKEN at {e}");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln_nb!("audit log BROKEN: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        AuditCommand::Reanchor { path, key } => {
            let key = match super::read_key(&key_file(path, key)) {
                Ok(k) => k,
                Err(e) => {
                    eprintln_nb!("audit log not re-anchored: the key is needed to check the records' MACs: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match super::reanchor(path, &key) {
                Ok(r) => {
                    match &r.anchor {
                        Some(a) => eprintln_nb!(
                            "audit log re-anchored: {} records, chain intact, MACs valid; {} now anchors record {} ({})",
                            r.records,
                            r.head.display(),
                            a.seq,
                            a.hash
                        ),
                        None => {
                            eprintln_nb!(
                                "audit log re-anchored: the log is empty; {} holds no anchor",
                                r.head.display()
                            )
                        }
                    }
                    if r.torn > 0 {
                        eprintln_nb!(
                            "note: the log ends with an incomplete line ({} bytes); the server drops it at its next start and records that",
                            r.torn
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln_nb!("audit log not re-anchored: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        AuditCommand::Keygen { path } => match super::keygen(path) {
            Ok(()) => {
                eprintln_nb!("audit key written to {} (mode 0600)", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln_nb!("audit key not written: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
