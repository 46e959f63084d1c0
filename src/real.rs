//! The next definition of each hooked function, resolved lazily and
//! thread-safely: through RTLD_NEXT on first use, or handed over by the dlsym
//! override when a program looks the name up through a library handle (the
//! only way to reach functions of libraries dlopen'ed RTLD_LOCAL, such as
//! libopapi.so).

use std::ffi::c_void;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

pub struct RealFn {
    name: &'static [u8], // NUL-terminated
    ptr: AtomicPtr<c_void>,
    tried: AtomicU8,
}

impl RealFn {
    pub const fn new(name: &'static [u8]) -> RealFn {
        RealFn { name, ptr: AtomicPtr::new(std::ptr::null_mut()), tried: AtomicU8::new(0) }
    }

    /// The real function, or None if no library defines it.
    #[inline]
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return Some(p);
        }
        self.resolve()
    }

    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        // A miss is cached (a program calling a missing function in a loop
        // must not pay a symbol lookup each time), but only once a lookup has
        // completed: racing first callers each look up, none sees a false
        // miss. offer() can still fill a cached miss.
        if self.tried.load(Ordering::Acquire) != 2 {
            let p = crate::dl::real_next(self.name.as_ptr() as *const c_char);
            if !p.is_null() {
                let _ = self.ptr.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
            }
            self.tried.store(2, Ordering::Release);
        }
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() { None } else { Some(p) }
    }

    /// A definition found through a library handle; the first one wins.
    pub fn offer(&self, p: *mut c_void) {
        let _ = self.ptr.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn name(&self) -> &'static str {
        std::str::from_utf8(&self.name[..self.name.len() - 1]).unwrap_or("?")
    }

    pub fn is_resolved(&self) -> bool {
        !self.ptr.load(Ordering::Acquire).is_null()
    }
}
