//! The `dlsym`/`dlvsym` overrides. torch_npu and op-plugin reach most ACL and
//! every aclnn function through `dlopen` + `dlsym(handle, name)`, which plain
//! symbol interposition never sees. For a name in the hook table, the override
//! returns u3m's wrapper (whatever the handle) after resolving the real function
//! through the caller's handle; for an aclnn operator's execute phase it returns
//! a generic trampoline; every other lookup is forwarded unchanged. A lookup
//! with RTLD_NEXT is tail-jumped to glibc so that "next" stays relative to the
//! real caller, exactly as without u3m.

use std::ffi::{c_void, CStr};
use std::os::raw::c_char;
#[cfg(not(test))]
use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::hooks;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// glibc's dlsym and dlvsym (found by elf::find_function at start-up).
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

fn self_addr() -> usize {
    self_addr as *const () as usize
}

/// Resolves glibc's dlsym/dlvsym; idempotent. Returns dlsym.
pub extern "C" fn resolve_real() -> *mut c_void {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let s = crate::elf::find_function(b"dlsym", self_addr());
    let v = crate::elf::find_function(b"dlvsym", self_addr());
    REAL_DLVSYM.store(v, Ordering::Release);
    REAL_DLSYM.store(s, Ordering::Release);
    s
}

/// glibc's dlsym, for u3m's own lookups (never through the public, hooked name).
#[inline]
pub fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        p = resolve_real();
        if p.is_null() {
            return std::ptr::null_mut();
        }
    }
    // SAFETY: `p` is glibc's dlsym (found by elf::find_function), whose
    // prototype DlsymFn is; dlsym accepts any handle and name the program
    // could pass, and u3m passes the program's own or a valid C string.
    let f: DlsymFn = unsafe { std::mem::transmute(p) };
    unsafe { f(handle, name) }
}

fn real_dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void {
    let mut p = REAL_DLVSYM.load(Ordering::Acquire);
    if p.is_null() {
        resolve_real();
        p = REAL_DLVSYM.load(Ordering::Acquire);
        if p.is_null() {
            return std::ptr::null_mut();
        }
    }
    // SAFETY: `p` is glibc's dlvsym, prototype DlvsymFn; the arguments are
    // the program's, passed on unchanged.
    let f: DlvsymFn = unsafe { std::mem::transmute(p) };
    unsafe { f(handle, name, version) }
}

/// Looks `name` up through RTLD_NEXT from u3m: the definition a program would
/// reach without u3m (used for RTLD_DEFAULT and main-program handles, whose
/// scope contains u3m's own exports).
pub fn real_next(name: *const c_char) -> *mut c_void {
    real_dlsym(RTLD_NEXT, name)
}

/// What the override returns for (handle, name), given glibc's answer `found`.
///
/// # Safety
/// `name` is null or a NUL-terminated string (dlsym's contract).
unsafe fn redirect(handle: *mut c_void, name: *const c_char, found: *mut c_void) -> *mut c_void {
    if name.is_null() || found.is_null() {
        return found;
    }
    let bytes = CStr::from_ptr(name).to_bytes();
    if let Some(h) = hooks::find(bytes) {
        crate::real::remember_handle(handle);
        // The handle's scope may contain u3m itself (RTLD_DEFAULT, the main
        // program's handle): then the real definition is the next one.
        let real = if std::ptr::eq(found, h.wrapper) {
            real_next(name)
        } else {
            found
        };
        if real.is_null() {
            return std::ptr::null_mut(); // the runtime lacks it: as without u3m
        }
        h.real.offer(real);
        return h.wrapper as *mut c_void;
    }
    if let Some(t) = hooks::aclnn::redirect(handle, bytes, found) {
        crate::real::remember_handle(handle);
        return t;
    }
    found
}

/// # Safety
/// dlsym's C contract: `name` is null or a NUL-terminated string.
unsafe extern "C" fn dlsym_impl(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let found = real_dlsym(handle, name);
    redirect(handle, name, found)
}

