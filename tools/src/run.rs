//! `u3m run [options] -- CMD ARGS...`: execs CMD with libu3m.so preloaded and
//! the options turned into U3M_* variables. The options come from the
//! library's own table of variables (`u3m_core::config::VARS`): `--help` is
//! built from it and docs/stats.md holds the same table (a test keeps them
//! equal). Every U3M_* value the program would see (options, `-e`, the
//! inherited environment) is checked against that table first: a bad one is
//! a usage error (exit 2) before anything starts. `U3M_LOG` defaults to
//! `info` here, so the library prints its start line and exit summary.
//! u3m execs rather than spawns, so the program keeps u3m's pid, signals
//! reach it directly, and the exit status is the program's own.

use crate::error::CliError;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use u3m_core::config::VARS;

/// One `u3m run` option and the variable it sets. Values are passed through
/// verbatim after `check_env` validated them with the library's parser.
pub struct EnvOption {
    pub long: &'static str,
    pub var: &'static str,
    pub value: &'static str,
    pub help: &'static str,
    #[cfg_attr(not(test), allow(dead_code))]
    pub spec: &'static u3m_core::config::VarSpec,
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
                    format!("{}; {}", v.doc, v.range_text())
                } else {
                    format!("{}; {} (default {})", v.doc, v.range_text(), v.default)
                };
                // clap keeps &'static str names; this table lives for the whole run.
                EnvOption {
                    long: leak(long),
                    var: v.name,
                    value: v.value_name(),
                    help: leak(help),
                    spec: v,
                }
            })
            .collect()
    })
}

pub fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A cell of a markdown table: a bare | would end the cell, even inside a
/// code span; <pid> would be a tag.
#[cfg(test)]
fn md(t: &str) -> String {
    t.replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The table as it appears in docs/stats.md.
#[cfg(test)]
pub fn markdown_table() -> String {
    let mut s = String::from(
        "| option | variable | values | default | meaning |\n| --- | --- | --- | --- | --- |\n",
    );
    for o in env_options() {
        s.push_str(&format!(
            "| `--{} {}` | `{}` | {}\n",
            o.long,
            md(o.value),
            o.var,
            spec_cells(o.spec)
        ));
    }
    s
}

/// "values | default | meaning |" cells of one variable.
#[cfg(test)]
fn spec_cells(v: &u3m_core::config::VarSpec) -> String {
    let default = if v.default.is_empty() {
        "-".to_string()
    } else {
        format!("`{}`", v.default)
    };
    format!("{} | {default} | {} |", md(&v.range_text()), md(v.doc))
}

/// Every U3M_* variable, the library's and the scripts': the README's table.
#[cfg(test)]
pub fn variables_table() -> String {
    let mut s =
        String::from("| variable | values | default | meaning |\n| --- | --- | --- | --- |\n");
    for v in u3m_core::config::VARS {
        s.push_str(&format!("| `{}` | {}\n", v.name, spec_cells(v)));
    }
    for (name, doc) in u3m_core::config::TOOL_VARS {
        s.push_str(&format!("| `{name}` | test / CI | - | {} |\n", md(doc)));
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
                // no allow_hyphen_values: `u3m run --hbm 1G prog` is an
                // unknown option, not a program called --hbm
                .trailing_var_arg(true)
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

/// The U3M_* variables a program started with `overrides` would see:
/// this process's environment, then the overrides in order (the last wins).
pub fn effective_u3m_env<'a>(
    overrides: impl IntoIterator<Item = (&'a str, &'a OsString)>,
    removed: &[String],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("U3M_") && !removed.contains(k))
        .collect();
    for (k, v) in overrides {
        if !k.starts_with("U3M_") {
            continue;
        }
        env.retain(|(e, _)| e != k);
        env.push((k.to_string(), v.to_string_lossy().into_owned()));
    }
    env
}

/// Checks U3M_* variables with libu3m.so's own parser: every invalid value
/// and every unknown name is a usage error, all of them listed.
pub fn check_env(env: Vec<(String, String)>, what: &str) -> Result<(), CliError> {
    let p = u3m_core::config::parse(env);
    let mut problems: Vec<String> = p.errors.iter().map(|e| e.to_string()).collect();
    problems.extend(p.unknown.iter().map(|u| match u.suggestion {
        Some(s) => format!("{}: unknown variable (did you mean {s}?)", u.name),
        None => format!("{}: unknown variable", u.name),
    }));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::Config {
            what: what.to_string(),
            problems,
        })
    }
}

