//! Reentrancy guard: a hook entered while this thread is already inside u3m
//! (the runtime calling a hooked name internally, or u3m's own work) takes the
//! plain pass-through path.
//!
//! The glue's per-thread state is one zero-initialised thread-local block
//! with no destructor (`Thread`, `this_thread`): the guard flag, the device
//! the thread set, and the launch range buffers (`hooks/ranges.rs`). A
//! hooked call looks it up once, in `Guard::enter`, and reaches the rest
//! through the guard. On x86-64 Linux the block is a TLS symbol of this
//! library reached with the initial-exec model (the thread pointer plus an
//! offset the loader put in the GOT: two instructions), where a Rust
//! thread-local of a cdylib costs a `__tls_get_addr` call per lookup
//! (BENCHMARKS.md `fast4`); libu3m.so is loaded at start-up (LD_PRELOAD),
//! so its block is in every thread's static TLS. Touching it never
//! allocates or registers anything; it stays usable while the thread exits
//! (other thread-locals' destructors may make hooked calls), and a call
//! made then is tracked as any other.
//!
//! It also holds the thread's row of hook call counts in the stats segment
//! (`Thread::count_call`): taken on the thread's first hooked call, given
//! back at its exit (`GIVE_BACK`), so a hooked call counts itself with a
//! load and a store instead of a read-modify-write of a shared counter.

use std::cell::Cell;

use u3m_core::engine::{Engine, Here, Range};
use u3m_core::shm::ThreadCalls;

/// One thread's state in the glue. Its initial state is all zero bytes
/// (every field's zero is a valid value, and the one wanted: see
/// `a_zeroed_block_is_a_new_threads_state`).
pub struct Thread {
    /// Inside u3m now.
    inside: Cell<bool>,
    /// The device this thread set with aclrtSetDevice, as its complement
    /// (`!dev`: 0 is -1, none seen yet).
    device_not: Cell<i32>,
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
    /// (None is a null word: `Here` is a transparent non-null pointer.)
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

// The block: zero bytes in this library's TLS segment (.tbss), one per
// thread, reached through its initial-exec offset (`this_thread`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
std::arch::global_asm!(
    ".pushsection .tbss.u3m_glue_thread,\"awT\",@nobits",
    ".p2align {align}",
    // global for the other objects of this library, hidden from others
    ".globl u3m_glue_thread",
    ".hidden u3m_glue_thread",
    ".type u3m_glue_thread,@object",
    ".size u3m_glue_thread,{size}",
    "u3m_glue_thread:",
    ".zero {size}",
    ".popsection",
    size = const std::mem::size_of::<Thread>(),
    align = const std::mem::align_of::<Thread>().trailing_zeros(),
);

// Elsewhere a const thread-local with the same (zero) initial state.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
thread_local! {
    static THREAD: Thread = const {
        Thread {
            inside: Cell::new(false),
            device_not: Cell::new(0),
            ranges: [const { Cell::new(std::ptr::null_mut()) }; 2],
            reap: Cell::new(0),
            op_name: OpName {
                len: Cell::new(0),
                bytes: Cell::new([0; OP_NAME_BYTES]),
                class: Cell::new(u3m_core::opclass::OpClass::MatMul),
                hash: Cell::new(0),
            },
            calls: Cell::new(std::ptr::null()),
            calls_state: Cell::new(0),
            here: Cell::new(None),
        }
    };
}

thread_local! {
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

/// This thread's state. A thread's TLS block (no destructor) lives as long
/// as its thread: a reference to it is used on this thread only (nothing
/// that holds one is `Send`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn this_thread() -> &'static Thread {
    let p: usize;
    // SAFETY: the thread pointer (%fs:0 holds its own address) plus the
    // block's offset from it, which the loader wrote into the GOT entry
    // (initial-exec TLS): this thread's `u3m_glue_thread`, sized and
    // aligned for a `Thread` and zero-initialised, a valid `Thread` (see
    // the type); `'static` never leaves the thread (Guard is !Send)
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + u3m_glue_thread@GOTTPOFF]",
            p = out(reg) p,
            options(pure, readonly, nostack),
        );
        &*(p as *const Thread)
    }
}

/// This thread's state (see above).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
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
        !self.device_not.get()
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
    this_thread().device()
}

pub fn set_current_device(dev: i32) {
    this_thread().device_not.set(!dev);
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

// `Option<Here>` is one word, None null (a transparent non-null pointer):
// the zero bytes of a new thread's block hold None
const _: () = assert!(std::mem::size_of::<Option<Here>>() == std::mem::size_of::<usize>());

#[cfg(test)]
mod tests {
    use super::*;

    /// What a new thread's block starts as (its zero bytes) is the state
    /// a thread that has made no hooked call has.
    #[test]
    fn a_zeroed_block_is_a_new_threads_state() {
        // SAFETY: every field of `Thread` is valid all zeros (bool, i32,
        // raw pointers, u8, byte arrays, u64, `OpClass` 0 = MatMul, and
        // `Option<Here>`, None by the assertion above)
        let t: Thread = unsafe { std::mem::MaybeUninit::zeroed().assume_init() };
        assert_eq!(t.device(), -1);
        assert!(!t.inside.get());
        assert!(t.here().is_none());
        assert!(t.calls_row().is_none());
        assert_eq!(
            (t.calls_state.get(), t.reap.get(), t.op_name.len.get()),
            (0, 0, 0)
        );
        assert!(t.ranges.iter().all(|r| r.get().is_null()));
    }

    /// Each thread has its own block, starting as a new thread's; it is
    /// the same block on every look-up of the thread.
    #[test]
    fn each_thread_has_its_own_block() {
        let here = this_thread() as *const Thread as usize;
        assert_eq!(here, this_thread() as *const Thread as usize);
        let before = current_device();
        set_current_device(3);
        let others: Vec<(usize, i32, i32)> = (0..4)
            .map(|k| {
                std::thread::spawn(move || {
                    let fresh = current_device();
                    set_current_device(k);
                    (
                        this_thread() as *const Thread as usize,
                        fresh,
                        current_device(),
                    )
                })
                .join()
                .unwrap()
            })
            .collect();
        for (k, (at, fresh, set)) in others.into_iter().enumerate() {
            assert_ne!(at, here);
            assert_eq!((fresh, set), (-1, k as i32));
        }
        assert_eq!(current_device(), 3);
        set_current_device(before);
    }
}
