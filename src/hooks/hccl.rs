//! HCCL hooks: collective send/receive buffers are accesses; registered
//! communication memory must never move (HCCL holds its physical pages).

use std::ffi::c_void;
use std::os::raw::c_int;

use super::Cx;
use crate::ffi::*;
use crate::init::current_device;
use u3m_core::engine::{PinReason, Range};
use u3m_core::opclass::OpClass;

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

unsafe fn note(cx: &Cx, name: &[u8], stream: aclrtStream, ranges: &[Range]) {
    let dev = current_device();
    cx.note(|e| e.collective(dev, stream as u64, name, ranges));
}

/// A collective: its buffers resident before (tier mode), noted after.
unsafe fn coll(
    cx: &Cx,
    name: &[u8],
    stream: aclrtStream,
    ranges: &[Range],
    call: impl FnOnce() -> HcclResult,
) -> HcclResult {
    let dev = current_device();
    // HCCL reports its own codes; a residency failure is an HCCL memory error
    let rc = super::around(
        cx,
        OpClass::Communication,
        dev,
        stream as u64,
        ranges,
        false,
        false,
        call,
        |r| *r == 0,
        |_| 3, /* HCCL_E_MEMORY */
    );
    if rc == 0 {
        note(cx, name, stream, ranges);
    }
    rc
}

fn rd(p: *const c_void, len: u64) -> Range {
    Range {
        addr: p as u64,
        len,
        write: false,
    }
}
fn wr(p: *const c_void, len: u64) -> Range {
    Range {
        addr: p as u64,
        len,
        write: true,
    }
}

pub unsafe fn all_reduce(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        c_int,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    r: *mut c_void,
    n: u64,
    dt: c_int,
    op: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let b = bytes(n, dt);
    coll(cx, b"HcclAllReduce", st, &[rd(s, b), wr(r, b)], || {
        f(s, r, n, dt, op, comm, st)
    })
}

pub unsafe fn broadcast(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, c_int, u32, HcclComm, aclrtStream) -> HcclResult,
    b: *mut c_void,
    n: u64,
    dt: c_int,
    root: u32,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    coll(cx, b"HcclBroadcast", st, &[wr(b, bytes(n, dt))], || {
        f(b, n, dt, root, comm, st)
    })
}

pub unsafe fn all_gather(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    r: *mut c_void,
    n: u64,
    dt: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let b = bytes(n, dt);
    let ranks = rank_size(comm);
    coll(
        cx,
        b"HcclAllGather",
        st,
        &[rd(s, b), wr(r, b.saturating_mul(ranks))],
        || f(s, r, n, dt, comm, st),
    )
}

pub unsafe fn reduce_scatter(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        c_int,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    r: *mut c_void,
    n: u64,
    dt: c_int,
    op: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let b = bytes(n, dt);
    let ranks = rank_size(comm);
    coll(
        cx,
        b"HcclReduceScatter",
        st,
        &[rd(s, b.saturating_mul(ranks)), wr(r, b)],
        || f(s, r, n, dt, op, comm, st),
    )
}

pub unsafe fn reduce(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        c_int,
        c_int,
        u32,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    r: *mut c_void,
    n: u64,
    dt: c_int,
    op: c_int,
    root: u32,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let b = bytes(n, dt);
    coll(cx, b"HcclReduce", st, &[rd(s, b), wr(r, b)], || {
        f(s, r, n, dt, op, root, comm, st)
    })
}

pub unsafe fn scatter(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        c_int,
        u32,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    r: *mut c_void,
    n: u64,
    dt: c_int,
    root: u32,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let b = bytes(n, dt);
    let ranks = rank_size(comm);
    coll(
        cx,
        b"HcclScatter",
        st,
        &[rd(s, b.saturating_mul(ranks)), wr(r, b)],
        || f(s, r, n, dt, root, comm, st),
    )
}

pub unsafe fn send(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, c_int, u32, HcclComm, aclrtStream) -> HcclResult,
    b: *mut c_void,
    n: u64,
    dt: c_int,
    peer: u32,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    coll(cx, b"HcclSend", st, &[rd(b, bytes(n, dt))], || {
        f(b, n, dt, peer, comm, st)
    })
}

pub unsafe fn recv(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut c_void, u64, c_int, u32, HcclComm, aclrtStream) -> HcclResult,
    b: *mut c_void,
    n: u64,
    dt: c_int,
    peer: u32,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    coll(cx, b"HcclRecv", st, &[wr(b, bytes(n, dt))], || {
        f(b, n, dt, peer, comm, st)
    })
}

pub unsafe fn all_to_all(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_void,
        u64,
        c_int,
        *const c_void,
        u64,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *const c_void,
    sn: u64,
    stt: c_int,
    r: *const c_void,
    rn: u64,
    rt: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let ranks = rank_size(comm);
    coll(
        cx,
        b"HcclAlltoAll",
        st,
        &[
            rd(s, bytes(sn, stt).saturating_mul(ranks)),
            wr(r, bytes(rn, rt).saturating_mul(ranks)),
        ],
        || f(s, sn, stt, r, rn, rt, comm, st),
    )
}

/// Extent of a V-collective buffer: max(displ + count) elements, from the
/// host arrays of uint64 counts and displacements (one per rank).
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

