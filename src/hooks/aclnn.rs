//! aclnn. Every operator executes as `aclnnXxx(workspace, workspaceSize,
//! executor, stream)` — one signature for all ~900 of them — after
//! `aclnnXxxGetWorkspaceSize(tensors..., &ws, &executor)` built the executor
//! from tensors made with aclCreateTensor. u3m intercepts the execute phase of
//! every operator generically: the dlsym override hands out a trampoline from a
//! fixed pool for any `aclnn*` name whose `*GetWorkspaceSize` companion exists
//! in the same library; at launch, the tensors this thread created since its
//! previous launch (their storage footprints) and the workspace are the
//! launch's accesses. Tensors are tracked per thread in a fixed array: no
//! allocation, no lock on the launch path.

// Handlers are called by the generated wrappers and trampolines with the
// program's arguments; their contract is the C prototype's.
#![allow(clippy::missing_safety_doc)]

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::args::{self, *};
use super::{Cx, Real};
use crate::ffi::*;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Queue, Range, MAX_OP_RANGES};

pub type ExecFn = unsafe extern "C" fn(*mut c_void, u64, *mut c_void, aclrtStream) -> aclnnStatus;

include!(concat!(env!("OUT_DIR"), "/aclnn_tramps.rs"));

/// Real execute function and operator name of each slot.
static REAL: [AtomicPtr<c_void>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
const NAME_MAX: usize = 96;
struct Names(UnsafeCell<[[u8; NAME_MAX]; SLOTS]>);
// A slot's name is written once, before its REAL pointer is published.
unsafe impl Sync for Names {}
static NAMES: Names = Names(UnsafeCell::new([[0; NAME_MAX]; SLOTS]));
static USED: AtomicUsize = AtomicUsize::new(0);
static CLAIM: spin::Mutex<()> = spin::Mutex::new(());

unsafe extern "C" fn tramp<const N: usize>(
    ws: *mut c_void,
    ws_size: u64,
    exec: *mut c_void,
    stream: aclrtStream,
) -> aclnnStatus {
    launch(N, ws, ws_size, exec, stream)
}

fn slot_name(slot: usize) -> &'static [u8] {
    let n = unsafe { &(*NAMES.0.get())[slot] };
    let len = n.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
    &n[..len]
}

/// For the dlsym override: the trampoline for an aclnn execute-phase lookup,
/// or None when `name` is not one (or the pool is exhausted: then the real
/// function is returned unobserved, and counted).
pub unsafe fn redirect(
    handle: *mut c_void,
    name: &[u8],
    found: *mut c_void,
) -> Option<*mut c_void> {
    // every two-phase operator: aclnnXxx, and the few op-api operators
    // without the aclnn prefix (aclStft, aclRfft1D); the companion check
    // below is what decides
    if !name.starts_with(b"acl")
        || name.ends_with(b"GetWorkspaceSize")
        || name.len() + 17 > NAME_MAX
    {
        return None;
    }
    // only two-phase operators: "<name>GetWorkspaceSize" must exist alongside
    let mut buf = [0u8; NAME_MAX + 20];
    buf[..name.len()].copy_from_slice(name);
    buf[name.len()..name.len() + 16].copy_from_slice(b"GetWorkspaceSize");
    if crate::dl::real_dlsym(handle, buf.as_ptr() as *const c_char).is_null() {
        return None;
    }
    let _g = CLAIM.lock();
    let used = USED.load(Ordering::Acquire);
    for (i, r) in REAL.iter().enumerate().take(used) {
        if r.load(Ordering::Acquire) == found {
            return Some(TRAMPOLINES[i] as *mut c_void);
        }
    }
    if used == SLOTS {
        crate::init::warn_once(
            "aclnn trampoline pool exhausted: further operators are not observed",
        );
        return None;
    }
    (&mut (*NAMES.0.get())[used])[..name.len()].copy_from_slice(name);
    REAL[used].store(found, Ordering::Release);
    USED.store(used + 1, Ordering::Release);
    Some(TRAMPOLINES[used] as *mut c_void)
}

