//! `u3m doctor`: checks the machine and the environment a program started
//! from this shell would get, before a long job finds out the hard way. Each
//! check prints one line — `ok`, `warn` or `FAIL`, what it found — and, when
//! something is off, what to do about it. Exit status 1 when a check failed.
//!
//! Checks: which libascendcl.so the dynamic linker would load (LD_LIBRARY_PATH,
//! then the ld.so cache, then the default directories) and the CANN version of
//! its install; libu3m.so and the LD_PRELOAD order; the U3M_* settings; the
//! stats directory's space; the swap directory's writability and free space;
//! the locked-memory limit against the DRAM tier; huge pages.

use crate::error::CliError;
use crate::human::bytes;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use u3m_core::config::{self, Config};

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// libu3m.so to check [default: the one next to the u3m binary].
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check's result.
#[derive(Debug)]
pub struct Check {
    pub verdict: Verdict,
    pub what: &'static str,
    pub found: String,
    pub fix: Option<String>,
}

fn check(verdict: Verdict, what: &'static str, found: String, fix: Option<String>) -> Check {
    Check {
        verdict,
        what,
        found,
        fix,
    }
}

/// Directories the dynamic linker searches for a library without a slash,
/// in order (no RUNPATH of a particular program: that one may differ).
fn search_dirs(ld_library_path: Option<&OsStr>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ld_library_path
        .map(|v| {
            v.as_bytes()
                .split(|&b| b == b':' || b == b';')
                .filter(|d| !d.is_empty())
                .map(|d| PathBuf::from(OsStr::from_bytes(d)))
                .collect()
        })
        .unwrap_or_default();
    dirs.extend(ld_cache_dirs("libascendcl.so"));
    for d in ["/lib64", "/usr/lib64", "/lib", "/usr/lib"] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// Directories of `name` in the ld.so cache (`ldconfig -p`), if any.
fn ld_cache_dirs(name: &str) -> Vec<PathBuf> {
    let Ok(o) = std::process::Command::new("ldconfig").arg("-p").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit("=> ").next())
        .filter_map(|p| Path::new(p.trim()).parent().map(Path::to_path_buf))
        .collect()
}

