//! Copy and memset hooks: each device side of a copy and every memset
//! destination is an access (copy sources are reads, destinations writes).

use std::ffi::c_void;
use std::os::raw::c_int;

use super::Cx;
use crate::ffi::*;
use crate::init::current_device;

#[inline]
unsafe fn note_copy(cx: &Cx, stream: aclrtStream, kind: c_int, dst: u64, dspan: u64, src: u64, sspan: u64, bytes: u64) {
    let dev = current_device();
    cx.note(|e| e.copy(dev, stream as u64, kind, dst, dspan, src, sspan, bytes));
}

pub unsafe fn memcpy(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int) -> aclError, dst: *mut c_void, dmax: usize, src: *const c_void, n: usize, kind: c_int) -> aclError {
    let r = f(dst, dmax, src, n, kind);
    if r == ACL_SUCCESS && n > 0 {
        note_copy(cx, std::ptr::null_mut(), kind, dst as u64, n as u64, src as u64, n as u64, n as u64);
    }
    r
}

pub unsafe fn memcpy_async(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int, aclrtStream) -> aclError, dst: *mut c_void, dmax: usize, src: *const c_void, n: usize, kind: c_int, s: aclrtStream) -> aclError {
    let r = f(dst, dmax, src, n, kind, s);
    if r == ACL_SUCCESS && n > 0 {
        note_copy(cx, s, kind, dst as u64, n as u64, src as u64, n as u64, n as u64);
    }
    r
}

pub unsafe fn memcpy_async_cond(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int, aclrtStream) -> aclError, dst: *mut c_void, dmax: usize, src: *const c_void, n: usize, kind: c_int, s: aclrtStream) -> aclError {
    memcpy_async(cx, f, dst, dmax, src, n, kind, s)
}

fn span(pitch: usize, width: usize, height: usize) -> u64 {
    if height == 0 { 0 } else { (pitch as u64).saturating_mul(height as u64 - 1).saturating_add(width as u64) }
}

pub unsafe fn memcpy_2d(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, usize, usize, c_int) -> aclError, dst: *mut c_void, dp: usize, src: *const c_void, sp: usize, w: usize, h: usize, kind: c_int) -> aclError {
    let r = f(dst, dp, src, sp, w, h, kind);
    if r == ACL_SUCCESS {
        note_copy(cx, std::ptr::null_mut(), kind, dst as u64, span(dp, w, h), src as u64, span(sp, w, h), (w as u64) * (h as u64));
    }
    r
}

pub unsafe fn memcpy_2d_async(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, usize, usize, c_int, aclrtStream) -> aclError, dst: *mut c_void, dp: usize, src: *const c_void, sp: usize, w: usize, h: usize, kind: c_int, s: aclrtStream) -> aclError {
    let r = f(dst, dp, src, sp, w, h, kind, s);
    if r == ACL_SUCCESS {
        note_copy(cx, s, kind, dst as u64, span(dp, w, h), src as u64, span(sp, w, h), (w as u64) * (h as u64));
    }
    r
}

