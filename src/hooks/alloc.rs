//! Allocation hooks: device memory (aclrtMalloc family: tier mode serves
//! what it manages), pinned host memory, host registration, memory info,
//! device reset, and the per-thread current device (kept here: it is the
//! interposer's state, not the engine's).
//!
//! Safety: every `pub unsafe fn` here is a hook handler,
//! `unsafe fn(&Cx, Real<args::NAME>, args::NAME)`; its contract is the C
//! prototype's (table.rs): the arguments are the program's, valid as that
//! function documents them, and `real` is the next definition of the name.
//! Pointers are read only where the runtime itself would read them.

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use crate::init::{current_device, set_current_device};
use std::sync::atomic::{
    AtomicU32,
    Ordering::{AcqRel, Acquire, Release},
};
use u3m_core::engine::{AllocApi, Call, Out};
use u3m_core::residency::MAX_DEVICES;

/// The program's device references: its successful aclrtSetDevice calls not
/// yet matched by an aclrtResetDevice (CANN counts them and releases a
/// device's resources when the count reaches zero).
static PROGRAM_REFS: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

fn refs_of(dev: i32) -> Option<&'static AtomicU32> {
    usize::try_from(dev).ok().and_then(|d| PROGRAM_REFS.get(d))
}

pub unsafe fn acl_init(_cx: &Cx, real: Real<aclInit>, a: aclInit) -> aclError {
    real.call(a)
}

pub unsafe fn acl_finalize(cx: &Cx, real: Real<aclFinalize>, a: aclFinalize) -> aclError {
    cx.run(&Call::Finalize, || real.call(a))
}

pub unsafe fn set_device(_cx: &Cx, real: Real<aclrtSetDevice>, a: aclrtSetDevice) -> aclError {
    let r = real.call(a);
    if r == ACL_SUCCESS {
        set_current_device(a.device_id);
        crate::runtime::learn_context(a.device_id);
        if let Some(n) = refs_of(a.device_id) {
            n.fetch_add(1, AcqRel);
        }
    }
    r
}

pub unsafe fn set_context(
    _cx: &Cx,
    real: Real<aclrtSetCurrentContext>,
    a: aclrtSetCurrentContext,
) -> aclError {
    let r = real.call(a);
    if r == ACL_SUCCESS {
        crate::init::refresh_current_device();
    }
    r
}

/// The context made becomes the thread's: its device is the context's
/// (u3m's calls on this thread are on that device from now on).
pub unsafe fn create_context(
    _cx: &Cx,
    real: Real<aclrtCreateContext>,
    a: aclrtCreateContext,
) -> aclError {
    let r = real.call(a);
    if r == ACL_SUCCESS {
        crate::init::refresh_current_device();
    }
    r
}

/// A thread whose current context this was has no device any more.
pub unsafe fn destroy_context(
    _cx: &Cx,
    real: Real<aclrtDestroyContext>,
    a: aclrtDestroyContext,
) -> aclError {
    let r = real.call(a);
    if r == ACL_SUCCESS {
        set_current_device(-1);
        crate::init::refresh_current_device();
    }
    r
}

fn malloc_call(
    api: AllocApi,
    out: *mut *mut std::ffi::c_void,
    size: usize,
    policy: i32,
) -> Call<'static> {
    Call::Malloc {
        api,
        size: size as u64,
        policy,
        // SAFETY: `out` is the program's `void **devPtr`, null or writable
        // for one pointer while the call runs.
        out: unsafe { Out::new(out) },
    }
}

/// A device allocation's result: after the first that succeeds, torch_npu's
/// freed blocks may become discard hints (torch_hints.rs).
pub(super) fn allocated(r: aclError) -> aclError {
    if r == ACL_SUCCESS {
        crate::torch_hints::after_alloc();
    }
    r
}

pub unsafe fn malloc(cx: &Cx, real: Real<aclrtMalloc>, a: aclrtMalloc) -> aclError {
    let call = malloc_call(AllocApi::Malloc, a.dev_ptr, a.size, a.policy);
    allocated(cx.run(&call, || real.call(a)))
}

pub unsafe fn malloc_align32(
    cx: &Cx,
    real: Real<aclrtMallocAlign32>,
    a: aclrtMallocAlign32,
) -> aclError {
    let call = malloc_call(AllocApi::MallocAlign32, a.dev_ptr, a.size, a.policy);
    allocated(cx.run(&call, || real.call(a)))
}

pub unsafe fn malloc_cached(
    cx: &Cx,
    real: Real<aclrtMallocCached>,
    a: aclrtMallocCached,
) -> aclError {
    let call = malloc_call(AllocApi::MallocCached, a.dev_ptr, a.size, a.policy);
    allocated(cx.run(&call, || real.call(a)))
}

pub unsafe fn malloc_with_cfg(
    cx: &Cx,
    real: Real<aclrtMallocWithCfg>,
    a: aclrtMallocWithCfg,
) -> aclError {
    let call = malloc_call(AllocApi::MallocWithCfg, a.dev_ptr, a.size, a.policy);
    allocated(cx.run(&call, || real.call(a)))
}

