//! aclnn. Every operator executes as `aclnnXxx(workspace, workspaceSize,
//! executor, stream)` — one signature for all ~900 of them — after
//! `aclnnXxxGetWorkspaceSize(tensors..., &ws, &executor)` built the executor
//! from tensors made with aclCreateTensor. u3m intercepts the execute phase of
//! every operator generically: the dlsym override hands out a trampoline from a
//! fixed pool for any `aclnn*` name whose `*GetWorkspaceSize` companion exists
//! in the same library; at launch, the tensors this thread created since its
//! previous launch (their storage footprints) and the workspace are the
//! launch's accesses, every one of them (a foreach operator passes every
//! parameter of a model). Tensors are tracked per thread in a list that grows
//! and is reused: no allocation once warm, no lock on the launch path.

// Handlers are called by the generated wrappers and trampolines with the
// program's arguments; their contract is the C prototype's.
#![allow(clippy::missing_safety_doc)]

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::args::{self, *};
use super::{Cx, Real};
use crate::ffi::*;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Queue, Range};

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
    if !name.starts_with(b"acl") || name.len() + 17 > NAME_MAX {
        return None;
    }
    if let Some(op) = name.strip_suffix(b"GetWorkspaceSize") {
        // the build phase of an operator whose prototype u3m knows: its
        // tensors are bound to the executor it returns (aclnn_bind.rs)
        return super::aclnn_bind::redirect(op, found);
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
    super::ranges::with(|ranges| {
        // the executor's own tensors when u3m saw it built (with roles);
        // else this thread's tensors since its last launch
        let mine = if super::aclnn_bind::take(exec as usize, ranges) {
            let _ = PENDING.try_with(|p| p.clear());
            Mine::Complete
        } else {
            PENDING
                .try_with(|p| p.drain_into(ranges))
                .unwrap_or(Mine::Unknown)
        };
        let has_ws = !ws.is_null() && ws_size > 0;
        if has_ws {
            ranges.push(Range {
                addr: ws as u64,
                len: ws_size,
                write: true,
            });
        }
        // With torch_npu's task queue, tensors are created on the submitting
        // thread and launched on the queue thread: an executor u3m did not
        // see built then has no tensors on this thread, and residency must
        // cover every live tensor (a superset: those of the launches queued
        // ahead too). So must it when this thread's pending list overflowed.
        // A launch whose tensors were created here but are all empty (no
        // range) is this thread's own: it touches nothing but its workspace.
        let tiering = cx.note(|e| e.residency().map(|t| t.active()).unwrap_or(false));
        let mut live = Vec::new();
        let resident = if tiering && mine == Mine::Unknown {
            super::aclnn_bind::live_ranges(&mut live);
            if has_ws {
                live.push(Range {
                    addr: ws as u64,
                    len: ws_size,
                    write: true,
                });
            }
            Some(&live[..])
        } else {
            None
        };
        let call = Call::Launch(Launch {
            kind: LaunchKind::Aclnn,
            name: Some(name),
            class: u3m_core::opclass::classify_bytes(name).0,
            ranges,
            resident,
            flops: None,
            q: Queue::on(stream as u64),
            api: Api::Aclnn,
        });
        cx.run(&call, || f(ws, ws_size, exec, stream))
    })
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

/// Most tensors one thread keeps pending between launches. A thread that
/// creates tensors and never launches (torch_npu's submitting thread, whose
/// launches run on the task queue's thread) must not grow without bound;
/// past this, the list is marked incomplete and the next launch on this
/// thread is made resident with every live tensor.
const PENDING_MAX: usize = 1 << 14;

/// Tensors created on this thread since its last aclnn launch. The list
/// grows as needed and is reused: no allocation per launch once warm.
struct Pending {
    t: RefCell<Vec<(usize, Range)>>,
    /// Tensors were created past `PENDING_MAX` since the last launch.
    overflow: Cell<bool>,
    /// A tensor (with a range or empty) was created since the last launch.
    created: Cell<bool>,
}

/// Whether a launch's tensors are known from its own thread.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mine {
    /// Every tensor this thread created since its last launch was recorded.
    Complete,
    /// None created here (another thread built the launch), or some not
    /// recorded (overflow): the launch's tensors are unknown.
    Unknown,
}

