//! Kernel launches whose device pointers hide in an opaque argument blob: the
//! blob's pointer-sized slots are scanned for addresses inside live device
//! allocations (a heuristic: a slot that happens to hold such a value is
//! treated as an access). Launches whose arguments u3m cannot read at all
//! (an args handle) are counted as opaque.

use std::ffi::c_void;

use super::Cx;
use crate::ffi::*;
use crate::init::current_device;
use u3m_core::opclass::OpClass;

unsafe fn scan(cx: &Cx, s: aclrtStream, args: *const c_void, size: usize) {
    if args.is_null() || size < 8 || size > (1 << 20) {
        return;
    }
    let words = std::slice::from_raw_parts(args as *const u8, size);
    let dev = current_device();
    cx.note(|e| e.kernel_args(dev, s as u64, words));
}

/// A launch whose blob may hold device pointers: those ranges are made
/// resident first (tier mode), the launch is noted after.
unsafe fn blob_launch<R: Copy>(
    cx: &Cx,
    s: aclrtStream,
    args: *const c_void,
    size: usize,
    ok: R,
    call: impl FnOnce() -> R,
) -> R
where
    R: PartialEq + From<i32>,
{
    let mut ranges = [u3m_core::engine::Range::ZERO; u3m_core::engine::MAX_OP_RANGES];
    let mut n = 0;
    if !args.is_null() && (8..=(1 << 20)).contains(&size) {
        let words = std::slice::from_raw_parts(args as *const u8, size);
        n = cx.note(|e| e.kernel_ranges(words, &mut ranges));
    }
    let dev = current_device();
    let r = super::around(
        cx,
        OpClass::Other,
        dev,
        s as u64,
        &ranges[..n],
        false,
        false,
        call,
        |r| *r == ok,
        R::from,
    );
    if r == ok {
        scan(cx, s, args, size);
    }
    r
}

pub unsafe fn launch(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u32, *const c_void, usize, aclrtStream) -> aclError,
    func: *mut c_void,
    nb: u32,
    args: *const c_void,
    size: usize,
    s: aclrtStream,
) -> aclError {
    blob_launch(cx, s, args, size, ACL_SUCCESS, || {
        f(func, nb, args, size, s)
    })
}

pub unsafe fn launch_v2(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        u32,
        *const c_void,
        usize,
        *mut c_void,
        aclrtStream,
    ) -> aclError,
    func: *mut c_void,
    nb: u32,
    args: *const c_void,
    size: usize,
    cfg: *mut c_void,
    s: aclrtStream,
) -> aclError {
    blob_launch(cx, s, args, size, ACL_SUCCESS, || {
        f(func, nb, args, size, cfg, s)
    })
}

pub unsafe fn launch_with_config(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        u32,
        aclrtStream,
        *mut c_void,
        *mut c_void,
        *mut c_void,
    ) -> aclError,
    func: *mut c_void,
    nb: u32,
    s: aclrtStream,
    cfg: *mut c_void,
    ah: *mut c_void,
    rsv: *mut c_void,
) -> aclError {
    let r = f(func, nb, s, cfg, ah, rsv);
    if r == ACL_SUCCESS {
        let dev = current_device();
        cx.note(|e| e.opaque_launch(dev, s as u64));
    }
    r
}

pub unsafe fn launch_with_host_args(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        u32,
        aclrtStream,
        *mut c_void,
        *mut c_void,
        usize,
        *mut c_void,
        usize,
    ) -> aclError,
    func: *mut c_void,
    nb: u32,
    s: aclrtStream,
    cfg: *mut c_void,
    ha: *mut c_void,
    size: usize,
    ph: *mut c_void,
    phn: usize,
) -> aclError {
    blob_launch(cx, s, ha, size, ACL_SUCCESS, || {
        f(func, nb, s, cfg, ha, size, ph, phn)
    })
}

pub unsafe fn rt_kernel_launch(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_void,
        u32,
        *mut c_void,
        u32,
        *mut c_void,
        aclrtStream,
    ) -> rtError_t,
    stub: *const c_void,
    bd: u32,
    args: *mut c_void,
    size: u32,
    sm: *mut c_void,
    s: aclrtStream,
) -> rtError_t {
    blob_launch(cx, s, args, size as usize, 0, || {
        f(stub, bd, args, size, sm, s)
    })
}
