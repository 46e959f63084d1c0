//! Copy and memset hooks: each device side of a copy and every memset
//! destination is an access (copy sources are reads, destinations writes).
//! In tier mode the device sides are made resident first; a destination that
//! covers whole chunks needs no copy-in (its old contents are overwritten).

use std::ffi::c_void;
use std::os::raw::c_int;

use super::{around, Cx};
use crate::ffi::*;
use crate::init::current_device;
use u3m_core::acl::MemcpyKind;
use u3m_core::engine::Range;
use u3m_core::opclass::OpClass;

/// ACL_ERROR_RT_DEVICE_TASK_ABORT: the device has gone away.
const DEVICE_TASK_ABORT: aclError = 107022;

/// The device ranges of a copy, by core's one rule.
fn copy_ranges(kind: c_int, dst: u64, dspan: u64, src: u64, sspan: u64) -> ([Range; 2], usize) {
    u3m_core::engine::copy_ranges(MemcpyKind(kind), dst, dspan, src, sspan)
}

#[inline]
unsafe fn note_copy(
    cx: &Cx,
    stream: aclrtStream,
    kind: c_int,
    dst: u64,
    dspan: u64,
    src: u64,
    sspan: u64,
    bytes: u64,
) {
    let dev = current_device();
    cx.note(|e| e.copy(dev, stream as u64, kind, dst, dspan, src, sspan, bytes));
}

/// One copy: tier protocol around the real call, then the observation.
#[allow(clippy::too_many_arguments)]
unsafe fn one(
    cx: &Cx,
    s: aclrtStream,
    sync: bool,
    kind: c_int,
    dst: u64,
    dspan: u64,
    src: u64,
    sspan: u64,
    bytes: u64,
    call: impl FnOnce() -> aclError,
) -> aclError {
    let (rs, n) = copy_ranges(kind, dst, dspan, src, sspan);
    let dev = current_device();
    // card failure: a synchronous read of managed memory the lost device
    // held is served from u3m's DRAM/NVMe copies
    let d2h = sync && MemcpyKind(kind).reads_device() && bytes > 0;
    if d2h {
        if let Some(rc) = cx.note(|e| e.tier_read_lost(src, dst as *mut u8, bytes)) {
            return rc;
        }
    }
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        s as u64,
        &rs[..n],
        true,
        sync,
        call,
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == DEVICE_TASK_ABORT {
        cx.note(|e| e.device_lost(dev));
        if d2h {
            if let Some(rc) = cx.note(|e| e.tier_read_lost(src, dst as *mut u8, bytes)) {
                return rc;
            }
        }
    }
    if r == ACL_SUCCESS && bytes > 0 {
        note_copy(cx, s, kind, dst, dspan, src, sspan, bytes);
    }
    r
}

pub unsafe fn memcpy(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int) -> aclError,
    dst: *mut c_void,
    dmax: usize,
    src: *const c_void,
    n: usize,
    kind: c_int,
) -> aclError {
    one(
        cx,
        std::ptr::null_mut(),
        true,
        kind,
        dst as u64,
        n as u64,
        src as u64,
        n as u64,
        n as u64,
        || f(dst, dmax, src, n, kind),
    )
}

pub unsafe fn memcpy_async(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *const c_void,
        usize,
        c_int,
        aclrtStream,
    ) -> aclError,
    dst: *mut c_void,
    dmax: usize,
    src: *const c_void,
    n: usize,
    kind: c_int,
    s: aclrtStream,
) -> aclError {
    one(
        cx,
        s,
        false,
        kind,
        dst as u64,
        n as u64,
        src as u64,
        n as u64,
        n as u64,
        || f(dst, dmax, src, n, kind, s),
    )
}

pub unsafe fn memcpy_async_cond(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *const c_void,
        usize,
        c_int,
        aclrtStream,
    ) -> aclError,
    dst: *mut c_void,
    dmax: usize,
    src: *const c_void,
    n: usize,
    kind: c_int,
    s: aclrtStream,
) -> aclError {
    memcpy_async(cx, f, dst, dmax, src, n, kind, s)
}

fn span(pitch: usize, width: usize, height: usize) -> u64 {
    if height == 0 {
        0
    } else {
        (pitch as u64)
            .saturating_mul(height as u64 - 1)
            .saturating_add(width as u64)
    }
}