pub unsafe fn free(cx: &Cx, real: Real<aclrtFree>, a: aclrtFree) -> aclError {
    let call = Call::Free {
        ptr: a.dev_ptr as u64,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn malloc_host(cx: &Cx, real: Real<aclrtMallocHost>, a: aclrtMallocHost) -> aclError {
    let call = Call::MallocHost {
        size: a.size as u64,
        out: Out::new(a.host_ptr),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn malloc_host_with_cfg(
    cx: &Cx,
    real: Real<aclrtMallocHostWithCfg>,
    a: aclrtMallocHostWithCfg,
) -> aclError {
    let call = Call::MallocHost {
        size: a.size,
        out: Out::new(a.ptr),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn free_host(cx: &Cx, real: Real<aclrtFreeHost>, a: aclrtFreeHost) -> aclError {
    let call = Call::FreeHost {
        ptr: a.host_ptr as u64,
    };
    cx.run(&call, || real.call(a))
}

/// A registered host range gets a device-visible alias: device memory u3m
/// must never move (it is the host's pages).
pub unsafe fn host_register(
    cx: &Cx,
    real: Real<aclrtHostRegister>,
    a: aclrtHostRegister,
) -> aclError {
    let call = Call::HostRegister {
        host: a.ptr as u64,
        size: a.size,
        alias: Some(Out::new(a.dev_ptr)),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn host_register_v2(
    cx: &Cx,
    real: Real<aclrtHostRegisterV2>,
    a: aclrtHostRegisterV2,
) -> aclError {
    let call = Call::HostRegister {
        host: a.ptr as u64,
        size: a.size,
        alias: None,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn host_unregister(
    cx: &Cx,
    real: Real<aclrtHostUnregister>,
    a: aclrtHostUnregister,
) -> aclError {
    let call = Call::HostUnregister { host: a.ptr as u64 };
    cx.run(&call, || real.call(a))
}

pub unsafe fn get_mem_info(cx: &Cx, real: Real<aclrtGetMemInfo>, a: aclrtGetMemInfo) -> aclError {
    let call = Call::MemInfo {
        attr: a.attr,
        free: Out::new(a.free),
        total: Out::new(a.total),
    };
    cx.run(&call, || real.call(a))
}

/// aclrtResetDevice drops one of the program's references to the device;
/// the runtime releases everything on it (with no aclrtFree) only when the
/// last goes, and u3m then forgets its managed chunks there too. While
/// another reference holds the device (another thread's aclrtSetDevice),
/// its memory stays, and so does u3m's (forgetting it would lose the
/// chunks u3m keeps on the host). A reset u3m saw no aclrtSetDevice for
/// (a count of 0: references it cannot see) is taken as the last.
pub unsafe fn reset_device(cx: &Cx, real: Real<aclrtResetDevice>, a: aclrtResetDevice) -> aclError {
    let refs = refs_of(a.device_id);
    let before = refs.map_or(0, |n| {
        n.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(1)))
            .unwrap_or(0)
    });
    let r = if before > 1 {
        real.call(a)
    } else {
        let call = Call::ResetDevice {
            device: a.device_id,
        };
        cx.run(&call, || {
            let r = real.call(a);
            // u3m's own reference (taken for a device the program had not
            // set) would keep the device, and the memory u3m now forgets,
            // alive: it goes with the program's last
            if r == ACL_SUCCESS && crate::runtime::drop_own_ref(a.device_id) {
                let _ = real.call(a);
            }
            r
        })
    };
    if r != ACL_SUCCESS {
        // refused: the reference is still held
        if let (Some(n), true) = (refs, before > 0) {
            n.fetch_add(1, AcqRel);
        }
        return r;
    }
    if before <= 1 {
        crate::runtime::forget_context(a.device_id);
    }
    if current_device() == a.device_id {
        set_current_device(-1);
    }
    r
}

/// aclrtResetDeviceForce drops every reference to the device at once (the
/// program's, however many, and the one u3m may hold for its default
/// context): the runtime releases everything on it, so u3m forgets its
/// managed chunks there and the context it kept.
pub unsafe fn reset_device_force(
    cx: &Cx,
    real: Real<aclrtResetDeviceForce>,
    a: aclrtResetDeviceForce,
) -> aclError {
    let call = Call::ResetDevice {
        device: a.device_id,
    };
    let r = cx.run(&call, || real.call(a));
    if r != ACL_SUCCESS {
        return r;
    }
    if let Some(n) = refs_of(a.device_id) {
        n.store(0, Release);
    }
    // u3m's reference went too: its kept context with it
    crate::runtime::drop_own_ref(a.device_id);
    crate::runtime::forget_context(a.device_id);
    if current_device() == a.device_id {
        set_current_device(-1);
    }
    r
}
