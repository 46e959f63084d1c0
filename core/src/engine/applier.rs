//! The applier thread (issue 10 part 2): deferred work of the calls —
//! the policy's buffered accesses (policy/pending.rs), the heat table's raw
//! ranges (heat/pending.rs: resolved into allocation, range and chunk
//! records and counted) — done off the calling threads, as bytehound hands
//! its heavy work to a thread.
//!
//! A call appends to its thread's buffer; when a buffer is *due* the call
//! wakes this thread (`Thread::unpark`: one swap of the parker's word, and
//! a futex wake when this thread sleeps) and goes on; this thread applies
//! every buffer. It is never needed for correctness: every decision still
//! applies everything buffered first, a full buffer is applied by the call
//! that finds it full, and a buffer this thread has not reached by the time
//! it is three quarters full is applied by its own thread after its call
//! (as before there was an applier). So the thread may be slow, descheduled
//! or gone (a forked child has none: buffering is off there, see
//! `Buffered::after_fork_child`).
//!
//! Its own thread, not the publisher's: a publisher round (a tier tick:
//! eviction, prefetch, a DRAM spill) can take milliseconds, during which
//! the buffers would fill and the calls would apply them after all; and
//! the publisher sleeps on a condvar whose wake-ups are the simulated
//! clock's hand-overs. It does not keep the process alive (a Rust thread
//! never does), holds no lock between applies, and stops at shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::Duration;

use super::Engine;

/// How long the thread sleeps without a wake-up before it looks anyway (a
/// safety net: `unpark` is never lost).
const IDLE: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct Applier {
    stop: AtomicBool,
    thread: Mutex<Option<Thread>>,
}

impl Applier {
    /// Starts the thread and hands it to the heat table and (tier mode)
    /// the policy.
    pub fn start(&self, e: &'static Engine) {
        let h = std::thread::Builder::new()
            .name("u3m-apply".into())
            .spawn(move || e.applier.main(e));
        if let Ok(h) = h {
            let t = h.thread().clone();
            if let Ok(mut g) = self.thread.lock() {
                *g = Some(t.clone());
            }
            e.heat.set_applier(t.clone());
            if let Some(r) = &e.residency {
                r.policy().set_applier(t);
            }
        }
    }

    fn main(&self, e: &'static Engine) {
        while !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(IDLE);
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            // a panic in the policy must not take the process down; the
            // calls apply their buffers themselves from then on
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                e.heat.apply_deferred();
                if let Some(r) = &e.residency {
                    r.policy().apply_deferred();
                }
            }));
            if ok.is_err() {
                // the heat buffers then fill and are applied by their
                // threads (or a reader) as without an applier
                if let Some(r) = &e.residency {
                    r.policy().set_applier_gone();
                }
                return;
            }
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Ok(g) = self.thread.lock() {
            if let Some(t) = &*g {
                t.unpark();
            }
        }
    }

    /// In a forked child the thread does not exist; the policy buffers no
    /// more there (its `after_fork_child`), so nothing is handed to it.
    pub fn forget_after_fork(&self) {
        self.stop.store(true, Ordering::Release);
    }
}
