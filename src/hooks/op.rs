//! aclop launches: every input and output data buffer is an access (inputs
//! read, outputs written). The `flops` int attribute, when a program sets
//! one, is remembered per attribute object (the interposer's state) so
//! launches can carry it.

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use crate::real::RealFn;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Queue, Range};
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

pub unsafe fn set_attr_int(_cx: &Cx, real: Real<aclopSetAttrInt>, a: aclopSetAttrInt) -> aclError {
    let r = real.call(a);
    if r == ACL_SUCCESS
        && !a.attr.is_null()
        && !a.name.is_null()
        && CStr::from_ptr(a.name).to_bytes() == b"flops"
        && a.value >= 0
    {
        if let Some(i) = attr_slot(a.attr as usize, true) {
            ATTR_FLOPS[i].store(a.value as u64, Ordering::Release);
        }
    }
    r
}

pub unsafe fn destroy_attr(_cx: &Cx, real: Real<aclopDestroyAttr>, a: aclopDestroyAttr) {
    if !a.attr.is_null() {
        if let Some(i) = attr_slot(a.attr as usize, false) {
            // tombstone-free removal is unnecessary: the key is simply cleared
            // (a later insert may reuse the slot; probing tolerates holes by
            // scanning the whole table when a key is absent)
            ATTR_FLOPS[i].store(0, Ordering::Release);
            ATTR_KEY[i].store(usize::MAX, Ordering::Release);
        }
    }
    real.call(a)
}

/// Collects the (addr, size) of each data buffer, however many.
///
/// # Safety
/// `list` is null or points to `n` data buffer pointers (null or live).
unsafe fn buffers(list: *const *const c_void, n: c_int, write: bool, out: &mut Vec<Range>) {
    if list.is_null() || n <= 0 {
        return;
    }
    let (Some(ga), Some(gs)) = (GET_ADDR.get(), GET_SIZE.get()) else {
        return;
    };
    // SAFETY: the real aclGetDataBufferAddr / aclGetDataBufferSizeV2, whose
    // prototypes these are
    let ga: unsafe extern "C" fn(*const c_void) -> *mut c_void = std::mem::transmute(ga);
    let gs: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(gs);
    for i in 0..n as usize {
        // SAFETY: the program passed `n` data buffers at `list` (the
        // operator's prototype); the runtime reads the same array
        let b = *list.add(i);
        if b.is_null() {
            continue;
        }
        out.push(Range {
            addr: ga(b) as u64,
            len: gs(b) as u64,
            write,
        });
    }
}

/// An aclop launch, decoded: the input and output data buffers are its
/// ranges (inputs read, outputs written), the `flops` attribute its work.
///
/// # Safety
/// The arguments of an aclop execute call the program made: `op_type` null
/// or a C string, `ins`/`outs` as `buffers` requires.
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
    real: impl FnMut() -> aclError,
) -> aclError {
    // every buffer, however many (the per-thread buffer grows and is reused)
    super::ranges::with(cx, |ranges| {
        buffers(ins, nin, false, ranges);
        buffers(outs, nout, true, ranges);
        let name = (!op_type.is_null()).then(|| CStr::from_ptr(op_type).to_bytes());
        // the name classified once: the class for the policy, the hash for
        // the heat table
        let (class, op_hash) = match name {
            Some(n) => {
                let (c, h) = u3m_core::opclass::classify_bytes(n);
                (c, Some(h))
            }
            None => (OpClass::Other, None),
        };
        let call = Call::Launch(Launch {
            kind: LaunchKind::Aclop,
            name,
            class,
            op_hash,
            ranges,
            resident: None,
            flops: attr_flops(attr),
            q: Queue::on(stream as u64),
            api: Api::Acl,
        });
        cx.run(&call, real)
    })
}

pub unsafe fn execute(cx: &Cx, real: Real<aclopExecute>, a: aclopExecute) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs,
        a.num_outputs,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

pub unsafe fn execute_v2(cx: &Cx, real: Real<aclopExecuteV2>, a: aclopExecuteV2) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs as *const *const c_void,
        a.num_outputs,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

pub unsafe fn compile_and_execute(
    cx: &Cx,
    real: Real<aclopCompileAndExecute>,
    a: aclopCompileAndExecute,
) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs,
        a.num_outputs,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

pub unsafe fn compile_and_execute_v2(
    cx: &Cx,
    real: Real<aclopCompileAndExecuteV2>,
    a: aclopCompileAndExecuteV2,
) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs as *const *const c_void,
        a.num_outputs,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}