pub unsafe fn memcpy_2d(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *const c_void,
        usize,
        usize,
        usize,
        c_int,
    ) -> aclError,
    dst: *mut c_void,
    dp: usize,
    src: *const c_void,
    sp: usize,
    w: usize,
    h: usize,
    kind: c_int,
) -> aclError {
    // a pitched destination is not overwritten whole unless the pitch is the width
    let (ds, ss) = (span(dp, w, h), span(sp, w, h));
    let (rs, n) = copy_ranges(kind, dst as u64, ds, src as u64, ss);
    let dev = current_device();
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        0,
        &rs[..n],
        dp == w,
        true,
        || f(dst, dp, src, sp, w, h, kind),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        note_copy(
            cx,
            std::ptr::null_mut(),
            kind,
            dst as u64,
            ds,
            src as u64,
            ss,
            (w as u64) * (h as u64),
        );
    }
    r
}

pub unsafe fn memcpy_2d_async(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *const c_void,
        usize,
        usize,
        usize,
        c_int,
        aclrtStream,
    ) -> aclError,
    dst: *mut c_void,
    dp: usize,
    src: *const c_void,
    sp: usize,
    w: usize,
    h: usize,
    kind: c_int,
    s: aclrtStream,
) -> aclError {
    let (ds, ss) = (span(dp, w, h), span(sp, w, h));
    let (rs, n) = copy_ranges(kind, dst as u64, ds, src as u64, ss);
    let dev = current_device();
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        s as u64,
        &rs[..n],
        dp == w,
        false,
        || f(dst, dp, src, sp, w, h, kind, s),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        note_copy(
            cx,
            s,
            kind,
            dst as u64,
            ds,
            src as u64,
            ss,
            (w as u64) * (h as u64),
        );
    }
    r
}

/// The copy kind of batch entry `i` from the location attributes.
unsafe fn batch_kind(
    attrs: *const aclrtMemcpyBatchAttr,
    idx: *const usize,
    nattrs: usize,
    i: usize,
) -> c_int {
    if attrs.is_null() || idx.is_null() || nattrs == 0 {
        return MEMCPY_DEFAULT;
    }
    let mut a = 0;
    while a + 1 < nattrs && *idx.add(a + 1) <= i {
        a += 1;
    }
    let at = &*attrs.add(a);
    match (
        at.dst_loc.type_ == MEM_LOCATION_DEVICE,
        at.src_loc.type_ == MEM_LOCATION_DEVICE,
    ) {
        (true, true) => MEMCPY_D2D,
        (true, false) => MEMCPY_H2D,
        (false, true) => MEMCPY_D2H,
        (false, false) => MEMCPY_H2H,
    }
}

/// Every device range of a batch (at most MAX_OP_RANGES are tiered; a
/// longer batch is split by the caller's own batching in practice).
#[allow(clippy::too_many_arguments)]
unsafe fn batch_ranges(
    dsts: *mut *mut c_void,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    n: usize,
    attrs: *mut aclrtMemcpyBatchAttr,
    idx: *mut usize,
    nattrs: usize,
) -> Vec<Range> {
    let mut v = Vec::new();
    if dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return v;
    }
    for i in 0..n.min(1 << 16) {
        let sz = *sizes.add(i) as u64;
        let (rs, k) = copy_ranges(
            batch_kind(attrs, idx, nattrs, i),
            *dsts.add(i) as u64,
            sz,
            *srcs.add(i) as u64,
            sz,
        );
        v.extend_from_slice(&rs[..k]);
    }
    v
}

#[allow(clippy::too_many_arguments)]
unsafe fn note_batch(
    cx: &Cx,
    s: aclrtStream,
    dsts: *mut *mut c_void,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    n: usize,
    attrs: *mut aclrtMemcpyBatchAttr,
    idx: *mut usize,
    nattrs: usize,
) {
    if dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return;
    }
    for i in 0..n {
        let sz = *sizes.add(i) as u64;
        let k = batch_kind(attrs, idx, nattrs, i);
        note_copy(
            cx,
            s,
            k,
            *dsts.add(i) as u64,
            sz,
            *srcs.add(i) as u64,
            sz,
            sz,
        );
    }
}

pub unsafe fn memcpy_batch(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut usize,
        *mut *mut c_void,
        *mut usize,
        usize,
        *mut aclrtMemcpyBatchAttr,
        *mut usize,
        usize,
        *mut usize,
    ) -> aclError,
    dsts: *mut *mut c_void,
    dmaxs: *mut usize,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    n: usize,
    attrs: *mut aclrtMemcpyBatchAttr,
    idx: *mut usize,
    nattrs: usize,
    fail: *mut usize,
) -> aclError {
    let rs = batch_ranges(dsts, srcs, sizes, n, attrs, idx, nattrs);
    let dev = current_device();
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        0,
        &rs,
        true,
        true,
        || f(dsts, dmaxs, srcs, sizes, n, attrs, idx, nattrs, fail),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        note_batch(
            cx,
            std::ptr::null_mut(),
            dsts,
            srcs,
            sizes,
            n,
            attrs,
            idx,
            nattrs,
        );
    }
    r
}

