//! Copy, memset and small stream-operation hooks: the device sides of a copy
//! (by core's one copy-direction rule), every memset destination, a cache
//! maintenance range, a device word. Each decodes into a `Call`; the engine
//! makes the device sides resident (a destination covering whole chunks
//! needs no copy-in) and observes them.
//!
//! Safety: every `pub unsafe fn` here is a hook handler,
//! `unsafe fn(&Cx, Real<args::NAME>, args::NAME)`; its contract is the C
//! prototype's (table.rs): the arguments are the program's, valid as that
//! function documents them, and `real` is the next definition of the name.
//! Pointers are read only where the runtime itself would read them.

use std::ffi::c_void;

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use u3m_core::acl::MemcpyKind;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Memcpy, Queue, Range, MAX_OP_RANGES};
use u3m_core::opclass::OpClass;

fn copy(q: Queue, kind: i32, dst: *mut c_void, src: *const c_void, n: usize) -> Call<'static> {
    Call::Copy {
        copy: Memcpy::linear(MemcpyKind(kind), dst as u64, src as u64, n as u64),
        q,
    }
}

pub unsafe fn memcpy(cx: &Cx, real: Real<aclrtMemcpy>, a: aclrtMemcpy) -> aclError {
    let call = copy(Queue::SYNC, a.kind, a.dst, a.src, a.count);
    cx.run(&call, || real.call(a))
}

pub unsafe fn memcpy_async(cx: &Cx, real: Real<aclrtMemcpyAsync>, a: aclrtMemcpyAsync) -> aclError {
    let call = copy(Queue::on(a.stream as u64), a.kind, a.dst, a.src, a.count);
    cx.run(&call, || real.call(a))
}

pub unsafe fn memcpy_async_cond(
    cx: &Cx,
    real: Real<aclrtMemcpyAsyncWithCondition>,
    a: aclrtMemcpyAsyncWithCondition,
) -> aclError {
    let call = copy(Queue::on(a.stream as u64), a.kind, a.dst, a.src, a.count);
    cx.run(&call, || real.call(a))
}

#[allow(clippy::too_many_arguments)]
fn copy_2d(
    q: Queue,
    kind: i32,
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
) -> Call<'static> {
    Call::Copy {
        copy: Memcpy::pitched(
            MemcpyKind(kind),
            dst as u64,
            dpitch as u64,
            src as u64,
            spitch as u64,
            width as u64,
            height as u64,
        ),
        q,
    }
}

pub unsafe fn memcpy_2d(cx: &Cx, real: Real<aclrtMemcpy2d>, a: aclrtMemcpy2d) -> aclError {
    let call = copy_2d(
        Queue::SYNC,
        a.kind,
        a.dst,
        a.dpitch,
        a.src,
        a.spitch,
        a.width,
        a.height,
    );
    cx.run(&call, || real.call(a))
}

pub unsafe fn memcpy_2d_async(
    cx: &Cx,
    real: Real<aclrtMemcpy2dAsync>,
    a: aclrtMemcpy2dAsync,
) -> aclError {
    let call = copy_2d(
        Queue::on(a.stream as u64),
        a.kind,
        a.dst,
        a.dpitch,
        a.src,
        a.spitch,
        a.width,
        a.height,
    );
    cx.run(&call, || real.call(a))
}

/// The copy kind of batch entry `i` from the location attributes.
///
/// # Safety
/// aclrtMemcpyBatch's contract: `attrs` holds `nattrs` attributes and `idx`
/// their `nattrs` start indices (or either is null).
unsafe fn batch_kind(
    attrs: *const aclrtMemcpyBatchAttr,
    idx: *const usize,
    nattrs: usize,
    i: usize,
) -> MemcpyKind {
    if attrs.is_null() || idx.is_null() || nattrs == 0 {
        return MemcpyKind::DEFAULT;
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
        (true, true) => MemcpyKind::DEVICE_TO_DEVICE,
        (true, false) => MemcpyKind::HOST_TO_DEVICE,
        (false, true) => MemcpyKind::DEVICE_TO_HOST,
        (false, false) => MemcpyKind::HOST_TO_HOST,
    }
}

