//! aclnn. Every operator executes as `aclnnXxx(workspace, workspaceSize,
//! executor, stream)` — one signature for all ~900 of them — after
//! `aclnnXxxGetWorkspaceSize(tensors..., &ws, &executor)` built the executor
//! from tensors made with aclCreateTensor. u3m intercepts the execute phase of
//! every operator generically: the dlsym override hands out a trampoline from a
//! fixed pool for any `aclnn*` name whose `*GetWorkspaceSize` companion exists
//! in the same library. A launch's accesses are the tensors bound to its
//! executor where it was built (`aclnn_bind.rs`: views with roles), else the
//! tensors this thread created since its previous launch (all written), and
//! the workspace — every one of them (a foreach operator passes every
//! parameter of a model). Pending tensors are tracked per thread in a list
//! that grows and is reused: no allocation once warm.

// Handlers are called by the generated wrappers and trampolines with the
// program's arguments; their contract is the C prototype's.
#![allow(clippy::missing_safety_doc)]

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use super::aclnn_bind::TensorMem;
use super::args::{self, *};
use super::{Cx, Real};
use crate::ffi::*;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Queue, Range};

pub type ExecFn = unsafe extern "C" fn(*mut c_void, u64, *mut c_void, aclrtStream) -> aclnnStatus;

include!(concat!(env!("OUT_DIR"), "/aclnn_tramps.rs"));

/// Real execute function and operator name of each slot.
static REAL: [AtomicPtr<c_void>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
/// The real.rs epoch each REAL pointer was found in: after a dlclose of the
/// runtime a slot's pointer may lie in an unloaded libopapi, so its next
/// call resolves it again (`current_real`).
static EPOCHS: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
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
    // SAFETY: a slot's name is written once, before its REAL pointer is
    // published (release); callers reach a slot only through that pointer
    let n = unsafe { &(*NAMES.0.get())[slot] };
    let len = n.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
    &n[..len]
}

/// For the dlsym override: the trampoline for an aclnn execute-phase lookup,
/// or None when `name` is not one (or the pool is exhausted: then the real
/// function is returned unobserved, and counted).
///
/// # Safety
/// `handle` is a handle dlsym accepted; `found` what dlsym returned for
/// `name` under it (a function with the execute-phase prototype when the
/// `GetWorkspaceSize` companion exists).
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
    let epoch = crate::real::epoch();
    for (i, r) in REAL.iter().enumerate().take(used) {
        if r.load(Ordering::Acquire) == found {
            if slot_name(i) != name {
                continue;
            }
            EPOCHS[i].store(epoch, Ordering::Release);
            return Some(TRAMPOLINES[i] as *mut c_void);
        }
        if EPOCHS[i].load(Ordering::Acquire) != epoch && slot_name(i) == name {
            // the operator again after its library was reloaded elsewhere:
            // the slot (and trampolines handed out before) follow it
            r.store(found, Ordering::Release);
            EPOCHS[i].store(epoch, Ordering::Release);
            return Some(TRAMPOLINES[i] as *mut c_void);
        }
    }
    if used == SLOTS {
        crate::init::warn_once(
            "aclnn trampoline pool exhausted: further operators are not observed",
        );
        return None;
    }
    // SAFETY: slot `used` is unpublished (USED not yet bumped) and CLAIM is
    // held: nobody else reads or writes its name
    (&mut (*NAMES.0.get())[used])[..name.len()].copy_from_slice(name);
    EPOCHS[used].store(epoch, Ordering::Release);
    REAL[used].store(found, Ordering::Release);
    USED.store(used + 1, Ordering::Release);
    Some(TRAMPOLINES[used] as *mut c_void)
}

/// Slot `slot`'s real function, resolved again when found before the
/// current epoch (null: its library is gone).
#[inline]
fn current_real(slot: usize) -> *mut c_void {
    let p = REAL[slot].load(Ordering::Acquire);
    let epoch = crate::real::epoch();
    if EPOCHS[slot].load(Ordering::Acquire) == epoch {
        return p;
    }
    match crate::real::refresh(p, &[slot_name(slot)]) {
        Some(q) => {
            REAL[slot].store(q, Ordering::Release);
            EPOCHS[slot].store(epoch, Ordering::Release);
            q
        }
        None => std::ptr::null_mut(),
    }
}

/// A trampoline's call. Safety: the program's execute-phase arguments.
unsafe fn launch(
    slot: usize,
    ws: *mut c_void,
    ws_size: u64,
    exec: *mut c_void,
    stream: aclrtStream,
) -> aclnnStatus {
    let p = current_real(slot);
    if p.is_null() {
        return ACLNN_ERR_INNER_NULLPTR;
    }
    // SAFETY: REAL[slot] holds the execute-phase function dlsym returned for
    // this slot's name; every aclnn execute phase has the ExecFn prototype
    let f: ExecFn = std::mem::transmute(p);
    match super::enter_uncounted() {
        Some(cx) => launch_with(&cx, f, slot_name(slot), ws, ws_size, exec, stream),
        None => f(ws, ws_size, exec, stream),
    }
}

