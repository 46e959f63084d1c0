//! aclop launches: every input and output data buffer is an access (inputs
//! read, outputs written). The `flops` int attribute, when a program sets
//! one, is remembered per attribute object so launches can carry it.

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Cx;
use crate::ffi::*;
use crate::init::current_device;
use crate::real::RealFn;
use u3m_core::engine::{Range, MAX_OP_RANGES};
use u3m_core::opclass::OpClass;

static GET_ADDR: RealFn = RealFn::new(b"aclGetDataBufferAddr\0");
static GET_SIZE: RealFn = RealFn::new(b"aclGetDataBufferSizeV2\0");

/// attr object -> flops, a small lock-free table (entries are reused when the
/// attribute object is destroyed).
const ATTR_SLOTS: usize = 1024;
static ATTR_KEY: [AtomicUsize; ATTR_SLOTS] = [const { AtomicUsize::new(0) }; ATTR_SLOTS];
static ATTR_FLOPS: [AtomicU64; ATTR_SLOTS] = [const { AtomicU64::new(0) }; ATTR_SLOTS];

fn attr_slot(attr: usize, insert: bool) -> Option<usize> {
    let start = (attr >> 4).wrapping_mul(0x9e37_79b9) % ATTR_SLOTS;
    for k in 0..ATTR_SLOTS {
        let i = (start + k) % ATTR_SLOTS;
        let cur = ATTR_KEY[i].load(Ordering::Acquire);
        if cur == attr {
            return Some(i);
        }
        if cur == 0 {
            if !insert {
                return None;
            }
            if ATTR_KEY[i]
                .compare_exchange(0, attr, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(i);
            }
        }
    }
    None
}

fn attr_flops(attr: *const c_void) -> Option<u64> {
    if attr.is_null() {
        return None;
    }
    attr_slot(attr as usize, false).map(|i| ATTR_FLOPS[i].load(Ordering::Acquire))
}

pub unsafe fn set_attr_int(
    _cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, *const c_char, i64) -> aclError,
    attr: *mut c_void,
    name: *const c_char,
    v: i64,
) -> aclError {
    let r = f(attr, name, v);
    if r == ACL_SUCCESS
        && !attr.is_null()
        && !name.is_null()
        && CStr::from_ptr(name).to_bytes() == b"flops"
        && v >= 0
    {
        if let Some(i) = attr_slot(attr as usize, true) {
            ATTR_FLOPS[i].store(v as u64, Ordering::Release);
        }
    }
    r
}

pub unsafe fn destroy_attr(_cx: &Cx, f: unsafe extern "C" fn(*const c_void), attr: *const c_void) {
    if !attr.is_null() {
        if let Some(i) = attr_slot(attr as usize, false) {
            // tombstone-free removal is unnecessary: the key is simply cleared
            // (a later insert may reuse the slot; probing tolerates holes by
            // scanning the whole table when a key is absent)
            ATTR_FLOPS[i].store(0, Ordering::Release);
            ATTR_KEY[i].store(usize::MAX, Ordering::Release);
        }
    }
    f(attr)
}

/// Collects the (addr, size) of each data buffer.
unsafe fn buffers(
    list: *const *const c_void,
    n: c_int,
    write: bool,
    out: &mut [Range; MAX_OP_RANGES],
    len: &mut usize,
) {
    if list.is_null() || n <= 0 {
        return;
    }
    let (Some(ga), Some(gs)) = (GET_ADDR.get(), GET_SIZE.get()) else {
        return;
    };
    let ga: unsafe extern "C" fn(*const c_void) -> *mut c_void = std::mem::transmute(ga);
    let gs: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(gs);
    for i in 0..n as usize {
        let b = *list.add(i);
        if b.is_null() || *len == MAX_OP_RANGES {
            continue;
        }
        out[*len] = Range {
            addr: ga(b) as u64,
            len: gs(b) as u64,
            write,
        };
        *len += 1;
    }
}