impl Pending {
    const fn new() -> Pending {
        Pending {
            t: RefCell::new(Vec::new()),
            overflow: Cell::new(false),
            created: Cell::new(false),
        }
    }
    /// Forgets every pending tensor (they are bound to an executor).
    fn clear(&self) {
        self.overflow.set(false);
        self.created.set(false);
        if let Ok(mut t) = self.t.try_borrow_mut() {
            t.clear();
        }
    }
    /// A tensor without a range (empty, or no data) was created.
    fn created_empty(&self) {
        self.created.set(true);
    }
    fn push(&self, tensor: usize, r: Range) {
        self.created.set(true);
        let Ok(mut t) = self.t.try_borrow_mut() else {
            self.overflow.set(true);
            return;
        };
        if t.len() < PENDING_MAX {
            t.push((tensor, r));
        } else {
            self.overflow.set(true);
        }
    }
    fn forget(&self, tensor: usize) {
        if let Ok(mut t) = self.t.try_borrow_mut() {
            if let Some(i) = t.iter().rposition(|e| e.0 == tensor) {
                t.swap_remove(i);
            }
        }
    }
    /// Appends the pending tensors' ranges to `out` (each storage once) and
    /// empties the list. All are treated as read and written: the
    /// executor's roles are opaque, and a conservative write keeps dirty
    /// tracking right.
    fn drain_into(&self, out: &mut Vec<Range>) -> Mine {
        let overflow = self.overflow.replace(false);
        let created = self.created.replace(false);
        let mine = if created && !overflow {
            Mine::Complete
        } else {
            Mine::Unknown
        };
        let Ok(mut t) = self.t.try_borrow_mut() else {
            return Mine::Unknown;
        };
        let start = out.len();
        if t.len() <= 64 {
            for e in t.iter() {
                // several tensors viewing one storage are one access
                if !out[start..].contains(&e.1) {
                    out.push(e.1);
                }
            }
        } else {
            // wide launches (foreach operators): sort instead of a quadratic scan
            out.extend(t.iter().map(|e| e.1));
            out[start..].sort_unstable_by_key(|r| (r.addr, r.len, r.write));
            let mut k = start;
            for i in start..out.len() {
                if k == start || out[k - 1] != out[i] {
                    out[k] = out[i];
                    k += 1;
                }
            }
            out.truncate(k);
        }
        t.clear();
        mine
    }
}

thread_local! {
    static PENDING: Pending = const { Pending::new() };
}

/// A GetWorkspaceSize on this thread bound the tensors so far to its
/// executor: they are no longer pending.
pub(super) fn pending_bound() {
    let _ = PENDING.try_with(|p| p.clear());
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
    if !t.is_null() {
        let len = if a.tensor_data.is_null() {
            0
        } else {
            footprint(a.data_type, a.storage_dims, a.storage_dims_num)
        };
        let r = Range {
            addr: a.tensor_data as u64,
            len,
            write: true,
        };
        // known to executors built from it (len 0: touches nothing)
        super::aclnn_bind::tensor_created(t as usize, r);
        if len == 0 {
            // an empty tensor still says this thread builds its launches
            let _ = PENDING.try_with(|p| p.created_empty());
        } else {
            let _ = PENDING.try_with(|p| p.push(t as usize, r));
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
    let _ = PENDING.try_with(|p| p.forget(a.tensor as usize));
    super::aclnn_bind::tensor_destroyed(a.tensor as usize);
    real.call(a)
}

/// Longest tensor list recorded (a longer one is unknown to u3m: its
/// executors fall back to the pending or live tensors).
const LIST_MAX: u64 = 1 << 20;

pub unsafe fn create_tensor_list(
    _cx: &Cx,
    real: Real<aclCreateTensorList>,
    a: aclCreateTensorList,
) -> *mut c_void {
    let l = real.call(a);
    if !l.is_null() && (a.size == 0 || !a.value.is_null()) && a.size <= LIST_MAX {
        let ts: &[*const c_void] = if a.size == 0 {
            &[]
        } else {
            // SAFETY: the runtime accepted `value` as an array of `size`
            // tensor pointers (it copied them into the list it returned)
            std::slice::from_raw_parts(a.value, a.size as usize)
        };
        // SAFETY: `*const c_void` and `usize` have the same size and layout
        let ts: &[usize] = std::mem::transmute::<&[*const c_void], &[usize]>(ts);
        super::aclnn_bind::list_created(l as usize, ts);
    }
    l
}

pub unsafe fn destroy_tensor_list(
    _cx: &Cx,
    real: Real<aclDestroyTensorList>,
    a: aclDestroyTensorList,
) -> aclnnStatus {
    // destroying a list destroys its tensors
    super::aclnn_bind::list_destroyed(a.list as usize);
    real.call(a)
}

/// A repeatable executor may be launched again after its tensors' addresses
/// changed (aclSetInputTensorAddr and friends): u3m drops its binding.
pub unsafe fn set_executor_repeatable(
    _cx: &Cx,
    real: Real<aclSetAclOpExecutorRepeatable>,
    a: aclSetAclOpExecutorRepeatable,
) -> aclnnStatus {
    super::aclnn_bind::forget(a.executor as usize);
    real.call(a)
}

pub unsafe fn destroy_executor(
    _cx: &Cx,
    real: Real<aclDestroyAclOpExecutor>,
    a: aclDestroyAclOpExecutor,
) -> aclnnStatus {
    super::aclnn_bind::forget(a.executor as usize);
    real.call(a)
}

/// Number of aclnn operators given a trampoline so far.
pub fn slots_used() -> usize {
    USED.load(Ordering::Acquire)
}
