//! `u3m run [options] -- CMD ARGS...`: execs CMD with libu3m.so preloaded and
//! the options turned into U3M_* variables. The options come from the
//! library's own table of variables (`u3m_core::config::VARS`): `--help` is
//! built from it and docs/stats.md holds the same table (a test keeps them
//! equal). u3m execs rather than spawns, so the
//! program keeps u3m's pid, signals reach it directly, and the exit status is
//! the program's own.

use crate::error::CliError;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use u3m_core::config::VARS;

/// One `u3m run` option and the variable it sets. Values are passed through
/// verbatim: libu3m.so validates them and reports a bad one on stderr.
pub struct EnvOption {
    pub long: &'static str,
    pub var: &'static str,
    pub value: &'static str,
    pub help: &'static str,
}

/// The options, one per variable of `u3m_core::config::VARS` (the library's
/// own table, which its parser reads too): `U3M_HBM_HIGH` is `--hbm-high`.
pub fn env_options() -> &'static [EnvOption] {
    static OPTS: OnceLock<Vec<EnvOption>> = OnceLock::new();
    OPTS.get_or_init(|| {
        VARS.iter()
            // Testing aids stay out of --help (`-e` still sets them).
            .filter(|v| !v.name.starts_with("U3M_DEBUG_"))
            .map(|v| {
                let long = v
                    .name
                    .trim_start_matches("U3M_")
                    .to_ascii_lowercase()
                    .replace('_', "-");
                let help = if v.default.is_empty() {
                    v.doc.to_string()
                } else {
                    format!("{} (default {})", v.doc, v.default)
                };
                // clap keeps &'static str names; this table lives for the whole run.
                EnvOption {
                    long: leak(long),
                    var: v.name,
                    value: value_name(v.name),
                    help: leak(help),
                }
            })
            .collect()
    })
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Placeholder shown in --help, from the variable's name.
fn value_name(var: &str) -> &'static str {
    match var {
        "U3M_MODE" => "MODE",
        "U3M_TRACE" => "PATH",
        "U3M_POLICY" => "NAME",
        "U3M_LOG" => "LEVEL",
        "U3M_HBM_LOW" | "U3M_HBM_HIGH" => "FRACTION",
        "U3M_OVERSUB" => "RATIO",
        "U3M_SSD_RATE" => "BYTES_PER_S",
        "U3M_TRACE_LOSSLESS" => "0|1",
        v if v.starts_with("U3M_MAX_") => "COUNT",
        v if v.ends_with("_BYTES") => "BYTES",
        v if v.ends_with("_DIR") => "DIR",
        v if v.ends_with("_MS") => "MS",
        v if v.ends_with("_S") => "SECONDS",
        _ => "VALUE",
    }
}