unsafe fn launch(
    slot: usize,
    ws: *mut c_void,
    ws_size: u64,
    exec: *mut c_void,
    stream: aclrtStream,
) -> aclnnStatus {
    let p = REAL[slot].load(Ordering::Acquire);
    if p.is_null() {
        return ACLNN_ERR_INNER_NULLPTR;
    }
    let f: ExecFn = std::mem::transmute(p);
    match super::enter_uncounted() {
        Some(cx) => launch_with(&cx, f, slot_name(slot), ws, ws_size, exec, stream),
        None => f(ws, ws_size, exec, stream),
    }
}

/// The execute phase of an aclnn operator named `name` (with its prefix):
/// the pending tensors of this thread and the workspace are its accesses.
pub unsafe fn launch_with(
    cx: &Cx,
    f: ExecFn,
    name: &[u8],
    ws: *mut c_void,
    ws_size: u64,
    exec: *mut c_void,
    stream: aclrtStream,
) -> aclnnStatus {
    let mut ranges = [Range::default(); MAX_OP_RANGES];
    let mut n = PENDING.with(|p| p.drain_into(&mut ranges));
    let has_ws = !ws.is_null() && ws_size > 0;
    if has_ws && n < MAX_OP_RANGES {
        ranges[n] = Range {
            addr: ws as u64,
            len: ws_size,
            write: true,
        };
        n += 1;
    }
    // With torch_npu's task queue, tensors are created on the submitting
    // thread and launched on the queue thread: this thread then has no
    // pending tensors, and residency must cover every live tensor (a
    // superset: those of the launches queued ahead too).
    let tiering = cx.note(|e| e.residency().map(|t| t.active()).unwrap_or(false));
    let live;
    // more tensors than the pending list holds: the same superset
    let overflow = PENDING.with(|p| p.overflow.take());
    let resident = if tiering && (n <= usize::from(has_ws) || overflow || n == MAX_OP_RANGES) {
        live = live_ranges(ws, ws_size);
        Some(&live[..])
    } else {
        None
    };
    let call = Call::Launch(Launch {
        kind: LaunchKind::Aclnn,
        name: Some(name),
        class: u3m_core::opclass::classify_bytes(name).0,
        ranges: &ranges[..n],
        resident,
        flops: None,
        q: Queue::on(stream as u64),
        api: Api::Aclnn,
    });
    cx.run(&call, || f(ws, ws_size, exec, stream))
}

/// Operators exported for programs that link libopapi directly (their calls
/// bind through the PLT, which no dlsym override sees). Every other operator
/// is reached generically through dlsym (`redirect`).
pub mod direct {
    use super::*;
    macro_rules! direct {
        ($($name:ident),*) => {$(
            #[allow(non_snake_case)]
            pub unsafe fn $name(cx: &Cx, real: Real<args::$name>, a: args::$name) -> aclnnStatus {
                launch_with(cx, real.0, stringify!($name).as_bytes(), a.workspace, a.workspace_size, a.executor, a.stream)
            }
        )*};
    }
    direct!(aclnnAdd, aclnnMul, aclnnMatmul, aclnnSoftmax);
}

/// Every tensor created and not yet destroyed, on any thread (tier mode's
/// residency for launches whose tensors another thread created).
static LIVE: spin::Mutex<Vec<(usize, Range)>> = spin::Mutex::new(Vec::new());

fn live_ranges(ws: *mut c_void, ws_size: u64) -> Vec<Range> {
    let mut v: Vec<Range> = Vec::new();
    for (_, r) in LIVE.lock().iter() {
        if !v.contains(r) {
            v.push(*r);
        }
    }
    if !ws.is_null() && ws_size > 0 {
        v.push(Range {
            addr: ws as u64,
            len: ws_size,
            write: true,
        });
    }
    v
}

