//! The writer side, used by `libu3m.so`: creates `u3m.<pid>` and updates it
//! without ever blocking or allocating after `create`.

use super::layout::*;
use super::{floor_char_boundary, mono_ns, proc_start, store_bytes, unix_ns, HotEntry};
use crate::monitor::Status as MonitorStatus;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering::*};

/// What the segment is created with.
#[derive(Debug, Clone)]
pub struct SegmentConfig<'a> {
    /// Directory of the segment file (`shm::default_dir()` normally).
    pub dir: PathBuf,
    /// `KEY=VALUE` items, separated by newlines or spaces: the mode and the
    /// effective U3M_* settings (`shm::config_pairs` reads them back).
    pub config_text: &'a str,
    /// Hook id i is named `hook_names[i]` (at most MAX_HOOKS, names of at most
    /// HOOK_NAME_LEN-1 bytes; longer ones are cut).
    pub hook_names: &'a [&'a str],
    /// Bit i of a hot entry's class mask is `class_names[i]`.
    pub class_names: &'a [&'a str],
    /// Header labels (`layout::LABEL_NAMES` order; at most LABEL_LEN-1 bytes
    /// each, longer ones cut). `new` fills them from the environment.
    pub labels: [String; LABELS],
}

impl<'a> SegmentConfig<'a> {
    pub fn new(
        config_text: &'a str,
        hook_names: &'a [&'a str],
        class_names: &'a [&'a str],
    ) -> Self {
        SegmentConfig {
            dir: super::default_dir(),
            config_text,
            hook_names,
            class_names,
            labels: super::labels_from_env(&|k| std::env::var(k).ok()),
        }
    }
}

/// This process's stats segment. Shared by all threads (`&self` everywhere).
pub struct StatsSegment {
    seg: NonNull<Segment>,
    path: CString,
    path_buf: PathBuf,
    pid: u32,
    /// Where counters of device ids >= MAX_DEVICES go (nowhere visible).
    sink: Box<DeviceGauges>,
}

// SAFETY: the mapping is shared memory accessed only through atomics (or
// fields immutable after `create`); the pointer stays valid until drop.
unsafe impl Send for StatsSegment {}
unsafe impl Sync for StatsSegment {}