/// A batch's copies, decoded: on the stack up to MAX_OP_RANGES entries.
///
/// # Safety
/// aclrtMemcpyBatch's contract: `dsts`, `srcs`, `sizes` hold `n` entries,
/// `attrs`/`idx` as in `batch_kind`.
#[allow(clippy::too_many_arguments)]
unsafe fn batch(
    cx: &Cx,
    q: Queue,
    dsts: *mut *mut c_void,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    n: usize,
    attrs: *mut aclrtMemcpyBatchAttr,
    idx: *mut usize,
    nattrs: usize,
    real: impl FnMut() -> aclError,
) -> aclError {
    let n = if dsts.is_null() || srcs.is_null() || sizes.is_null() {
        0
    } else {
        n
    };
    let entry = |i: usize| {
        Memcpy::linear(
            batch_kind(attrs, idx, nattrs, i),
            *dsts.add(i) as u64,
            *srcs.add(i) as u64,
            *sizes.add(i) as u64,
        )
    };
    let mut small = [Memcpy::ZERO; MAX_OP_RANGES];
    let large: Vec<Memcpy>;
    let copies: &[Memcpy] = if n <= MAX_OP_RANGES {
        for (i, c) in small.iter_mut().enumerate().take(n) {
            *c = entry(i);
        }
        &small[..n]
    } else {
        large = (0..n).map(entry).collect();
        &large
    };
    cx.run(&Call::CopyBatch { copies, q }, real)
}

pub unsafe fn memcpy_batch(cx: &Cx, real: Real<aclrtMemcpyBatch>, a: aclrtMemcpyBatch) -> aclError {
    batch(
        cx,
        Queue::SYNC,
        a.dsts,
        a.srcs,
        a.sizes,
        a.num_batches,
        a.attrs,
        a.attrs_indexes,
        a.num_attrs,
        || real.call(a),
    )
}

pub unsafe fn memcpy_batch_async(
    cx: &Cx,
    real: Real<aclrtMemcpyBatchAsync>,
    a: aclrtMemcpyBatchAsync,
) -> aclError {
    batch(
        cx,
        Queue::on(a.stream as u64),
        a.dsts,
        a.srcs,
        a.sizes,
        a.num_batches,
        a.attrs,
        a.attrs_indexes,
        a.num_attrs,
        || real.call(a),
    )
}

fn set(q: Queue, p: *mut c_void, bytes: u64) -> Call<'static> {
    Call::Memset {
        addr: p as u64,
        bytes,
        q,
    }
}

pub unsafe fn memset(cx: &Cx, real: Real<aclrtMemset>, a: aclrtMemset) -> aclError {
    cx.run(&set(Queue::SYNC, a.dev_ptr, a.count as u64), || {
        real.call(a)
    })
}

pub unsafe fn memset_async(cx: &Cx, real: Real<aclrtMemsetAsync>, a: aclrtMemsetAsync) -> aclError {
    let call = set(Queue::on(a.stream as u64), a.dev_ptr, a.count as u64);
    cx.run(&call, || real.call(a))
}

pub unsafe fn memset_d32(cx: &Cx, real: Real<aclrtMemsetD32>, a: aclrtMemsetD32) -> aclError {
    cx.run(&set(Queue::SYNC, a.ptr, 4 * a.n as u64), || real.call(a))
}

pub unsafe fn memset_d32_async(
    cx: &Cx,
    real: Real<aclrtMemsetD32Async>,
    a: aclrtMemsetD32Async,
) -> aclError {
    let call = set(Queue::on(a.stream as u64), a.ptr, 4 * a.n as u64);
    cx.run(&call, || real.call(a))
}

/// A small operation on `range` queued on `stream` (observed under `name`).
fn stream_op<'a>(name: &'static [u8], range: &'a [Range; 1], stream: aclrtStream) -> Call<'a> {
    Call::Launch(Launch {
        kind: LaunchKind::Stream,
        name: Some(name),
        class: OpClass::Layout,
        op_hash: None,
        ranges: range,
        resident: None,
        flops: None,
        q: Queue::on(stream as u64),
        api: Api::Acl,
    })
}

/// Cache maintenance of a device range on a stream: an access (read).
pub unsafe fn cmo_async(cx: &Cx, real: Real<aclrtCmoAsync>, a: aclrtCmoAsync) -> aclError {
    let r = [Range {
        addr: a.src as u64,
        len: a.size as u64,
        write: false,
        whole: false,
    }];
    cx.run(&stream_op(b"CmoAsync", &r, a.stream), || real.call(a))
}

fn word(p: *mut c_void, write: bool) -> [Range; 1] {
    [Range {
        addr: p as u64,
        len: 8,
        write,
        whole: false,
    }]
}

/// A stream-ordered write of an 8-byte device word.
pub unsafe fn value_write(cx: &Cx, real: Real<aclrtValueWrite>, a: aclrtValueWrite) -> aclError {
    let r = word(a.dev_addr, true);
    cx.run(&stream_op(b"ValueWrite", &r, a.stream), || real.call(a))
}

/// A stream-ordered wait on an 8-byte device word (a read).
/// Another thread's later write releases it: work queued after it waits for
/// the host (`Engine::program_waits_on_host`).
pub unsafe fn value_wait(cx: &Cx, real: Real<aclrtValueWait>, a: aclrtValueWait) -> aclError {
    cx.note(|e| e.program_waits_on_host());
    let r = word(a.dev_addr, false);
    cx.run(&stream_op(b"ValueWait", &r, a.stream), || real.call(a))
}
