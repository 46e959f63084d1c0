//! Zero-initialised memory for the big tables, committed only where it is
//! touched, so a table sized for a million entries costs memory (and start-up
//! time) only for the entries in use.
//!
//! The tables are slices of cache-line aligned records (`align(64)`). Rust's
//! `alloc_zeroed` reaches `calloc` only for alignments up to 16; above that it
//! allocates and then writes every byte — 128 MiB of allocation table and
//! 32 MiB of chunk records at the first hooked call, ~0.2 s of page faults.
//! So `slice` maps anonymous memory directly: the kernel's zero pages, any
//! alignment up to a page, nothing touched.

use std::alloc::{alloc_zeroed, Layout};
use std::ops::Deref;
use std::ptr::NonNull;

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

/// A zeroed slice in its own anonymous mapping (see the module doc); shared
/// read-only through `Deref` (the elements are atomics). Unmapped on drop.
pub(crate) struct ZSlice<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
}

// SAFETY: owns its elements like a Box<[T]>.
unsafe impl<T: Send> Send for ZSlice<T> {}
// SAFETY: only `&[T]` is handed out.
unsafe impl<T: Sync> Sync for ZSlice<T> {}

impl<T> Deref for ZSlice<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised (zeroed, Zeroable) elements live in the
        // mapping until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for ZSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the elements are atomics (no drop glue that matters); the
        // mapping is ours and nothing borrows it any more (&mut self).
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.bytes);
        }
    }
}

/// A zeroed slice of `n >= 1` elements (n = 0 gives one), or None.
pub(crate) fn slice<T: Zeroable>(n: usize) -> Option<ZSlice<T>> {
    let n = n.max(1);
    let layout = Layout::array::<T>(n).ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    if layout.align() > page || layout.size() == 0 {
        return None;
    }
    // SAFETY: a fresh private anonymous mapping; the kernel zero-fills it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            layout.size(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    Some(ZSlice {
        ptr: NonNull::new(p as *mut T)?,
        len: n,
        bytes: layout.size(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[repr(C, align(64))]
    struct Line([AtomicU64; 8]);
    // SAFETY: atomics only.
    unsafe impl Zeroable for Line {}

    /// Resident pages of [p, p+len) (mincore).
    fn resident(p: *const u8, len: usize) -> usize {
        let page = 4096;
        let mut v = vec![0u8; len.div_ceil(page)];
        // SAFETY: a mapping of ours, page aligned; `v` has one byte per page.
        let r = unsafe { libc::mincore(p as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn a_large_aligned_table_is_zero_aligned_and_not_committed() {
        let n = 1 << 20; // 64 MiB of cache lines
        let s = slice::<Line>(n).expect("mapping");
        assert_eq!(s.len(), n);
        assert_eq!(s.as_ptr() as usize % 64, 0);
        // untouched: nothing committed (alloc + memset would commit all of it)
        assert_eq!(resident(s.as_ptr() as *const u8, n * 64), 0);
        assert_eq!(s[n - 1].0[7].load(Relaxed), 0);
        s[12345].0[3].store(7, Relaxed);
        assert_eq!(s[12345].0[3].load(Relaxed), 7);
        // one page each, or one 2 MiB page each with transparent huge pages
        assert!(resident(s.as_ptr() as *const u8, n * 64) <= 1024);
    }
}
