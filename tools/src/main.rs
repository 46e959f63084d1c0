//! `u3m`: the command-line program — the sidecar (`stat`, `top`) that reads
//! the stats segments of running u3m processes, the runner (`run`) and the
//! A/B comparison (`ab`).

mod ab;
mod collect;
mod doctor;
mod error;
mod exporter;
mod human;
mod json;
mod pickle;
mod plan;
mod progress;
mod ranks;
mod replay;
mod report;
mod run;
mod shell;
mod snapshot;
mod stat;
mod synth;
mod table;
mod top;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "u3m",
    version = u3m_core::VERSION,
    about = "Transparent three-tier memory for Ascend NPU processes: run programs under libu3m.so and watch them",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print one snapshot of every live u3m process (or one).
    Stat(StatArgs),
    /// Live view of every u3m process (or one), refreshed in place.
    Top(TopArgs),
    /// Run CMD under libu3m.so, with options turned into U3M_* variables.
    Run(run::RunArgs),
    /// Run CMD with and without libu3m.so and compare the arms side by side.
    Ab(ab::AbArgs),
    /// Size a model's weights, gradients, optimizer states, activations and KV cache, and whether they fit HBM / DRAM / NVMe.
    Plan(plan::PlanArgs),
    /// Replay traces through the tiering engine and its policies with a cost model, side by side against Belady's MIN.
    Replay(replay::ReplayArgs),
    /// Write a PyTorch memory snapshot (pickle for torch.cuda._memory_viz) from a trace or a live process.
    Snapshot(snapshot::SnapshotArgs),
    /// Write a self-contained HTML report of what the tiering engine does with a trace.
    Report(report::ReportArgs),
    /// Serve /metrics (Prometheus / OpenMetrics) for every u3m process on this node.
    Exporter(exporter::ExporterArgs),
    /// Write a trace of a Llama-shaped workload (training, LoRA, RAG serving, mixed), optionally scaled down.
    Synth(synth::SynthArgs),
    /// Check this machine and environment for u3m: libascendcl.so and CANN version, LD_PRELOAD, settings, /dev/shm, swap directory, locked memory, huge pages.
    Doctor(doctor::DoctorArgs),
    /// Print shell completions: `u3m completions bash > /etc/bash_completion.d/u3m`.
    Completions(shell::CompletionsArgs),
    /// Print the man page (roff), or write one per command with --dir.
    Man(shell::ManArgs),
}

/// Where to look for segments, and which process.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Only the process with this pid.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
    /// Directory of the stats segments [default: $U3M_SHM_DIR or /dev/shm].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Target {
    pub fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(u3m_core::shm::default_dir)
    }
}

#[derive(clap::Args, Debug)]
pub struct StatArgs {
    #[command(flatten)]
    pub target: Target,
    /// Print JSON (schema in docs/stats.md) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// How many recent events to show per process.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub events: usize,
}

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    pub target: Target,
    /// Refresh interval in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub interval: u64,
    /// Stop after this many refreshes.
    #[arg(long, value_name = "N")]
    pub iterations: Option<u64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Stat(a) => stat::main(&a),
        Cmd::Top(a) => top::main(&a),
        Cmd::Run(a) => run::main(a),
        Cmd::Ab(a) => ab::main(a),
        Cmd::Plan(a) => plan::main(&a),
        Cmd::Replay(a) => replay::main(a),
        Cmd::Synth(a) => synth::main(&a),
        Cmd::Exporter(a) => exporter::main(&a),
        Cmd::Snapshot(a) => snapshot::main(&a),
        Cmd::Report(a) => report::main(&a),
        Cmd::Doctor(a) => doctor::main(&a),
        Cmd::Completions(a) => shell::completions(&a, <Cli as clap::CommandFactory>::command()),
        Cmd::Man(a) => shell::man(&a, <Cli as clap::CommandFactory>::command()),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("u3m: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_are_reported_by_clap_with_status_2() {
        for args in [
            &["u3m", "stat", "--bogus"][..],
            &["u3m", "top", "--interval", "1"],
            &["u3m", "nosuch"],
            &["u3m", "run"],
        ] {
            let e = Cli::try_parse_from(args).expect_err("must fail");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
        let c = Cli::try_parse_from(["u3m", "stat", "-p", "42", "--json", "--dir", "/x"]).unwrap();
        match c.cmd {
            Cmd::Stat(a) => {
                assert_eq!(a.target.pid, Some(42));
                assert!(a.json);
                assert_eq!(a.target.dir(), PathBuf::from("/x"));
            }
            _ => panic!(),
        }
    }
}
