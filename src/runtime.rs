//! The tiering engine's device runtime: the real CANN functions, called
//! directly (never through u3m's own exports, so u3m's own work is neither
//! observed nor tiered).
//!
//! Every unsafe block here is one `call!`: the pointer is the named CANN
//! function, transmuted to its C prototype as acl_rt.h declares it, and the
//! arguments are u3m's own values or out-parameters on this stack.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use crate::ffi::*;
use crate::hooks::table::real;
use crate::real::RealFn;
use u3m_core::acl::{AclError, MemcpyKind};
use u3m_core::engine::runtime::Runtime;
use u3m_core::residency::MAX_DEVICES;

static CREATE_STREAM: RealFn = RealFn::new(b"aclrtCreateStream\0");
static SYNC_STREAM: RealFn = RealFn::new(b"aclrtSynchronizeStream\0");
static GET_DEVICE: RealFn = RealFn::new(b"aclrtGetDevice\0");
static CREATE_EVENT: RealFn = RealFn::new(b"aclrtCreateEvent\0");
static RECORD_EVENT: RealFn = RealFn::new(b"aclrtRecordEvent\0");
static QUERY_EVENT: RealFn = RealFn::new(b"aclrtQueryEventStatus\0");
static SYNC_EVENT: RealFn = RealFn::new(b"aclrtSynchronizeEvent\0");
static WAIT_EVENT: RealFn = RealFn::new(b"aclrtStreamWaitEvent\0");
static ELAPSED: RealFn = RealFn::new(b"aclrtEventElapsedTime\0");
static GET_CONTEXT: RealFn = RealFn::new(b"aclrtGetCurrentContext\0");

const NOT_FOUND: i32 = ACL_ERROR_RT_FEATURE_NOT_SUPPORT;

/// Calls a real function; its aclError as a result.
macro_rules! call {
    ($f:expr, $ty:ty, $($a:expr),*) => {{
        let rc = match $f.get() {
            Some(p) => {
                // SAFETY: `p` is the function `$f` names and `$ty` its C
                // prototype (module note); the arguments are valid for it.
                let f: $ty = unsafe { std::mem::transmute::<*mut c_void, $ty>(p) };
                unsafe { f($($a),*) }
            }
            None => NOT_FOUND,
        };
        AclError::check(rc)
    }};
}

/// aclrtMallocPhysical at a location with a memory attribute.
fn physical(location: u32, id: u32, mem_attr: c_int, bytes: u64) -> Result<u64, AclError> {
    let prop = aclrtPhysicalMemProp {
        handle_type: 0,
        allocation_type: 0,
        mem_attr,
        location: aclrtMemLocation {
            id,
            type_: location,
        },
        reserve: 0,
    };

    let mut h: aclrtDrvMemHandle = std::ptr::null_mut();
    call!(
        real::aclrtMallocPhysical,
        unsafe extern "C" fn(
            *mut aclrtDrvMemHandle,
            usize,
            *const aclrtPhysicalMemProp,
            u64,
        ) -> i32,
        &mut h,
        bytes as usize,
        &prop,
        0
    )
    .map(|()| h as u64)
}

/// The calling thread's current context (aclrtGetCurrentContext).
fn get_context() -> Result<u64, AclError> {
    let mut c: *mut c_void = std::ptr::null_mut();
    call!(
        GET_CONTEXT,
        unsafe extern "C" fn(*mut *mut c_void) -> i32,
        &mut c
    )?;
    if c.is_null() {
        return Err(AclError::RT_FEATURE_NOT_SUPPORT);
    }
    Ok(c as u64)
}

/// Per device, the default context u3m switches threads to (0: not known
/// yet). A device switch by aclrtSetDevice takes a device reference every
/// time, and the device's resources go only once as many aclrtResetDevice
/// calls have dropped them all (CANN's aclrtResetDevice documentation,
/// docs/acl-surface.md §1k), so u3m switches with aclrtSetCurrentContext to
/// this context instead.
/// Learned without a reference from the program's own aclrtSetDevice (after
/// it the thread is on the device's default context: `learn_context`);
/// failing that taken once by u3m (`OWN_REF`), kept until the program's
/// last reset of the device (`drop_own_ref`) or a forced one.
static DEFAULT_CTX: [AtomicU64; MAX_DEVICES] = [NO_CTX; MAX_DEVICES];
/// u3m took a device reference for `DEFAULT_CTX[dev]` (aclrtSetDevice):
/// the context lives until the program's last reset of the device.
static OWN_REF: [AtomicBool; MAX_DEVICES] = [NO_REF; MAX_DEVICES];
// array initialisers (`[const { .. }; N]` is newer than rust-version 1.75)
#[allow(clippy::declare_interior_mutable_const)]
const NO_CTX: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO_REF: AtomicBool = AtomicBool::new(false);

