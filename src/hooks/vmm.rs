//! Virtual-memory hooks: reservations, physical handles, mappings (expandable
//! segments), and shareable-handle IPC (whose memory must never move).

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};

use super::Cx;
use crate::ffi::*;
use crate::init::current_device;

pub unsafe fn reserve(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> aclError,
    p: *mut *mut c_void,
    size: usize,
    alignment: usize,
    expect: *mut c_void,
    flags: u64,
) -> aclError {
    let r = f(p, size, alignment, expect, flags);
    if r == ACL_SUCCESS && !p.is_null() {
        let va = *p as u64;
        let dev = current_device();
        cx.note(|e| e.reserve(dev, va, size as u64));
    }
    r
}

pub unsafe fn release(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    p: *mut c_void,
) -> aclError {
    let r = f(p);
    if r == ACL_SUCCESS {
        cx.note(|e| e.release(p as u64));
    }
    r
}

pub unsafe fn malloc_physical(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut aclrtDrvMemHandle,
        usize,
        *const aclrtPhysicalMemProp,
        u64,
    ) -> aclError,
    h: *mut aclrtDrvMemHandle,
    size: usize,
    prop: *const aclrtPhysicalMemProp,
    flags: u64,
) -> aclError {
    let dev = if prop.is_null() {
        current_device()
    } else {
        (*prop).location.id as i32
    };
    super::alloc::learn_capacity(cx, dev);
    // tier mode: u3m's own handle, backed by 2 MiB chunks that move
    // independently; shareable (POSIX) handles stay real
    if !h.is_null() && !prop.is_null() && flags == 0 && size > 0 {
        let shareable = (*prop).handle_type != 0;
        if let Some(res) = cx.note(|e| e.tier_malloc_physical(dev, size as u64, shareable)) {
            return match res {
                Ok(handle) => {
                    *h = handle as aclrtDrvMemHandle;
                    cx.note(|e| e.phys_alloc(dev, handle, size as u64));
                    ACL_SUCCESS
                }
                Err(code) => {
                    cx.note(|e| {
                        e.alloc_failed(
                            dev,
                            size as u64,
                            code,
                            u3m_core::engine::AllocApi::MallocPhysical,
                        )
                    });
                    code
                }
            };
        }
    }
    let r = f(h, size, prop, flags);
    if r == ACL_SUCCESS && !h.is_null() {
        let handle = *h as u64;
        cx.note(|e| e.phys_alloc(dev, handle, size as u64));
    } else if r != ACL_SUCCESS {
        cx.note(|e| {
            e.alloc_failed(
                dev,
                size as u64,
                r,
                u3m_core::engine::AllocApi::MallocPhysical,
            )
        });
    }
    r
}

pub unsafe fn free_physical(
    cx: &Cx,
    f: unsafe extern "C" fn(aclrtDrvMemHandle) -> aclError,
    h: aclrtDrvMemHandle,
) -> aclError {
    let r = match cx.note(|e| e.tier_free_physical(h as u64)) {
        Some(r) => r,
        None => f(h),
    };
    if r == ACL_SUCCESS {
        cx.note(|e| e.phys_free(h as u64));
    }
    r
}

pub unsafe fn map(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, usize, aclrtDrvMemHandle, u64) -> aclError,
    va: *mut c_void,
    size: usize,
    offset: usize,
    h: aclrtDrvMemHandle,
    flags: u64,
) -> aclError {
    let ours = !va.is_null() && flags == 0;
    let r = match if ours {
        cx.note(|e| e.tier_map(va as u64, size as u64, offset as u64, h as u64))
    } else {
        None
    } {
        Some(r) => r,
        None => f(va, size, offset, h, flags),
    };
    if r == ACL_SUCCESS {
        cx.note(|e| e.map(va as u64, size as u64, h as u64));
    }
    r
}

pub unsafe fn unmap(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    va: *mut c_void,
) -> aclError {
    cx.note(|e| e.unmap_begin(va as u64));
    let r = match cx.note(|e| e.tier_unmap(va as u64)) {
        Some(r) => r,
        None => f(va),
    };
    if r == ACL_SUCCESS {
        cx.note(|e| e.unmap(va as u64));
    }
    r
}

pub unsafe fn export_shareable(
    cx: &Cx,
    f: unsafe extern "C" fn(aclrtDrvMemHandle, c_int, u64, *mut u64) -> aclError,
    h: aclrtDrvMemHandle,
    ty: c_int,
    flags: u64,
    out: *mut u64,
) -> aclError {
    // a handle of u3m's: export the real chunk under it (pinned from now on)
    let real = match cx.note(|e| e.tier_export(h as u64)) {
        Some(Ok(real)) => real as aclrtDrvMemHandle,
        Some(Err(code)) => {
            crate::init::warn("aclrtMemExportToShareableHandle: u3m could not give the managed handle real memory for export");
            return code;
        }
        None => h,
    };
    let r = f(real, ty, flags, out);
    if r == ACL_SUCCESS {
        cx.note(|e| e.phys_exported(h as u64));
    }
    r
}

pub unsafe fn import_shareable(
    cx: &Cx,
    f: unsafe extern "C" fn(u64, i32, *mut aclrtDrvMemHandle) -> aclError,
    s: u64,
    dev: i32,
    h: *mut aclrtDrvMemHandle,
) -> aclError {
    let r = f(s, dev, h);
    if r == ACL_SUCCESS && !h.is_null() {
        let handle = *h as u64;
        cx.note(|e| e.phys_imported(dev, handle));
    }
    r
}

pub unsafe fn set_pid_shareable(
    _cx: &Cx,
    f: unsafe extern "C" fn(u64, *mut i32, usize) -> aclError,
    s: u64,
    pid: *mut i32,
    n: usize,
) -> aclError {
    f(s, pid, n)
}

/// A device range exported to other processes: it must never move (tier
/// mode makes it resident and pins it first).
pub unsafe fn ipc_export_key(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, *mut c_char, usize, u64) -> aclError,
    p: *mut c_void,
    size: usize,
    key: *mut c_char,
    len: usize,
    flags: u64,
) -> aclError {
    let dev = current_device();
    if let Some(code) = cx.note(|e| e.tier_pin_range(dev, p as u64, size as u64)) {
        return code;
    }
    let r = f(p, size, key, len, flags);
    if r == ACL_SUCCESS {
        cx.note(|e| {
            e.pin(
                p as u64,
                size as u64,
                u3m_core::engine::PinReason::IpcExported,
            )
        });
    }
    r
}

/// Another process's allocation mapped into this one: not u3m's to move.
pub unsafe fn ipc_import_key(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut *mut c_void, *const c_char, u64) -> aclError,
    p: *mut *mut c_void,
    key: *const c_char,
    flags: u64,
) -> aclError {
    let r = f(p, key, flags);
    if r == ACL_SUCCESS {
        cx.note(|e| e.ipc_imported());
    }
    r
}

pub unsafe fn ipc_close(
    _cx: &Cx,
    f: unsafe extern "C" fn(*const c_char) -> aclError,
    key: *const c_char,
) -> aclError {
    f(key)
}
