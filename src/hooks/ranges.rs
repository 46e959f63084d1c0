//! A per-thread buffer for a launch's ranges. A launch may touch any number
//! of buffers (a foreach operator takes every parameter of a model); keeping
//! only a fixed number would launch an operator on memory tier mode never
//! made resident. The buffer grows to the widest launch the thread has made
//! and is reused: no heap allocation per call once warm.

use std::cell::RefCell;

use u3m_core::engine::Range;

thread_local! {
    static BUF: RefCell<Vec<Range>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's range buffer, empty. The buffer is taken out
/// for the duration, so a nested use (a hook reached from inside `f`) gets a
/// fresh one instead of a borrow panic; so does a call during thread exit,
/// after the thread-local is gone.
pub fn with<R>(f: impl FnOnce(&mut Vec<Range>) -> R) -> R {
    let mut v = BUF
        .try_with(|b| {
            b.try_borrow_mut()
                .map(|mut b| std::mem::take(&mut *b))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    v.clear();
    let r = f(&mut v);
    // keep the larger of the two buffers (a nested use may have left one)
    let _ = BUF.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            if v.capacity() > b.capacity() {
                *b = v;
            }
        }
    });
    r
}
