//! The NVMe store: one swap file, grown in extents up to a byte limit and
//! carved by the pool. Pool offsets are file offsets.
//!
//! Lifecycle and security (docs/stores.md): `new` makes a private directory
//! `u3m-<pid>-XXXXXX` (mkdtemp: mode 0700) inside the swap directory, creates
//! `swap` in it with O_EXCL|O_NOFOLLOW and mode 0600, and unlinks it at once,
//! before any data is written: a crash leaves at most an empty private
//! directory (removed by the next store started in that swap directory) and no
//! readable copy of model data. Each extent is ftruncate'd, fallocate'd (so a
//! full disk shows as `NoSpace` when the extent is added, not as SIGBUS when a
//! page is first touched) and mapped MAP_SHARED with memmap2.
//!
//! Copies go through `write`/`read` (pwrite/pread on the descriptor), which
//! turn ENOSPC and EIO into errors. The mapping is there for callers that need
//! a host address; see `host_ptr_safe`.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use super::pool::{Pool, SegmentId};
use super::{StoreError, StoreStats};

/// Faults to inject, for tests that prove a full or failing disk loses no
/// data. All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeFaults {
    /// Once this many bytes have gone through `write`/`write_at`, every
    /// further write fails (without writing) with `write_errno`.
    pub fail_writes_after_bytes: Option<u64>,
    /// errno of injected write failures; 0 means ENOSPC (→ `NoSpace`).
    pub write_errno: i32,
    /// Every extent growth fails with this errno (ENOSPC → `NoSpace`).
    pub fail_grow_errno: Option<i32>,
    /// Every read fails with this errno.
    pub fail_read_errno: Option<i32>,
}

#[derive(Clone, Debug)]
pub struct NvmeConfig {
    /// The swap directory (U3M_SWAP_DIR); the store's private directory goes
    /// inside it.
    pub dir: PathBuf,
    /// Most bytes of file the store will hold (U3M_SWAP_BYTES).
    pub limit_bytes: u64,
    /// Bytes added to the file at a time (rounded up to the page size); a
    /// larger request gets an extent of its own size.
    pub extent_bytes: u64,
    pub faults: NvmeFaults,
}

impl NvmeConfig {
    pub fn new(dir: impl Into<PathBuf>, limit_bytes: u64, extent_bytes: u64) -> NvmeConfig {
        NvmeConfig {
            dir: dir.into(),
            limit_bytes,
            extent_bytes,
            faults: NvmeFaults::default(),
        }
    }
}

/// A piece of swap file the store handed out. Not `Clone`: give it back once.
#[derive(Debug, PartialEq, Eq)]
pub struct NvmeSlot {
    /// The slot's bytes in the extent's mapping; see `NvmeStore::host_ptr_safe`.
    pub ptr: *mut u8,
    /// Bytes asked for (the pool reserves it rounded up to 32).
    pub len: u64,
    /// The extent holding the slot.
    pub extent: SegmentId,
    /// Offset of the slot in the swap file.
    pub off: u64,
}

// SAFETY: a slot is an address, a length and an offset; the store that owns
// the mapping synchronises its bookkeeping.
unsafe impl Send for NvmeSlot {}
unsafe impl Sync for NvmeSlot {}

struct Extent {
    /// A raw mapping: callers write through `NvmeSlot::ptr`, which a
    /// slice-based `MmapMut` would not license.
    map: MmapRaw,
    file_off: u64,
    len: u64,
    /// fallocate succeeded: every block of the extent exists on disk.
    preallocated: bool,
}