/// The table as it appears in docs/stats.md.
#[cfg(test)]
pub fn markdown_table() -> String {
    let mut s = String::from("| option | variable | meaning |\n| --- | --- | --- |\n");
    for o in env_options() {
        // A bare | would end the cell, even inside a code span; <pid> would be a tag.
        let md = |t: &str| {
            t.replace('|', "\\|")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        s.push_str(&format!(
            "| `--{} {}` | `{}` | {} |\n",
            o.long,
            md(o.value),
            o.var,
            md(o.help)
        ));
    }
    s
}

#[derive(Debug, Clone)]
pub struct RunArgs {
    /// (variable, value) from the table's options, in table order.
    pub env: Vec<(&'static str, OsString)>,
    /// Extra VAR=VALUE pairs from --env.
    pub extra: Vec<(String, OsString)>,
    pub lib: Option<PathBuf>,
    pub dry_run: bool,
    pub cmd: Vec<OsString>,
}

impl Args for RunArgs {
    fn augment_args(mut cmd: Command) -> Command {
        for o in env_options() {
            cmd = cmd.arg(
                Arg::new(o.long)
                    .long(o.long)
                    .value_name(o.value)
                    .value_parser(clap::value_parser!(OsString))
                    .help(format!("{} [sets {}]", o.help, o.var)),
            );
        }
        cmd.arg(
            Arg::new("env")
                .short('e')
                .long("env")
                .value_name("VAR=VALUE")
                .action(ArgAction::Append)
                .value_parser(parse_pair)
                .help("set another environment variable for CMD (repeatable)"),
        )
        .arg(
            Arg::new("lib")
                .long("lib")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help("libu3m.so to preload [default: the one next to the u3m binary]"),
        )
        .arg(
            Arg::new("dry-run")
                .long("dry-run")
                .action(ArgAction::SetTrue)
                .help("print the environment and command instead of running it"),
        )
        .arg(
            Arg::new("cmd")
                .value_name("CMD")
                .num_args(1..)
                .required(true)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .value_parser(clap::value_parser!(OsString))
                .help("the program to run and its arguments (after --)"),
        )
        .after_help("Variables set by these options are documented in docs/stats.md (\"u3m run\").")
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

fn parse_pair(s: &str) -> Result<(String, OsString), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') => Ok((k.to_string(), v.into())),
        _ => Err(format!("'{s}' is not VAR=VALUE")),
    }
}

impl FromArgMatches for RunArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let env = env_options()
            .iter()
            .filter_map(|o| m.get_one::<OsString>(o.long).map(|v| (o.var, v.clone())))
            .collect();
        Ok(RunArgs {
            env,
            extra: m
                .get_many::<(String, OsString)>("env")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
            lib: m.get_one::<PathBuf>("lib").cloned(),
            dry_run: m.get_flag("dry-run"),
            cmd: m
                .get_many::<OsString>("cmd")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// libu3m.so next to the running u3m binary, else in `../lib/u3m/` (where
/// the Python wheel installs it: `<prefix>/bin/u3m`, `<prefix>/lib/u3m/`).
pub fn default_lib() -> Result<PathBuf, CliError> {
    let exe = std::env::current_exe().map_err(|err| CliError::Io {
        what: "finding the u3m binary",
        err,
    })?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let Some(dir) = exe.parent() else {
        return Ok(PathBuf::from("libu3m.so"));
    };
    let next = dir.join("libu3m.so");
    let wheel = dir.join("../lib/u3m/libu3m.so");
    Ok(if !next.is_file() && wheel.is_file() {
        wheel
    } else {
        next
    })
}

/// LD_PRELOAD with `lib` first, keeping what was there.
pub fn preload_value(lib: &std::path::Path, existing: Option<OsString>) -> OsString {
    let mut v = lib.as_os_str().to_os_string();
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(e);
    }
    v
}

pub fn main(a: RunArgs) -> Result<ExitCode, CliError> {
    let lib = match &a.lib {
        Some(l) if l.is_relative() => std::env::current_dir()
            .map(|d| d.join(l))
            .unwrap_or_else(|_| l.clone()),
        Some(l) => l.clone(),
        None => default_lib()?,
    };
    if !lib.is_file() {
        return Err(CliError::LibMissing(lib));
    }
    let preload = preload_value(&lib, std::env::var_os("LD_PRELOAD"));
    let mut vars: Vec<(String, OsString)> = vec![("LD_PRELOAD".into(), preload)];
    vars.extend(a.env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    vars.extend(a.extra.iter().cloned());
    let (prog, args) = a
        .cmd
        .split_first()
        .ok_or_else(|| CliError::Usage("u3m run: no command given".into()))?;
    if a.dry_run {
        for (k, v) in &vars {
            println!("{k}={}", v.to_string_lossy());
        }
        let words: Vec<String> = a
            .cmd
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        println!("{}", words.join(" "));
        return Ok(ExitCode::SUCCESS);
    }
    let mut c = std::process::Command::new(prog);
    c.args(args);
    for (k, v) in &vars {
        c.env(k, v);
    }
    // Only returns on failure.
    let err = c.exec();
    Err(CliError::Exec {
        cmd: prog.to_string_lossy().into_owned(),
        err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn options_map_to_variables_in_table_order() {
        let t = T::try_parse_from([
            "u3m",
            "--oversub",
            "2.0",
            "--mode",
            "observe",
            "-e",
            "ACLSIM_HBM=1G",
            "--",
            "prog",
            "--mode",
            "x",
        ])
        .unwrap();
        let env: Vec<(&str, &str)> = t
            .run
            .env
            .iter()
            .map(|(k, v)| (*k, v.to_str().unwrap()))
            .collect();
        assert_eq!(env, vec![("U3M_MODE", "observe"), ("U3M_OVERSUB", "2.0")]);
        assert_eq!(
            t.run.extra,
            vec![("ACLSIM_HBM".to_string(), OsString::from("1G"))]
        );
        assert_eq!(
            t.run.cmd,
            vec!["prog", "--mode", "x"],
            "options after the command belong to it"
        );
        let t = T::try_parse_from(["u3m", "--trace", "/t", "prog", "-v"]).unwrap();
        assert_eq!(t.run.cmd, vec!["prog", "-v"], "-- is optional");
        assert_eq!(
            T::try_parse_from(["u3m", "-e", "novalue", "prog"])
                .unwrap_err()
                .exit_code(),
            2
        );
        assert_eq!(
            T::try_parse_from(["u3m", "--mode"])
                .unwrap_err()
                .exit_code(),
            2
        );
    }

    #[test]
    fn every_variable_is_unique_and_named_u3m() {
        let mut vars: Vec<&str> = env_options().iter().map(|o| o.var).collect();
        assert!(vars.iter().all(|v| v.starts_with("U3M_")));
        vars.sort_unstable();
        vars.dedup();
        assert_eq!(vars.len(), env_options().len());
        let o = env_options()
            .iter()
            .find(|o| o.var == "U3M_HBM_HIGH")
            .unwrap();
        assert_eq!((o.long, o.value), ("hbm-high", "FRACTION"));
        assert!(o.help.ends_with("(default 0.90)"), "{}", o.help);
    }

    #[test]
    fn preload_is_prepended() {
        let lib = std::path::Path::new("/x/libu3m.so");
        assert_eq!(preload_value(lib, None), "/x/libu3m.so");
        assert_eq!(preload_value(lib, Some("".into())), "/x/libu3m.so");
        assert_eq!(
            preload_value(lib, Some("/a.so /b.so".into())),
            "/x/libu3m.so:/a.so /b.so"
        );
    }

    #[test]
    fn docs_hold_the_same_table() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/stats.md"))
            .expect("docs/stats.md");
        let begin = "<!-- run-options:begin -->\n";
        let end = "<!-- run-options:end -->";
        let start = doc.find(begin).expect("begin marker") + begin.len();
        let stop = doc.find(end).expect("end marker");
        assert_eq!(
            &doc[start..stop],
            markdown_table(),
            "docs/stats.md's u3m run table is out of date; replace it with:\n{}",
            markdown_table()
        );
    }
}
