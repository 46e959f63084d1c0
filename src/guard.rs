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
//!
//! It also holds the thread's row of hook call counts in the stats segment
//! (`Thread::count_call`): taken on the thread's first hooked call, given
//! back at its exit (`GIVE_BACK`), so a hooked call counts itself with a
//! load and a store instead of a read-modify-write of a shared counter.

use std::cell::Cell;

use u3m_core::engine::{Engine, Here, Range};
use u3m_core::shm::ThreadCalls;

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
    /// The thread's row of call counts in the stats segment (null: none
    /// held), and whether it was taken: 0 not yet, 1 held, 2 none (every
    /// row was held, or the thread is exiting): the shared counts.
    calls: Cell<*const ThreadCalls>,
    calls_state: Cell<u8>,
    /// The core's per-thread look-up of this thread (`Here`, kept from the
    /// thread's first hooked call: `count_call_first`), handed to
    /// `Engine::run_in` so a launch looks up no thread-local of its own.
    here: Cell<Option<Here>>,
}

/// Longest operator type `OpName` keeps (longer ones are classified every
/// time).
pub(crate) const OP_NAME_MAX: usize = 48;

/// The bytes a kept name occupies: its bytes, then zeros (its NUL among
/// them) up to a whole number of 8-byte words past the longest name's NUL
/// (`hooks/op.rs` compares a name word by word).
pub(crate) const OP_NAME_BYTES: usize = (OP_NAME_MAX / 8 + 1) * 8;

/// A thread's last classified aclop type (`hooks/op.rs`); `len` 0: none.
pub(crate) struct OpName {
    pub(crate) len: Cell<u8>,
    pub(crate) bytes: Cell<[u8; OP_NAME_BYTES]>,
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
                bytes: Cell::new([0; OP_NAME_BYTES]),
                class: Cell::new(u3m_core::opclass::OpClass::Other),
                hash: Cell::new(0),
            },
            calls: Cell::new(std::ptr::null()),
            calls_state: Cell::new(0),
            here: Cell::new(None),
        }
    };
    /// Registered with the thread's row of call counts: gives it back when
    /// the thread exits.
    static GIVE_BACK: GiveBack = const { GiveBack };
}

struct GiveBack;

impl Drop for GiveBack {
    fn drop(&mut self) {
        let t = this_thread();
        t.calls_state.set(2);
        let row = t.calls.replace(std::ptr::null());
        if !row.is_null() {
            // SAFETY: a row `count_call_first` took from the engine (which
            // lives for the process), not given back before (swapped out
            // above)
            unsafe { &*row }.give_back();
        }
    }
}

/// This thread's state. The block of a const thread-local without a
/// destructor lives as long as its thread: a reference to it is used on
/// this thread only (nothing that holds one is `Send`).
#[inline]
fn this_thread() -> &'static Thread {
    // SAFETY: see above; `'static` never leaves the thread (Guard is !Send)
    THREAD.with(|t| unsafe { &*(t as *const Thread) })
}

/// In a forked child that starts clean: the calling (forking) thread
/// forgets its row of call counts ([`Thread::forget_calls_row`]).
pub fn forget_calls_row() {
    this_thread().forget_calls_row();
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

    /// The thread's row of counts in the stats segment, if it holds one
    /// (the engine counts a launch in it: `Engine::run_in`).
    #[inline]
    pub fn calls_row(&self) -> Option<&ThreadCalls> {
        // SAFETY: as in `count_call`
        unsafe { self.calls.get().as_ref() }
    }

    /// The core's `Here` of this thread, once its first hooked call kept
    /// it (None before: the engine looks it up itself).
    #[inline]
    pub fn here(&self) -> Option<Here> {
        self.here.get()
    }

    /// Counts one call of `hook` in the stats segment: in the thread's
    /// own row (taken on its first call), else in the shared counts.
    #[inline]
    pub fn count_call(&self, eng: &'static Engine, hook: u16) {
        let row = self.calls.get();
        if row.is_null() {
            return self.count_call_first(eng, hook);
        }
        // SAFETY: the row taken by `count_call_first` on this thread (a
        // `Thread` is reached on its own thread only), held until
        // `GiveBack` nulls `calls`; the engine lives for the process
        eng.count_call_in(Some(unsafe { &*row }), hook);
    }

    /// In a forked child that starts clean (a new engine, its own stats
    /// segment): the row the forking thread held is in the parent's segment,
    /// still mapped shared; counting on in it would add the child's calls to
    /// the parent's. The thread takes a row of the new segment instead.
    fn forget_calls_row(&self) {
        self.calls.set(std::ptr::null());
        self.calls_state.set(0);
    }

    #[cold]
    #[inline(never)]
    fn count_call_first(&self, eng: &'static Engine, hook: u16) {
        if self.here.get().is_none() {
            self.here.set(Here::now());
        }
        if self.calls_state.get() == 0 {
            self.calls_state.set(2);
            // the exit hook first: a row is taken only if it will be given
            // back (not while the thread is exiting)
            if GIVE_BACK.try_with(|_| ()).is_ok() {
                if let Some(row) = eng.take_thread_calls() {
                    self.calls.set(row);
                    self.calls_state.set(1);
                    return eng.count_call_in(Some(row), hook);
                }
            }
        }
        eng.count_call_in(None, hook);
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