/// Tensors created on this thread since its last aclnn launch.
struct Pending {
    t: UnsafeCell<[(usize, Range); MAX_OP_RANGES]>,
    n: std::cell::Cell<usize>,
    /// A tensor did not fit since the last launch.
    overflow: std::cell::Cell<bool>,
}

impl Pending {
    const fn new() -> Pending {
        Pending {
            t: UnsafeCell::new([(0, Range::ZERO); MAX_OP_RANGES]),
            n: std::cell::Cell::new(0),
            overflow: std::cell::Cell::new(false),
        }
    }
    fn push(&self, tensor: usize, r: Range) {
        let n = self.n.get();
        if n < MAX_OP_RANGES {
            unsafe { (*self.t.get())[n] = (tensor, r) };
            self.n.set(n + 1);
        } else {
            self.overflow.set(true);
        }
    }
    fn forget(&self, tensor: usize) {
        let t = unsafe { &mut *self.t.get() };
        let n = self.n.get();
        if let Some(i) = t[..n].iter().position(|e| e.0 == tensor) {
            t[i] = t[n - 1];
            self.n.set(n - 1);
        }
    }
    /// All pending tensors are treated as read and written: the executor's
    /// roles are opaque, and a conservative write keeps dirty tracking right.
    fn drain_into(&self, out: &mut [Range; MAX_OP_RANGES]) -> usize {
        let t = unsafe { &*self.t.get() };
        let n = self.n.get();
        let mut k = 0;
        for e in &t[..n] {
            // several tensors viewing one storage are one access
            if !out[..k].contains(&e.1) {
                out[k] = e.1;
                k += 1;
            }
        }
        self.n.set(0);
        k
    }
}

thread_local! {
    static PENDING: Pending = const { Pending::new() };
}

/// Storage footprint of a tensor: prod(storageDims) * element size.
unsafe fn footprint(dtype: c_int, dims: *const i64, n: u64) -> u64 {
    let es = acl_dtype_size(dtype);
    if dims.is_null() || n == 0 || n > 64 || es == 0 {
        return 0;
    }
    let mut e: u64 = 1;
    for i in 0..n as usize {
        let d = *dims.add(i);
        if d < 0 {
            return 0;
        }
        e = e.saturating_mul(d as u64);
    }
    e.saturating_mul(es)
}

pub unsafe fn create_tensor(
    cx: &Cx,
    real: Real<aclCreateTensor>,
    a: aclCreateTensor,
) -> *mut c_void {
    let t = real.call(a);
    if !t.is_null() && !a.tensor_data.is_null() {
        let len = footprint(a.data_type, a.storage_dims, a.storage_dims_num);
        if len > 0 {
            let r = Range {
                addr: a.tensor_data as u64,
                len,
                write: true,
            };
            PENDING.with(|p| p.push(t as usize, r));
            if cx.note(|e| e.residency().is_some()) {
                let mut l = LIVE.lock();
                if l.len() < 1 << 16 {
                    l.push((t as usize, r));
                }
            }
            cx.note(|e| e.tensor_created());
        }
    }
    t
}

pub unsafe fn destroy_tensor(
    _cx: &Cx,
    real: Real<aclDestroyTensor>,
    a: aclDestroyTensor,
) -> aclnnStatus {
    PENDING.with(|p| p.forget(a.tensor as usize));
    forget_live(a.tensor as usize);
    real.call(a)
}

fn forget_live(t: usize) {
    let mut l = LIVE.lock();
    if let Some(i) = l.iter().rposition(|e| e.0 == t) {
        l.swap_remove(i);
    }
}

pub unsafe fn create_tensor_list(
    _cx: &Cx,
    real: Real<aclCreateTensorList>,
    a: aclCreateTensorList,
) -> *mut c_void {
    real.call(a)
}

pub unsafe fn destroy_tensor_list(
    _cx: &Cx,
    real: Real<aclDestroyTensorList>,
    a: aclDestroyTensorList,
) -> aclnnStatus {
    real.call(a)
}

/// Number of aclnn operators given a trampoline so far.
pub fn slots_used() -> usize {
    USED.load(Ordering::Acquire)
}
