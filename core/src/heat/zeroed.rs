//! Zero-initialised heap blocks for the big tables. `calloc`-style
//! allocation leaves untouched pages uncommitted, so a table sized for a
//! million entries costs memory only for the entries in use.

use std::alloc::{alloc_zeroed, Layout};

/// Types whose all-zero bit pattern is a valid, meaningful value (atomics
/// and arrays of them; null `AtomicPtr`s).
///
/// # Safety
/// Implement only for such types.
pub(crate) unsafe trait Zeroable: Sized {}

/// A zeroed `Box<T>`, or None if the allocator refuses.
pub(crate) fn boxed<T: Zeroable>() -> Option<Box<T>> {
    let layout = Layout::new::<T>();
    assert!(layout.size() > 0);
    // SAFETY: non-zero size; all-zero is a valid T (Zeroable).
    unsafe {
        let p = alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            None
        } else {
            Some(Box::from_raw(p))
        }
    }
}

/// A zeroed boxed slice of `n >= 1` elements, or None.
pub(crate) fn slice<T: Zeroable>(n: usize) -> Option<Box<[T]>> {
    let layout = Layout::array::<T>(n.max(1)).ok()?;
    // SAFETY: non-zero size; all-zero is a valid T (Zeroable); the layout is
    // that of a [T; n], which is what Box<[T]> deallocates.
    unsafe {
        let p = alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            None
        } else {
            Some(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                p,
                n.max(1),
            )))
        }
    }
}
