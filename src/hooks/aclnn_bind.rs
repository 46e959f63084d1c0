//! Which tensors an aclnn executor uses, learned where the executor is
//! built. `aclnnXxxGetWorkspaceSize(args..., &ws, &executor)` runs on the
//! thread that submits the operator; with torch_npu's task queue the launch
//! `aclnnXxx(ws, wsSize, executor, stream)` runs later on another thread,
//! where nothing says which tensors it touches. So u3m hooks the
//! `GetWorkspaceSize` of every operator whose prototype it knows
//! (`u3m_core::roles`), reads the tensors (and their roles) from the raw
//! arguments and binds them to the executor the call returned; the launch
//! looks its executor up (`take`). Executors u3m did not see built — an
//! operator outside the table, a repeatable executor (whose tensor addresses
//! may be changed after it is built) — have no binding: the launch falls
//! back to its thread's pending tensors or every live tensor (aclnn.rs).
//!
//! The hook is a trampoline per operator from a fixed pool (like the
//! execute-phase ones): it takes every integer and floating-point argument
//! register and `STACK_SLOTS` stack slots, calls the real function with the
//! same values (the callee reads only those its prototype has; the extra
//! slots read the caller's frame, which is mapped), and reads the executor
//! out-parameter after the call. x86-64 and AArch64 only.

// Handlers are called by the trampolines with the program's arguments;
// their contract is the C prototype's.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::ffi::*;
use u3m_core::engine::Range;
use u3m_core::roles::{self, Loc, Param, Proto};

/// Stack slots a trampoline passes on (the widest prototype in the table,
/// aclnnFlashAttentionScoreGrad, takes 19 on x86-64).
const STACK_SLOTS: usize = 24;
const FLOAT_REGS: usize = 8;
#[cfg(target_arch = "x86_64")]
const INT_REGS: usize = 6;
#[cfg(target_arch = "aarch64")]
const INT_REGS: usize = 8;

/// The integer-class arguments of one call: registers, then stack slots.
struct RawArgs {
    int: [u64; INT_REGS],
    stack: [u64; STACK_SLOTS],
}

impl RawArgs {
    fn at(&self, loc: Loc) -> Option<u64> {
        match loc {
            Loc::Int(i) => self.int.get(i).copied(),
            Loc::Stack(k) => self.stack.get(k).copied(),
            Loc::Float(_) => None,
        }
    }
}

macro_rules! gws_abi {
    ($($i:ident)*; $($f:ident)*; $($s:ident)*) => {
        /// A `GetWorkspaceSize` as the trampolines call it: every argument
        /// register and `STACK_SLOTS` stack slots.
        pub type GwsFn = unsafe extern "C" fn($($i: u64,)* $($f: f64,)* $($s: u64,)*) -> aclnnStatus;

        #[allow(clippy::too_many_arguments)]
        unsafe extern "C" fn gws_tramp<const N: usize>($($i: u64,)* $($f: f64,)* $($s: u64,)*) -> aclnnStatus {
            let p = GWS_REAL[N].load(Ordering::Acquire);
            if p.is_null() {
                return ACLNN_ERR_INNER_NULLPTR;
            }
            // SAFETY: GWS_REAL[N] holds the real GetWorkspaceSize that dlsym
            // returned for this slot's name; calling it through the
            // all-registers signature passes every argument on unchanged.
            let real: GwsFn = std::mem::transmute(p);
            let rc = real($($i,)* $($f,)* $($s,)*);
            if rc == 0 {
                let args = RawArgs { int: [$($i),*], stack: [$($s),*] };
                bind_after(N, &args);
            }
            rc
        }
    };
}

#[cfg(target_arch = "x86_64")]
gws_abi!(i0 i1 i2 i3 i4 i5; f0 f1 f2 f3 f4 f5 f6 f7;
    s0 s1 s2 s3 s4 s5 s6 s7 s8 s9 s10 s11 s12 s13 s14 s15 s16 s17 s18 s19 s20 s21 s22 s23);
