//! Discard hints from torch_npu's caching allocator (U3M_TORCH_HINTS,
//! docs/torch-npu.md).
//!
//! A block torch_npu's caching allocator frees holds dead bytes until it is
//! handed out and written again — `u3m_discard`'s promise — but the
//! allocator keeps its segments, so u3m sees no ACL call and would copy
//! that dead data out of HBM. torch_npu reports every free to the trace
//! trackers attached to its allocator (`TraceEntry::FREE_COMPLETED`, sent
//! without memory-history recording). It has no C entry point for
//! attaching one, so u3m does it through the allocator's virtual
//! `attachAllocatorTraceTracker`, with a `std::function` built here in
//! libstdc++'s layout. That is sound only for a layout checked against the
//! wheel's headers (torch_layout.rs): the version, the allocator's dynamic
//! type and the slot's home object must all match, or nothing is called.
//!
//! The attempt is made once, on the first device allocation that succeeds
//! in tier mode (torch_npu has created its per-device allocators by then);
//! it never waits, since the caller may hold the allocator's lock.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use crate::torch_layout::{ALLOCATOR_SYMBOL, KNOWN, STD_FUNCTION_BYTES};

const UNTRIED: u8 = 0;
const BUSY: u8 = 1;
const DONE: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNTRIED);
/// Attempts that found torch_npu's allocator not made yet.
static EARLY: AtomicU8 = AtomicU8::new(0);
const EARLY_MAX: u8 = 16;

/// The stored functor of a `std::function` (libstdc++'s `_Any_data`): the
/// tracker keeps the index of its layout in `KNOWN` in the first word.
type AnyData = [usize; 2];
type Manager = unsafe extern "C" fn(*mut AnyData, *const AnyData, c_int) -> bool;
type Invoker = unsafe extern "C" fn(*const AnyData, *const u8);

/// libstdc++'s `std::function<void(const TraceEntry&)>`.
#[repr(C)]
struct StdFunction {
    functor: AnyData,
    manager: Option<Manager>,
    invoker: Option<Invoker>,
}

const _: () = assert!(std::mem::size_of::<StdFunction>() == STD_FUNCTION_BYTES);

/// libstdc++'s `_Manager_operation` on a functor stored in place (16
/// trivially copyable bytes): 0 its `type_info` (libstdc++'s `typeid(void)`
/// stands in; nothing asks torch_npu's trackers for theirs), 1 a pointer
/// to it, 2 a copy, 3 its destruction (nothing to do).
unsafe extern "C" fn manager(dest: *mut AnyData, src: *const AnyData, op: c_int) -> bool {
    match op {
        0 => (*dest)[0] = void_type_info() as usize,
        1 => (*dest)[0] = src as usize,
        2 => *dest = *src,
        _ => {}
    }
    false
}

fn void_type_info() -> *mut c_void {
    static TI: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let p = TI.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    let p = crate::dl::real_dlsym(std::ptr::null_mut(), c"_ZTIv".as_ptr());
    TI.store(p, Ordering::Relaxed);
    p
}

/// The tracker: a freed block becomes a discard hint. Called by torch_npu
/// with its allocator lock held; takes u3m's residency lock (u3m never
/// calls into torch_npu holding it).
unsafe extern "C" fn invoke(f: *const AnyData, e: *const u8) {
    let Some(l) = KNOWN.get((*f)[0]) else { return };
    if e.is_null() || (e.add(l.action) as *const i32).read_unaligned() != l.free_completed {
        return;
    }
    let addr = (e.add(l.addr) as *const i64).read_unaligned();
    let size = (e.add(l.size) as *const i64).read_unaligned();
    if addr > 0 && size > 0 {
        crate::api::discard_hint(addr as u64, size as u64);
    }
}

/// After a device allocation succeeded (tier mode's hooks): attaches the
/// tracker the first time, or leaves for good. One load when done.
#[inline]
pub fn after_alloc() {
    if STATE.load(Ordering::Relaxed) == DONE {
        return;
    }
    attempt();
}