/// After the program's aclrtSetDevice(dev) succeeded on this thread: the
/// thread's context is `dev`'s default one; u3m keeps it to switch to.
pub fn learn_context(dev: i32) {
    let Some(slot) = usize::try_from(dev).ok().and_then(|d| DEFAULT_CTX.get(d)) else {
        return;
    };
    if slot.load(Acquire) == 0 {
        if let Ok(c) = get_context() {
            let _ = slot.compare_exchange(0, c, AcqRel, Acquire);
        }
    }
}

/// After the program's aclrtResetDevice(dev): a default context u3m learned
/// (no reference of its own) may be gone; u3m takes its own when it next
/// needs `dev`. One u3m took stays (the program's last reset drops it
/// first: `drop_own_ref`).
pub fn forget_context(dev: i32) {
    let Ok(d) = usize::try_from(dev) else { return };
    if d < MAX_DEVICES && !OWN_REF[d].load(Acquire) {
        DEFAULT_CTX[d].store(0, Release);
    }
}

/// At the program's last aclrtResetDevice(dev), or a forced one: whether
/// u3m held a reference of its own there, now given up (after a plain
/// reset the caller drops it with one more); u3m takes a new one when it
/// next needs `dev`.
pub fn drop_own_ref(dev: i32) -> bool {
    let Ok(d) = usize::try_from(dev) else {
        return false;
    };
    if d >= MAX_DEVICES || !OWN_REF[d].swap(false, AcqRel) {
        return false;
    }
    DEFAULT_CTX[d].store(0, Release);
    true
}

/// `dev`'s default context, taken by u3m on first need (aclrtSetDevice,
/// which also makes it the calling thread's context, and
/// aclrtGetCurrentContext): one device reference, until the program's last
/// reset of the device.
/// Two threads that both find it missing each take one (the first kept is
/// the one used; the other reference stays too: at most one per thread
/// that raced, once).
fn default_context(dev: u32) -> Result<u64, AclError> {
    let d = dev as usize;
    if d >= MAX_DEVICES {
        return Err(AclError::RT_PARAM_INVALID);
    }
    let c = DEFAULT_CTX[d].load(Acquire);
    if c != 0 {
        return Ok(c);
    }
    call!(
        real::aclrtSetDevice,
        unsafe extern "C" fn(i32) -> i32,
        dev as i32
    )?;
    let c = get_context()?;
    OWN_REF[d].store(true, Release);
    match DEFAULT_CTX[d].compare_exchange(0, c, AcqRel, Acquire) {
        Ok(_) => Ok(c),
        Err(known) => Ok(known),
    }
}

pub struct Real;

impl Runtime for Real {
    /// The calling thread goes to `dev`'s default context (kept by u3m,
    /// `default_context`): no device reference per switch.
    fn set_device(&self, dev: u32) -> Result<(), AclError> {
        let ctx = default_context(dev)?;
        self.set_context(ctx)
    }

    fn current_context(&self) -> Option<u64> {
        get_context().ok()
    }

    fn set_context(&self, ctx: u64) -> Result<(), AclError> {
        call!(
            real::aclrtSetCurrentContext,
            unsafe extern "C" fn(*mut c_void) -> i32,
            ctx as *mut c_void
        )
    }