pub fn main(a: RunArgs) -> Result<ExitCode, CliError> {
    let overrides = a
        .env
        .iter()
        .map(|(k, v)| (*k, v))
        .chain(a.extra.iter().map(|(k, v)| (k.as_str(), v)));
    let u3m_env = effective_u3m_env(overrides, &[]);
    let log_set = u3m_env.iter().any(|(k, _)| k == "U3M_LOG");
    check_env(u3m_env, "u3m run")?;
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
    if !log_set {
        // the start line and the exit summary on stderr
        vars.push(("U3M_LOG".into(), "info".into()));
    }
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
        // an unknown option before the command is a usage error, not a program
        let e = T::try_parse_from(["u3m", "--hbm", "130M", "--", "prog"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--hbm"), "{e}");
        let t = T::try_parse_from(["u3m", "--", "--weird-prog", "-x"]).unwrap();
        assert_eq!(
            t.run.cmd,
            vec!["--weird-prog", "-x"],
            "after -- anything goes"
        );
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
        assert!(o.help.ends_with("; 0.05..1 (default 0.90)"), "{}", o.help);
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, x)| (k.to_string(), x.to_string()))
            .collect()
    }

    #[test]
    fn settings_are_checked_with_the_library_table() {
        assert!(check_env(pairs(&[("U3M_OVERSUB", "2")]), "t").is_ok());
        assert!(check_env(pairs(&[("U3M_SKIP_TORCH", "1")]), "t").is_ok());
        let e = check_env(
            pairs(&[
                ("U3M_OVERSUBB", "2"),
                ("U3M_OVERSUB", "0.5"),
                ("U3M_MODE", "tierx"),
                ("U3M_LOG", "chatty"),
            ]),
            "u3m run",
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let text = e.to_string();
        for needle in [
            "u3m run: invalid settings, nothing was started:",
            "U3M_OVERSUBB: unknown variable (did you mean U3M_OVERSUB?)",
            "U3M_OVERSUB: '0.5' is outside 1..64",
            "U3M_MODE: 'tierx' is not one of off, observe, tier",
            "U3M_LOG: 'chatty' is not one of quiet, warn, info, debug",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
    }

    #[test]
    fn overrides_win_over_the_environment_in_order() {
        let a: OsString = "2".into();
        let b: OsString = "3".into();
        let env = effective_u3m_env(
            [("U3M_OVERSUB", &a), ("PATH", &a), ("U3M_OVERSUB", &b)],
            &[],
        );
        let o: Vec<_> = env.iter().filter(|(k, _)| k == "U3M_OVERSUB").collect();
        assert_eq!(o, vec![&("U3M_OVERSUB".to_string(), "3".to_string())]);
        assert!(!env.iter().any(|(k, _)| k == "PATH"));
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

    /// The text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in a
    /// file of the repository; with U3M_UPDATE_DOCS=1 it is replaced by
    /// `want` first (how the tables are regenerated).
    fn marked(file: &str, name: &str, want: &str) -> String {
        let path = format!("{}/../{file}", env!("CARGO_MANIFEST_DIR"));
        let doc = std::fs::read_to_string(&path).expect(&path);
        let begin = format!("<!-- {name}:begin -->\n");
        let end = format!("<!-- {name}:end -->");
        let start = doc.find(&begin).expect("begin marker") + begin.len();
        let stop = doc.find(&end).expect("end marker");
        if std::env::var("U3M_UPDATE_DOCS").is_ok_and(|v| v == "1") {
            let new = format!("{}{want}{}", &doc[..start], &doc[stop..]);
            std::fs::write(&path, new).expect(&path);
            return want.to_string();
        }
        doc[start..stop].to_string()
    }

    #[test]
    fn docs_hold_the_same_table() {
        assert_eq!(
            marked("docs/stats.md", "run-options", &markdown_table()),
            markdown_table(),
            "docs/stats.md's u3m run table is out of date; replace it with:\n{}",
            markdown_table()
        );
        assert_eq!(
            marked("README.md", "variables", &variables_table()),
            variables_table(),
            "README.md's variable table is out of date; replace it with:\n{}",
            variables_table()
        );
    }
}