pub unsafe fn memcpy_batch_async(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut usize,
        *mut *mut c_void,
        *mut usize,
        usize,
        *mut aclrtMemcpyBatchAttr,
        *mut usize,
        usize,
        *mut usize,
        aclrtStream,
    ) -> aclError,
    dsts: *mut *mut c_void,
    dmaxs: *mut usize,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    n: usize,
    attrs: *mut aclrtMemcpyBatchAttr,
    idx: *mut usize,
    nattrs: usize,
    fail: *mut usize,
    s: aclrtStream,
) -> aclError {
    let rs = batch_ranges(dsts, srcs, sizes, n, attrs, idx, nattrs);
    let dev = current_device();
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        s as u64,
        &rs,
        true,
        false,
        || f(dsts, dmaxs, srcs, sizes, n, attrs, idx, nattrs, fail, s),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        note_batch(cx, s, dsts, srcs, sizes, n, attrs, idx, nattrs);
    }
    r
}

unsafe fn set(
    cx: &Cx,
    s: aclrtStream,
    sync: bool,
    p: *mut c_void,
    bytes: u64,
    call: impl FnOnce() -> aclError,
) -> aclError {
    let dev = current_device();
    let rs = [Range {
        addr: p as u64,
        len: bytes,
        write: true,
    }];
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        s as u64,
        &rs,
        true,
        sync,
        call,
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS && bytes > 0 {
        cx.note(|e| e.memset(dev, s as u64, p as u64, bytes));
    }
    r
}

pub unsafe fn memset(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, i32, usize) -> aclError,
    p: *mut c_void,
    max: usize,
    v: i32,
    n: usize,
) -> aclError {
    set(cx, std::ptr::null_mut(), true, p, n as u64, || {
        f(p, max, v, n)
    })
}

pub unsafe fn memset_async(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, i32, usize, aclrtStream) -> aclError,
    p: *mut c_void,
    max: usize,
    v: i32,
    n: usize,
    s: aclrtStream,
) -> aclError {
    set(cx, s, false, p, n as u64, || f(p, max, v, n, s))
}

pub unsafe fn memset_d32(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, u32, usize) -> aclError,
    p: *mut c_void,
    size: usize,
    v: u32,
    n: usize,
) -> aclError {
    set(cx, std::ptr::null_mut(), true, p, 4 * n as u64, || {
        f(p, size, v, n)
    })
}

pub unsafe fn memset_d32_async(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, u32, usize, aclrtStream) -> aclError,
    p: *mut c_void,
    size: usize,
    v: u32,
    n: usize,
    s: aclrtStream,
) -> aclError {
    set(cx, s, false, p, 4 * n as u64, || f(p, size, v, n, s))
}

/// Cache maintenance of a device range on a stream: an access (read).
pub unsafe fn cmo_async(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, usize, c_int, aclrtStream) -> aclError,
    p: *mut c_void,
    size: usize,
    ty: c_int,
    s: aclrtStream,
) -> aclError {
    let dev = current_device();
    let rs = [Range {
        addr: p as u64,
        len: size as u64,
        write: false,
    }];
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        s as u64,
        &rs,
        false,
        false,
        || f(p, size, ty, s),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        cx.note(|e| e.op(dev, s as u64, b"CmoAsync", &rs, None));
    }
    r
}

/// A stream-ordered write of an 8-byte device word.
pub unsafe fn value_write(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, u32, aclrtStream) -> aclError,
    p: *mut c_void,
    v: u64,
    flag: u32,
    s: aclrtStream,
) -> aclError {
    word(cx, b"ValueWrite", true, p, s, || f(p, v, flag, s))
}

/// A stream-ordered wait on an 8-byte device word (a read).
pub unsafe fn value_wait(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, u32, aclrtStream) -> aclError,
    p: *mut c_void,
    v: u64,
    flag: u32,
    s: aclrtStream,
) -> aclError {
    word(cx, b"ValueWait", false, p, s, || f(p, v, flag, s))
}

unsafe fn word(
    cx: &Cx,
    name: &[u8],
    write: bool,
    p: *mut c_void,
    s: aclrtStream,
    call: impl FnOnce() -> aclError,
) -> aclError {
    let dev = current_device();
    let rs = [Range {
        addr: p as u64,
        len: 8,
        write,
    }];
    let r = around(
        cx,
        OpClass::Layout,
        dev,
        s as u64,
        &rs,
        false,
        false,
        call,
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        cx.note(|e| e.op(dev, s as u64, name, &rs, None));
    }
    r
}