pub unsafe fn all_to_all_v(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *const c_void,
        *const c_void,
        *const c_void,
        c_int,
        *const c_void,
        *const c_void,
        *const c_void,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *const c_void,
    sc: *const c_void,
    sd: *const c_void,
    stt: c_int,
    r: *const c_void,
    rcn: *const c_void,
    rd_: *const c_void,
    rt: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let ranks = rank_size(comm);
    let sb = bytes(v_extent(sc, sd, ranks), stt);
    let rb = bytes(v_extent(rcn, rd_, ranks), rt);
    coll(cx, b"HcclAlltoAllV", st, &[rd(s, sb), wr(r, rb)], || {
        f(s, sc, sd, stt, r, rcn, rd_, rt, comm, st)
    })
}

pub unsafe fn all_gather_v(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        u64,
        *mut c_void,
        *const c_void,
        *const c_void,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    sn: u64,
    r: *mut c_void,
    rcn: *const c_void,
    rdp: *const c_void,
    dt: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let ranks = rank_size(comm);
    coll(
        cx,
        b"HcclAllGatherV",
        st,
        &[
            rd(s, bytes(sn, dt)),
            wr(r, bytes(v_extent(rcn, rdp, ranks), dt)),
        ],
        || f(s, sn, r, rcn, rdp, dt, comm, st),
    )
}

pub unsafe fn reduce_scatter_v(
    cx: &Cx,
    f: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *const c_void,
        *mut c_void,
        u64,
        c_int,
        c_int,
        HcclComm,
        aclrtStream,
    ) -> HcclResult,
    s: *mut c_void,
    sc: *const c_void,
    sd: *const c_void,
    r: *mut c_void,
    rn: u64,
    dt: c_int,
    op: c_int,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let ranks = rank_size(comm);
    coll(
        cx,
        b"HcclReduceScatterV",
        st,
        &[
            rd(s, bytes(v_extent(sc, sd, ranks), dt)),
            wr(r, bytes(rn, dt)),
        ],
        || f(s, sc, sd, r, rn, dt, op, comm, st),
    )
}

pub unsafe fn batch_send_recv(
    cx: &Cx,
    f: unsafe extern "C" fn(*mut HcclSendRecvItem, u32, HcclComm, aclrtStream) -> HcclResult,
    items: *mut HcclSendRecvItem,
    n: u32,
    comm: HcclComm,
    st: aclrtStream,
) -> HcclResult {
    let mut ranges = [Range::default(); u3m_core::engine::MAX_OP_RANGES];
    let mut k = 0;
    if !items.is_null() {
        for i in 0..(n as usize).min(ranges.len()) {
            let it = &*items.add(i);
            ranges[k] = Range {
                addr: it.buf as u64,
                len: bytes(it.count, it.data_type),
                write: it.send_recv_type == 1,
            };
            k += 1;
        }
    }
    coll(cx, b"HcclBatchSendRecv", st, &ranges[..k], || {
        f(items, n, comm, st)
    })
}

pub unsafe fn comm_register(
    cx: &Cx,
    f: unsafe extern "C" fn(HcclComm, *mut c_void, u64, *mut *mut c_void, u32) -> HcclResult,
    comm: HcclComm,
    addr: *mut c_void,
    size: u64,
    h: *mut *mut c_void,
    flag: u32,
) -> HcclResult {
    let rc = f(comm, addr, size, h, flag);
    if rc == 0 {
        cx.note(|e| e.pin(addr as u64, size, PinReason::HcclRegistered));
    }
    rc
}

pub unsafe fn comm_deregister(
    _cx: &Cx,
    f: unsafe extern "C" fn(HcclComm, *mut c_void) -> HcclResult,
    comm: HcclComm,
    h: *mut c_void,
) -> HcclResult {
    f(comm, h)
}

pub unsafe fn set_memory_range(
    cx: &Cx,
    f: unsafe extern "C" fn(HcclComm, *mut c_void, usize, usize, u64) -> HcclResult,
    comm: HcclComm,
    base: *mut c_void,
    size: usize,
    align: usize,
    flags: u64,
) -> HcclResult {
    let rc = f(comm, base, size, align, flags);
    if rc == 0 {
        cx.note(|e| e.pin(base as u64, size as u64, PinReason::HcclRegistered));
    }
    rc
}

pub unsafe fn unset_memory_range(
    _cx: &Cx,
    f: unsafe extern "C" fn(HcclComm, *mut c_void) -> HcclResult,
    comm: HcclComm,
    base: *mut c_void,
) -> HcclResult {
    f(comm, base)
}

pub unsafe fn activate_comm_memory(
    cx: &Cx,
    f: unsafe extern "C" fn(
        HcclComm,
        *mut c_void,
        usize,
        usize,
        aclrtDrvMemHandle,
        u64,
    ) -> HcclResult,
    comm: HcclComm,
    va: *mut c_void,
    size: usize,
    off: usize,
    h: aclrtDrvMemHandle,
    flags: u64,
) -> HcclResult {
    let rc = f(comm, va, size, off, h, flags);
    if rc == 0 {
        cx.note(|e| e.pin(va as u64, size as u64, PinReason::HcclRegistered));
    }
    rc
}

pub unsafe fn deactivate_comm_memory(
    _cx: &Cx,
    f: unsafe extern "C" fn(HcclComm, *mut c_void) -> HcclResult,
    comm: HcclComm,
    va: *mut c_void,
) -> HcclResult {
    f(comm, va)
}
