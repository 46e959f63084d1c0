//! Allocation hooks: device memory (aclrtMalloc family), pinned host memory,
//! host registration, memory info, and the per-thread current device.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};

use super::Cx;
use crate::ffi::*;
use crate::init::{current_device, set_current_device};
use u3m_core::engine::AllocApi;

pub unsafe fn acl_init(
    cx: &Cx,
    f: unsafe extern "C" fn(*const c_char) -> aclError,
    p: *const c_char,
) -> aclError {
    let r = f(p);
    cx.note(|e| e.runtime_init(r));
    r
}

pub unsafe fn acl_finalize(cx: &Cx, f: unsafe extern "C" fn() -> aclError) -> aclError {
    // flush before the runtime goes away: the program may exit right after
    cx.note(|e| e.runtime_finalize());
    f()
}

pub unsafe fn set_device(_cx: &Cx, f: unsafe extern "C" fn(i32) -> aclError, dev: i32) -> aclError {
    let r = f(dev);
    if r == ACL_SUCCESS {
        set_current_device(dev);
    }
    r
}

pub unsafe fn set_context(
    _cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    ctx: *mut c_void,
) -> aclError {
    let r = f(ctx);
    if r == ACL_SUCCESS {
        crate::init::refresh_current_device();
    }
    r
}

/// The device's physical capacity, asked once per device from the runtime
/// (a pure query: it changes nothing the program could observe).
pub unsafe fn learn_capacity(cx: &Cx, dev: i32) {
    if dev < 0 || cx.eng.capacity(dev) != 0 {
        return;
    }
    static GET: crate::real::RealFn = crate::real::RealFn::new(b"aclrtGetMemInfo\0");
    if let Some(p) = GET.get() {
        let f: unsafe extern "C" fn(c_int, *mut usize, *mut usize) -> aclError =
            std::mem::transmute(p);
        let (mut fr, mut tot) = (0usize, 0usize);
        if f(1, &mut fr, &mut tot) == ACL_SUCCESS {
            cx.note(|e| e.mem_info(dev, fr as u64, tot as u64));
        }
    }
}

/// Tier mode: an allocation u3m passes to the runtime that fails for lack of
/// HBM gets room made (managed chunks evicted) and is tried again.
unsafe fn retry_with_room(cx: &Cx, size: usize, call: impl Fn() -> aclError) -> aclError {
    let mut r = call();
    let dev = current_device();
    let mut tries = 0;
    while r == ACL_ERROR_RT_MEMORY_ALLOCATION
        && tries < 4
        && cx.note(|e| e.tier_make_room(dev, size as u64 + (2 << 20)))
    {
        r = call();
        tries += 1;
    }
    r
}

/// Tier mode: an allocation u3m manages itself (VA reserved by u3m, backed
/// by chunks on demand). None: the runtime allocates it.
unsafe fn managed(
    cx: &Cx,
    dev_ptr: *mut *mut c_void,
    size: usize,
    api: AllocApi,
) -> Option<aclError> {
    if dev_ptr.is_null() || size == 0 {
        return None; // the runtime reports the bad argument
    }
    let dev = current_device();
    let res = cx.note(|e| e.tier_malloc(dev, size as u64))?;
    Some(match res {
        Ok(va) => {
            *dev_ptr = va as *mut c_void;
            cx.note(|e| e.alloc(dev, va, size as u64, api));
            ACL_SUCCESS
        }
        Err(code) => {
            cx.note(|e| e.alloc_failed(dev, size as u64, code, api));
            code
        }
    })
}

unsafe fn malloc_common(
    cx: &Cx,
    r: aclError,
    dev_ptr: *mut *mut c_void,
    size: usize,
    api: AllocApi,
) -> aclError {
    let dev = current_device();
    learn_capacity(cx, dev);
    if r == ACL_SUCCESS && !dev_ptr.is_null() {
        let p = *dev_ptr as u64;
        cx.note(|e| e.alloc(dev, p, size as u64, api));
    } else if r != ACL_SUCCESS {
        cx.note(|e| e.alloc_failed(dev, size as u64, r, api));
    }
    r
}

pub unsafe fn malloc(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> aclError,
    p: *mut *mut c_void,
    size: usize,
    policy: c_int,
) -> aclError {
    let f = |p, size, policy| retry_with_room(cx, size, || f(p, size, policy));
    if let Some(r) = managed(cx, p, size, AllocApi::Malloc) {
        return r;
    }
    let r = f(p, size, policy);
    malloc_common(cx, r, p, size, AllocApi::Malloc)
}

pub unsafe fn malloc_align32(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> aclError,
    p: *mut *mut c_void,
    size: usize,
    policy: c_int,
) -> aclError {
    let f = |p, size, policy| retry_with_room(cx, size, || f(p, size, policy));
    if let Some(r) = managed(cx, p, size, AllocApi::MallocAlign32) {
        return r;
    }
    let r = f(p, size, policy);
    malloc_common(cx, r, p, size, AllocApi::MallocAlign32)
}

