//! Reentrancy guard: a hook entered while this thread is already inside u3m
//! (the runtime calling a hooked name internally, or u3m's own work) takes the
//! plain pass-through path.
//!
//! The glue's per-thread state is one const-initialised thread-local with no
//! destructor (`THREAD`): the guard flag, the device the thread set, and the
//! launch range buffers (`hooks/ranges.rs`). A hooked call looks it up once,
//! in `Guard::enter`, and reaches the rest through the guard (a cdylib's
//! thread-local costs a `__tls_get_addr` call per lookup: BENCHMARKS.md
//! `fast4`). Touching it never allocates or registers anything; it stays
//! usable while the thread exits (other thread-locals' destructors may make
//! hooked calls), and a call made then is tracked as any other.

use std::cell::Cell;

use u3m_core::engine::Range;

/// One thread's state in the glue.
pub struct Thread {
    /// Inside u3m now.
    inside: Cell<bool>,
    /// The device this thread set with aclrtSetDevice (-1: none seen yet).
    device: Cell<i32>,
    /// The launch range buffers (`hooks/ranges.rs`): owned boxes, null when
    /// none is kept (not made yet, taken by a call in progress, or freed at
    /// thread exit).
    pub(crate) ranges: [Cell<*mut Vec<Range>>; 2],
    /// The buffers' exit hook (`hooks/ranges.rs`): 0 not registered yet,
    /// 1 registered, 2 run (the thread is exiting: nothing is kept).
    pub(crate) reap: Cell<u8>,
    /// The last operator type this thread launched through aclop, with its
    /// class and hash (`hooks/op.rs`): a program launches the same few types
    /// over and over, and comparing the name costs less than classifying it.
    pub(crate) op_name: OpName,
}

/// Longest operator type `OpName` keeps (longer ones are classified every
/// time).
pub(crate) const OP_NAME_MAX: usize = 48;

/// A thread's last classified aclop type (`hooks/op.rs`); `len` 0: none.
pub(crate) struct OpName {
    pub(crate) len: Cell<u8>,
    pub(crate) bytes: Cell<[u8; OP_NAME_MAX]>,
    pub(crate) class: Cell<u3m_core::opclass::OpClass>,
    pub(crate) hash: Cell<u64>,
}

thread_local! {
    static THREAD: Thread = const {
        Thread {
            inside: Cell::new(false),
            device: Cell::new(-1),
            ranges: [const { Cell::new(std::ptr::null_mut()) }; 2],
            reap: Cell::new(0),
            op_name: OpName {
                len: Cell::new(0),
                bytes: Cell::new([0; OP_NAME_MAX]),
                class: Cell::new(u3m_core::opclass::OpClass::Other),
                hash: Cell::new(0),
            },
        }
    };
}

/// This thread's state. The block of a const thread-local without a
/// destructor lives as long as its thread: a reference to it is used on
/// this thread only (nothing that holds one is `Send`).
#[inline]
fn this_thread() -> &'static Thread {
    // SAFETY: see above; `'static` never leaves the thread (Guard is !Send)
    THREAD.with(|t| unsafe { &*(t as *const Thread) })
}

/// Held while this thread is inside u3m; gives the thread's state without
/// another thread-local lookup.
pub struct Guard(*const Thread);

impl Guard {
    /// Some(guard) if this thread was not inside u3m; None for a nested call.
    #[inline]
    pub fn enter() -> Option<Guard> {
        let t = this_thread();
        if t.inside.get() {
            None
        } else {
            t.inside.set(true);
            Some(Guard(t))
        }
    }

    /// This thread's state.
    #[inline]
    pub fn thread(&self) -> &Thread {
        // SAFETY: `enter` took it from this thread's THREAD, which outlives
        // the guard (a guard never leaves its thread: raw pointer, !Send)
        unsafe { &*self.0 }
    }
}

impl Thread {
    /// The device this thread set (-1: none seen yet).
    #[inline]
    pub fn device(&self) -> i32 {
        self.device.get()
    }
}

/// Whether this thread is inside u3m now.
#[inline]
pub fn inside() -> bool {
    this_thread().inside.get()
}

/// The device this thread set with aclrtSetDevice (-1: none seen yet).
#[inline]
pub fn current_device() -> i32 {
    this_thread().device.get()
}

pub fn set_current_device(dev: i32) {
    this_thread().device.set(dev);
}

/// This thread's state outside a hooked call (`hooks/ranges.rs`'s exit path).
pub(crate) fn thread() -> &'static Thread {
    this_thread()
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        self.thread().inside.set(false);
    }
}
