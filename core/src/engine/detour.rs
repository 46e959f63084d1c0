//! Calls the engine may own or only observes: allocation (tier mode serves
//! the allocations it manages itself, and makes room for the runtime's),
//! host memory, memory info, IPC, virtual memory (u3m's own physical
//! handles), graph capture, lifecycle. Each family decides with a `Detour`
//! (mirrord-layer's result): u3m served the call, or the real function runs.

use std::sync::atomic::Ordering::Relaxed;

use super::call::{AllocApi, Call, Out};
use super::run::Real;
use super::{dev_index, Engine, PinReason};
use crate::acl::AclError;
use crate::config::LogLevel;
use crate::engine::runtime::CHUNK;
use crate::residency::{malloc_policy_known, malloc_room, Room};
use crate::shm::mono_ns;

/// Rounds of `retry_with_room` however short `U3M_ALLOC_WAIT_MS` is.
const ROOM_TRIES: u32 = 4;

/// What the engine does with a call it may own.
enum Detour<T> {
    /// u3m served the call itself: the real function is not called.
    Done(Result<T, AclError>),
    /// Not u3m's: the real function runs.
    Bypass,
}

impl<T> From<Option<Result<T, AclError>>> for Detour<T> {
    fn from(o: Option<Result<T, AclError>>) -> Detour<T> {
        match o {
            Some(r) => Detour::Done(r),
            None => Detour::Bypass,
        }
    }
}

const E_ALLOC: i32 = AclError::RT_MEMORY_ALLOCATION.raw();

/// aclrtGetMemInfo attributes that describe HBM: ACL_HBM_MEM and its
/// HUGE / NORMAL / P2P / HUGE1G variants.
fn hbm_attr(attr: i32) -> bool {
    matches!(attr, 1 | 4 | 5 | 8 | 9 | 10 | 11)
}