pub unsafe fn malloc_cached(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> aclError,
    p: *mut *mut c_void,
    size: usize,
    policy: c_int,
) -> aclError {
    let f = |p, size, policy| retry_with_room(cx, size, || f(p, size, policy));
    if let Some(r) = managed(cx, p, size, AllocApi::MallocCached) {
        return r;
    }
    let r = f(p, size, policy);
    malloc_common(cx, r, p, size, AllocApi::MallocCached)
}

pub unsafe fn malloc_with_cfg(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, usize, c_int, *mut c_void) -> aclError,
    p: *mut *mut c_void,
    size: usize,
    policy: c_int,
    cfg: *mut c_void,
) -> aclError {
    if let Some(r) = managed(cx, p, size, AllocApi::MallocWithCfg) {
        return r;
    }
    let r = f(p, size, policy, cfg);
    malloc_common(cx, r, p, size, AllocApi::MallocWithCfg)
}

pub unsafe fn free(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    p: *mut c_void,
) -> aclError {
    cx.note(|e| e.free(p as u64));
    if let Some(r) = cx.note(|e| e.tier_free(p as u64)) {
        return r;
    }
    f(p)
}

pub unsafe fn malloc_host(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, usize) -> aclError,
    p: *mut *mut c_void,
    size: usize,
) -> aclError {
    let r = f(p, size);
    if r == ACL_SUCCESS && !p.is_null() {
        let h = *p as u64;
        cx.note(|e| e.host_alloc(h, size as u64));
    }
    r
}

pub unsafe fn malloc_host_with_cfg(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, u64, *mut c_void) -> aclError,
    p: *mut *mut c_void,
    size: u64,
    cfg: *mut c_void,
) -> aclError {
    let r = f(p, size, cfg);
    if r == ACL_SUCCESS && !p.is_null() {
        let h = *p as u64;
        cx.note(|e| e.host_alloc(h, size));
    }
    r
}

pub unsafe fn free_host(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    p: *mut c_void,
) -> aclError {
    let r = f(p);
    if r == ACL_SUCCESS {
        cx.note(|e| e.host_free(p as u64));
    }
    r
}

/// A registered host range gets a device-visible alias: device memory u3m
/// must never move (it is the host's pages).
pub unsafe fn host_register(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, c_int, *mut *mut c_void) -> aclError,
    p: *mut c_void,
    size: u64,
    ty: c_int,
    dev_ptr: *mut *mut c_void,
) -> aclError {
    let r = f(p, size, ty, dev_ptr);
    if r == ACL_SUCCESS && !dev_ptr.is_null() {
        let alias = *dev_ptr as u64;
        let dev = current_device();
        cx.note(|e| e.host_register(dev, p as u64, size, alias));
    }
    r
}

pub unsafe fn host_register_v2(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, u32) -> aclError,
    p: *mut c_void,
    size: u64,
    flag: u32,
) -> aclError {
    let r = f(p, size, flag);
    if r == ACL_SUCCESS {
        let dev = current_device();
        // V2 maps the host pages at the same address on the device
        cx.note(|e| e.host_register(dev, p as u64, size, p as u64));
    }
    r
}

pub unsafe fn host_unregister(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    p: *mut c_void,
) -> aclError {
    let r = f(p);
    if r == ACL_SUCCESS {
        cx.note(|e| e.host_unregister(p as u64));
    }
    r
}

pub unsafe fn get_mem_info(
    cx: &Cx,
    f: unsafe extern "C" fn(c_int, *mut usize, *mut usize) -> aclError,
    attr: c_int,
    free: *mut usize,
    total: *mut usize,
) -> aclError {
    let r = f(attr, free, total);
    // HBM attributes: ACL_HBM_MEM and its HUGE/NORMAL/P2P/HUGE1G variants
    if r == ACL_SUCCESS
        && matches!(attr, 1 | 4 | 5 | 8 | 9 | 10 | 11)
        && !free.is_null()
        && !total.is_null()
    {
        let (fr, tot) = (*free as u64, *total as u64);
        let dev = current_device();
        cx.note(|e| e.mem_info(dev, fr, tot));
        // tier mode: the virtual capacity, true for this process
        if let Some((vf, vt)) = cx.note(|e| e.tier_mem_info(dev, fr, tot)) {
            *free = vf as usize;
            *total = vt as usize;
        }
    }
    r
}

/// The runtime releases everything the process holds on the device, with no
/// aclrtFree: u3m forgets it too (its managed chunks there are gone).
pub unsafe fn reset_device(
    cx: &Cx,
    f: unsafe extern "C" fn(i32) -> aclError,
    dev: i32,
) -> aclError {
    let r = f(dev);
    if r == ACL_SUCCESS {
        cx.note(|e| e.device_reset(dev));
        if current_device() == dev {
            set_current_device(-1);
        }
    }
    r
}
