//! The one error type of the `u3m` binary: each variant names what is wrong,
//! and maps to the exit status.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum CliError {
    /// Bad arguments that clap could not see (exit 2).
    Usage(String),
    /// Invalid U3M_* settings, found before anything ran (exit 2).
    Config { what: String, problems: Vec<String> },
    /// The segment directory cannot be read.
    Dir { dir: PathBuf, err: io::Error },
    /// `-p PID` names no live u3m process.
    NoProcess {
        pid: u32,
        dir: PathBuf,
        why: Option<String>,
    },
    /// `u3m run`: libu3m.so is not where it must be.
    LibMissing(PathBuf),
    /// `u3m run`: the command could not be executed.
    Exec { cmd: String, err: io::Error },
    /// Terminal or output failure.
    Io { what: &'static str, err: io::Error },
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Config { .. } => 2,
            // As shells do: 127 not found, 126 found but not runnable.
            CliError::Exec { err, .. } if err.kind() == io::ErrorKind::NotFound => 127,
            CliError::Exec { .. } => 126,
            _ => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => write!(f, "{m}"),
            CliError::Config { what, problems } => {
                write!(f, "{what}: invalid settings, nothing was started:")?;
                for p in problems {
                    write!(f, "\n  {p}")?;
                }
                write!(f, "\n(valid values: `u3m run --help`, docs/stats.md)")
            }
            CliError::Dir { dir, err } => write!(f, "cannot read the segment directory {}: {err}", dir.display()),
            CliError::NoProcess { pid, dir, why } => {
                write!(f, "no live u3m process with pid {pid} (no readable {}/u3m.{pid})", dir.display())?;
                if let Some(w) = why {
                    write!(f, ": {w}")?;
                }
                Ok(())
            }
            CliError::LibMissing(p) => write!(
                f,
                "libu3m.so not found at {} (u3m run preloads the libu3m.so installed next to the u3m binary; build it with `cargo build --release`, or pass --lib PATH)",
                p.display()
            ),
            CliError::Exec { cmd, err } => write!(f, "cannot run '{cmd}': {err}"),
            CliError::Io { what, err } => write!(f, "{what}: {err}"),
        }
    }
}

impl std::error::Error for CliError {}