/// An aclop launch: the data buffers are decoded before the call (tier mode
/// makes them resident), the launch is noted after it.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    cx: &Cx,
    op_type: *const c_char,
    nin: c_int,
    ins: *const *const c_void,
    nout: c_int,
    outs: *const *const c_void,
    attr: *const c_void,
    stream: aclrtStream,
    call: impl FnOnce() -> aclError,
) -> aclError {
    let mut ranges = [Range::default(); MAX_OP_RANGES];
    let mut n = 0;
    buffers(ins, nin, false, &mut ranges, &mut n);
    buffers(outs, nout, true, &mut ranges, &mut n);
    let dev = current_device();
    let class = if op_type.is_null() {
        OpClass::Other
    } else {
        u3m_core::opclass::classify_bytes(CStr::from_ptr(op_type).to_bytes()).0
    };
    let r = super::around(
        cx,
        class,
        dev,
        stream as u64,
        &ranges[..n],
        false,
        false,
        call,
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == 107022 {
        // ACL_ERROR_RT_DEVICE_TASK_ABORT: the card is gone
        cx.note(|e| e.device_lost(dev));
    }
    if r == ACL_SUCCESS && !op_type.is_null() {
        let name = CStr::from_ptr(op_type).to_bytes();
        let flops = attr_flops(attr);
        cx.note(|e| e.op(dev, stream as u64, name, &ranges[..n], flops));
    }
    r
}

pub unsafe fn execute(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_char,
        c_int,
        *const *const c_void,
        *const *const c_void,
        c_int,
        *const *const c_void,
        *const *mut c_void,
        *const c_void,
        aclrtStream,
    ) -> aclError,
    t: *const c_char,
    nin: c_int,
    ind: *const *const c_void,
    ins: *const *const c_void,
    nout: c_int,
    outd: *const *const c_void,
    outs: *const *mut c_void,
    attr: *const c_void,
    s: aclrtStream,
) -> aclError {
    launch(
        cx,
        t,
        nin,
        ins,
        nout,
        outs as *const *const c_void,
        attr,
        s,
        || f(t, nin, ind, ins, nout, outd, outs, attr, s),
    )
}

pub unsafe fn execute_v2(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_char,
        c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        *mut c_void,
        aclrtStream,
    ) -> aclError,
    t: *const c_char,
    nin: c_int,
    ind: *mut *mut c_void,
    ins: *mut *mut c_void,
    nout: c_int,
    outd: *mut *mut c_void,
    outs: *mut *mut c_void,
    attr: *mut c_void,
    s: aclrtStream,
) -> aclError {
    launch(
        cx,
        t,
        nin,
        ins as *const *const c_void,
        nout,
        outs as *const *const c_void,
        attr,
        s,
        || f(t, nin, ind, ins, nout, outd, outs, attr, s),
    )
}

pub unsafe fn compile_and_execute(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_char,
        c_int,
        *const *const c_void,
        *const *const c_void,
        c_int,
        *const *const c_void,
        *const *mut c_void,
        *const c_void,
        c_int,
        c_int,
        *const c_char,
        aclrtStream,
    ) -> aclError,
    t: *const c_char,
    nin: c_int,
    ind: *const *const c_void,
    ins: *const *const c_void,
    nout: c_int,
    outd: *const *const c_void,
    outs: *const *mut c_void,
    attr: *const c_void,
    eng: c_int,
    flag: c_int,
    path: *const c_char,
    s: aclrtStream,
) -> aclError {
    launch(
        cx,
        t,
        nin,
        ins,
        nout,
        outs as *const *const c_void,
        attr,
        s,
        || f(t, nin, ind, ins, nout, outd, outs, attr, eng, flag, path, s),
    )
}

pub unsafe fn compile_and_execute_v2(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_char,
        c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        *mut c_void,
        c_int,
        c_int,
        *const c_char,
        aclrtStream,
    ) -> aclError,
    t: *const c_char,
    nin: c_int,
    ind: *mut *mut c_void,
    ins: *mut *mut c_void,
    nout: c_int,
    outd: *mut *mut c_void,
    outs: *mut *mut c_void,
    attr: *mut c_void,
    eng: c_int,
    flag: c_int,
    path: *const c_char,
    s: aclrtStream,
) -> aclError {
    launch(
        cx,
        t,
        nin,
        ins as *const *const c_void,
        nout,
        outs as *const *const c_void,
        attr,
        s,
        || f(t, nin, ind, ins, nout, outd, outs, attr, eng, flag, path, s),
    )
}
