//! Graph capture and replay. Work queued on a capturing stream is recorded,
//! not run; a replay reuses the raw device addresses recorded at capture, so
//! the engine remembers which memory each captured graph touches and treats a
//! replay as touching it again.

use std::ffi::c_void;

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use crate::real::RealFn;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Out, Queue, Range};
use u3m_core::opclass::OpClass;

pub unsafe fn capture_begin(
    cx: &Cx,
    real: Real<aclmdlRICaptureBegin>,
    a: aclmdlRICaptureBegin,
) -> aclError {
    let call = Call::CaptureBegin {
        stream: a.stream as u64,
    };
    cx.run(&call, || real.call(a))
}

/// Capture into an existing graph (the branches of conditional nodes): work
/// after it is recorded, not run, exactly as after aclmdlRICaptureBegin.
pub unsafe fn capture_to_model_begin(
    cx: &Cx,
    real: Real<aclmdlRICaptureToModelRIBegin>,
    a: aclmdlRICaptureToModelRIBegin,
) -> aclError {
    let call = Call::CaptureBegin {
        stream: a.stream as u64,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn capture_end(
    cx: &Cx,
    real: Real<aclmdlRICaptureEnd>,
    a: aclmdlRICaptureEnd,
) -> aclError {
    let call = Call::CaptureEnd {
        stream: a.stream as u64,
        out: Out::new(a.model_ri),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn capture_get_info(
    _cx: &Cx,
    real: Real<aclmdlRICaptureGetInfo>,
    a: aclmdlRICaptureGetInfo,
) -> aclError {
    real.call(a)
}

pub unsafe fn capture_exchange_mode(
    _cx: &Cx,
    real: Real<aclmdlRICaptureThreadExchangeMode>,
    a: aclmdlRICaptureThreadExchangeMode,
) -> aclError {
    real.call(a)
}

pub unsafe fn task_grp_begin(
    _cx: &Cx,
    real: Real<aclmdlRICaptureTaskGrpBegin>,
    a: aclmdlRICaptureTaskGrpBegin,
) -> aclError {
    real.call(a)
}

pub unsafe fn task_grp_end(
    _cx: &Cx,
    real: Real<aclmdlRICaptureTaskGrpEnd>,
    a: aclmdlRICaptureTaskGrpEnd,
) -> aclError {
    real.call(a)
}

pub unsafe fn task_update_begin(
    _cx: &Cx,
    real: Real<aclmdlRICaptureTaskUpdateBegin>,
    a: aclmdlRICaptureTaskUpdateBegin,
) -> aclError {
    real.call(a)
}

pub unsafe fn task_update_end(
    _cx: &Cx,
    real: Real<aclmdlRICaptureTaskUpdateEnd>,
    a: aclmdlRICaptureTaskUpdateEnd,
) -> aclError {
    real.call(a)
}

/// A replay touches everything the graph touched at capture: resident
/// before each replay.
pub unsafe fn ri_execute_async(
    cx: &Cx,
    real: Real<aclmdlRIExecuteAsync>,
    a: aclmdlRIExecuteAsync,
) -> aclError {
    let call = Call::GraphReplay {
        model: a.model_ri as u64,
        q: Queue::on(a.stream as u64),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn ri_execute(cx: &Cx, real: Real<aclmdlRIExecute>, a: aclmdlRIExecute) -> aclError {
    let call = Call::GraphReplay {
        model: a.model_ri as u64,
        q: Queue::SYNC,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn ri_destroy(cx: &Cx, real: Real<aclmdlRIDestroy>, a: aclmdlRIDestroy) -> aclError {
    let call = Call::GraphDestroy {
        model: a.model_ri as u64,
    };
    cx.run(&call, || real.call(a))
}

static NUM_BUFFERS: RealFn = RealFn::new(b"aclmdlGetDatasetNumBuffers\0");
static GET_BUFFER: RealFn = RealFn::new(b"aclmdlGetDatasetBuffer\0");
static GET_ADDR: RealFn = RealFn::new(b"aclGetDataBufferAddr\0");
static GET_SIZE: RealFn = RealFn::new(b"aclGetDataBufferSizeV2\0");

/// The (addr, size) of every buffer of an aclmdlDataset, however many.
///
/// # Safety
/// `ds` is null or a dataset the program passed to a model execution.
unsafe fn dataset(ds: *const c_void, write: bool, out: &mut Vec<Range>) {
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
    // SAFETY: the real aclmdlGetDatasetNumBuffers, aclmdlGetDatasetBuffer,
    // aclGetDataBufferAddr and aclGetDataBufferSizeV2, whose prototypes these are
    let nb: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(nb);
    let gb: unsafe extern "C" fn(*const c_void, usize) -> *mut c_void = std::mem::transmute(gb);
    let ga: unsafe extern "C" fn(*const c_void) -> *mut c_void = std::mem::transmute(ga);
    let gs: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(gs);
    for i in 0..nb(ds) {
        let b = gb(ds, i);
        if b.is_null() {
            continue;
        }
        out.push(Range {
            addr: ga(b) as u64,
            len: gs(b) as u64,
            write,
            whole: false,
        });
    }
}

/// A model execution: its datasets' buffers are its ranges (observed, not
/// made resident), named `aclmdl<id>`.
///
/// # Safety
/// `input`/`output` as `dataset` requires.
unsafe fn model(
    cx: &Cx,
    id: u32,
    input: *const c_void,
    output: *mut c_void,
    stream: aclrtStream,
    real: impl FnMut() -> aclError,
) -> aclError {
    super::ranges::with(cx, |ranges| {
        dataset(input, false, ranges);
        dataset(output, true, ranges);
        let mut name = [0u8; 32];
        let mut w = &mut name[..];
        let _ = std::io::Write::write_fmt(&mut w, format_args!("aclmdl{id}"));
        let len = name.iter().position(|&b| b == 0).unwrap_or(32);
        let call = Call::Launch(Launch {
            kind: LaunchKind::Model,
            name: Some(&name[..len]),
            class: OpClass::Other,
            op_hash: None,
            ranges,
            resident: None,
            flops: None,
            q: Queue::on(stream as u64),
            api: Api::Acl,
        });
        cx.run(&call, real)
    })
}

pub unsafe fn mdl_execute(cx: &Cx, real: Real<aclmdlExecute>, a: aclmdlExecute) -> aclError {
    model(
        cx,
        a.model_id,
        a.input,
        a.output,
        std::ptr::null_mut(),
        || real.call(a),
    )
}

pub unsafe fn mdl_execute_async(
    cx: &Cx,
    real: Real<aclmdlExecuteAsync>,
    a: aclmdlExecuteAsync,
) -> aclError {
    model(cx, a.model_id, a.input, a.output, a.stream, || real.call(a))
}
