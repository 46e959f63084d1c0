//! `u3m`: the command-line program (sidecar, runner, A/B). Subcommands arrive
//! with the interposer and tiering issues; for now it reports its version.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("--version") | Some("-V") => {
            println!("u3m {}", u3m_core::VERSION);
            ExitCode::SUCCESS
        }
        Some("--help") | Some("-h") => {
            println!("usage: u3m --version\n(subcommands top, stat, run, ab, replay, synth, plan arrive with later issues)");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("u3m: unknown subcommand '{other}' (try --help)");
            ExitCode::from(2)
        }
    }
}