#[cold]
fn attempt() {
    // another thread at it: never wait for it
    if STATE
        .compare_exchange(UNTRIED, BUSY, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let mut outcome = std::panic::catch_unwind(try_attach).unwrap_or(Outcome::Skip("a panic"));
    let next = match outcome {
        Outcome::Early if EARLY.fetch_add(1, Ordering::Relaxed) + 1 < EARLY_MAX => UNTRIED,
        Outcome::Early => {
            outcome = Outcome::Unknown(format!(
                "its allocator was not made after {EARLY_MAX} allocations"
            ));
            DONE
        }
        _ => DONE,
    };
    match outcome {
        Outcome::Attached(v) => crate::init::info(&format!(
            "torch_npu {v}: freed caching-allocator blocks are discard hints (U3M_TORCH_HINTS=on)"
        )),
        Outcome::Unknown(why) => crate::init::info(&format!(
            "torch_npu's caching allocator gives no hints: {why} (docs/torch-npu.md)"
        )),
        Outcome::Skip(why) if !why.is_empty() => {
            crate::init::info(&format!("no torch_npu hints: {why}"))
        }
        _ => {}
    }
    STATE.store(next, Ordering::Release);
}

enum Outcome {
    Attached(String),
    /// torch_npu is there, but not a layout u3m knows.
    Unknown(String),
    /// The allocator is not made yet: try again on a later allocation.
    Early,
    /// Nothing to do (not tier mode, hints off, no torch_npu; "" says
    /// nothing).
    Skip(&'static str),
}

fn try_attach() -> Outcome {
    let Some(e) = crate::init::engine() else {
        return Outcome::Skip("");
    };
    let cfg = e.config();
    if cfg.mode != u3m_core::config::Mode::Tier || !cfg.torch_hints {
        return Outcome::Skip("");
    }
    // torch_npu's extension loads libtorch_npu.so with RTLD_LOCAL: not in
    // RTLD_DEFAULT's scope, but found by its soname if loaded
    // SAFETY: RTLD_NOLOAD never loads anything; the handle is closed below
    // (the library stays, Python holds it).
    let h = unsafe {
        libc::dlopen(
            c"libtorch_npu.so".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        // not a torch_npu process
        return Outcome::Skip("");
    }
    let sym = crate::dl::real_dlsym(h, ALLOCATOR_SYMBOL.as_ptr());
    // SAFETY: `h` came from dlopen above.
    unsafe { libc::dlclose(h) };
    if sym.is_null() {
        return Outcome::Unknown("libtorch_npu.so does not export its allocator".into());
    }
    let Some((lib, base)) = object_of(sym) else {
        return Outcome::Unknown("cannot tell which library defines its allocator".into());
    };
    let version = match torch_npu_version(&lib) {
        Some(v) => v,
        None => return Outcome::Unknown(format!("no version.py beside {lib}")),
    };
    let Some(index) = KNOWN.iter().position(|l| l.version == version) else {
        return Outcome::Unknown(format!(
            "version {version} is not one whose layout u3m knows"
        ));
    };
    let l = &KNOWN[index];
    // SAFETY: `sym` is libtorch_npu's `std::atomic<NPUAllocator*>`, whose
    // layout is one pointer; it is read as the allocator reads it.
    let obj = unsafe { (*(sym as *const AtomicPtr<c_void>)).load(Ordering::Acquire) };
    if obj.is_null() {
        return Outcome::Early;
    }
    // SAFETY: `obj` is a live polymorphic C++ object (the allocator never
    // frees it); its first word is its vtable, whose word -1 is its
    // `type_info` (Itanium C++ ABI), a vtable pointer and the name.
    let (class, attach) = unsafe {
        let vtbl = *(obj as *const *const usize);
        let ti = *vtbl.sub(1) as *const *const c_char;
        let name = CStr::from_ptr(*ti.add(1)).to_bytes();
        let name = name.strip_prefix(b"*").unwrap_or(name);
        (
            String::from_utf8_lossy(name).into_owned(),
            *vtbl.add(l.attach_slot),
        )
    };
    if class != l.class {
        return Outcome::Unknown(format!("its allocator is a {class}, not the {}", l.class));
    }
    if object_of(attach as *const c_void).map(|o| o.1) != Some(base) {
        return Outcome::Unknown("the tracker slot is not libtorch_npu's own function".into());
    }
    let mut f = StdFunction {
        functor: [index, 0],
        manager: Some(manager),
        invoker: Some(invoke),
    };
    // SAFETY: slot `attach_slot` of this class's vtable is
    // `attachAllocatorTraceTracker(AllocatorTraceTracker)` (torch_layout.rs,
    // checked against the headers): `this` and the by-value std::function
    // passed by address (Itanium ABI); the caller destroys the argument
    // after the call, here through its own manager (moved from: none).
    unsafe {
        let call: unsafe extern "C" fn(*mut c_void, *mut StdFunction) = std::mem::transmute(attach);
        call(obj, &mut f);
        if let Some(m) = f.manager {
            m(&mut f.functor, &f.functor, 3);
        }
    }
    Outcome::Attached(version)
}

/// The path and load address of the object that defines `addr`.
fn object_of(addr: *const c_void) -> Option<(String, usize)> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads only its arguments; `info` is writable.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    Some((path.to_string_lossy().into_owned(), info.dli_fbase as usize))
}

/// torch_npu's `__version__`, from `version.py` in the package directory
/// above `lib/libtorch_npu.so`.
fn torch_npu_version(lib: &str) -> Option<String> {
    let dir = std::path::Path::new(lib).parent()?.parent()?;
    let text = std::fs::read_to_string(dir.join("version.py")).ok()?;
    version_of(&text)
}

fn version_of(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("__version__"))?;
    let v = line.split_once('=')?.1.trim();
    let v = v.strip_prefix(['\'', '"'])?;
    let end = v.find(['\'', '"'])?;
    Some(v[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_is_read_as_torch_npu_writes_it() {
        let text = "__version__ = '2.14.0'\ngit_version = '54e365d3'\n";
        assert_eq!(version_of(text).as_deref(), Some("2.14.0"));
        assert_eq!(
            version_of("__version__ = \"2.14.0.post1\"").as_deref(),
            Some("2.14.0.post1")
        );
        assert_eq!(version_of("version = '2.14.0'"), None);
        assert_eq!(version_of("__version__ = 2"), None);
        assert_eq!(version_of("__version__ = '2.14.0"), None);
    }

    #[test]
    fn the_manager_copies_and_points_at_the_stored_functor() {
        let src: AnyData = [7, 9];
        let mut dest: AnyData = [0, 0];
        unsafe {
            assert!(!manager(&mut dest, &src, 2));
            assert_eq!(dest, [7, 9]);
            manager(&mut dest, &src, 1);
            assert_eq!(dest[0], &src as *const AnyData as usize);
            manager(&mut dest, &src, 3);
        }
    }

    #[test]
    fn the_tracker_ignores_all_but_freed_blocks_and_bad_rows() {
        // an ALLOC entry and an unknown layout index do nothing (no engine
        // here: a FREE_COMPLETED entry would be a hint without effect)
        let e = [0u8; 64];
        unsafe {
            invoke(&[0, 0], e.as_ptr());
            invoke(&[KNOWN.len(), 0], e.as_ptr());
            invoke(&[0, 0], std::ptr::null());
        }
    }
}
