//! Reentrancy guard: a hook entered while this thread is already inside u3m
//! (the runtime calling a hooked name internally, or u3m's own work) takes the
//! plain pass-through path. Const-initialised thread-local with no destructor,
//! so touching it never allocates or registers anything.

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

pub struct Guard(());

impl Guard {
    /// Some(guard) if this thread was not inside u3m; None for a nested call.
    #[inline]
    pub fn enter() -> Option<Guard> {
        INSIDE.with(|c| {
            if c.get() {
                None
            } else {
                c.set(true);
                Some(Guard(()))
            }
        })
    }
}

/// Whether this thread is inside u3m now.
#[inline]
pub fn inside() -> bool {
    INSIDE.with(|c| c.get())
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(false));
    }
}