/// The first `name` in `dirs`.
pub fn find_library(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The CANN version of the install holding `lib` (…/lib64/libascendcl.so):
/// `version=` of ascend_toolkit_install.info, or `Version=` of
/// runtime/version.info, in the library's directory or up to three above.
pub fn cann_version(lib: &Path) -> Option<(String, PathBuf)> {
    let real = lib.canonicalize().unwrap_or_else(|_| lib.to_path_buf());
    for start in [lib, real.as_path()] {
        let mut dir = start.parent();
        for _ in 0..4 {
            let Some(d) = dir else { break };
            for (file, key) in [
                ("ascend_toolkit_install.info", "version="),
                ("runtime/version.info", "Version="),
                ("version.info", "Version="),
            ] {
                let p = d.join(file);
                if let Ok(t) = std::fs::read_to_string(&p) {
                    if let Some(v) = t.lines().find_map(|l| l.trim().strip_prefix(key)) {
                        return Some((v.trim().to_string(), d.to_path_buf()));
                    }
                }
            }
            dir = d.parent();
        }
    }
    None
}

fn libascendcl(env: &Env) -> Check {
    let what = "libascendcl.so";
    let dirs = search_dirs(env.get("LD_LIBRARY_PATH").as_deref());
    match find_library("libascendcl.so", &dirs) {
        None => check(
            Verdict::Fail,
            what,
            "not found on LD_LIBRARY_PATH, in the ld.so cache or the default directories".into(),
            Some(
                "source CANN's set_env.sh first (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`; on the simulator `source target/release/cann/set_env.sh`)".into(),
            ),
        ),
        Some(p) => {
            let real = p.canonicalize().unwrap_or_else(|_| p.clone());
            let shown = if real != p {
                format!("{} (-> {})", p.display(), real.display())
            } else {
                p.display().to_string()
            };
            match cann_version(&p) {
                Some((v, home)) => {
                    let mut c = check(
                        Verdict::Ok,
                        what,
                        format!("{shown}, CANN {v} in {}", home.display()),
                        None,
                    );
                    if let Some(h) = env.get("ASCEND_HOME_PATH") {
                        let h = PathBuf::from(h);
                        let same = h.canonicalize().ok() == home.canonicalize().ok();
                        if !same {
                            c.verdict = Verdict::Warn;
                            c.fix = Some(format!(
                                "ASCEND_HOME_PATH is {}, another install than the library's: source that install's set_env.sh alone",
                                h.display()
                            ));
                        }
                    }
                    c
                }
                None => check(
                    Verdict::Warn,
                    what,
                    format!("{shown}, CANN version unknown (no ascend_toolkit_install.info or version.info near it)"),
                    Some("check that this is CANN's runtime and not a stray copy".into()),
                ),
            }
        }
    }
}

fn preload(env: &Env, lib: &Path) -> Check {
    let what = "libu3m.so / LD_PRELOAD";
    if !lib.is_file() {
        return check(
            Verdict::Fail,
            what,
            format!("no libu3m.so at {}", lib.display()),
            Some("build it (`cargo build --release`) or pass --lib PATH".into()),
        );
    }
    let words: Vec<String> = env
        .get("LD_PRELOAD")
        .map(|v| {
            v.to_string_lossy()
                .split([':', ' '])
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let is_u3m = |w: &str| Path::new(w).file_name() == Some(OsStr::new("libu3m.so"));
    let pos = words.iter().position(|w| is_u3m(w));
    let acl_before: Vec<&String> = words
        .iter()
        .take(pos.unwrap_or(words.len()))
        .filter(|w| {
            let n = Path::new(w.as_str())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            [
                "libascendcl",
                "libopapi",
                "libhccl",
                "libnnopbase",
                "libruntime",
                "libvgpu",
                "libvnpu",
            ]
            .iter()
            .any(|p| n.starts_with(p))
        })
        .collect();
    match pos {
        None if words.is_empty() => check(
            Verdict::Ok,
            what,
            format!(
                "{} present; LD_PRELOAD empty (`u3m run` and `u3m ab` set it)",
                lib.display()
            ),
            None,
        ),
        None => check(
            Verdict::Ok,
            what,
            format!(
                "{} present; LD_PRELOAD={} (`u3m run` puts libu3m.so first)",
                lib.display(),
                words.join(":")
            ),
            None,
        ),
        Some(_) if !acl_before.is_empty() => check(
            Verdict::Fail,
            what,
            format!("LD_PRELOAD={}: {} comes before libu3m.so", words.join(":"), acl_before[0]),
            Some("put libu3m.so first: a library before it that defines ACL functions hides them from u3m".into()),
        ),
        Some(i) => check(
            Verdict::Ok,
            what,
            format!(
                "LD_PRELOAD={} (libu3m.so is entry {} of {})",
                words.join(":"),
                i + 1,
                words.len()
            ),
            None,
        ),
    }
}

fn settings(env: &Env) -> (Check, Config) {
    let what = "U3M_* settings";
    let vars: Vec<(String, String)> = env
        .vars
        .iter()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("U3M_"))
        .collect();
    let n = vars
        .iter()
        .filter(|(k, _)| config::spec(k).is_some())
        .count();
    let p = config::parse(vars);
    let mut problems: Vec<String> = p.errors.iter().map(|e| e.to_string()).collect();
    problems.extend(p.unknown.iter().map(|u| u.to_string()));
    let c = if problems.is_empty() {
        check(
            Verdict::Ok,
            what,
            format!("{n} set, all valid; mode {}", p.config.mode.name()),
            None,
        )
    } else {
        check(
            if p.errors.is_empty() {
                Verdict::Warn
            } else {
                Verdict::Fail
            },
            what,
            problems.join("; "),
            Some("valid values: `u3m run --help` or docs/stats.md".into()),
        )
    };
    (c, p.config)
}

fn writable_dir(dir: &Path) -> Result<(), String> {
    let md = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !md.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let probe = dir.join(format!(".u3m-doctor.{}", std::process::id()));
    std::fs::write(&probe, b"x").map_err(|e| format!("{} is not writable: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn shm(cfg: &Config) -> Check {
    let what = "stats directory";
    let dir = &cfg.shm_dir;
    let seg = u3m_core::shm::layout::SEGMENT_SIZE as u64;
    if let Err(e) = writable_dir(dir) {
        return check(
            Verdict::Warn,
            what,
            e,
            Some(
                "u3m runs without live stats then; set U3M_SHM_DIR to a writable tmpfs directory"
                    .into(),
            ),
        );
    }
    let free = config::free_bytes(dir).unwrap_or(0);
    let verdict = if free < 64 * seg {
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    check(
        verdict,
        what,
        format!(
            "{} writable, {} free ({} per process)",
            dir.display(),
            bytes(free),
            bytes(seg)
        ),
        (verdict != Verdict::Ok).then(|| {
            "enlarge it (`mount -o remount,size=1G /dev/shm`; docker: --shm-size) or set U3M_SHM_DIR".to_string()
        }),
    )
}

fn swap(cfg: &Config) -> Check {
    let what = "swap directory (NVMe tier)";
    let Some(dir) = &cfg.swap_dir else {
        return check(
            Verdict::Ok,
            what,
            "none: the host tier is pinned DRAM only".into(),
            Some(
                "to spill beyond DRAM set U3M_SWAP_DIR to a directory on a local NVMe drive".into(),
            ),
        );
    };
    if let Err(e) = writable_dir(dir) {
        return check(
            Verdict::Fail,
            what,
            e,
            Some("create it and make it writable by this user, or unset U3M_SWAP_DIR".into()),
        );
    }
    let free = config::free_bytes(dir).unwrap_or(0);
    match cfg.nvme_bytes() {
        Ok(n) if cfg.swap_bytes > 0 && n > free => check(
            Verdict::Warn,
            what,
            format!(
                "{} writable, {} free, U3M_SWAP_BYTES asks for {}",
                dir.display(),
                bytes(free),
                bytes(n)
            ),
            Some("lower U3M_SWAP_BYTES or free space: a full disk keeps data in DRAM".into()),
        ),
        Ok(n) => check(
            Verdict::Ok,
            what,
            format!(
                "{} writable, {} free, NVMe tier {}{}",
                dir.display(),
                bytes(free),
                bytes(n),
                if cfg.swap_bytes == 0 {
                    " (90 % of free less 1 GiB)"
                } else {
                    ""
                }
            ),
            None,
        ),
        Err(e) => check(
            Verdict::Fail,
            what,
            e,
            Some("free space or set U3M_SWAP_BYTES".into()),
        ),
    }
}

fn physical_ram() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (p, s) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if p > 0 && s > 0 {
        p as u64 * s as u64
    } else {
        0
    }
}

fn memlock(cfg: &Config) -> Check {
    let what = "locked memory (pinned DRAM)";
    let dram = if cfg.dram_bytes == 0 {
        physical_ram() / 2
    } else {
        cfg.dram_bytes
    };
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return check(
            Verdict::Warn,
            what,
            "RLIMIT_MEMLOCK unreadable".into(),
            None,
        );
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let limit = if rl.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        bytes(rl.rlim_cur)
    };
    let found = format!(
        "RLIMIT_MEMLOCK {limit}, DRAM tier {} of {} RAM{}",
        bytes(dram),
        bytes(physical_ram()),
        if root {
            " (root: the limit does not bind)"
        } else {
            ""
        }
    );
    if rl.rlim_cur == libc::RLIM_INFINITY || rl.rlim_cur >= dram || root {
        let ram = physical_ram();
        if ram > 0 && dram > ram / 10 * 9 {
            return check(
                Verdict::Warn,
                what,
                found,
                Some("the DRAM tier takes nearly all RAM: lower U3M_DRAM_BYTES".into()),
            );
        }
        check(Verdict::Ok, what, found, None)
    } else {
        check(
            Verdict::Warn,
            what,
            found,
            Some("pinning the DRAM tier may fail: `ulimit -l unlimited` (systemd LimitMEMLOCK=infinity, docker --ulimit memlock=-1), or lower U3M_DRAM_BYTES".into()),
        )
    }
}

fn huge_pages() -> Check {
    let what = "huge pages";
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |k: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
    };
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|t| {
            t.split_whitespace()
                .find(|w| w.starts_with('['))
                .map(|w| w.trim_matches(['[', ']']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let total = field("HugePages_Total:").unwrap_or(0);
    let size_kib = field("Hugepagesize:").unwrap_or(0);
    let found = format!(
        "{total} reserved of {}, transparent huge pages: {thp}",
        bytes(size_kib * 1024)
    );
    if thp == "never" && total == 0 {
        check(
            Verdict::Warn,
            what,
            found,
            Some("large pinned DRAM tiers map faster with huge pages: `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` or reserve vm.nr_hugepages".into()),
        )
    } else {
        check(Verdict::Ok, what, found, None)
    }
}

/// The environment a program started from here would get.
pub struct Env {
    pub vars: Vec<(OsString, OsString)>,
}

impl Env {
    fn get(&self, k: &str) -> Option<OsString> {
        self.vars
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    }
}

pub fn run_checks(env: &Env, lib: &Path) -> Vec<Check> {
    let (cfg_check, cfg) = settings(env);
    vec![
        libascendcl(env),
        preload(env, lib),
        cfg_check,
        shm(&cfg),
        swap(&cfg),
        memlock(&cfg),
        huge_pages(),
    ]
}

pub fn render(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        let tag = match c.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        let _ = writeln!(s, "{tag}  {:<28} {}", c.what, c.found);
        if let Some(f) = &c.fix {
            let _ = writeln!(
                s,
                "      {:<28} {}",
                if c.verdict == Verdict::Ok {
                    "note:"
                } else {
                    "fix:"
                },
                f
            );
        }
    }
    let worst = checks
        .iter()
        .map(|c| c.verdict)
        .max()
        .unwrap_or(Verdict::Ok);
    let (w, f) = (
        checks.iter().filter(|c| c.verdict == Verdict::Warn).count(),
        checks.iter().filter(|c| c.verdict == Verdict::Fail).count(),
    );
    let _ = writeln!(
        s,
        "{}",
        match worst {
            Verdict::Ok => format!("u3m doctor: all {} checks ok", checks.len()),
            _ => format!(
                "u3m doctor: {f} failed, {w} warning(s) of {} checks",
                checks.len()
            ),
        }
    );
    s
}

pub fn main(a: &DoctorArgs) -> Result<ExitCode, CliError> {
    let lib = match &a.lib {
        Some(l) => l.clone(),
        None => crate::run::default_lib()?,
    };
    let env = Env {
        vars: std::env::vars_os().collect(),
    };
    let checks = run_checks(&env, &lib);
    print!("{}", render(&checks));
    let failed = checks.iter().any(|c| c.verdict == Verdict::Fail);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env {
            vars: pairs.iter().map(|(k, v)| (k.into(), v.into())).collect(),
        }
    }

    #[test]
    fn preload_order_is_checked() {
        let lib = std::env::current_exe().unwrap(); // any existing file
        let c = preload(
            &env(&[("LD_PRELOAD", "/x/libascendcl.so:/y/libu3m.so")]),
            &lib,
        );
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(c.found.contains("/x/libascendcl.so comes before libu3m.so"));
        let c = preload(
            &env(&[("LD_PRELOAD", "/y/libu3m.so /x/libjemalloc.so")]),
            &lib,
        );
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        let c = preload(&env(&[]), Path::new("/no/libu3m.so"));
        assert_eq!(c.verdict, Verdict::Fail);
    }

    #[test]
    fn library_search_follows_ld_library_path_in_order() {
        let d = std::env::temp_dir().join(format!("u3m-doctor-unit-{}", std::process::id()));
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("libascendcl.so"), b"").unwrap();
        std::fs::write(d.join("ascend_toolkit_install.info"), "version=9.9.9\n").unwrap();
        let path: OsString = format!("{}:{}", a.display(), b.display()).into();
        let dirs = search_dirs(Some(&path));
        assert_eq!(
            find_library("libascendcl.so", &dirs),
            Some(b.join("libascendcl.so"))
        );
        assert_eq!(
            cann_version(&b.join("libascendcl.so")).map(|v| v.0),
            Some("9.9.9".to_string())
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn settings_problems_fail_and_typos_warn() {
        let (c, _) = settings(&env(&[("U3M_OVERSUB", "0.5")]));
        assert_eq!(c.verdict, Verdict::Fail);
        let (c, _) = settings(&env(&[("U3M_OVERSUBB", "2")]));
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.found.contains("did you mean U3M_OVERSUB?"), "{}", c.found);
    }
}