impl Engine {
    pub(super) fn detour(&self, dev: i32, call: &Call<'_>, real: Real<'_>) -> i32 {
        match *call {
            Call::Malloc {
                api,
                size,
                policy,
                out,
            } => self.run_malloc(dev, api, size, policy, out, real),
            Call::Free { ptr } => {
                // forgotten before the real free: afterwards the runtime may
                // hand the address to another thread
                let managed = self.free(ptr);
                // what u3m did not serve is the runtime's (no second
                // look-up of the address)
                match if managed {
                    self.managed_free(ptr)
                } else {
                    Detour::Bypass
                } {
                    Detour::Done(r) => AclError::raw_of(&r),
                    Detour::Bypass => real(),
                }
            }
            Call::MallocHost { size, out } => {
                let rc = real();
                if let (0, Some(h)) = (rc, out.get()) {
                    self.host_alloc(h, size);
                }
                rc
            }
            Call::FreeHost { ptr } => {
                let rc = real();
                if rc == 0 {
                    self.host_free(ptr);
                }
                rc
            }
            Call::HostRegister { host, size, alias } => {
                let rc = real();
                if rc == 0 {
                    // V2 (no alias out) maps the host pages at the same
                    // address on the device
                    match alias {
                        None => self.host_register(dev, host, size, host),
                        Some(a) => {
                            if let Some(a) = a.get() {
                                self.host_register(dev, host, size, a);
                            }
                        }
                    }
                }
                rc
            }
            Call::HostUnregister { host } => {
                let rc = real();
                if rc == 0 {
                    self.host_unregister(host);
                }
                rc
            }
            Call::MemInfo { attr, free, total } => {
                let rc = real();
                if let (0, true, Some(fr), Some(tot)) =
                    (rc, hbm_attr(attr), free.get(), total.get())
                {
                    self.mem_info(dev, fr, tot);
                    // tier mode: the virtual capacity, true for this process
                    if let Some(r) = &self.residency {
                        let (vf, vt) = r.mem_info(dev.max(0) as u32, fr, tot);
                        free.set(vf);
                        total.set(vt);
                    }
                }
                rc
            }
            Call::ResetDevice { device } => {
                let rc = real();
                if rc == 0 {
                    self.device_reset(device);
                }
                rc
            }
            Call::IpcExport { addr, size } => {
                // exported memory must never move: resident and pinned first
                if let Some(r) = &self.residency {
                    if let Err(e) = r.pin_range(dev.max(0) as u32, addr, size) {
                        return e.raw();
                    }
                }
                let rc = real();
                if rc == 0 {
                    self.pin(addr, size, PinReason::IpcExported);
                }
                rc
            }
            Call::IpcImport => {
                let rc = real();
                if rc == 0 {
                    self.ipc_imported();
                }
                rc
            }
            Call::Pin { addr, len, reason } => {
                let rc = real();
                if rc == 0 {
                    self.pin(addr, len, reason);
                }
                rc
            }
            Call::Reserve { size, out } => {
                let rc = real();
                if let (0, Some(va)) = (rc, out.get()) {
                    self.reserve(dev, va, size);
                }
                rc
            }
            Call::Release { va } => {
                let rc = real();
                if rc == 0 {
                    self.release(va);
                }
                rc
            }
            Call::MallocPhysical {
                device,
                size,
                shareable,
                plain,
                out,
            } => self.run_malloc_physical(device, size, shareable, plain, out, real),
            Call::FreePhysical { handle } => {
                let rc = match Detour::from(
                    self.residency
                        .as_ref()
                        .and_then(|r| r.free_physical(handle)),
                ) {
                    Detour::Done(r) => AclError::raw_of(&r),
                    Detour::Bypass => real(),
                };
                if rc == 0 {
                    self.phys_free(handle);
                }
                rc
            }
            Call::Map {
                va,
                size,
                offset,
                handle,
                flags,
            } => {
                // u3m's handles are mapped chunk by chunk by the manager
                let ours = va != 0 && flags == 0;
                let d = match (ours, &self.residency) {
                    (true, Some(r)) => Detour::from(r.map(va, size, offset, handle)),
                    _ => Detour::Bypass,
                };
                let rc = match d {
                    Detour::Done(r) => AclError::raw_of(&r),
                    Detour::Bypass => real(),
                };
                if rc == 0 {
                    self.map(va, size, handle);
                }
                rc
            }
            Call::Unmap { va } => {
                self.unmap_begin(va);
                let rc = match Detour::from(self.residency.as_ref().and_then(|r| r.unmap(va))) {
                    Detour::Done(r) => AclError::raw_of(&r),
                    Detour::Bypass => real(),
                };
                if rc == 0 {
                    self.unmap(va);
                }
                rc
            }
            Call::ExportHandle { handle, pass } => {
                // a handle of u3m's: the real chunk behind it is exported
                // (and pinned from now on)
                match Detour::from(self.residency.as_ref().and_then(|r| r.export(handle))) {
                    Detour::Done(Ok(h)) => pass.set(h),
                    Detour::Done(Err(e)) => {
                        if self.cfg.log >= LogLevel::Warn {
                            eprintln!("u3m: aclrtMemExportToShareableHandle: u3m could not give the managed handle real memory for export");
                        }
                        return e.raw();
                    }
                    Detour::Bypass => {}
                }
                let rc = real();
                if rc == 0 {
                    self.phys_exported(handle);
                }
                rc
            }
            Call::ImportHandle { device, out } => {
                let rc = real();
                if let (0, Some(h)) = (rc, out.get()) {
                    self.phys_imported(device, h);
                }
                rc
            }
            Call::CaptureBegin { stream } => {
                // the use fence of the stream's earlier calls is recorded
                // while the stream still runs what is queued on it
                if let Some(r) = &self.residency {
                    r.before_capture(stream);
                }
                let rc = real();
                if rc == 0 {
                    self.capture_begin(stream);
                }
                rc
            }
            Call::CaptureEnd { stream, out } => {
                let rc = real();
                let model = if rc == 0 { out.get().unwrap_or(0) } else { 0 };
                self.capture_end(stream, model);
                rc
            }
            Call::GraphDestroy { model } => {
                let rc = real();
                if rc == 0 {
                    self.graph_destroy(model);
                }
                rc
            }
            Call::Finalize => {
                // flush before the runtime goes away: the program may exit
                // right after; u3m's runtime objects are given back while
                // the runtime can take them (it may be unloaded next)
                self.runtime_finalize();
                if let Some(r) = &self.residency {
                    r.finalize();
                }
                real()
            }
            // device work is `run`'s
            Call::Copy { .. }
            | Call::CopyBatch { .. }
            | Call::Memset { .. }
            | Call::Launch(_)
            | Call::Collective { .. }
            | Call::Kernel { .. }
            | Call::OpaqueKernel { .. }
            | Call::GraphReplay { .. } => real(),
        }
    }

    /// aclrtMalloc family: tier mode serves the allocations it manages (a
    /// reserved VA backed by chunks on demand); the runtime's own that fail
    /// for lack of HBM get room made (managed chunks evicted) and are tried
    /// again.
    fn run_malloc(
        &self,
        dev: i32,
        api: AllocApi,
        size: u64,
        policy: i32,
        out: Out,
        real: Real<'_>,
    ) -> i32 {
        // a bad argument (null out, size 0, unknown policy) is the runtime's
        // to report
        if !out.is_null() && size > 0 && malloc_policy_known(policy) {
            let padded = api != AllocApi::MallocAlign32;
            match self.managed_malloc(dev, size, malloc_room(size, padded)) {
                Detour::Done(Ok(va)) => {
                    out.set(va);
                    self.alloc(dev, va, size, api);
                    return 0;
                }
                Detour::Done(Err(e)) => {
                    self.alloc_failed(dev, size, e.raw(), api);
                    return e.raw();
                }
                Detour::Bypass => {}
            }
        }
        let mut rc = real();
        if rc == E_ALLOC {
            rc = self.retry_with_room(dev, size, real);
        }
        self.learn_capacity(dev);
        if rc == 0 {
            if let Some(p) = out.get() {
                self.alloc(dev, p, size, api);
            }
        } else {
            self.alloc_failed(dev, size, rc, api);
        }
        rc
    }

