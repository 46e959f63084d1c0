//! `u3m completions SHELL` and `u3m man`: shell completions and man pages,
//! both generated from the clap definitions (and, for the man page's
//! ENVIRONMENT section, from the library's table of variables), so they
//! cannot drift from what `u3m` accepts.

use crate::error::CliError;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write u3m.1 and one u3m-<command>.1 per command into DIR instead of
    /// printing u3m.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn completions(a: &CompletionsArgs, mut cmd: clap::Command) -> Result<ExitCode, CliError> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "u3m", &mut out);
    write_stdout(&out)
}

fn write_stdout(b: &[u8]) -> Result<ExitCode, CliError> {
    let mut so = std::io::stdout().lock();
    match so.write_all(b).and_then(|_| so.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(err) => Err(CliError::Io {
            what: "writing to stdout",
            err,
        }),
    }
}

/// roff text with its special characters escaped.
fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    // a line starting with . or ' would be a request
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// The ENVIRONMENT section: every U3M_* variable of the library's table,
/// then those of the scripts and tests.
pub fn environment_section() -> String {
    let mut s = String::from(".SH ENVIRONMENT\nlibu3m.so reads these variables once, at the first ACL call; \\fBu3m run\\fR and \\fBu3m ab\\fR check every value against the same table before starting anything.\n");
    for v in u3m_core::config::VARS {
        s.push_str(&format!(
            ".TP\n\\fB{}\\fR={}\n{}. Values: {}.{}\n",
            roff(v.name),
            roff(v.value_name()),
            roff(v.doc),
            roff(&v.range_text()),
            if v.default.is_empty() {
                String::new()
            } else {
                format!(" Default: {}.", roff(v.default))
            }
        ));
    }
    for (name, doc) in u3m_core::config::TOOL_VARS {
        s.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{} (scripts and tests).\n",
            roff(name),
            roff(doc)
        ));
    }
    s
}

/// u3m.1: the whole command, its subcommands, ENVIRONMENT, SEE ALSO.
pub fn page(cmd: &clap::Command) -> Result<Vec<u8>, std::io::Error> {
    let man = clap_mangen::Man::new(cmd.clone())
        .date("")
        .source(format!("u3m {}", u3m_core::VERSION));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    man.render_subcommands_section(&mut out)?;
    out.extend_from_slice(environment_section().as_bytes());
    out.extend_from_slice(
        b".SH SEE ALSO\nREADME.md, docs/stats.md (the stats segment, u3m stat/top/run), docs/tiering.md, docs/real-npu.md in the u3m repository; \\fBu3m\\-<command>\\fR(1) for each command.\n",
    );
    man.render_version_section(&mut out)?;
    Ok(out)
}

pub fn man(a: &ManArgs, cmd: clap::Command) -> Result<ExitCode, CliError> {
    let io = |err| CliError::Io {
        what: "writing the man page",
        err,
    };
    let Some(dir) = &a.dir else {
        return write_stdout(&page(&cmd).map_err(io)?);
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join("u3m.1"), page(&cmd).map_err(io)?).map_err(io)?;
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("u3m-{}", sub.get_name());
        let sub = sub.clone().name(crate::run::leak(name.clone()));
        let mut out = Vec::new();
        clap_mangen::Man::new(sub)
            .date("")
            .source(format!("u3m {}", u3m_core::VERSION))
            .render(&mut out)
            .map_err(io)?;
        std::fs::write(dir.join(format!("{name}.1")), out).map_err(io)?;
        n += 1;
    }
    eprintln!("u3m: wrote {n} man pages to {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
