//! `snowluma-fake`: runs the fake SnowLuma server by hand or for benchmarks.
//!
//! ```text
//! snowluma-fake [--token TOKEN] [--port PORT] [--file NAME=PATH]... [--preset interop|golden]
//! ```
//!
//! Prints the endpoint URL (`http://127.0.0.1:<port>/`) as one line on stdout,
//! then serves until interrupted or killed. `--file` makes a local file
//! downloadable under NAME by the `download_file*_stream` actions.
//! `--preset interop` applies [`FakeSnowLuma::interop_preset`], the set-up the
//! interoperability clients in `tests/interop/` expect; `--preset golden`
//! applies [`FakeSnowLuma::golden_preset`], the fake the Node server's
//! transcripts were recorded against.

use std::io::Write;
use std::process::ExitCode;

use snowluma_fake::{FakeOptions, FakeSnowLuma};

const USAGE: &str =
    "usage: snowluma-fake [--token TOKEN] [--port PORT] [--file NAME=PATH]... [--preset interop|golden]";

#[derive(Debug, Default)]
struct Args {
    token: Option<String>,
    port: u16,
    files: Vec<(String, String)>,
    preset_interop: bool,
    preset_golden: bool,
    help: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args::default();
    while let Some(arg) = args.next() {
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value.to_string())),
            _ => (arg, None),
        };
        let mut value = || inline.clone().or_else(|| args.next()).ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--token" => parsed.token = Some(value()?),
            "--port" => {
                let text = value()?;
                parsed.port = text.parse().map_err(|_| format!("invalid port: {text}"))?;
            }
            "--file" => {
                let spec = value()?;
                let (name, path) = spec.split_once('=').ok_or(format!("--file wants NAME=PATH, got {spec}"))?;
                parsed.files.push((name.to_string(), path.to_string()));
            }
            "--preset" => match value()?.as_str() {
                "interop" => parsed.preset_interop = true,
                "golden" => parsed.preset_golden = true,
                other => return Err(format!("unknown preset: {other} (known: interop, golden)")),
            },
            "-h" | "--help" => parsed.help = true,
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    Ok(parsed)
}

#[tokio::main]
#[allow(clippy::print_stdout)]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("snowluma-fake: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let server = match FakeSnowLuma::start_on_port(FakeOptions { token: args.token }, args.port).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("snowluma-fake: cannot listen on 127.0.0.1:{}: {err}", args.port);
            return ExitCode::FAILURE;
        }
    };
    if args.preset_interop {
        server.interop_preset();
    }
    if args.preset_golden {
        server.golden_preset();
    }
    for (name, path) in &args.files {
        match std::fs::read(path) {
            Ok(bytes) => server.add_file(name, bytes),
            Err(err) => {
                eprintln!("snowluma-fake: cannot read {path}: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("{}", server.url());
    let _ = std::io::stdout().flush();
    // Serve until Ctrl-C; if signals are unavailable, until killed.
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
    drop(server);
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::parse_args;

    fn parse(args: &[&str]) -> Result<super::Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_flags() {
        let args = parse(&["--token", "t", "--port=8080", "--file", "a.bin=/tmp/a"]).unwrap();
        assert_eq!(args.token.as_deref(), Some("t"));
        assert_eq!(args.port, 8080);
        assert_eq!(args.files, vec![("a.bin".to_string(), "/tmp/a".to_string())]);
        assert!(parse(&[]).unwrap().token.is_none());
        assert!(parse(&["--port", "x"]).is_err());
        assert!(parse(&["--port"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--preset", "interop"]).unwrap().preset_interop);
        assert!(parse(&["--preset", "golden"]).unwrap().preset_golden);
        assert!(parse(&["--preset", "x"]).is_err());
    }
}