impl StatsSegment {
    /// Creates `<dir>/u3m.<pid>` (mode 0600, O_EXCL), sized, backed and
    /// mapped. A file already there carries our pid, so it belongs to a
    /// process that is gone (pid reuse, or an exec that skipped the exit
    /// handlers): it is replaced.
    pub fn create(cfg: &SegmentConfig) -> io::Result<StatsSegment> {
        let pid = std::process::id();
        let path_buf = cfg.dir.join(format!("{}{pid}", super::FILE_PREFIX));
        let path = CString::new(path_buf.as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "segment path contains NUL")
        })?;
        let fd = match open_excl(&path) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // SAFETY: valid C string.
                unsafe { libc::unlink(path.as_ptr()) };
                open_excl(&path)?
            }
            r => r?,
        };
        let mapped = size_and_map(fd);
        // SAFETY: fd is ours; the mapping keeps the file alive.
        unsafe { libc::close(fd) };
        let ptr = match mapped {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: valid C string.
                unsafe { libc::unlink(path.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: zeroed atomics are valid values.
        let sink: Box<DeviceGauges> = Box::new(unsafe { std::mem::zeroed() });
        let s = StatsSegment {
            seg: ptr,
            path,
            path_buf,
            pid,
            sink,
        };
        s.init(cfg);
        Ok(s)
    }

    fn init(&self, cfg: &SegmentConfig) {
        let p = self.seg.as_ptr();
        let start_mono = mono_ns();
        // SAFETY: the mapping is fresh, zero-filled and not yet visible to
        // readers (magic is 0), so plain writes to immutable fields are fine.
        unsafe {
            let h = &mut (*p).header;
            h.layout_major = LAYOUT_MAJOR;
            h.layout_minor = LAYOUT_MINOR;
            h.total_size = SEGMENT_SIZE as u64;
            h.header_size = std::mem::size_of::<Header>() as u32;
            h.pid = self.pid;
            h.start_ticks = proc_start(self.pid).map(|s| s.0).unwrap_or(0);
            h.start_unix_ns = unix_ns();
            h.start_mono_ns = start_mono;
            let v = crate::VERSION.as_bytes();
            let n = v.len().min(VERSION_LEN - 1);
            h.version[..n].copy_from_slice(&v[..n]);
            h.max_devices = MAX_DEVICES as u32;
            h.max_hooks = MAX_HOOKS as u32;
            h.hot_capacity = HOT_CAPACITY as u32;
            h.event_capacity = EVENT_CAPACITY as u32;
            h.event_record_size = std::mem::size_of::<EventSlot>() as u32;
            h.thread_rows = THREAD_ROWS as u32;
            let names = &mut (*p).names;
            h.n_hook_names = copy_names(&mut names.hook_names, cfg.hook_names) as u32;
            h.n_class_names = copy_names(&mut names.class_names, cfg.class_names) as u32;
            h.pid_ns = super::own_pid_ns();
            for (slot, v) in h.labels.iter_mut().zip(&cfg.labels) {
                let n = floor_char_boundary(v, LABEL_LEN - 1);
                slot[..n].copy_from_slice(&v.as_bytes()[..n]);
            }
        }
        self.set_config(cfg.config_text);
        let seg = self.seg();
        seg.header.state.store(STATE_RUNNING, Relaxed);
        let pairs = super::config_pairs(cfg.config_text);
        let mode = pairs
            .iter()
            .find(|(k, _)| k == "U3M_MODE" || k == "mode")
            .map_or("", |(_, v)| v.as_str());
        self.event_at(
            start_mono,
            EventKind::Start,
            NO_DEVICE,
            0,
            0,
            self.pid as u64,
            mode,
        );
        seg.header.magic.store(MAGIC, Release);
    }

    fn seg(&self) -> &Segment {
        // SAFETY: valid for the lifetime of self.
        unsafe { self.seg.as_ref() }
    }

    /// Path of the segment file.
    pub fn path(&self) -> &Path {
        &self.path_buf
    }

    /// Pid that created the segment. A forked child must create its own and
    /// stop writing to this one (MAP_SHARED survives fork).
    pub fn owner_pid(&self) -> u32 {
        self.pid
    }

    /// CLOCK_MONOTONIC at creation (the origin readers show event times from).
    pub fn start_mono_ns(&self) -> u64 {
        self.seg().header.start_mono_ns
    }

    #[cfg(test)]
    pub(crate) fn raw_header(&self) -> &Header {
        &self.seg().header
    }

    /// Gauges of device `d`; ids beyond MAX_DEVICES count into a private sink.
    #[inline]
    pub fn device(&self, d: usize) -> &DeviceGauges {
        match self.seg().devices.get(d) {
            Some(g) => {
                if g.present.load(Relaxed) == 0 {
                    g.present.store(1, Relaxed);
                }
                g
            }
            None => &self.sink,
        }
    }

    /// Counts one call of hook `id`.
    #[inline]
    pub fn count_call(&self, id: usize) {
        match self.seg().calls.count.get(id) {
            Some(c) => c.fetch_add(1, Relaxed),
            None => self.seg().header.calls_overflow.fetch_add(1, Relaxed),
        };
    }

    /// A row of call counts for the calling thread alone (`ThreadCalls`),
    /// held until it is given back (`ThreadCalls::give_back`, at the
    /// thread's exit); None when every row is held (the thread counts in
    /// the shared `Calls`).
    pub fn take_thread_calls(&self) -> Option<&ThreadCalls> {
        self.seg().threads.iter().find(|r| {
            r.held.load(Relaxed) == 0 && r.held.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
        })
    }

    /// Counts one call of hook `id` in the calling thread's row (`row`,
    /// from `take_thread_calls` on this thread), or in the shared counts
    /// when it has none.
    #[inline]
    pub fn count_call_in(&self, row: Option<&ThreadCalls>, id: usize) {
        match row.and_then(|r| r.count.get(id)) {
            // only this thread writes its row's counts: no read-modify-write
            Some(c) => c.store(c.load(Relaxed).wrapping_add(1), Relaxed),
            None => self.count_call(id),
        }
    }

    /// Counts one operator launch on device `d` (`device(d).ops`) in the
    /// calling thread's row (`row`, as in `count_call_in`), or in the
    /// device's shared count when it has none.
    #[inline]
    pub fn count_op_in(&self, row: Option<&ThreadCalls>, d: usize) {
        let g = self.device(d);
        match row.and_then(|r| r.ops.get(d)) {
            // only this thread writes its row's counts: no read-modify-write
            Some(c) => c.store(c.load(Relaxed).wrapping_add(1), Relaxed),
            None => {
                g.ops.fetch_add(1, Relaxed);
            }
        }
    }

    /// Appends an event stamped now.
    #[inline]
    pub fn event(&self, kind: EventKind, dev: u32, addr: u64, len: u64, text: &str) {
        self.event_at(mono_ns(), kind, dev, addr, len, 0, text);
    }

    /// Appends an event with a kind-specific value (docs/stats.md).
    #[inline]
    pub fn event_value(
        &self,
        kind: EventKind,
        dev: u32,
        addr: u64,
        len: u64,
        value: u64,
        text: &str,
    ) {
        self.event_at(mono_ns(), kind, dev, addr, len, value, text);
    }

    /// Appends an event with an explicit CLOCK_MONOTONIC time. Lossy: when the
    /// slot is being rewritten by a writer that lapped the ring, the event is
    /// dropped and counted in `events_dropped`; readers see the gap.
    #[allow(clippy::too_many_arguments)]
    pub fn event_at(
        &self,
        time_ns: u64,
        kind: EventKind,
        dev: u32,
        addr: u64,
        len: u64,
        value: u64,
        text: &str,
    ) {
        let seg = self.seg();
        let h = &seg.header;
        let seq = h.event_head.fetch_add(1, Relaxed);
        let slot = &seg.events[(seq as usize) & (EVENT_CAPACITY - 1)];
        let writing = 2 * seq + 1;
        let cur = slot.stamp.load(Relaxed);
        // Odd: another writer is in this slot; >= ours: a newer record is.
        if cur & 1 == 1
            || cur >= writing
            || slot
                .stamp
                // Acquire: the lapped writer's data stores (released by its
                // even stamp) happen before ours (a loom model found a record
                // stamped for us holding its data with Relaxed: loom/)
                .compare_exchange(cur, writing, Acquire, Relaxed)
                .is_err()
        {
            h.events_dropped.fetch_add(1, Relaxed);
            return;
        }
        // Seqlock write (Boehm, "Can seqlocks get along with programming
        // language memory models?"): odd stamp, release fence, relaxed data,
        // release store of the even stamp.
        fence(Release);
        let tlen = floor_char_boundary(text, EVENT_TEXT_LEN);
        let dev = if dev >= NO_DEVICE {
            NO_DEVICE_WIRE
        } else {
            dev as u16
        };
        slot.time_ns.store(time_ns, Relaxed);
        slot.meta
            .store(pack_meta(kind as u16, dev, tlen as u16), Relaxed);
        slot.addr.store(addr, Relaxed);
        slot.len.store(len, Relaxed);
        slot.value.store(value, Relaxed);
        store_bytes(&slot.text, &text.as_bytes()[..tlen]);
        slot.stamp.store(writing + 1, Release);
    }

    /// Replaces the hot table with (at most HOT_CAPACITY of) `entries`.
    /// Returns false, without waiting, if another publication is in progress.
    pub fn publish_hot(&self, entries: &[HotEntry]) -> bool {
        let seg = self.seg();
        let hot = &seg.hot;
        let cur = hot.seq.load(Relaxed);
        if cur & 1 == 1
            || hot
                .seq
                .compare_exchange(cur, cur + 1, Relaxed, Relaxed)
                .is_err()
        {
            seg.header.hot_skipped.fetch_add(1, Relaxed);
            return false;
        }
        fence(Release);
        let n = entries.len().min(HOT_CAPACITY);
        for (slot, e) in hot.entries.iter().zip(&entries[..n]) {
            slot.addr.store(e.addr, Relaxed);
            slot.len.store(e.len, Relaxed);
            slot.device.store(e.device as u64, Relaxed);
            slot.accesses.store(e.accesses, Relaxed);
            slot.heat.store(e.heat.to_bits(), Relaxed);
            slot.class_mask.store(e.class_mask, Relaxed);
            slot.last_ns.store(e.last_ns, Relaxed);
        }
        hot.count.store(n as u64, Relaxed);
        hot.published_ns.store(mono_ns(), Relaxed);
        hot.seq.store(cur + 2, Release);
        seg.header.hot_publishes.fetch_add(1, Relaxed);
        true
    }

    /// Rewrites the configuration text (cut at CONFIG_TEXT_LEN bytes).
    /// Returns false, without waiting, if another rewrite is in progress.
    pub fn set_config(&self, text: &str) -> bool {
        let c = &self.seg().config;
        let cur = c.seq.load(Relaxed);
        if cur & 1 == 1
            || c.seq
                .compare_exchange(cur, cur + 1, Relaxed, Relaxed)
                .is_err()
        {
            return false;
        }
        fence(Release);
        let n = floor_char_boundary(text, CONFIG_TEXT_LEN);
        c.len.store(n as u64, Relaxed);
        store_bytes(&c.text, &text.as_bytes()[..n]);
        c.seq.store(cur + 2, Release);
        true
    }

    /// Publishes the monitor's state for device `d`.
    pub fn publish_monitor(&self, d: usize, st: &MonitorStatus) {
        let g = self.device(d);
        g.monitor_level.store(st.level as u64, Relaxed);
        let oom_ms = match st.seconds_to_oom {
            Some(s) if s.is_finite() => (s * 1000.0).clamp(0.0, (u64::MAX - 1) as f64) as u64,
            _ => u64::MAX,
        };
        g.monitor_oom_ms.store(oom_ms, Relaxed);
        g.monitor_use_ppm
            .store((st.use_fraction.max(0.0) * 1e6) as u64, Relaxed);
        g.monitor_growth_bps
            .store(st.growth_bps as i64 as u64, Relaxed);
        g.monitor_updated_ns.store(mono_ns(), Relaxed);
    }

    /// Marks the segment as exiting and unlinks it (the mapping stays valid,
    /// so threads still counting do no harm). Does nothing in a forked child:
    /// the file belongs to the parent.
    pub fn remove(&self) {
        if std::process::id() != self.pid {
            return;
        }
        let seg = self.seg();
        seg.header.state.store(STATE_EXITING, Relaxed);
        self.event(EventKind::Exit, NO_DEVICE, 0, 0, "");
        // SAFETY: valid C string, built at creation (no allocation here).
        unsafe { libc::unlink(self.path.as_ptr()) };
    }
}

impl ThreadCalls {
    /// Gives the row back (its thread is done counting in it): the counts
    /// stay, the next thread to take it counts on from them. Only the
    /// thread that took it, once.
    pub fn give_back(&self) {
        self.held.store(0, Release);
    }
}

impl DeviceGauges {
    /// Adds to a tier's resident bytes and raises its peak.
    #[inline]
    pub fn add_used(&self, tier: usize, bytes: u64) {
        if let (Some(u), Some(p)) = (self.used.get(tier), self.peak.get(tier)) {
            let now = u.fetch_add(bytes, Relaxed).wrapping_add(bytes);
            p.fetch_max(now, Relaxed);
        }
    }

    /// Takes from a tier's resident bytes, saturating at zero (an accounting
    /// slip must not show 16 EiB).
    #[inline]
    pub fn sub_used(&self, tier: usize, bytes: u64) {
        if let Some(u) = self.used.get(tier) {
            let _ = u.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(bytes)));
        }
    }

    /// Counts one copy of `bytes` of kind COPY_* (H2H, H2D, D2H, D2D).
    #[inline]
    pub fn add_copy(&self, kind: usize, bytes: u64) {
        if let (Some(c), Some(b)) = (self.copy_calls.get(kind), self.copy_bytes.get(kind)) {
            c.fetch_add(1, Relaxed);
            b.fetch_add(bytes, Relaxed);
        }
    }
}

