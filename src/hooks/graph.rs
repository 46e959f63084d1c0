//! Graph capture and replay. Work queued on a capturing stream is recorded,
//! not run; a replay reuses the raw device addresses recorded at capture, so
//! the engine remembers which memory each captured graph touches and treats a
//! replay as touching it again.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};

use super::Cx;
use crate::ffi::*;
use crate::init::current_device;
use crate::real::RealFn;
use u3m_core::engine::{Range, MAX_OP_RANGES};
use u3m_core::opclass::OpClass;

pub unsafe fn capture_begin(
    cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream, c_int) -> aclError,
    s: aclrtStream,
    mode: c_int,
) -> aclError {
    let r = f(s, mode);
    if r == ACL_SUCCESS {
        cx.note(|e| e.capture_begin(s as u64));
    }
    r
}

/// Capture into an existing graph (the branches of conditional nodes): work
/// after it is recorded, not run, exactly as after aclmdlRICaptureBegin.
pub unsafe fn capture_to_model_begin(
    cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream, *mut c_void, c_int) -> aclError,
    s: aclrtStream,
    ri: *mut c_void,
    mode: c_int,
) -> aclError {
    let r = f(s, ri, mode);
    if r == ACL_SUCCESS {
        cx.note(|e| e.capture_begin(s as u64));
    }
    r
}

pub unsafe fn capture_end(
    cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream, *mut *mut c_void) -> aclError,
    s: aclrtStream,
    ri: *mut *mut c_void,
) -> aclError {
    let r = f(s, ri);
    let model = if r == ACL_SUCCESS && !ri.is_null() {
        *ri as u64
    } else {
        0
    };
    cx.note(|e| e.capture_end(s as u64, model));
    r
}

pub unsafe fn capture_get_info(
    _cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream, *mut c_int, *mut *mut c_void) -> aclError,
    s: aclrtStream,
    st: *mut c_int,
    ri: *mut *mut c_void,
) -> aclError {
    f(s, st, ri)
}

pub unsafe fn capture_exchange_mode(
    _cx: &Cx,
    f: unsafe extern "C" fn(*mut c_int) -> aclError,
    m: *mut c_int,
) -> aclError {
    f(m)
}

pub unsafe fn task_grp_begin(
    _cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream) -> aclError,
    s: aclrtStream,
) -> aclError {
    f(s)
}

pub unsafe fn task_grp_end(
    _cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream, *mut *mut c_void) -> aclError,
    s: aclrtStream,
    h: *mut *mut c_void,
) -> aclError {
    f(s, h)
}

pub unsafe fn task_update_begin(
    _cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream, *mut c_void) -> aclError,
    s: aclrtStream,
    h: *mut c_void,
) -> aclError {
    f(s, h)
}

pub unsafe fn task_update_end(
    _cx: &Cx,
    f: unsafe extern "C" fn(aclrtStream) -> aclError,
    s: aclrtStream,
) -> aclError {
    f(s)
}

pub unsafe fn ri_execute_async(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, aclrtStream) -> aclError,
    ri: *mut c_void,
    s: aclrtStream,
) -> aclError {
    // everything the graph touches is resident before each replay
    let ranges = cx.note(|e| e.graph_ranges(ri as u64));
    let dev = current_device();
    let r = super::around(
        cx,
        OpClass::Other,
        dev,
        s as u64,
        &ranges,
        false,
        false,
        || f(ri, s),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        let dev = current_device();
        cx.note(|e| e.graph_replay(dev, s as u64, ri as u64));
    }
    r
}

pub unsafe fn ri_execute(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, i32) -> aclError,
    ri: *mut c_void,
    timeout: i32,
) -> aclError {
    let ranges = cx.note(|e| e.graph_ranges(ri as u64));
    let dev = current_device();
    let r = super::around(
        cx,
        OpClass::Other,
        dev,
        0,
        &ranges,
        false,
        true,
        || f(ri, timeout),
        |r| *r == ACL_SUCCESS,
        |e| e,
    );
    if r == ACL_SUCCESS {
        let dev = current_device();
        cx.note(|e| e.graph_replay(dev, 0, ri as u64));
    }
    r
}

pub unsafe fn ri_destroy(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void) -> aclError,
    ri: *mut c_void,
) -> aclError {
    let r = f(ri);
    if r == ACL_SUCCESS {
        cx.note(|e| e.graph_destroy(ri as u64));
    }
    r
}

static NUM_BUFFERS: RealFn = RealFn::new(b"aclmdlGetDatasetNumBuffers\0");
static GET_BUFFER: RealFn = RealFn::new(b"aclmdlGetDatasetBuffer\0");
static GET_ADDR: RealFn = RealFn::new(b"aclGetDataBufferAddr\0");
static GET_SIZE: RealFn = RealFn::new(b"aclGetDataBufferSizeV2\0");

/// The (addr, size) of every buffer of an aclmdlDataset.
unsafe fn dataset(ds: *const c_void, write: bool, out: &mut [Range; MAX_OP_RANGES], n: &mut usize) {
    if ds.is_null() {
        return;
    }
    let (Some(nb), Some(gb), Some(ga), Some(gs)) = (
        NUM_BUFFERS.get(),
        GET_BUFFER.get(),
        GET_ADDR.get(),
        GET_SIZE.get(),
    ) else {
        return;
    };
    let nb: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(nb);
    let gb: unsafe extern "C" fn(*const c_void, usize) -> *mut c_void = std::mem::transmute(gb);
    let ga: unsafe extern "C" fn(*const c_void) -> *mut c_void = std::mem::transmute(ga);
    let gs: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(gs);
    for i in 0..nb(ds) {
        let b = gb(ds, i);
        if b.is_null() || *n == MAX_OP_RANGES {
            continue;
        }
        out[*n] = Range {
            addr: ga(b) as u64,
            len: gs(b) as u64,
            write,
        };
        *n += 1;
    }
}

unsafe fn note_model(
    cx: &Cx,
    model: u32,
    input: *const c_void,
    output: *mut c_void,
    s: aclrtStream,
) {
    let mut ranges = [Range::default(); MAX_OP_RANGES];
    let mut n = 0;
    dataset(input, false, &mut ranges, &mut n);
    dataset(output, true, &mut ranges, &mut n);
    let mut name = [0u8; 32];
    let mut w = &mut name[..];
    let _ = std::io::Write::write_fmt(&mut w, format_args!("aclmdl{model}"));
    let len = name.iter().position(|&b| b == 0).unwrap_or(32);
    let dev = current_device();
    cx.note(|e| e.op(dev, s as u64, &name[..len], &ranges[..n], None));
}

pub unsafe fn mdl_execute(
    cx: &Cx,
    f: unsafe extern "C" fn(u32, *const c_void, *mut c_void) -> aclError,
    id: u32,
    i: *const c_void,
    o: *mut c_void,
) -> aclError {
    let r = f(id, i, o);
    if r == ACL_SUCCESS {
        note_model(cx, id, i, o, std::ptr::null_mut());
    }
    r
}

pub unsafe fn mdl_execute_async(
    cx: &Cx,
    f: unsafe extern "C" fn(u32, *const c_void, *mut c_void, aclrtStream) -> aclError,
    id: u32,
    i: *const c_void,
    o: *mut c_void,
    s: aclrtStream,
) -> aclError {
    let r = f(id, i, o, s);
    if r == ACL_SUCCESS {
        note_model(cx, id, i, o, s);
    }
    r
}

#[allow(dead_code)]
const _: Option<*const c_char> = None;
