//! The failure model of tier mode: fail closed. A panic in the engine (a
//! hooked call or the background helper) may leave the residency state half
//! updated, and its lock poisoned — after which every residency entry
//! answers "not u3m's". Passing calls through then would launch work on
//! managed ranges whose data sits in DRAM or NVMe (an MMU fault at best,
//! silently wrong data at worst). So once u3m manages memory, an internal
//! error switches the engine to *failed*: every later call that does device
//! work (copies, memsets, launches, collectives, kernels, graph replays)
//! or exports memory is refused with 207001 (HCCL: HCCL_E_MEMORY) and never
//! reaches the runtime; calls that do not touch device memory (streams,
//! events, sync, frees, finalize) still run so the program can report the
//! error and exit. Outside tier mode, or before anything is managed, u3m
//! owns nothing and falls back to pass-through as before.
//!
//! Debug hook for tests: `LIBU3M_TEST_PANIC_AT=N` panics inside the engine,
//! with the residency lock held, at the N-th call that runs the residency
//! protocol (not a U3M_ setting: only tests set it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::call::{Api, Call};
use super::Engine;
use crate::acl::AclError;

#[derive(Default)]
pub(super) struct Failure {
    failed: AtomicBool,
    /// The first refused call was reported on stderr.
    said: AtomicBool,
    /// LIBU3M_TEST_PANIC_AT (0: never).
    panic_at: u64,
    protocol_calls: AtomicU64,
    /// A forked child that kept the engine (its HBM refusals are explained).
    in_child: AtomicBool,
    child_said: AtomicBool,
}

impl Failure {
    pub(super) fn from_env() -> Failure {
        let panic_at = std::env::var("LIBU3M_TEST_PANIC_AT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Failure {
            panic_at,
            ..Failure::default()
        }
    }
}

/// One line on stderr with a single write(2) (never stdout).
fn say(line: &str) {
    let s = format!("u3m: {line}\n");
    // SAFETY: writes `s.len()` bytes from a live String to fd 2.
    unsafe { libc::write(2, s.as_ptr() as *const libc::c_void, s.len()) };
}

impl Engine {
    /// The engine failed closed: device work is refused from now on.
    #[inline]
    pub fn failed(&self) -> bool {
        self.failure.failed.load(Relaxed)
    }

    /// After an internal error (`why`): in tier mode with managed memory the
    /// engine fails closed and true is returned; otherwise false (the caller
    /// falls back to pass-through: u3m holds nothing a runtime call could
    /// miss).
    pub fn fail_closed(&self, why: &str) -> bool {
        let holds = self.residency.as_ref().is_some_and(|r| r.active());
        if !holds {
            return false;
        }
        if !self.failure.failed.swap(true, Relaxed) {
            say(&format!(
                "{why} in tier mode — failing closed: managed memory may be in DRAM/NVMe, so every later call on device memory returns 207001 (ACL_ERROR_RT_MEMORY_ALLOCATION) instead of running on it"
            ));
        }
        true
    }

    /// A panic in the background helper: fail closed as for a hooked call;
    /// without managed memory the helper just stops.
    pub(super) fn background_failed(&self) {
        self.fail_closed("internal error (panic) in the background helper");
    }

    /// What a call gets once the engine has failed: device work is refused
    /// (Some(code)); None: the call touches no device memory and may run.
    pub fn refusal(&self, call: &Call<'_>) -> Option<i32> {
        let refused = AclError::RT_MEMORY_ALLOCATION;
        let api = match *call {
            Call::Copy { .. }
            | Call::CopyBatch { .. }
            | Call::Memset { .. }
            | Call::OpaqueKernel { .. }
            | Call::GraphReplay { .. }
            | Call::IpcExport { .. }
            | Call::ExportHandle { .. } => Api::Acl,
            Call::Launch(ref l) => l.api,
            Call::Collective { .. } => Api::Hccl,
            Call::Kernel { api, .. } => api,
            _ => return None,
        };
        Some(api.residency_error(refused))
    }

    /// `run` of a failed engine.
    pub(super) fn run_failed(&self, call: &Call<'_>, real: super::run::Real<'_>) -> i32 {
        match self.refusal(call) {
            Some(rc) => {
                if !self.failure.said.swap(true, Relaxed) {
                    say("refusing device work after an internal error (see above); the process should exit");
                }
                rc
            }
            None => real(),
        }
    }

    /// Marks this engine as a forked child's.
    pub(super) fn set_forked_child(&self) {
        self.failure.in_child.store(true, Relaxed);
    }

    /// In a forked child: a synchronous host<->device copy of managed
    /// memory, served without HBM (`Residency::child_copy`). None: not one.
    pub(super) fn child_copy(&self, c: &super::call::Memcpy, sync: bool) -> Option<i32> {
        if !sync || !self.failure.in_child.load(Relaxed) || c.bytes == 0 {
            return None;
        }
        if c.dspan != c.bytes || c.sspan != c.bytes {
            return None; // pitched: the normal path
        }
        let r = self.residency.as_ref()?;
        let (dev_addr, host, to_device) = match c.kind {
            crate::acl::MemcpyKind::HOST_TO_DEVICE => (c.dst, c.src, true),
            crate::acl::MemcpyKind::DEVICE_TO_HOST => (c.src, c.dst, false),
            _ => return None,
        };
        // SAFETY: the hooks decoded `host` from the program's host pointer,
        // valid for `bytes` of the copy's access for the duration of the call
        let res = unsafe { r.child_copy(dev_addr, host as *mut u8, c.bytes, to_device) }?;
        Some(AclError::raw_of(&res))
    }

    /// A call refused for lack of HBM in a forked child: why, once.
    pub(super) fn explain_child_refusal(&self, rc: i32) {
        if rc == AclError::RT_MEMORY_ALLOCATION.raw()
            && self.failure.in_child.load(Relaxed)
            && !self.failure.child_said.swap(true, Relaxed)
        {
            say("forked child: device memory is shared with the parent, so the child never evicts what was resident at the fork; a call needing more HBM than is free returns 207001");
        }
    }

    /// The test hook: panics with the residency lock held at the
    /// LIBU3M_TEST_PANIC_AT-th protocol call.
    #[inline]
    pub(super) fn maybe_test_panic(&self) {
        if self.failure.panic_at == 0 {
            return;
        }
        let n = self.failure.protocol_calls.fetch_add(1, Relaxed) + 1;
        if n == self.failure.panic_at {
            if let Some(r) = &self.residency {
                r.panic_under_lock("LIBU3M_TEST_PANIC_AT");
            }
        }
    }
}