impl StatsSegment {
    /// In a forked child that keeps the parent's engine: the mapping becomes
    /// a private copy, so the child's counting never lands in the parent's
    /// segment (the child publishes nothing).
    pub fn privatize_after_fork(&self) {
        let base = self.seg.as_ptr().cast::<u8>();
        let mut copy = vec![0u8; SEGMENT_SIZE];
        // SAFETY: the segment is mapped readable for SEGMENT_SIZE bytes and,
        // right after fork, only this thread exists to touch it; the anonymous
        // mapping replaces it at the same address and size (MAP_FIXED), and
        // the copy is written back before anything reads it.
        unsafe {
            std::ptr::copy_nonoverlapping(base, copy.as_mut_ptr(), SEGMENT_SIZE);
            let p = libc::mmap(
                base.cast(),
                SEGMENT_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if p == base.cast() {
                std::ptr::copy_nonoverlapping(copy.as_ptr(), base, SEGMENT_SIZE);
            }
        }
    }
}

impl Drop for StatsSegment {
    fn drop(&mut self) {
        // SAFETY: mapped in create with this size; nothing borrows it past self.
        unsafe { libc::munmap(self.seg.as_ptr().cast(), SEGMENT_SIZE) };
    }
}

fn open_excl(path: &CString) -> io::Result<i32> {
    // SAFETY: valid C string; flags and mode are constants.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // umask may have narrowed the mode; make it exactly 0600.
    // SAFETY: fd is open.
    unsafe { libc::fchmod(fd, 0o600) };
    Ok(fd)
}

/// Sizes the file, reserves its blocks, maps it. Reserving matters on tmpfs:
/// a page that cannot be backed later would be SIGBUS inside someone's job,
/// so a full /dev/shm must fail here instead.
fn size_and_map(fd: i32) -> io::Result<NonNull<Segment>> {
    let size = SEGMENT_SIZE as libc::off_t;
    // SAFETY: plain syscalls on our fd.
    unsafe {
        if libc::ftruncate(fd, size) != 0 {
            return Err(io::Error::last_os_error());
        }
        match libc::posix_fallocate(fd, 0, size) {
            0 => {}
            libc::EOPNOTSUPP | libc::EINVAL => zero_fill(fd)?,
            e => return Err(io::Error::from_raw_os_error(e)),
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            SEGMENT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(NonNull::new_unchecked(p.cast()))
    }
}

/// Backs every block by writing zeros (filesystems without fallocate).
fn zero_fill(fd: i32) -> io::Result<()> {
    let buf = [0u8; 4096];
    let mut off = 0usize;
    while off < SEGMENT_SIZE {
        let n = buf.len().min(SEGMENT_SIZE - off);
        // SAFETY: buf is valid for n bytes.
        let w = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), n, off as libc::off_t) };
        if w < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        off += w as usize;
    }
    Ok(())
}

fn copy_names<const N: usize>(table: &mut [[u8; N]], names: &[&str]) -> usize {
    let n = names.len().min(table.len());
    for (slot, name) in table.iter_mut().zip(&names[..n]) {
        let k = floor_char_boundary(name, N - 1);
        slot[..k].copy_from_slice(&name.as_bytes()[..k]);
    }
    n
}