pub struct NvmeStore {
    file: File,
    private_dir: PathBuf,
    /// The process that made the private directory; only it removes it (a
    /// forked child that drops an inherited store must not).
    owner_pid: u32,
    pool: Pool,
    extents: BTreeMap<SegmentId, Extent>,
    /// File ranges of released extents, hole-punched, to reuse.
    holes: Vec<(u64, u64)>,
    file_len: u64,
    limit: u64,
    extent_bytes: u64,
    page: u64,
    /// Bytes of all extents.
    held: u64,
    faults: NvmeFaults,
    grows: u64,
    releases: u64,
    grow_failures: u64,
    bytes_written: u64,
    bytes_read: u64,
    io_errors: u64,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn dir_error(dir: &Path, what: impl Into<String>) -> StoreError {
    StoreError::SwapDir {
        dir: dir.to_path_buf(),
        what: what.into(),
    }
}

/// Removes empty private directories left in `dir` by crashed processes:
/// ours by uid, named u3m-<pid>-*, whose pid is gone. rmdir only removes
/// empty directories, so nothing of a live store can be lost.
fn remove_stale_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("u3m-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(md) = e.path().symlink_metadata() else {
            continue;
        };
        if !md.is_dir() || md.uid() != uid || pid <= 0 {
            continue;
        }
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } == -1 && errno() == libc::ESRCH {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// mkdtemp(`dir`/u3m-<pid>-XXXXXX): a new directory with mode 0700.
fn make_private_dir(dir: &Path) -> Result<PathBuf, StoreError> {
    let mut tmpl = dir.as_os_str().as_bytes().to_vec();
    tmpl.extend_from_slice(format!("/u3m-{}-XXXXXX", std::process::id()).as_bytes());
    let c = CString::new(tmpl).map_err(|_| dir_error(dir, "path contains a NUL byte"))?;
    let raw = c.into_raw();
    // SAFETY: `raw` is a NUL-terminated template mkdtemp fills in place.
    let r = unsafe { libc::mkdtemp(raw) };
    let err = errno();
    // SAFETY: `raw` came from CString::into_raw and its length is unchanged.
    let c = unsafe { CString::from_raw(raw) };
    if r.is_null() {
        let e = std::io::Error::from_raw_os_error(err);
        return Err(dir_error(
            dir,
            format!("cannot create a private directory in it: {e}"),
        ));
    }
    Ok(PathBuf::from(OsStr::from_bytes(c.as_bytes())))
}

/// Creates `private_dir`/swap (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) and
/// unlinks it before any data is written.
fn create_unlinked(private_dir: &Path) -> std::io::Result<File> {
    let path = private_dir.join("swap");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    if let Err(e) = std::fs::remove_file(&path) {
        // Without the unlink a crash could leave model data readable on disk:
        // refuse the directory rather than use it.
        drop(file);
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(file)
}

impl NvmeStore {
    /// A store in a private directory under `dir`, up to `limit_bytes` of
    /// file, grown `extent_bytes` at a time. No file space is taken until
    /// the first `alloc`.
    pub fn new(
        dir: impl AsRef<Path>,
        limit_bytes: u64,
        extent_bytes: u64,
    ) -> Result<NvmeStore, StoreError> {
        NvmeStore::with_config(NvmeConfig::new(dir.as_ref(), limit_bytes, extent_bytes))
    }

    pub fn with_config(cfg: NvmeConfig) -> Result<NvmeStore, StoreError> {
        let dir = cfg.dir.as_path();
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(dir_error(dir, "does not exist"))
            }
            Err(e) => return Err(dir_error(dir, format!("cannot be examined: {e}"))),
            Ok(md) if !md.is_dir() => return Err(dir_error(dir, "is not a directory")),
            Ok(_) => {}
        }
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| dir_error(dir, "path contains a NUL byte"))?;
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(dir_error(dir, format!("is not writable: {e}")));
        }
        remove_stale_dirs(dir);
        // Two tries: another process's stale-directory sweep (one that cannot
        // see our pid, e.g. from another pid namespace) may remove our empty
        // directory between mkdtemp and open.
        let mut tries = 0;
        let (private_dir, file) = loop {
            tries += 1;
            let private_dir = make_private_dir(dir)?;
            match create_unlinked(&private_dir) {
                Ok(f) => break (private_dir, f),
                Err(e) => {
                    let _ = std::fs::remove_dir(&private_dir);
                    if tries < 2 && e.raw_os_error() == Some(libc::ENOENT) {
                        continue;
                    }
                    return Err(dir_error(
                        dir,
                        format!("cannot create a swap file in it: {e}"),
                    ));
                }
            }
        };
        let page = page_size();
        Ok(NvmeStore {
            file,
            private_dir,
            owner_pid: std::process::id(),
            pool: Pool::new(),
            extents: BTreeMap::new(),
            holes: Vec::new(),
            file_len: 0,
            limit: cfg.limit_bytes,
            extent_bytes: cfg.extent_bytes.max(1).div_ceil(page) * page,
            page,
            held: 0,
            faults: cfg.faults,
            grows: 0,
            releases: 0,
            grow_failures: 0,
            bytes_written: 0,
            bytes_read: 0,
            io_errors: 0,
        })
    }

    /// The store's private directory (empty while the store lives).
    pub fn private_dir(&self) -> &Path {
        &self.private_dir
    }

    /// Replaces the injected faults (tests).
    pub fn set_faults(&mut self, f: NvmeFaults) {
        self.faults = f;
    }

    /// `len` bytes of swap file, growing an extent when no free block fits.
    /// `Full` at the byte limit; `NoSpace` / `Io` when the filesystem refuses
    /// the extent.
    pub fn alloc(&mut self, len: u64) -> Result<NvmeSlot, StoreError> {
        if let Some(slot) = self.carve(len) {
            return Ok(slot);
        }
        self.grow(len)?;
        self.carve(len).ok_or(StoreError::Full)
    }

    fn carve(&mut self, len: u64) -> Option<NvmeSlot> {
        let off = self.pool.alloc(len)?;
        let extent = self.pool.segment_of(off)?;
        let Some(e) = self.extents.get(&extent) else {
            // Every segment has its extent; never hand out an unmapped slot.
            let _ = self.pool.free(off);
            return None;
        };
        // SAFETY: the block lies inside the extent, which is mapped whole.
        let ptr = unsafe { e.map.as_mut_ptr().add((off - e.file_off) as usize) };
        Some(NvmeSlot {
            ptr,
            len,
            extent,
            off,
        })
    }

    fn grow(&mut self, len: u64) -> Result<(), StoreError> {
        let need = len
            .max(1)
            .checked_next_multiple_of(self.page)
            .ok_or(StoreError::Full)?;
        let room = self.limit.saturating_sub(self.held) / self.page * self.page;
        let size = self.extent_bytes.max(need).min(room);
        if size < need {
            return Err(StoreError::Full);
        }
        let (file_off, hole) = match self.holes.iter().position(|&(_, l)| l >= size) {
            Some(i) => (self.holes[i].0, Some(i)),
            None => (self.file_len, None),
        };
        let fd = self.file.as_raw_fd();
        let old_len = self.file_len;
        let end = file_off + size;
        let undo = |t: &mut NvmeStore| {
            if end > old_len {
                // SAFETY: plain syscall on our descriptor.
                unsafe { libc::ftruncate(fd, old_len as libc::off_t) };
            } else {
                punch_hole(fd, file_off, size);
            }
            t.grow_failures += 1;
        };
        if end > old_len {
            // SAFETY: plain syscall on our descriptor.
            if unsafe { libc::ftruncate(fd, end as libc::off_t) } != 0 {
                let e = errno();
                undo(self);
                return Err(StoreError::from_errno(e));
            }
        }
        let mut preallocated = true;
        let r = match self.faults.fail_grow_errno {
            Some(e) => Err(e),
            // SAFETY: plain syscall on our descriptor.
            None => match unsafe {
                libc::fallocate(fd, 0, file_off as libc::off_t, size as libc::off_t)
            } {
                0 => Ok(()),
                _ => Err(errno()),
            },
        };
        match r {
            Ok(()) => {}
            // A filesystem without fallocate: the extent stays sparse and only
            // `write` reports a full disk.
            Err(libc::EOPNOTSUPP) | Err(libc::ENOSYS) => preallocated = false,
            Err(e) => {
                undo(self);
                return Err(StoreError::from_errno(e));
            }
        }
        // MAP_SHARED over the range just allocated in the file.
        let map = match MmapOptions::new()
            .offset(file_off)
            .len(size as usize)
            .map_raw(&self.file)
        {
            Ok(m) => m,
            Err(e) => {
                undo(self);
                return Err(StoreError::from_io(&e));
            }
        };
        let id = match self.pool.add_segment(file_off, size) {
            Ok(id) => id,
            Err(_) => {
                undo(self);
                return Err(StoreError::Io(libc::EINVAL));
            }
        };
        if let Some(i) = hole {
            let (hoff, hlen) = self.holes[i];
            if hlen > size {
                self.holes[i] = (hoff + size, hlen - size);
            } else {
                self.holes.swap_remove(i);
            }
        }
        self.file_len = self.file_len.max(end);
        self.extents.insert(
            id,
            Extent {
                map,
                file_off,
                len: size,
                preallocated,
            },
        );
        self.held += size;
        self.grows += 1;
        Ok(())
    }

    /// Gives a slot back. `BadSlot` if this store did not hand it out or it was
    /// already freed.
    pub fn free(&mut self, slot: NvmeSlot) -> Result<(), StoreError> {
        if self.pool.segment_of(slot.off) != Some(slot.extent) {
            return Err(StoreError::BadSlot);
        }
        self.pool
            .free(slot.off)
            .map(|_| ())
            .map_err(|_| StoreError::BadSlot)
    }

    /// Releases every extent that holds no live slot: unmaps it and returns
    /// its disk blocks (truncate at the file's end, hole punch elsewhere).
    /// Returns the bytes released.
    pub fn shrink(&mut self) -> u64 {
        let fd = self.file.as_raw_fd();
        let mut released = 0;
        for id in self.pool.free_segments() {
            if self.pool.remove_segment(id).is_err() {
                continue;
            }
            let Some(e) = self.extents.remove(&id) else {
                continue;
            };
            drop(e.map);
            punch_hole(fd, e.file_off, e.len);
            self.holes.push((e.file_off, e.len));
            self.held -= e.len;
            released += e.len;
            self.releases += 1;
        }
        // Give back the file's tail: holes that end where the file ends.
        while let Some(i) = self.holes.iter().position(|&(o, l)| o + l == self.file_len) {
            self.file_len = self.holes.swap_remove(i).0;
        }
        // SAFETY: plain syscall on our descriptor.
        unsafe { libc::ftruncate(fd, self.file_len as libc::off_t) };
        released
    }

    /// Checks that `slot` is live here and `[at, at + n)` lies inside it.
    fn check(&self, slot: &NvmeSlot, at: u64, n: usize) -> Result<(), StoreError> {
        let live = self.pool.segment_of(slot.off) == Some(slot.extent)
            && self.pool.block_len(slot.off).is_some_and(|l| l >= slot.len);
        let fits = at.checked_add(n as u64).is_some_and(|end| end <= slot.len);
        if live && fits {
            Ok(())
        } else {
            Err(StoreError::BadSlot)
        }
    }

    /// Copies `src` into the slot's first bytes with pwrite.
    pub fn write(&mut self, slot: &NvmeSlot, src: &[u8]) -> Result<(), StoreError> {
        self.write_at(slot, 0, src)
    }

    /// Copies `src` into the slot at byte `at` with pwrite. On an error the
    /// range's contents are unspecified; the caller keeps its copy.
    pub fn write_at(&mut self, slot: &NvmeSlot, at: u64, src: &[u8]) -> Result<(), StoreError> {
        self.check(slot, at, src.len())?;
        if let Some(limit) = self.faults.fail_writes_after_bytes {
            if self.bytes_written + src.len() as u64 > limit {
                self.io_errors += 1;
                let e = if self.faults.write_errno == 0 {
                    libc::ENOSPC
                } else {
                    self.faults.write_errno
                };
                return Err(StoreError::from_errno(e));
            }
        }
        match self.file.write_all_at(src, slot.off + at) {
            Ok(()) => {
                self.bytes_written += src.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.io_errors += 1;
                Err(StoreError::from_io(&e))
            }
        }
    }

    /// Fills `dst` from the slot's first bytes with pread.
    pub fn read(&mut self, slot: &NvmeSlot, dst: &mut [u8]) -> Result<(), StoreError> {
        self.read_at(slot, 0, dst)
    }

    /// Fills `dst` from the slot at byte `at` with pread.
    pub fn read_at(&mut self, slot: &NvmeSlot, at: u64, dst: &mut [u8]) -> Result<(), StoreError> {
        self.check(slot, at, dst.len())?;
        if let Some(e) = self.faults.fail_read_errno {
            self.io_errors += 1;
            return Err(StoreError::from_errno(e));
        }
        match self.file.read_exact_at(dst, slot.off + at) {
            Ok(()) => {
                self.bytes_read += dst.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.io_errors += 1;
                Err(StoreError::from_io(&e))
            }
        }
    }

    /// Whether touching `slot.ptr` directly cannot raise SIGBUS for lack of
    /// disk space: true when the slot's extent was fallocate'd (its blocks
    /// exist), false on a filesystem without fallocate. A media error while
    /// the kernel reads a page back can still raise SIGBUS through the
    /// mapping, so data copies should use `write`/`read`, which return it.
    pub fn host_ptr_safe(&self, slot: &NvmeSlot) -> bool {
        self.extents
            .get(&slot.extent)
            .is_some_and(|e| e.preallocated)
    }

    /// Bytes in live slots (rounded to 32).
    pub fn used(&self) -> u64 {
        self.pool.used()
    }

    /// Bytes of file held in extents.
    pub fn capacity(&self) -> u64 {
        self.held
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            capacity: self.held,
            grows: self.grows,
            releases: self.releases,
            grow_failures: self.grow_failures,
            bytes_written: self.bytes_written,
            bytes_read: self.bytes_read,
            io_errors: self.io_errors,
            ..StoreStats::from_pool(self.limit, &self.pool.stats())
        }
    }
}

/// Returns a file range's blocks to the filesystem; best effort (a
/// filesystem without hole punching keeps them until the file is closed).
fn punch_hole(fd: i32, off: u64, len: u64) {
    // SAFETY: plain syscall on a descriptor the caller owns.
    unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
}

impl Drop for NvmeStore {
    fn drop(&mut self) {
        // Unmap before the descriptor closes (the fields would drop in
        // declaration order otherwise; either works, this is explicit).
        self.extents.clear();
        if std::process::id() == self.owner_pid {
            let _ = std::fs::remove_dir(&self.private_dir);
        }
    }
}