    fn current_device(&self) -> Option<u32> {
        let mut d: i32 = -1;
        call!(GET_DEVICE, unsafe extern "C" fn(*mut i32) -> i32, &mut d).ok()?;
        u32::try_from(d).ok()
    }

    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        // ACL_HBM_MEM_HUGE: 2 MiB pages
        physical(MEM_LOCATION_DEVICE, dev, 4, bytes)
    }

    fn malloc_physical_host(&self, _dev: u32, bytes: u64) -> Result<u64, AclError> {
        // ACL_MEM_HUGE on NUMA node 0 (the device's node is not known here)
        physical(MEM_LOCATION_HOST_NUMA, 0, 13, bytes)
    }

    fn free_physical(&self, handle: u64) -> Result<(), AclError> {
        call!(
            real::aclrtFreePhysical,
            unsafe extern "C" fn(aclrtDrvMemHandle) -> i32,
            handle as aclrtDrvMemHandle
        )
    }

    fn reserve(&self, bytes: u64) -> Result<u64, AclError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        call!(
            real::aclrtReserveMemAddress,
            unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> i32,
            &mut p,
            bytes as usize,
            0,
            std::ptr::null_mut(),
            1
        )
        .map(|()| p as u64)
    }

    fn release(&self, va: u64) -> Result<(), AclError> {
        call!(
            real::aclrtReleaseMemAddress,
            unsafe extern "C" fn(*mut c_void) -> i32,
            va as *mut c_void
        )
    }

    fn map(&self, va: u64, bytes: u64, handle: u64) -> Result<(), AclError> {
        call!(
            real::aclrtMapMem,
            unsafe extern "C" fn(*mut c_void, usize, usize, aclrtDrvMemHandle, u64) -> i32,
            va as *mut c_void,
            bytes as usize,
            0,
            handle as aclrtDrvMemHandle,
            0
        )
    }

    fn unmap(&self, va: u64) -> Result<(), AclError> {
        call!(
            real::aclrtUnmapMem,
            unsafe extern "C" fn(*mut c_void) -> i32,
            va as *mut c_void
        )
    }

    fn create_stream(&self) -> Result<u64, AclError> {
        let mut s: aclrtStream = std::ptr::null_mut();
        call!(
            CREATE_STREAM,
            unsafe extern "C" fn(*mut aclrtStream) -> i32,
            &mut s
        )
        .map(|()| s as u64)
    }

    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        kind: MemcpyKind,
        stream: u64,
    ) -> Result<(), AclError> {
        call!(
            real::aclrtMemcpyAsync,
            unsafe extern "C" fn(
                *mut c_void,
                usize,
                *const c_void,
                usize,
                c_int,
                aclrtStream,
            ) -> i32,
            dst as *mut c_void,
            bytes as usize,
            src as *const c_void,
            bytes as usize,
            kind.0,
            stream as aclrtStream
        )
    }

    fn memset_async(&self, dst: u64, bytes: u64, value: u8, stream: u64) -> Result<(), AclError> {
        call!(
            real::aclrtMemsetAsync,
            unsafe extern "C" fn(*mut c_void, usize, i32, usize, aclrtStream) -> i32,
            dst as *mut c_void,
            bytes as usize,
            value as i32,
            bytes as usize,
            stream as aclrtStream
        )
    }

    fn sync_stream(&self, stream: u64) -> Result<(), AclError> {
        call!(
            SYNC_STREAM,
            unsafe extern "C" fn(aclrtStream) -> i32,
            stream as aclrtStream
        )
    }

    fn create_event(&self) -> Result<u64, AclError> {
        let mut e: aclrtEvent = std::ptr::null_mut();
        call!(
            CREATE_EVENT,
            unsafe extern "C" fn(*mut aclrtEvent) -> i32,
            &mut e
        )
        .map(|()| e as u64)
    }

    fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError> {
        call!(
            RECORD_EVENT,
            unsafe extern "C" fn(aclrtEvent, aclrtStream) -> i32,
            event as aclrtEvent,
            stream as aclrtStream
        )
    }

    fn event_done(&self, event: u64) -> Result<bool, AclError> {
        let mut st: c_int = 0;
        call!(
            QUERY_EVENT,
            unsafe extern "C" fn(aclrtEvent, *mut c_int) -> i32,
            event as aclrtEvent,
            &mut st
        )
        .map(|()| st == 1) // ACL_EVENT_RECORDED_STATUS_COMPLETE
    }

    fn elapsed_ns(&self, start: u64, end: u64) -> Result<u64, AclError> {
        let mut ms: f32 = 0.0;
        call!(
            ELAPSED,
            unsafe extern "C" fn(*mut f32, aclrtEvent, aclrtEvent) -> i32,
            &mut ms,
            start as aclrtEvent,
            end as aclrtEvent
        )?;
        Ok((ms.max(0.0) as f64 * 1e6) as u64)
    }

    fn sync_event(&self, event: u64) -> Result<(), AclError> {
        call!(
            SYNC_EVENT,
            unsafe extern "C" fn(aclrtEvent) -> i32,
            event as aclrtEvent
        )
    }

    fn stream_wait(&self, stream: u64, event: u64) -> Result<(), AclError> {
        call!(
            WAIT_EVENT,
            unsafe extern "C" fn(aclrtStream, aclrtEvent) -> i32,
            stream as aclrtStream,
            event as aclrtEvent
        )
    }

    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, AclError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        call!(
            real::aclrtMallocHost,
            unsafe extern "C" fn(*mut *mut c_void, usize) -> i32,
            &mut p,
            bytes as usize
        )
        .map(|()| p as *mut u8)
    }

    fn free_host(&self, ptr: *mut u8) -> Result<(), AclError> {
        call!(
            real::aclrtFreeHost,
            unsafe extern "C" fn(*mut c_void) -> i32,
            ptr as *mut c_void
        )
    }

    fn mem_info(&self) -> Result<(u64, u64), AclError> {
        let (mut f, mut t) = (0usize, 0usize);
        call!(
            real::aclrtGetMemInfo,
            unsafe extern "C" fn(c_int, *mut usize, *mut usize) -> i32,
            1,
            &mut f,
            &mut t
        )
        .map(|()| (f as u64, t as u64))
    }
}
