//! u3m's own C API: hints a framework may give the library it runs under.
//! A program finds them with `dlsym(RTLD_DEFAULT, "u3m_discard")`: absent
//! without libu3m.so, so calling them is never required (docs/api.md).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use u3m_core::acl::AclError;

use crate::guard::Guard;

/// `int u3m_discard(const void *ptr, size_t size)`: the program will not
/// read `[ptr, ptr + size)` before writing it again — a caching allocator
/// freed the block. u3m may then drop that memory from HBM without copying
/// it out (chunks wholly inside the range, in HBM, written since their last
/// copy-out and in no call in progress); work already queued on it still
/// runs first. Reading the range before writing it gives undefined bytes,
/// as reading freed memory does. Returns 0 (also for memory u3m does not
/// manage, observe mode and u3m disabled: a hint, never an error), or
/// ACL_ERROR_INVALID_PARAM (100000) for a null `ptr`.
#[unsafe(no_mangle)]
pub extern "C" fn u3m_discard(ptr: *const c_void, size: usize) -> i32 {
    if ptr.is_null() {
        return AclError::INVALID_PARAM.raw();
    }
    if size == 0 {
        return 0;
    }
    discard_hint(ptr as u64, size as u64);
    0
}

/// A discard hint for `[va, va + size)` (u3m_discard's, and torch_npu's
/// freed blocks through `torch_hints`): never fails, never unwinds.
pub(crate) fn discard_hint(va: u64, size: u64) {
    // a hint from inside a hooked call (a callback) is ignored
    let Some(_g) = Guard::enter() else { return };
    let Some(e) = crate::init::engine() else {
        return;
    };
    // never unwinds into the caller
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(r) = e.residency() {
            r.discard(va, size);
        }
    }));
}
