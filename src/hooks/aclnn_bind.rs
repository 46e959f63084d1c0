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
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

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
            let p = gws_current_real(N);
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
/// The real.rs epoch each GWS_REAL pointer was found in (as aclnn.rs's
/// EPOCHS: after a dlclose of the runtime it is resolved again).
static GWS_EPOCHS: [AtomicU32; GWS_SLOTS] = [const { AtomicU32::new(0) }; GWS_SLOTS];

/// Slot `slot`'s real GetWorkspaceSize, resolved again when found before
/// the current epoch (null: its library is gone).
#[inline]
fn gws_current_real(slot: usize) -> *mut c_void {
    let p = GWS_REAL[slot].load(Ordering::Acquire);
    let epoch = crate::real::epoch();
    if GWS_EPOCHS[slot].load(Ordering::Acquire) == epoch {
        return p;
    }
    // the slot is published (a trampoline handed out): its prototype is set
    let Some(op) = GWS_PROTO.lock()[slot].map(|p| p.name) else {
        return std::ptr::null_mut();
    };
    match crate::real::refresh(p, &[op.as_bytes(), b"GetWorkspaceSize"]) {
        Some(q) => {
            GWS_REAL[slot].store(q, Ordering::Release);
            GWS_EPOCHS[slot].store(epoch, Ordering::Release);
            q
        }
        None => std::ptr::null_mut(),
    }
}

/// For the dlsym override: the trampoline for `<op>GetWorkspaceSize` when
/// the table has the operator's prototype (None: returned unhooked).
pub unsafe fn redirect(op: &[u8], found: *mut c_void) -> Option<*mut c_void> {
    let proto = roles::aclnn(op)?;
    if proto.stack_slots(INT_REGS, FLOAT_REGS) > STACK_SLOTS {
        return None;
    }
    let mut protos = GWS_PROTO.lock();
    let used = GWS_USED.load(Ordering::Acquire);
    let epoch = crate::real::epoch();
    for i in 0..used {
        if protos[i].map(|p| p.name) == Some(proto.name) {
            // the same operator looked up again: one slot, one real function
            // per epoch (after a reload it follows the new definition)
            if GWS_EPOCHS[i].load(Ordering::Acquire) != epoch {
                GWS_REAL[i].store(found, Ordering::Release);
                GWS_EPOCHS[i].store(epoch, Ordering::Release);
            }
            return (GWS_REAL[i].load(Ordering::Acquire) == found)
                .then_some(GWS_TRAMPOLINES[i] as *mut c_void);
        }
    }
    if used == GWS_SLOTS {
        return None;
    }
    protos[used] = Some(proto);
    GWS_EPOCHS[used].store(epoch, Ordering::Release);
    GWS_REAL[used].store(found, Ordering::Release);
    GWS_USED.store(used + 1, Ordering::Release);
    Some(GWS_TRAMPOLINES[used] as *mut c_void)
}

/// The memory of one aclTensor: the bytes its view can touch (what it
/// reads or writes; len 0: empty or without data) and its whole storage
/// (what the runtime may require mapped: the simulator checks it).
#[derive(Clone, Copy, Debug)]
pub struct TensorMem {
    pub view: Range,
    pub storage: Range,
    /// The view is contiguous (plain format, row-major strides, a known
    /// offset, inside its storage): an operator writing every element of
    /// it writes every byte of `view`.
    pub contiguous: bool,
}

/// Hashes a pointer key in a few instructions (the default SipHash costs
/// more than the rest of a launch's bookkeeping). Keys are object addresses
/// the runtime handed out, not attacker-chosen.
#[derive(Default)]
struct PtrHash(u64);

