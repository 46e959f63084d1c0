//! Finding the segments of live u3m processes in a directory, and cleaning
//! up those of dead ones (a process killed with SIGKILL never removes its own).
//!
//! Removal rule (issue 13 finding 8: `u3m stat` as root removed any
//! `u3m.<pid>` file with a valid magic whose process was gone). A file is
//! removed only when u3m can prove it is a segment a u3m of this user wrote
//! and that its writer is gone:
//! - it is a regular file (not a link) owned by the user running u3m — the
//!   kernel sets the owner at creation and only root can change it, so no
//!   other user can plant a file that root's `u3m stat` then removes;
//! - it has a u3m header of this layout whose pid is the one in its name;
//! - its writer is gone: no such pid, a zombie, or a pid whose start time
//!   differs from the one the writer recorded (pid reuse);
//! - it is still the same file (device, inode) when it is removed.
//!
//! An empty file of a dead pid owned by the user (a writer killed while
//! creating it) holds nothing and is removed too. Everything else is left in
//! place with a note saying why.

use crate::error::CliError;
use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use u3m_core::shm::reader::{list, liveness};
use u3m_core::shm::{Liveness, OpenError, SegmentReader};

/// An open segment of a live process.
pub struct Found {
    pub reader: SegmentReader,
    /// (device, inode) of the file when opened: a new process with the same
    /// pid replaces the file, and the reader must follow.
    pub file_id: (u64, u64),
}

/// Scans one directory, repeatedly (top) or once (stat).
pub struct Scanner {
    pub dir: PathBuf,
    pub only: Option<u32>,
    /// Notes already given, so a refresh loop does not repeat them.
    noted: HashSet<String>,
    /// Why `only` was not found, if it was seen and rejected.
    pub only_why: Option<String>,
}

impl Scanner {
    pub fn new(dir: PathBuf, only: Option<u32>) -> Self {
        Scanner {
            dir,
            only,
            noted: HashSet::new(),
            only_why: None,
        }
    }

    /// Brings `open` up to date with the directory: drops segments that went
    /// away or whose process died, opens new ones, removes dead files.
    /// Returns notes for stderr (each given once per scanner).
    pub fn scan(&mut self, open: &mut BTreeMap<u32, Found>) -> Result<Vec<String>, CliError> {
        let mut notes = Vec::new();
        let files = list(&self.dir).map_err(|err| CliError::Dir {
            dir: self.dir.clone(),
            err,
        })?;
        let present: BTreeMap<u32, PathBuf> = files.into_iter().collect();
        open.retain(|pid, f| {
            present
                .get(pid)
                .is_some_and(|p| file_id(p) == Some(f.file_id))
                && f.reader.liveness() == Liveness::Alive
        });
        for (pid, path) in present {
            if open.contains_key(&pid) {
                continue;
            }
            match self.examine(pid, &path, &mut notes) {
                Some(f) => {
                    if self.only.is_none() || self.only == Some(pid) {
                        open.insert(pid, f);
                    }
                }
                None => continue,
            }
        }
        notes.retain(|n| self.noted.insert(n.clone()));
        Ok(notes)
    }

    /// Opens one file; a dead writer's file is removed (with a note) when
    /// the rule in the module header proves it u3m's.
    fn examine(&mut self, pid: u32, path: &Path, notes: &mut Vec<String>) -> Option<Found> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        let id = (meta.dev(), meta.ino());
        let mine = self.only == Some(pid);
        // SAFETY: geteuid has no preconditions.
        let owned = meta.file_type().is_file() && meta.uid() == unsafe { libc::geteuid() };
        match SegmentReader::open(path) {
            Ok(r) if r.pid() != pid => {
                notes.push(format!(
                    "skipping {}: it says it belongs to pid {} (left in place)",
                    path.display(),
                    r.pid()
                ));
                if mine {
                    self.only_why = Some(format!("the file says it belongs to pid {}", r.pid()));
                }
                None
            }
            Ok(r) => match r.liveness() {
                Liveness::Alive => Some(Found {
                    reader: r,
                    file_id: id,
                }),
                Liveness::Dead(why) => {
                    drop(r);
                    let removed = if owned {
                        self.remove(path, id, why, notes)
                    } else {
                        notes.push(format!(
                            "left stale segment {} ({why}): owned by uid {}, not by this user (u3m removes only segments it can prove this user's u3m wrote)",
                            path.display(),
                            meta.uid()
                        ));
                        false
                    };
                    if mine {
                        self.only_why = Some(if removed {
                            format!("{why} (stale segment removed)")
                        } else {
                            format!("{why} (stale segment left in place)")
                        });
                    }
                    None
                }
            },
            Err(e) => {
                let dead = liveness(pid, 0) != Liveness::Alive;
                let msg = e.to_string();
                match e {
                    // An empty file: a writer killed while creating it. It
                    // holds nothing, so the owner's u3m may remove it.
                    OpenError::NotReady if dead && owned && meta.len() == 0 => {
                        self.remove(path, id, "process no longer exists", notes);
                    }
                    // Half-written or of another layout: not provably ours.
                    OpenError::NotReady
                    | OpenError::TooSmall { .. }
                    | OpenError::Version { .. }
                    | OpenError::Geometry(_)
                        if dead =>
                    {
                        notes.push(format!(
                            "left {} (process no longer exists): {msg}; not provably a u3m segment, remove it by hand if it is",
                            path.display()
                        ))
                    }
                    OpenError::NotReady => {}
                    OpenError::Io(ref io) if io.kind() == std::io::ErrorKind::PermissionDenied => {
                        notes.push(format!(
                            "skipping {}: not readable by this user",
                            path.display()
                        ))
                    }
                    other => notes.push(format!("skipping {}: {other}", path.display())),
                }
                if mine {
                    self.only_why = Some(if dead {
                        "process no longer exists".into()
                    } else {
                        msg
                    });
                }
                None
            }
        }
    }

    /// Removes `path` if it is still the file `id` that was examined.
    fn remove(&self, path: &Path, id: (u64, u64), why: &str, notes: &mut Vec<String>) -> bool {
        if file_id(path) != Some(id) {
            return false; // replaced meanwhile: look again next time
        }
        match std::fs::remove_file(path) {
            Ok(()) => {
                notes.push(format!("removed stale segment {} ({why})", path.display()));
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                notes.push(format!(
                    "cannot remove stale segment {} ({why}): {e}",
                    path.display()
                ));
                false
            }
        }
    }
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// One scan for `stat`: every live process (or `only`), notes on stderr.
pub fn scan_once(dir: PathBuf, only: Option<u32>) -> Result<Vec<Found>, CliError> {
    let mut s = Scanner::new(dir, only);
    let mut open = BTreeMap::new();
    for n in s.scan(&mut open)? {
        eprintln!("u3m: {n}");
    }
    if let Some(pid) = only {
        if !open.contains_key(&pid) {
            return Err(CliError::NoProcess {
                pid,
                dir: s.dir.clone(),
                why: s.only_why.take(),
            });
        }
    }
    Ok(open.into_values().collect())
}