    /// An allocation u3m does not manage, refused for lack of HBM: managed
    /// chunks are evicted for it (`make_room`, the room kept for it until
    /// the retry, so u3m's own fault-ins evict rather than take it) and it
    /// is tried again — at least `ROOM_TRIES` times, and on for up to
    /// `U3M_ALLOC_WAIT_MS`: other threads' allocations u3m does not manage
    /// are not held back by the kept room and may take it first, and at
    /// times every resident chunk is in a call in flight, so nothing can
    /// move until one ends (mt_stress, 8 threads on 48 MiB: four rounds
    /// were all lost once in 60 runs under load, and with rounds on while
    /// room could be made, once in 120 to a moment when none could). When
    /// no resident chunk may ever move (none resident, or only exported
    /// ones and, in a forked child, those resident at the fork), the
    /// runtime's refusal is returned at once.
    fn retry_with_room(&self, dev: i32, size: u64, real: Real<'_>) -> i32 {
        let Some(r) = &self.residency else {
            return E_ALLOC;
        };
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(self.cfg.alloc_wait_ms);
        let mut tries = 0;
        loop {
            let room = self.make_room(dev, size + CHUNK);
            if room.is_none() {
                if !r.may_move(dev.max(0) as u32) || std::time::Instant::now() >= deadline {
                    return E_ALLOC;
                }
                // the calls in flight end, or other threads free
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let rc = real();
            drop(room);
            tries += 1;
            if rc != E_ALLOC || (tries >= ROOM_TRIES && std::time::Instant::now() >= deadline) {
                return rc;
            }
        }
    }

    /// An allocation the residency manager serves (Bypass: not tier mode,
    /// or too small to manage).
    fn managed_malloc(&self, dev: i32, size: u64, room: u64) -> Detour<u64> {
        let Some(r) = &self.residency else {
            return Detour::Bypass;
        };
        // a size u3m does not manage goes to the runtime without asking it
        // for free memory first (a runtime call per small allocation)
        if !r.manages_size(dev.max(0) as u32, size) {
            return Detour::Bypass;
        }
        let Ok((free, total)) = r.runtime().mem_info() else {
            return Detour::Bypass;
        };
        self.capacity[dev_index(dev)].store(total, Relaxed);
        let t0 = mono_ns();
        let d = r.malloc_with_room(dev.max(0) as u32, size, room, free, total);
        self.ops.stall_ns.fetch_add(mono_ns() - t0, Relaxed);
        self.say_refused(r);
        d.into()
    }

    fn managed_free(&self, ptr: u64) -> Detour<()> {
        self.residency.as_ref().and_then(|r| r.free(ptr)).into()
    }

    /// After an unmanaged allocation failed with 207001: evict managed
    /// chunks so that a retry can succeed, the room kept for the caller
    /// while the `Room` lives. None: nothing could move.
    /// When every candidate is still in use (calls queued on their streams
    /// name them), waits for the first such use, unlocked, and tries again:
    /// a use fence is recorded only when an eviction asks, so the first ask
    /// rarely finds it complete.
    fn make_room(&self, dev: i32, bytes: u64) -> Option<Room> {
        let r = self.residency.as_ref()?;
        let d = dev.max(0) as u32;
        r.make_room(d, bytes)
            .or_else(|| r.wait_busy().then(|| r.make_room(d, bytes)).flatten())
    }

    /// aclrtMallocPhysical: u3m's own handle (2 MiB chunks that move
    /// independently) for a plain, non-shareable one in tier mode.
    fn run_malloc_physical(
        &self,
        device: i32,
        size: u64,
        shareable: bool,
        plain: bool,
        out: Out,
        real: Real<'_>,
    ) -> i32 {
        self.learn_capacity(device);
        if !out.is_null() && plain && size > 0 {
            let d = self
                .residency
                .as_ref()
                .and_then(|r| r.malloc_physical(device.max(0) as u32, size, shareable));
            match Detour::from(d) {
                Detour::Done(Ok(h)) => {
                    out.set(h);
                    self.phys_alloc(device, h, size);
                    return 0;
                }
                Detour::Done(Err(e)) => {
                    self.alloc_failed(device, size, e.raw(), AllocApi::MallocPhysical);
                    return e.raw();
                }
                Detour::Bypass => {}
            }
        }
        let rc = real();
        if rc == 0 {
            if let Some(h) = out.get() {
                self.phys_alloc(device, h, size);
            }
        } else {
            self.alloc_failed(device, size, rc, AllocApi::MallocPhysical);
        }
        rc
    }

    /// The device's physical capacity, asked once per device from the
    /// runtime (a pure query: it changes nothing the program could observe).
    fn learn_capacity(&self, dev: i32) {
        if dev < 0 || self.capacity(dev) != 0 {
            return;
        }
        if let Some(Ok((free, total))) = self.rt.map(|rt| rt.mem_info()) {
            self.mem_info(dev, free, total);
        }
    }
}
