//! Finding the segments of live u3m processes in a directory, and cleaning
//! up those of dead ones (a process killed with SIGKILL never removes its own).

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

    /// Opens one file; a dead writer's file is removed (with a note).
    fn examine(&mut self, pid: u32, path: &Path, notes: &mut Vec<String>) -> Option<Found> {
        let id = file_id(path)?;
        let mine = self.only == Some(pid);
        match SegmentReader::open(path) {
            Ok(r) => match r.liveness() {
                Liveness::Alive => {
                    if r.pid() != pid {
                        notes.push(format!(
                            "skipping {}: it says it belongs to pid {}",
                            path.display(),
                            r.pid()
                        ));
                        return None;
                    }
                    Some(Found {
                        reader: r,
                        file_id: id,
                    })
                }
                Liveness::Dead(why) => {
                    self.remove(path, why, notes);
                    if mine {
                        self.only_why = Some(format!("{why} (stale segment removed)"));
                    }
                    None
                }
            },
            Err(e) => {
                let dead = liveness(pid, 0) != Liveness::Alive;
                let msg = e.to_string();
                match e {
                    // Half-created or of another layout version: garbage only
                    // if its process is gone.
                    OpenError::NotReady
                    | OpenError::TooSmall { .. }
                    | OpenError::Version { .. }
                    | OpenError::Geometry(_)
                        if dead =>
                    {
                        self.remove(path, "process no longer exists", notes)
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

    fn remove(&self, path: &Path, why: &str, notes: &mut Vec<String>) {
        match std::fs::remove_file(path) {
            Ok(()) => notes.push(format!("removed stale segment {} ({why})", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => notes.push(format!(
                "cannot remove stale segment {} ({why}): {e}",
                path.display()
            )),
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