/// The copy kind of batch entry `i` from the location attributes.
unsafe fn batch_kind(attrs: *const aclrtMemcpyBatchAttr, idx: *const usize, nattrs: usize, i: usize) -> c_int {
    if attrs.is_null() || idx.is_null() || nattrs == 0 {
        return MEMCPY_DEFAULT;
    }
    let mut a = 0;
    while a + 1 < nattrs && *idx.add(a + 1) <= i {
        a += 1;
    }
    let at = &*attrs.add(a);
    match (at.dst_loc.type_ == MEM_LOCATION_DEVICE, at.src_loc.type_ == MEM_LOCATION_DEVICE) {
        (true, true) => MEMCPY_D2D,
        (true, false) => MEMCPY_H2D,
        (false, true) => MEMCPY_D2H,
        (false, false) => MEMCPY_H2H,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn note_batch(cx: &Cx, s: aclrtStream, dsts: *mut *mut c_void, srcs: *mut *mut c_void, sizes: *mut usize, n: usize, attrs: *mut aclrtMemcpyBatchAttr, idx: *mut usize, nattrs: usize) {
    if dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return;
    }
    for i in 0..n {
        let sz = *sizes.add(i) as u64;
        let k = batch_kind(attrs, idx, nattrs, i);
        note_copy(cx, s, k, *dsts.add(i) as u64, sz, *srcs.add(i) as u64, sz, sz);
    }
}

pub unsafe fn memcpy_batch(cx: &Cx, f: unsafe extern "C" fn(*mut *mut c_void, *mut usize, *mut *mut c_void, *mut usize, usize, *mut aclrtMemcpyBatchAttr, *mut usize, usize, *mut usize) -> aclError, dsts: *mut *mut c_void, dmaxs: *mut usize, srcs: *mut *mut c_void, sizes: *mut usize, n: usize, attrs: *mut aclrtMemcpyBatchAttr, idx: *mut usize, nattrs: usize, fail: *mut usize) -> aclError {
    let r = f(dsts, dmaxs, srcs, sizes, n, attrs, idx, nattrs, fail);
    if r == ACL_SUCCESS {
        note_batch(cx, std::ptr::null_mut(), dsts, srcs, sizes, n, attrs, idx, nattrs);
    }
    r
}

pub unsafe fn memcpy_batch_async(cx: &Cx, f: unsafe extern "C" fn(*mut *mut c_void, *mut usize, *mut *mut c_void, *mut usize, usize, *mut aclrtMemcpyBatchAttr, *mut usize, usize, *mut usize, aclrtStream) -> aclError, dsts: *mut *mut c_void, dmaxs: *mut usize, srcs: *mut *mut c_void, sizes: *mut usize, n: usize, attrs: *mut aclrtMemcpyBatchAttr, idx: *mut usize, nattrs: usize, fail: *mut usize, s: aclrtStream) -> aclError {
    let r = f(dsts, dmaxs, srcs, sizes, n, attrs, idx, nattrs, fail, s);
    if r == ACL_SUCCESS {
        note_batch(cx, s, dsts, srcs, sizes, n, attrs, idx, nattrs);
    }
    r
}

pub unsafe fn memset(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, i32, usize) -> aclError, p: *mut c_void, max: usize, v: i32, n: usize) -> aclError {
    let r = f(p, max, v, n);
    if r == ACL_SUCCESS && n > 0 {
        let dev = current_device();
        cx.note(|e| e.memset(dev, 0, p as u64, n as u64));
    }
    r
}

pub unsafe fn memset_async(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, i32, usize, aclrtStream) -> aclError, p: *mut c_void, max: usize, v: i32, n: usize, s: aclrtStream) -> aclError {
    let r = f(p, max, v, n, s);
    if r == ACL_SUCCESS && n > 0 {
        let dev = current_device();
        cx.note(|e| e.memset(dev, s as u64, p as u64, n as u64));
    }
    r
}

pub unsafe fn memset_d32(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, u32, usize) -> aclError, p: *mut c_void, size: usize, v: u32, n: usize) -> aclError {
    let r = f(p, size, v, n);
    if r == ACL_SUCCESS && n > 0 {
        let dev = current_device();
        cx.note(|e| e.memset(dev, 0, p as u64, 4 * n as u64));
    }
    r
}

pub unsafe fn memset_d32_async(cx: &Cx, f: unsafe extern "C" fn(*mut c_void, usize, u32, usize, aclrtStream) -> aclError, p: *mut c_void, size: usize, v: u32, n: usize, s: aclrtStream) -> aclError {
    let r = f(p, size, v, n, s);
    if r == ACL_SUCCESS && n > 0 {
        let dev = current_device();
        cx.note(|e| e.memset(dev, s as u64, p as u64, 4 * n as u64));
    }
    r
}