impl Hasher for PtrHash {
    fn finish(&self) -> u64 {
        // the table indexes buckets by low bits and tags by high bits
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        let n = n as u64;
        self.0 = (n ^ (n >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type PtrMap<V> = HashMap<usize, V, BuildHasherDefault<PtrHash>>;

/// Every live aclTensor's memory.
static TENSORS: spin::Mutex<Option<PtrMap<TensorMem>>> = spin::Mutex::new(None);
/// Every live aclTensorList: its tensors.
static LISTS: spin::Mutex<Option<PtrMap<Vec<usize>>>> = spin::Mutex::new(None);
/// What an executor touches: its tensors' views with roles, and the
/// storages residency must cover besides (read).
#[derive(Default)]
struct Bound {
    ranges: Vec<Range>,
    storage: Vec<Range>,
}

/// Executors built through a hooked GetWorkspaceSize and not yet launched.
static EXECS: spin::Mutex<Option<PtrMap<Bound>>> = spin::Mutex::new(None);
/// Range lists of launched executors, reused by later bindings.
static SPARE: spin::Mutex<Vec<Bound>> = spin::Mutex::new(Vec::new());
/// More unlaunched executors than this (built and never launched nor
/// destroyed) and the bindings are dropped (launches fall back).
const EXECS_MAX: usize = 1 << 16;

pub fn tensor_created(t: usize, r: TensorMem) {
    TENSORS
        .lock()
        .get_or_insert_with(PtrMap::default)
        .insert(t, r);
}

pub fn tensor_destroyed(t: usize) {
    if let Some(m) = &mut *TENSORS.lock() {
        m.remove(&t);
    }
}

pub fn list_created(l: usize, tensors: &[usize]) {
    LISTS
        .lock()
        .get_or_insert_with(PtrMap::default)
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

/// Every live tensor's storage, each once, written (a launch whose tensors
/// are unknown).
pub fn live_ranges(out: &mut Vec<Range>) {
    let start = out.len();
    if let Some(m) = &*TENSORS.lock() {
        out.extend(m.values().map(|t| t.storage).filter(|r| r.len > 0));
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
    bind(proto, args);
}

/// After a successful GetWorkspaceSize reached through its exported hook
/// (programs linking libopapi directly), with the operator's prototype
/// (`roles::aclnn`, looked up once per hook): `ints` are its arguments in
/// order (all integer-class).
pub fn bind_direct(proto: Option<Proto>, ints: &[u64]) {
    let Some(proto) = proto else {
        return;
    };
    let mut args = RawArgs {
        int: [0; INT_REGS],
        stack: [0; STACK_SLOTS],
    };
    for (i, &v) in ints.iter().enumerate() {
        match i.checked_sub(INT_REGS) {
            None => args.int[i] = v,
            Some(k) if k < STACK_SLOTS => args.stack[k] = v,
            Some(_) => return,
        }
    }
    bind(proto, &args);
}

fn bind(proto: Proto, args: &RawArgs) {
    let mut b = SPARE.lock().pop().unwrap_or_default();
    b.ranges.clear();
    b.storage.clear();
    let exec = ranges_of(proto, args, &mut b);
    match exec {
        Some(e) if e != 0 => {
            let mut g = EXECS.lock();
            let m = g.get_or_insert_with(PtrMap::default);
            if m.len() >= EXECS_MAX {
                m.clear();
            }
            if let Some(old) = m.insert(e, b) {
                // an executor address reused without a launch we saw
                SPARE.lock().push(old);
            }
        }
        _ => SPARE.lock().push(b),
    }
    // this thread's tensors so far are accounted for by the executor
    super::aclnn::pending_bound();
}

/// The ranges of the call's tensors into `out`, and the executor it
/// returned (None: some tensor or list unknown to u3m, or no executor).
fn ranges_of(proto: Proto, args: &RawArgs, b: &mut Bound) -> Option<usize> {
    let tensors = TENSORS.lock();
    let tm = tensors.as_ref();
    let mut exec = None;
    let tensor = |t: u64, write: bool, out: bool, b: &mut Bound| -> Option<()> {
        let m = tm?.get(&(t as usize))?;
        if m.view.len > 0 {
            // an out-of-place output, contiguous: written whole (unless it
            // overlaps another tensor of the call: see below)
            let whole = write && out && m.contiguous;
            b.ranges.push(Range {
                write,
                whole,
                ..m.view
            });
        }
        if m.storage.len > 0 && m.storage != m.view {
            b.storage.push(Range {
                write: false,
                ..m.storage
            });
        }
        Some(())
    };
    for (p, loc) in proto.locations(INT_REGS, FLOAT_REGS) {
        let v = args.at(loc);
        match (p, v) {
            (Param::Tensor { .. } | Param::List { .. }, Some(0)) => {} // an optional one, absent
            (Param::Tensor { write, out }, Some(t)) => tensor(t, write, out, b)?,
            (Param::List { write }, Some(l)) => {
                let lists = LISTS.lock();
                for &t in lists.as_ref()?.get(&(l as usize))? {
                    if t != 0 {
                        tensor(t as u64, write, false, b)?;
                    }
                }
            }
            // an `aclOpExecutor **` is an aligned user address; anything else
            // means the runtime's prototype is not the table's: no binding
            (Param::Executor, Some(pp)) if pp >= 1 << 16 && pp % 8 == 0 => {
                // SAFETY: the executor out-parameter the real GetWorkspaceSize
                // just wrote on success; every tensor argument before it was
                // one u3m created, so the arguments are laid out as the
                // table says (tests/abi_conformance.rs holds the simulator's
                // prototypes to CANN's headers)
                exec = Some(unsafe { (pp as *const usize).read_unaligned() });
            }
            (Param::Executor, _) => return None,
            _ => {}
        }
    }
    // one range read and written is written; each range once
    let out = &mut b.ranges;
    out.sort_unstable_by_key(|r| (r.addr, r.len, !r.write));
    // an output overlapping another tensor of the call (an input it reads,
    // the same tensor passed twice) is not written whole: sorted by
    // address, a range overlaps an earlier one when it starts before the
    // furthest end so far, a later one when the next starts before its end
    let mut reach = 0;
    for i in 0..out.len() {
        let end = out[i].addr + out[i].len;
        let overlaps = out[i].addr < reach || out.get(i + 1).is_some_and(|n| n.addr < end);
        reach = reach.max(end);
        out[i].whole &= !overlaps;
    }
    let mut k = 0;
    for i in 0..out.len() {
        if k > 0 && out[k - 1].addr == out[i].addr && out[k - 1].len == out[i].len {
            continue; // the written one sorts first
        }
        out[k] = out[i];
        k += 1;
    }
    out.truncate(k);
    b.storage.sort_unstable_by_key(|r| (r.addr, r.len));
    dedup_from(&mut b.storage, 0);
    exec
}

/// At launch: the ranges bound to `exec` appended to `out` and the
/// storages residency must cover besides to `storage` (true), or false
/// when u3m did not see it built. The binding is consumed: a launch
/// consumes a (non-repeatable) executor.
pub fn take(exec: usize, out: &mut Vec<Range>, storage: &mut Vec<Range>) -> bool {
    let Some(b) = EXECS.lock().as_mut().and_then(|m| m.remove(&exec)) else {
        return false;
    };
    out.extend_from_slice(&b.ranges);
    storage.extend_from_slice(&b.storage);
    SPARE.lock().push(b);
    true
}

/// The executor is destroyed, or made repeatable (its tensors' addresses
/// may then be changed before a later launch): no binding.
pub fn forget(exec: usize) {
    if let Some(v) = EXECS.lock().as_mut().and_then(|m| m.remove(&exec)) {
        SPARE.lock().push(v);
    }
}
