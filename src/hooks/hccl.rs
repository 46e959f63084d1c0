//! HCCL hooks: collective send/receive buffers are accesses (a residency
//! failure is HCCL_E_MEMORY); registered communication memory must never
//! move (HCCL holds its physical pages).
//!
//! Safety: every `pub unsafe fn` here is a hook handler,
//! `unsafe fn(&Cx, Real<args::NAME>, args::NAME)`; its contract is the C
//! prototype's (table.rs): the arguments are the program's, valid as that
//! function documents them, and `real` is the next definition of the name.
//! Pointers are read only where the runtime itself would read them.

use std::ffi::c_void;
use std::os::raw::c_int;

use super::args::*;
use super::ranges;
use super::{Cx, Real};
use crate::ffi::*;
use u3m_core::engine::{Call, PinReason, Queue, Range};

/// The communicator's rank count (1 if unknown).
///
/// # Safety
/// `comm` is the program's communicator, passed to HcclGetRankSize as the
/// program's own call would.
unsafe fn rank_size(comm: HcclComm) -> u64 {
    static F: crate::real::RealFn = crate::real::RealFn::new(b"HcclGetRankSize\0");
    let Some(p) = F.get() else { return 1 };
    let f: unsafe extern "C" fn(HcclComm, *mut u32) -> HcclResult = std::mem::transmute(p);
    let mut n = 1u32;
    if f(comm, &mut n) != 0 || n == 0 {
        1
    } else {
        n as u64
    }
}

fn bytes(count: u64, dt: c_int) -> u64 {
    count.saturating_mul(hccl_dtype_size(dt))
}

/// A collective: its buffers resident before (tier mode), observed after.
fn coll<'a>(name: &'a [u8], stream: aclrtStream, ranges: &'a [Range]) -> Call<'a> {
    Call::Collective {
        name,
        ranges,
        q: Queue::on(stream as u64),
    }
}

fn rd(p: *const c_void, len: u64) -> Range {
    Range {
        addr: p as u64,
        len,
        write: false,
        whole: false,
    }
}
fn wr(p: *const c_void, len: u64) -> Range {
    Range {
        addr: p as u64,
        len,
        write: true,
        whole: false,
    }
}

pub unsafe fn all_reduce(cx: &Cx, real: Real<HcclAllReduce>, a: HcclAllReduce) -> HcclResult {
    let b = bytes(a.count, a.data_type);
    let rs = [rd(a.send_buf, b), wr(a.recv_buf, b)];
    cx.run(&coll(b"HcclAllReduce", a.stream, &rs), || real.call(a))
}

pub unsafe fn broadcast(cx: &Cx, real: Real<HcclBroadcast>, a: HcclBroadcast) -> HcclResult {
    let rs = [wr(a.buf, bytes(a.count, a.data_type))];
    cx.run(&coll(b"HcclBroadcast", a.stream, &rs), || real.call(a))
}

pub unsafe fn all_gather(cx: &Cx, real: Real<HcclAllGather>, a: HcclAllGather) -> HcclResult {
    let b = bytes(a.send_count, a.data_type);
    let ranks = rank_size(a.comm);
    let rs = [rd(a.send_buf, b), wr(a.recv_buf, b.saturating_mul(ranks))];
    cx.run(&coll(b"HcclAllGather", a.stream, &rs), || real.call(a))
}

pub unsafe fn reduce_scatter(
    cx: &Cx,
    real: Real<HcclReduceScatter>,
    a: HcclReduceScatter,
) -> HcclResult {
    let b = bytes(a.recv_count, a.data_type);
    let ranks = rank_size(a.comm);
    let rs = [rd(a.send_buf, b.saturating_mul(ranks)), wr(a.recv_buf, b)];
    cx.run(&coll(b"HcclReduceScatter", a.stream, &rs), || real.call(a))
}

pub unsafe fn reduce(cx: &Cx, real: Real<HcclReduce>, a: HcclReduce) -> HcclResult {
    let b = bytes(a.count, a.data_type);
    let rs = [rd(a.send_buf, b), wr(a.recv_buf, b)];
    cx.run(&coll(b"HcclReduce", a.stream, &rs), || real.call(a))
}

pub unsafe fn scatter(cx: &Cx, real: Real<HcclScatter>, a: HcclScatter) -> HcclResult {
    let b = bytes(a.recv_count, a.data_type);
    let ranks = rank_size(a.comm);
    let rs = [rd(a.send_buf, b.saturating_mul(ranks)), wr(a.recv_buf, b)];
    cx.run(&coll(b"HcclScatter", a.stream, &rs), || real.call(a))
}

pub unsafe fn send(cx: &Cx, real: Real<HcclSend>, a: HcclSend) -> HcclResult {
    let rs = [rd(a.send_buf, bytes(a.count, a.data_type))];
    cx.run(&coll(b"HcclSend", a.stream, &rs), || real.call(a))
}

pub unsafe fn recv(cx: &Cx, real: Real<HcclRecv>, a: HcclRecv) -> HcclResult {
    let rs = [wr(a.recv_buf, bytes(a.count, a.data_type))];
    cx.run(&coll(b"HcclRecv", a.stream, &rs), || real.call(a))
}

