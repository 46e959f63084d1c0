//! A per-thread buffer for a launch's ranges. A launch may touch any number
//! of buffers (a foreach operator takes every parameter of a model); keeping
//! only a fixed number would launch an operator on memory tier mode never
//! made resident. The buffer grows to the widest launch the thread has made
//! and is reused: no heap allocation per call once warm.
//!
//! The buffers hang off the guard's per-thread state (guard.rs), reached
//! through the call's `Cx` without another thread-local lookup; a
//! destructor-bearing thread-local (`REAP`), touched only when a buffer is
//! first kept, frees them when the thread exits.

use std::cell::Cell;

use super::Cx;
use u3m_core::engine::Range;

/// Frees the thread's kept buffers at thread exit.
struct Reap;

impl Drop for Reap {
    fn drop(&mut self) {
        let t = crate::guard::thread();
        t.reap.set(2);
        for slot in &t.ranges {
            let p = slot.replace(std::ptr::null_mut());
            if !p.is_null() {
                // SAFETY: a kept buffer is a Box this module leaked into the
                // slot (`put`), taken out exactly once (replace above)
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

thread_local! {
    static REAP: Reap = const { Reap };
}

/// Runs `f` with this thread's range buffer, empty. The buffer is taken out
/// for the duration, so a nested use (a hook reached from inside `f`) gets a
/// fresh one instead of sharing it; so does a call during thread exit,
/// after the buffers were freed (its buffer is then dropped, not kept).
pub fn with<R>(cx: &Cx, f: impl FnOnce(&mut Vec<Range>) -> R) -> R {
    let t = cx.thread();
    with_in(t, &t.ranges[0], f)
}

/// `with`, for two buffers at once (a launch's accesses, and what
/// residency must cover besides them).
pub fn with2<R>(cx: &Cx, f: impl FnOnce(&mut Vec<Range>, &mut Vec<Range>) -> R) -> R {
    let t = cx.thread();
    with_in(t, &t.ranges[0], |a| with_in(t, &t.ranges[1], |b| f(a, b)))
}

fn with_in<R>(
    t: &crate::guard::Thread,
    slot: &Cell<*mut Vec<Range>>,
    f: impl FnOnce(&mut Vec<Range>) -> R,
) -> R {
    let p = slot.replace(std::ptr::null_mut());
    let mut v: Box<Vec<Range>> = if p.is_null() {
        Box::default()
    } else {
        // SAFETY: see `Reap::drop`: a kept buffer, taken out of its slot
        unsafe { Box::from_raw(p) }
    };
    v.clear();
    let r = f(&mut v);
    put(t, slot, v);
    r
}

/// Keeps `v` in `slot` (the larger of it and one a nested use left there),
/// unless the thread is exiting (then it is dropped).
fn put(t: &crate::guard::Thread, slot: &Cell<*mut Vec<Range>>, v: Box<Vec<Range>>) {
    let old = slot.get();
    // SAFETY: as in `with_in`
    if !old.is_null() && unsafe { (*old).capacity() } >= v.capacity() {
        return;
    }
    // the first buffer kept registers the thread's exit hook; none is kept
    // once that hook has run (or when it cannot be registered)
    match t.reap.get() {
        1 => {}
        0 if REAP.try_with(|_| ()).is_ok() => t.reap.set(1),
        _ => return,
    }
    slot.set(Box::into_raw(v));
    if !old.is_null() {
        // SAFETY: as in `with_in`; out of the slot now
        drop(unsafe { Box::from_raw(old) });
    }
}