#[cfg(target_arch = "aarch64")]
gws_abi!(i0 i1 i2 i3 i4 i5 i6 i7; f0 f1 f2 f3 f4 f5 f6 f7;
    s0 s1 s2 s3 s4 s5 s6 s7 s8 s9 s10 s11 s12 s13 s14 s15 s16 s17 s18 s19 s20 s21 s22 s23);

include!(concat!(env!("OUT_DIR"), "/aclnn_gws_tramps.rs"));

/// Real function and prototype of each slot.
static GWS_REAL: [AtomicPtr<c_void>; GWS_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; GWS_SLOTS];
static GWS_PROTO: spin::Mutex<[Option<Proto>; GWS_SLOTS]> = spin::Mutex::new([None; GWS_SLOTS]);
static GWS_USED: AtomicUsize = AtomicUsize::new(0);

/// For the dlsym override: the trampoline for `<op>GetWorkspaceSize` when
/// the table has the operator's prototype (None: returned unhooked).
pub unsafe fn redirect(op: &[u8], found: *mut c_void) -> Option<*mut c_void> {
    let proto = roles::aclnn(op)?;
    if proto.stack_slots(INT_REGS, FLOAT_REGS) > STACK_SLOTS {
        return None;
    }
    let mut protos = GWS_PROTO.lock();
    let used = GWS_USED.load(Ordering::Acquire);
    for i in 0..used {
        if protos[i].map(|p| p.name) == Some(proto.name) {
            // the same operator looked up again: one slot, one real function
            return (GWS_REAL[i].load(Ordering::Acquire) == found)
                .then_some(GWS_TRAMPOLINES[i] as *mut c_void);
        }
    }
    if used == GWS_SLOTS {
        return None;
    }
    protos[used] = Some(proto);
    GWS_REAL[used].store(found, Ordering::Release);
    GWS_USED.store(used + 1, Ordering::Release);
    Some(GWS_TRAMPOLINES[used] as *mut c_void)
}

/// Every live aclTensor: its range (len 0: empty or without data).
static TENSORS: spin::Mutex<Option<HashMap<usize, Range>>> = spin::Mutex::new(None);
/// Every live aclTensorList: its tensors.
static LISTS: spin::Mutex<Option<HashMap<usize, Vec<usize>>>> = spin::Mutex::new(None);
/// Executors built through a hooked GetWorkspaceSize and not yet launched:
/// their ranges, with roles.
static EXECS: spin::Mutex<Option<HashMap<usize, Vec<Range>>>> = spin::Mutex::new(None);
/// Range lists of launched executors, reused by later bindings.
static SPARE: spin::Mutex<Vec<Vec<Range>>> = spin::Mutex::new(Vec::new());
/// More unlaunched executors than this (built and never launched nor
/// destroyed) and the bindings are dropped (launches fall back).
const EXECS_MAX: usize = 1 << 16;

pub fn tensor_created(t: usize, r: Range) {
    TENSORS.lock().get_or_insert_with(HashMap::new).insert(t, r);
}

pub fn tensor_destroyed(t: usize) {
    if let Some(m) = &mut *TENSORS.lock() {
        m.remove(&t);
    }
}

pub fn list_created(l: usize, tensors: &[usize]) {
    LISTS
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(l, tensors.to_vec());
}

/// Destroying a list destroys its tensors.
pub fn list_destroyed(l: usize) {
    let Some(ts) = LISTS.lock().as_mut().and_then(|m| m.remove(&l)) else {
        return;
    };
    if let Some(m) = &mut *TENSORS.lock() {
        for t in ts {
            m.remove(&t);
        }
    }
}

/// Every live tensor's range, each storage once (a launch whose tensors are
/// unknown).
pub fn live_ranges(out: &mut Vec<Range>) {
    let start = out.len();
    if let Some(m) = &*TENSORS.lock() {
        out.extend(m.values().filter(|r| r.len > 0).copied());
    }
    out[start..].sort_unstable_by_key(|r| (r.addr, r.len, r.write));
    dedup_from(out, start);
}