/// `dlsym`: RTLD_NEXT is tail-jumped to glibc with the caller's return address
/// intact; everything else goes through dlsym_impl.
///
/// # Safety
/// dlsym's C contract. The naked bodies below only compare the handle and
/// jump: the argument registers reach glibc or dlsym_impl untouched (saved
/// and restored around resolve_real, with the stack kept 16-byte aligned).
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne 2f",
        "mov rax, qword ptr [rip + {slot}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        "2:",
        "jmp {imp}",
        slot = sym REAL_DLSYM,
        resolve = sym resolve_real,
        imp = sym dlsym_impl,
    )
}

/// # Safety
/// As the x86-64 `dlsym`.
#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmn x0, #1",
        "b.ne 2f",
        "adrp x16, {slot}",
        "ldr x16, [x16, :lo12:{slot}]",
        "cbz x16, 3f",
        "br x16",
        "3:",
        "stp x0, x1, [sp, #-32]!",
        "str x30, [sp, #16]",
        "bl {resolve}",
        "mov x16, x0",
        "ldr x30, [sp, #16]",
        "ldp x0, x1, [sp], #32",
        "br x16",
        "2:",
        "b {imp}",
        slot = sym REAL_DLSYM,
        resolve = sym resolve_real,
        imp = sym dlsym_impl,
    )
}

/// # Safety
/// dlvsym's C contract: `name` and `version` are null or NUL-terminated.
unsafe extern "C" fn dlvsym_impl(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let found = real_dlvsym(handle, name, version);
    redirect(handle, name, found)
}

/// `dlvsym`, as `dlsym` above.
///
/// # Safety
/// dlvsym's C contract; the naked body only compares and jumps, restoring
/// the argument registers it saves around resolve_real.
#[cfg(all(not(test), target_arch = "x86_64"))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne 2f",
        "mov rax, qword ptr [rip + {slot}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "push rdx",
        "call {resolve}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "mov rax, qword ptr [rip + {slot}]",
        "jmp rax",
        "2:",
        "jmp {imp}",
        slot = sym REAL_DLVSYM,
        resolve = sym resolve_real,
        imp = sym dlvsym_impl,
    )
}

/// # Safety
/// As the x86-64 `dlvsym`.
#[cfg(all(not(test), target_arch = "aarch64"))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "cmn x0, #1",
        "b.ne 2f",
        "adrp x16, {slot}",
        "ldr x16, [x16, :lo12:{slot}]",
        "cbz x16, 3f",
        "br x16",
        "3:",
        "stp x0, x1, [sp, #-32]!",
        "stp x2, x30, [sp, #16]",
        "bl {resolve}",
        "adrp x16, {slot}",
        "ldr x16, [x16, :lo12:{slot}]",
        "ldp x2, x30, [sp, #16]",
        "ldp x0, x1, [sp], #32",
        "br x16",
        "2:",
        "b {imp}",
        slot = sym REAL_DLVSYM,
        resolve = sym resolve_real,
        imp = sym dlvsym_impl,
    )
}

/// `dlclose`: glibc's, then, if the program closed a handle u3m looked
/// hooked names up through, u3m forgets the handle and re-resolves every
/// real function before its next use (a runtime unloaded after aclFinalize
/// and loaded again may lie at another address).
///
/// # Safety
/// dlclose's C contract: `handle` came from dlopen.
#[cfg(not(test))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut p = REAL.load(Ordering::Acquire);
    if p.is_null() {
        p = real_next(b"dlclose\0".as_ptr() as *const c_char);
        if p.is_null() {
            return -1;
        }
        REAL.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's dlclose (the next definition after u3m's),
    // called with the program's own argument.
    let rc = unsafe { std::mem::transmute::<*mut c_void, DlcloseFn>(p)(handle) };
    if rc == 0 {
        crate::real::forget_handle(handle);
    }
    rc
}

#[allow(dead_code)]
const _: *mut c_void = RTLD_DEFAULT;