/// The execute phase of an aclnn operator named `name` (with its prefix):
/// its executor's bound tensors (else this thread's pending ones) and the
/// workspace are its accesses.
///
/// # Safety
/// `f` is the operator's real execute phase; the other arguments are the
/// program's, passed on unchanged.
pub unsafe fn launch_with(
    cx: &Cx,
    f: ExecFn,
    name: &[u8],
    ws: *mut c_void,
    ws_size: u64,
    exec: *mut c_void,
    stream: aclrtStream,
) -> aclnnStatus {
    super::ranges::with2(cx, |ranges, extra| {
        // the executor's own tensors when u3m saw it built (with roles);
        // else this thread's tensors since its last launch. `extra`: the
        // storages around their views, which residency covers too (read)
        let mine = if super::aclnn_bind::take(exec as usize, ranges, extra) {
            let _ = PENDING.try_with(|p| p.clear());
            Mine::Complete
        } else {
            PENDING
                .try_with(|p| p.drain_into(ranges, extra))
                .unwrap_or(Mine::Unknown)
        };
        let has_ws = !ws.is_null() && ws_size > 0;
        if has_ws {
            ranges.push(Range {
                addr: ws as u64,
                len: ws_size,
                write: true,
                whole: false,
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
        let resident = if !tiering {
            None
        } else if mine == Mine::Unknown {
            extra.clear();
            super::aclnn_bind::live_ranges(extra);
            extra.extend_from_slice(ranges);
            Some(&extra[..])
        } else if !extra.is_empty() {
            extra.extend_from_slice(ranges);
            Some(&extra[..])
        } else {
            None
        };
        // the name classified once: the class for the policy, the hash for
        // the heat table
        let (class, op_hash) = u3m_core::opclass::classify_bytes(name);
        let call = Call::Launch(Launch {
            kind: LaunchKind::Aclnn,
            name: Some(name),
            class,
            op_hash: Some(op_hash),
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

    // their build phases: the tensors bound to the executor, with roles
    macro_rules! direct_gws {
        ($($name:ident => $op:literal ($($arg:ident),*)),*) => {$(
            #[allow(non_snake_case)]
            pub unsafe fn $name(_cx: &Cx, real: Real<args::$name>, a: args::$name) -> aclnnStatus {
                let rc = real.call(a);
                if rc == 0 {
                    static PROTO: std::sync::OnceLock<Option<u3m_core::roles::Proto>> =
                        std::sync::OnceLock::new();
                    let proto = *PROTO.get_or_init(|| u3m_core::roles::aclnn($op));
                    super::super::aclnn_bind::bind_direct(proto, &[$(a.$arg as u64),*]);
                }
                rc
            }
        )*};
    }
    direct_gws!(
        aclnnAddGetWorkspaceSize => b"aclnnAdd" (self_, other, alpha, out, workspace_size, executor),
        aclnnMulGetWorkspaceSize => b"aclnnMul" (self_, other, out, workspace_size, executor),
        aclnnMatmulGetWorkspaceSize => b"aclnnMatmul" (self_, mat2, out, cube_math_type, workspace_size, executor),
        aclnnSoftmaxGetWorkspaceSize => b"aclnnSoftmax" (self_, dim, out, workspace_size, executor)
    );
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
    t: RefCell<Vec<(usize, TensorMem)>>,
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
    fn push(&self, tensor: usize, r: TensorMem) {
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
    fn drain_into(&self, out: &mut Vec<Range>, storage: &mut Vec<Range>) -> Mine {
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
        out.extend(t.iter().map(|e| e.1.view).filter(|r| r.len > 0));
        dedup(out, start);
        // the storages around views, for residency (read)
        let s0 = storage.len();
        storage.extend(t.iter().filter(|e| e.1.storage != e.1.view).map(|e| Range {
            write: false,
            ..e.1.storage
        }));
        dedup(storage, s0);
        t.clear();
        mine
    }
}

/// Removes repeated ranges from `v[start..]` (several tensors viewing the
/// same bytes are one access); order kept for a few, sorted for many.
fn dedup(v: &mut Vec<Range>, start: usize) {
    if v.len() - start <= 64 {
        let mut k = start;
        for i in start..v.len() {
            if !v[start..k].contains(&v[i]) {
                v[k] = v[i];
                k += 1;
            }
        }
        v.truncate(k);
    } else {
        // wide launches (foreach operators): sort instead of a quadratic scan
        v[start..].sort_unstable_by_key(|r| (r.addr, r.len, r.write));
        let mut k = start;
        for i in start..v.len() {
            if k == start || v[k - 1] != v[i] {
                v[k] = v[i];
                k += 1;
            }
        }
        v.truncate(k);
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

/// Storage footprint of a tensor: prod(storageDims) * element size (no
/// dimensions: one element).
///
/// # Safety
/// `dims` is null or points to `n` readable i64 (aclCreateTensor's contract,
/// which the runtime accepted).
unsafe fn footprint(dtype: c_int, dims: *const i64, n: u64) -> u64 {
    let es = acl_dtype_size(dtype);
    if (dims.is_null() && n > 0) || n > 64 || es == 0 {
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

/// Formats whose strides describe memory (NCHW, NHWC, ND, NDHWC, NCDHW);
/// the others (fractal, C0-blocked) are laid out by their storage shape.
const PLAIN_FORMATS: [c_int; 5] = [0, 1, 2, 27, 30];

/// The bytes a tensor can touch, as (offset from its data pointer, length):
/// its view — element `offset` plus (dims - 1) × strides — when its format
/// is plain and the view lies in the storage, so a view into a large buffer
/// (a KV-cache append, a slice) covers only its own chunks; else the whole
/// storage footprint. (0, 0): empty.
///
/// # Safety
/// `a` holds the arguments of an aclCreateTensor the runtime accepted: its
/// view dims and strides point to `view_dims_num` readable i64 each.
unsafe fn extent(a: &aclCreateTensor) -> (u64, u64) {
    let storage = footprint(a.data_type, a.storage_dims, a.storage_dims_num);
    let es = acl_dtype_size(a.data_type);
    let n = a.view_dims_num as usize;
    if storage == 0
        || !PLAIN_FORMATS.contains(&a.format)
        || n > 64
        || a.offset < 0
        || (n > 0 && (a.view_dims.is_null() || a.stride.is_null()))
    {
        return (0, storage);
    }
    // last element's index, in elements from the data pointer
    let mut last = a.offset as i128;
    for i in 0..n {
        let (d, st) = (*a.view_dims.add(i), *a.stride.add(i));
        if d == 0 {
            return (0, 0); // no element at all
        }
        if d < 0 || st < 0 {
            return (0, storage);
        }
        last += (d as i128 - 1) * st as i128;
    }
    let lo = a.offset as i128 * es as i128;
    let hi = (last + 1) * es as i128;
    if hi > storage as i128 {
        // past its storage: both (the runtime judges such a tensor)
        return (0, (hi as u64).max(storage));
    }
    (lo as u64, (hi - lo) as u64)
}

/// Whether the view is contiguous: a plain format, row-major strides (a
/// dimension of 1 may have any stride), a known offset, every element
/// inside the storage. Then `extent`'s view is exactly its elements' bytes,
/// and an operator writing each element writes every byte of it.
///
/// # Safety
/// As `extent`.
unsafe fn contiguous(a: &aclCreateTensor) -> bool {
    let storage = footprint(a.data_type, a.storage_dims, a.storage_dims_num);
    let es = acl_dtype_size(a.data_type);
    let n = a.view_dims_num as usize;
    if storage == 0
        || es == 0
        || !PLAIN_FORMATS.contains(&a.format)
        || n > 64
        || a.offset < 0
        || (n > 0 && (a.view_dims.is_null() || a.stride.is_null()))
    {
        return false;
    }
    let mut elems: u64 = 1;
    for i in (0..n).rev() {
        let (d, st) = (*a.view_dims.add(i), *a.stride.add(i));
        // a negative stride, even on a dimension of 1, makes `extent` fall
        // back to the whole storage: not the view's bytes
        if d <= 0 || st < 0 || (d > 1 && st != elems as i64) {
            return false;
        }
        elems = match elems.checked_mul(d as u64) {
            Some(e) if e <= storage => e,
            _ => return false,
        };
    }
    (a.offset as u64)
        .checked_add(elems)
        .and_then(|e| e.checked_mul(es))
        .is_some_and(|hi| hi <= storage)
}

pub unsafe fn create_tensor(
    cx: &Cx,
    real: Real<aclCreateTensor>,
    a: aclCreateTensor,
) -> *mut c_void {
    let t = real.call(a);
    if !t.is_null() {
        let (at, len) = if a.tensor_data.is_null() {
            (0, 0)
        } else {
            extent(&a)
        };
        let storage = if a.tensor_data.is_null() {
            0
        } else {
            footprint(a.data_type, a.storage_dims, a.storage_dims_num)
        };
        let mem = TensorMem {
            view: Range {
                addr: a.tensor_data as u64 + at,
                len,
                write: true,
                whole: false,
            },
            // never smaller than the view (a tensor past its storage)
            storage: Range {
                addr: a.tensor_data as u64,
                len: storage.max(at + len),
                write: true,
                whole: false,
            },
            // the view is exactly its elements' bytes (a broadcast,
            // strided or transposed view is not)
            contiguous: !a.tensor_data.is_null() && len > 0 && contiguous(&a),
        };
        // known to executors built from it (len 0: touches nothing)
        super::aclnn_bind::tensor_created(t as usize, mem);
        if mem.storage.len == 0 {
            // an empty tensor still says this thread builds its launches
            let _ = PENDING.try_with(|p| p.created_empty());
        } else {
            let _ = PENDING.try_with(|p| p.push(t as usize, mem));
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