pub unsafe fn all_to_all(cx: &Cx, real: Real<HcclAlltoAll>, a: HcclAlltoAll) -> HcclResult {
    let ranks = rank_size(a.comm);
    let rs = [
        rd(
            a.send_buf,
            bytes(a.send_count, a.send_type).saturating_mul(ranks),
        ),
        wr(
            a.recv_buf,
            bytes(a.recv_count, a.recv_type).saturating_mul(ranks),
        ),
    ];
    cx.run(&coll(b"HcclAlltoAll", a.stream, &rs), || real.call(a))
}

/// Extent of a V-collective buffer: max(displ + count) elements, from the
/// host arrays of uint64 counts and displacements (one per rank).
///
/// # Safety
/// The V-collective's contract: `counts` and `displs` hold `ranks` uint64
/// each (or are null).
unsafe fn v_extent(counts: *const c_void, displs: *const c_void, ranks: u64) -> u64 {
    if counts.is_null() || ranks > 65536 {
        return 0;
    }
    let c = counts as *const u64;
    let d = displs as *const u64;
    let mut m = 0u64;
    for i in 0..ranks as usize {
        let off = if d.is_null() { 0 } else { *d.add(i) };
        m = m.max(off.saturating_add(*c.add(i)));
    }
    m
}

pub unsafe fn all_to_all_v(cx: &Cx, real: Real<HcclAlltoAllV>, a: HcclAlltoAllV) -> HcclResult {
    let ranks = rank_size(a.comm);
    let sb = bytes(v_extent(a.send_counts, a.sdispls, ranks), a.send_type);
    let rb = bytes(v_extent(a.recv_counts, a.rdispls, ranks), a.recv_type);
    let rs = [rd(a.send_buf, sb), wr(a.recv_buf, rb)];
    cx.run(&coll(b"HcclAlltoAllV", a.stream, &rs), || real.call(a))
}

pub unsafe fn all_gather_v(cx: &Cx, real: Real<HcclAllGatherV>, a: HcclAllGatherV) -> HcclResult {
    let ranks = rank_size(a.comm);
    let rs = [
        rd(a.send_buf, bytes(a.send_count, a.data_type)),
        wr(
            a.recv_buf,
            bytes(v_extent(a.recv_counts, a.recv_displs, ranks), a.data_type),
        ),
    ];
    cx.run(&coll(b"HcclAllGatherV", a.stream, &rs), || real.call(a))
}

pub unsafe fn reduce_scatter_v(
    cx: &Cx,
    real: Real<HcclReduceScatterV>,
    a: HcclReduceScatterV,
) -> HcclResult {
    let ranks = rank_size(a.comm);
    let rs = [
        rd(
            a.send_buf,
            bytes(v_extent(a.send_counts, a.send_displs, ranks), a.data_type),
        ),
        wr(a.recv_buf, bytes(a.recv_count, a.data_type)),
    ];
    cx.run(&coll(b"HcclReduceScatterV", a.stream, &rs), || real.call(a))
}

pub unsafe fn batch_send_recv(
    cx: &Cx,
    real: Real<HcclBatchSendRecv>,
    a: HcclBatchSendRecv,
) -> HcclResult {
    // every item: a batch may exchange any number of buffers, and one left
    // out would run on memory tier mode never made resident
    ranges::with(cx, |ranges| {
        if !a.items.is_null() {
            for i in 0..a.item_num as usize {
                let it = &*a.items.add(i);
                ranges.push(Range {
                    addr: it.buf as u64,
                    len: bytes(it.count, it.data_type),
                    write: it.send_recv_type == HCCL_RECV,
                    whole: false,
                });
            }
        }
        cx.run(&coll(b"HcclBatchSendRecv", a.stream, ranges), || {
            real.call(a)
        })
    })
}

/// Communication memory HCCL holds the pages of: never moved.
fn pinned(addr: *mut c_void, len: u64) -> Call<'static> {
    Call::Pin {
        addr: addr as u64,
        len,
        reason: PinReason::HcclRegistered,
    }
}

pub unsafe fn comm_register(
    cx: &Cx,
    real: Real<HcclCommRegister>,
    a: HcclCommRegister,
) -> HcclResult {
    cx.run(&pinned(a.addr, a.size), || real.call(a))
}

pub unsafe fn comm_deregister(
    _cx: &Cx,
    real: Real<HcclCommDeregister>,
    a: HcclCommDeregister,
) -> HcclResult {
    real.call(a)
}

pub unsafe fn set_memory_range(
    cx: &Cx,
    real: Real<HcclCommSetMemoryRange>,
    a: HcclCommSetMemoryRange,
) -> HcclResult {
    cx.run(&pinned(a.base_vir_ptr, a.size as u64), || real.call(a))
}

pub unsafe fn unset_memory_range(
    _cx: &Cx,
    real: Real<HcclCommUnsetMemoryRange>,
    a: HcclCommUnsetMemoryRange,
) -> HcclResult {
    real.call(a)
}

pub unsafe fn activate_comm_memory(
    cx: &Cx,
    real: Real<HcclCommActivateCommMemory>,
    a: HcclCommActivateCommMemory,
) -> HcclResult {
    cx.run(&pinned(a.vir_ptr, a.size as u64), || real.call(a))
}

pub unsafe fn deactivate_comm_memory(
    _cx: &Cx,
    real: Real<HcclCommDeactivateCommMemory>,
    a: HcclCommDeactivateCommMemory,
) -> HcclResult {
    real.call(a)
}
