//! `cargo run -p snowluma-catalog --bin gen-catalog [-- --check | --draft]`
//!
//! Regenerates `catalog/generated/catalog.json` from `catalog/upstream/`
//! and `catalog/overlay/`. `--check` only reports whether the committed file
//! is fresh; `--draft` skips the completeness checks (for work in progress;
//! never committed).

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let draft = args.iter().any(|a| a == "--draft");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("generated/catalog.json");
    let text = match snowluma_catalog::generate::generate(root, !draft) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gen-catalog: {e}");
            return ExitCode::FAILURE;
        }
    };
    if check {
        let current = std::fs::read_to_string(&out).unwrap_or_default();
        if current != text {
            eprintln!("gen-catalog: {} is stale", out.display());
            return ExitCode::FAILURE;
        }
        eprintln!("gen-catalog: up to date");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = std::fs::write(&out, text) {
        eprintln!("gen-catalog: cannot write {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    eprintln!("gen-catalog: wrote {}", out.display());
    ExitCode::SUCCESS
}
