//! What the residency manager needs from a device runtime. libu3m.so
//! implements it with the real CANN functions (never through its own hooks);
//! the offline replayer implements it with a cost model; unit tests with a
//! fake that keeps bytes. One engine, several drivers. Handles, streams,
//! events and device addresses are plain integers here; errors are typed
//! (`AclError`), success is `Ok`.

use crate::acl::{AclError, MemcpyKind};

pub const CHUNK: u64 = 2 << 20;

/// Runs `f` with `dev` as the calling thread's device: a stream (and what
/// is recorded on it) is usable only from its own device. Switches only when
/// the runtime says the current device differs, and switches back after:
/// to the caller's own context when the runtime can name it (a thread with
/// a context it created keeps it: `set_device` alone would bring it back on
/// the device's default context, and its next launch would go there), else
/// to its device. None when the switch is refused (`f` did not run).
pub fn on_device<T>(rt: &dyn Runtime, dev: u32, f: impl FnOnce() -> T) -> Option<T> {
    match rt.current_device() {
        Some(cur) if cur != dev => {
            let saved = rt.current_context();
            let r = rt.set_device(dev).is_ok().then(f);
            // back even when the switch failed: it may have gone half way
            restore(rt, saved, Some(cur));
            r
        }
        _ => Some(f()),
    }
}

/// Gives the caller its context `saved` back, else its device `cur`.
fn restore(rt: &dyn Runtime, saved: Option<u64>, cur: Option<u32>) {
    let back = match saved {
        Some(ctx) => rt.set_context(ctx),
        None => Err(AclError::RT_FEATURE_NOT_SUPPORT),
    };
    if back.is_err() {
        if let Some(c) = cur {
            let _ = rt.set_device(c);
        }
    }
}

/// Runs `f` on `dev`'s default context whatever the caller's context, even
/// one of its own on `dev`, and gives the caller its context back after:
/// for what u3m keeps past the call (its streams). A context the program
/// made goes with everything created in it when the program destroys it
/// (aclrtDestroyContext). A runtime that cannot name contexts: `on_device`.
/// None when the switch is refused (`f` did not run).
pub fn on_default_context<T>(rt: &dyn Runtime, dev: u32, f: impl FnOnce() -> T) -> Option<T> {
    let Some(saved) = rt.current_context() else {
        return on_device(rt, dev, f);
    };
    let cur = rt.current_device();
    let r = rt.set_device(dev).is_ok().then(f);
    restore(rt, Some(saved), cur);
    r
}

pub trait Runtime: Send + Sync {
    /// Makes `dev` the calling thread's device, on the device's default
    /// context. `on_device` restores the caller's context after; background
    /// threads call it directly. A runtime whose device switch takes a
    /// reference (aclrtSetDevice: one per call until as many
    /// aclrtResetDevice) must not take one per switch (libu3m.so switches
    /// with aclrtSetCurrentContext to a context it keeps per device).
    fn set_device(&self, dev: u32) -> Result<(), AclError>;
    /// The calling thread's device (aclrtGetDevice); None if it has none or
    /// the runtime cannot say.
    fn current_device(&self) -> Option<u32> {
        None
    }
    /// The calling thread's current context (aclrtGetCurrentContext), as an
    /// opaque handle for `set_context`; None if it has none or the runtime
    /// cannot say (then `on_device` restores the device instead).
    fn current_context(&self) -> Option<u64> {
        None
    }
    /// Makes `ctx` (from `current_context`) the calling thread's context
    /// again (aclrtSetCurrentContext).
    fn set_context(&self, _ctx: u64) -> Result<(), AclError> {
        Err(AclError::RT_FEATURE_NOT_SUPPORT)
    }
    /// A 2 MiB-granular physical allocation on `dev`.
    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, AclError>;
    fn free_physical(&self, handle: u64) -> Result<(), AclError>;
    /// A 2 MiB-granular physical allocation in pinned host memory
    /// (aclrtMallocPhysical at a HOST_NUMA location, near `dev`): mapped at a
    /// device VA like an HBM handle, read and written by the device over the
    /// link. It has no host pointer: its data moves by device copies.
    fn malloc_physical_host(&self, dev: u32, bytes: u64) -> Result<u64, AclError>;
    /// A device VA range on the calling thread's device.
    fn reserve(&self, bytes: u64) -> Result<u64, AclError>;
    fn release(&self, va: u64) -> Result<(), AclError>;
    fn map(&self, va: u64, bytes: u64, handle: u64) -> Result<(), AclError>;
    fn unmap(&self, va: u64) -> Result<(), AclError>;
    /// A stream on the calling thread's device.
    fn create_stream(&self) -> Result<u64, AclError>;
    /// aclrtMemcpyAsync (u3m's own copies: HOST_TO_DEVICE, DEVICE_TO_HOST,
    /// DEVICE_TO_DEVICE).
    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        kind: MemcpyKind,
        stream: u64,
    ) -> Result<(), AclError>;
    /// aclrtMemsetAsync of u3m's own: `bytes` at device address `dst` set
    /// to `value`, in order on `stream` (fresh memory for a first touch
    /// given HBM that still holds another chunk's bytes: migrate.rs).
    fn memset_async(&self, dst: u64, bytes: u64, value: u8, stream: u64) -> Result<(), AclError>;
    fn sync_stream(&self, stream: u64) -> Result<(), AclError>;
    fn create_event(&self) -> Result<u64, AclError>;
    fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError>;
    /// Ok(true) once everything before the event's latest record has run.
    fn event_done(&self, event: u64) -> Result<bool, AclError>;
    fn sync_event(&self, event: u64) -> Result<(), AclError>;
    fn stream_wait(&self, stream: u64, event: u64) -> Result<(), AclError>;
    /// Device time between two completed events (aclrtEventElapsedTime),
    /// ns: what the read-once probe compares. A runtime that cannot time
    /// events says so, and the probe keeps copying.
    fn elapsed_ns(&self, _start: u64, _end: u64) -> Result<u64, AclError> {
        Err(AclError::RT_FEATURE_NOT_SUPPORT)
    }
    /// The runtime itself starts a copy into device memory only after the
    /// work that last used that memory ended (`u3m replay`'s hand-over
    /// what-ifs, which answer every event as complete): u3m need not order
    /// its copy-ins after the copy-outs that freed their HBM. A device
    /// does not (false).
    fn orders_pages(&self) -> bool {
        false
    }
    /// Pinned host memory.
    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, AclError>;
    fn free_host(&self, ptr: *mut u8) -> Result<(), AclError>;
    /// aclrtGetMemInfo(ACL_HBM_MEM) on the calling thread's device: (free, total).
    fn mem_info(&self) -> Result<(u64, u64), AclError>;
}
