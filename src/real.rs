//! The next definition of each hooked function (and of the few runtime
//! helpers u3m calls itself), resolved lazily and thread-safely: through
//! RTLD_NEXT, or through a library handle the program looked a hooked name up
//! with — the only way to reach libraries dlopen'ed RTLD_LOCAL (torch_npu
//! loads libascendcl, libopapi and libhccl that way).
//!
//! A program may unload the runtime (aclFinalize, dlclose) and load it again,
//! possibly at another address: a dlclose of a handle u3m remembered forgets
//! the handle and starts a new epoch, and every definition resolved in an
//! older epoch is looked up again before its next use (`RealFn::get`).

use std::ffi::c_void;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

const MAX_HANDLES: usize = 16;
static HANDLES: [AtomicPtr<c_void>; MAX_HANDLES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_HANDLES];
/// A slot whose handle was dlclose'd: skipped by lookups, reused by
/// `remember_handle` (null still ends the list).
const CLOSED: *mut c_void = 1 as *mut c_void;
/// Bumped whenever a handle is added: a cached miss is retried after that.
static HANDLES_GEN: AtomicU32 = AtomicU32::new(1);
/// Bumped when a remembered handle is closed: definitions resolved before
/// may lie in an unloaded library.
static EPOCH: AtomicU32 = AtomicU32::new(1);

/// Remembers a library handle through which a hooked name was found.
pub fn remember_handle(h: *mut c_void) {
    if h.is_null() || h as isize == -1 || h == CLOSED {
        return;
    }
    if HANDLES.iter().any(|s| s.load(Ordering::Acquire) == h) {
        return;
    }
    for slot in HANDLES.iter() {
        let cur = slot.load(Ordering::Acquire);
        if (cur.is_null() || cur == CLOSED)
            && slot
                .compare_exchange(cur, h, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            HANDLES_GEN.fetch_add(1, Ordering::AcqRel);
            return;
        }
    }
}

/// After the program dlclose'd `h`: if u3m remembered it, the handle is
/// forgotten and every resolved definition is looked up again before its
/// next use (the library may be gone, or come back at another address).
/// true when `h` was one of u3m's handles.
pub fn forget_handle(h: *mut c_void) -> bool {
    let mut found = false;
    for slot in HANDLES.iter() {
        if slot
            .compare_exchange(h, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            found = true;
        }
    }
    if found {
        EPOCH.fetch_add(1, Ordering::AcqRel);
        HANDLES_GEN.fetch_add(1, Ordering::AcqRel);
    }
    found
}

/// The CANN libraries a program may have loaded privately (RTLD_LOCAL):
/// Python loads torch_npu's _C module that way, and with it libascendcl.
const CANN_LIBS: &[&[u8]] = &[
    b"libascendcl.so\0",
    b"libacl_rt.so\0",
    b"libhccl.so\0",
    b"libopapi.so\0",
    b"libnnopbase.so\0",
    b"libacl_op_compiler.so\0",
    b"libruntime.so\0",
];

/// Remembers every CANN library already loaded, without loading any.
fn remember_loaded_cann_libs() {
    for lib in CANN_LIBS {
        let h = unsafe {
            libc::dlopen(
                lib.as_ptr() as *const c_char,
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            )
        };
        if !h.is_null() {
            remember_handle(h);
        }
    }
}

/// Looks `name` up: RTLD_NEXT first, then every remembered handle, then the
/// CANN libraries already loaded privately.
pub fn lookup(name: *const c_char) -> *mut c_void {
    let p = crate::dl::real_next(name);
    if !p.is_null() {
        return p;
    }
    let p = lookup_handles(name);
    if !p.is_null() {
        return p;
    }
    remember_loaded_cann_libs();
    lookup_handles(name)
}

fn lookup_handles(name: *const c_char) -> *mut c_void {
    for slot in HANDLES.iter() {
        let h = slot.load(Ordering::Acquire);
        if h.is_null() {
            break;
        }
        if h == CLOSED {
            continue;
        }
        let p = crate::dl::real_dlsym(h, name);
        if !p.is_null() {
            return p;
        }
    }
    std::ptr::null_mut()
}

pub struct RealFn {
    name: &'static [u8], // NUL-terminated
    ptr: AtomicPtr<c_void>,
    /// EPOCH when `ptr` was found: from an older epoch it is looked up again.
    epoch: AtomicU32,
    /// HANDLES_GEN at the last completed lookup (0: never looked up).
    tried: AtomicU32,
}

impl RealFn {
    pub const fn new(name: &'static [u8]) -> RealFn {
        RealFn {
            name,
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicU32::new(0),
            tried: AtomicU32::new(0),
        }
    }

    /// The real function, or None if no library defines it.
    #[inline]
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() && self.current() {
            return Some(p);
        }
        self.resolve()
    }

    /// `ptr` (if any) was found in the current epoch.
    #[inline]
    fn current(&self) -> bool {
        self.epoch.load(Ordering::Acquire) == EPOCH.load(Ordering::Acquire)
    }

    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        // A miss is cached until a new library handle is seen (a program
        // calling a missing function in a loop must not pay a lookup each
        // time); racing first callers each look up, none sees a false miss.
        let epoch = EPOCH.load(Ordering::Acquire);
        if self.epoch.load(Ordering::Acquire) != epoch {
            // resolved before a dlclose: forget it, look up again
            self.ptr.store(std::ptr::null_mut(), Ordering::Release);
            self.epoch.store(epoch, Ordering::Release);
            self.tried.store(0, Ordering::Release);
        }
        let gen = HANDLES_GEN.load(Ordering::Acquire);
        if self.tried.load(Ordering::Acquire) != gen {
            let p = lookup(self.name.as_ptr() as *const c_char);
            if !p.is_null() {
                let _ = self.ptr.compare_exchange(
                    std::ptr::null_mut(),
                    p,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            self.tried.store(gen, Ordering::Release);
        }
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            None
        } else {
            Some(p)
        }
    }

    /// A definition found through a library handle; the first one of an
    /// epoch wins.
    pub fn offer(&self, p: *mut c_void) {
        if !self.current() {
            self.ptr.store(std::ptr::null_mut(), Ordering::Release);
            self.epoch.store(EPOCH.load(Ordering::Acquire), Ordering::Release);
            self.tried.store(0, Ordering::Release);
        }
        let _ =
            self.ptr
                .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn name(&self) -> &'static str {
        std::str::from_utf8(&self.name[..self.name.len() - 1]).unwrap_or("?")
    }

    pub fn is_resolved(&self) -> bool {
        !self.ptr.load(Ordering::Acquire).is_null() && self.current()
    }
}
