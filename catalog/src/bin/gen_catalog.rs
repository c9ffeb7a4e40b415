//! `cargo run -p snowluma-catalog --bin gen-catalog [-- --check | --draft]`
//!
//! Regenerates `catalog/generated/catalog.json` from `catalog/upstream/`
//! and `catalog/overlay/`, and `catalog/generated/index.rs` (the build-time
//! index compiled into the binary) from that text. `--check` only reports
//! whether the committed files are fresh; `--draft` skips the completeness
//! checks (for work in progress; never committed).

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let draft = args.iter().any(|a| a == "--draft");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = match snowluma_catalog::generate::generate(root, !draft) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gen-catalog: {e}");
            return ExitCode::FAILURE;
        }
    };
    let index = match snowluma_catalog::index::render(&text) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("gen-catalog: {e}");
            return ExitCode::FAILURE;
        }
    };
    let files = [(root.join("generated/catalog.json"), text), (root.join("generated/index.rs"), index)];
    if check {
        let mut fresh = true;
        for (path, want) in &files {
            if std::fs::read_to_string(path).unwrap_or_default() != *want {
                eprintln!("gen-catalog: {} is stale", path.display());
                fresh = false;
            }
        }
        if !fresh {
            return ExitCode::FAILURE;
        }
        eprintln!("gen-catalog: up to date");
        return ExitCode::SUCCESS;
    }
    for (path, text) in &files {
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("gen-catalog: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("gen-catalog: wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