/// Removes repeated ranges from `out[start..]` (sorted).
fn dedup_from(out: &mut Vec<Range>, start: usize) {
    let mut k = start;
    for i in start..out.len() {
        if k == start || out[k - 1] != out[i] {
            out[k] = out[i];
            k += 1;
        }
    }
    out.truncate(k);
}

/// After a successful GetWorkspaceSize in slot `slot`: binds the tensors
/// of its arguments to the executor it returned.
fn bind_after(slot: usize, args: &RawArgs) {
    // only while u3m is active; the guard keeps u3m's own calls out
    let Some(_cx) = super::enter_uncounted() else {
        return;
    };
    let Some(proto) = GWS_PROTO.lock()[slot] else {
        return;
    };
    let mut ranges = SPARE.lock().pop().unwrap_or_default();
    ranges.clear();
    let exec = ranges_of(proto, args, &mut ranges);
    match exec {
        Some(e) if e != 0 => {
            let mut g = EXECS.lock();
            let m = g.get_or_insert_with(HashMap::new);
            if m.len() >= EXECS_MAX {
                m.clear();
            }
            if let Some(old) = m.insert(e, ranges) {
                // an executor address reused without a launch we saw
                SPARE.lock().push(old);
            }
        }
        _ => SPARE.lock().push(ranges),
    }
    // this thread's tensors so far are accounted for by the executor
    super::aclnn::pending_bound();
}

/// The ranges of the call's tensors into `out`, and the executor it
/// returned (None: some tensor or list unknown to u3m, or no executor).
fn ranges_of(proto: Proto, args: &RawArgs, out: &mut Vec<Range>) -> Option<usize> {
    let tensors = TENSORS.lock();
    let tm = tensors.as_ref();
    let mut exec = None;
    let tensor = |t: u64, write: bool, out: &mut Vec<Range>| -> Option<()> {
        let r = tm?.get(&(t as usize))?;
        if r.len > 0 {
            out.push(Range { write, ..*r });
        }
        Some(())
    };
    for (p, loc) in proto.locations(INT_REGS, FLOAT_REGS) {
        let v = args.at(loc);
        match (p, v) {
            (Param::Tensor { .. } | Param::List { .. }, Some(0)) => {} // an optional one, absent
            (Param::Tensor { write }, Some(t)) => tensor(t, write, out)?,
            (Param::List { write }, Some(l)) => {
                let lists = LISTS.lock();
                for &t in lists.as_ref()?.get(&(l as usize))? {
                    if t != 0 {
                        tensor(t as u64, write, out)?;
                    }
                }
            }
            (Param::Executor, Some(pp)) if pp != 0 => {
                // SAFETY: the executor out-parameter (`aclOpExecutor **`,
                // non-null) the real GetWorkspaceSize just wrote on success
                exec = Some(unsafe { (pp as *const usize).read_unaligned() });
            }
            _ => {}
        }
    }
    // one storage read and written is written; each range once
    out.sort_unstable_by_key(|r| (r.addr, r.len, !r.write));
    let mut k = 0;
    for i in 0..out.len() {
        if k > 0 && out[k - 1].addr == out[i].addr && out[k - 1].len == out[i].len {
            continue; // the written one sorts first
        }
        out[k] = out[i];
        k += 1;
    }
    out.truncate(k);
    exec
}

/// At launch: the ranges bound to `exec` appended to `out` (true), or false
/// when u3m did not see it built. The binding is consumed: a launch
/// consumes a (non-repeatable) executor.
pub fn take(exec: usize, out: &mut Vec<Range>) -> bool {
    let Some(v) = EXECS.lock().as_mut().and_then(|m| m.remove(&exec)) else {
        return false;
    };
    out.extend_from_slice(&v);
    SPARE.lock().push(v);
    true
}

/// The executor is destroyed, or made repeatable (its tensors' addresses
/// may then be changed before a later launch): no binding.
pub fn forget(exec: usize) {
    if let Some(v) = EXECS.lock().as_mut().and_then(|m| m.remove(&exec)) {
        SPARE.lock().push(v);
    }
}
