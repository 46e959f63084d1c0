//! `Engine::run`: one hooked call, start to end. Device work (copies,
//! memsets, launches, collectives, kernels, graph replays) runs inside the
//! residency protocol — the memory it touches is resident before the real
//! call and its use is recorded after — then is observed (heat table, stats,
//! trace). Calls the engine may own (allocation, VMM) are in `detour.rs`.
//!
//! Outside tier mode (or before anything is managed) the protocol is one
//! relaxed load; observe mode allocates nothing here.

use std::sync::atomic::Ordering::Relaxed;

use super::call::{Api, Call, Launch, LaunchKind, Memcpy, Queue};
use super::{Engine, Range, MAX_OP_RANGES};
use crate::acl::AclError;
use crate::opclass::OpClass;
use crate::perthread::Here;
use crate::residency::{Order, Residency, Token};
use crate::shm::ThreadCalls;

/// The real function with the program's arguments (an allocation retried
/// after making room calls it again).
pub(super) type Real<'r> = &'r mut dyn FnMut() -> i32;

impl Engine {
    /// Runs one hooked call: `dev` is the calling thread's device, `real`
    /// the real function with the program's arguments. Returns what the
    /// program gets back (the real function's code, or the error u3m
    /// returns instead of calling it).
    ///
    /// An operator launch (the call a training step makes most) goes
    /// straight to `run_launch`, inlined here with `resident` (two call
    /// layers fewer); every other call, and any call of a failed engine,
    /// to `run_other`.
    #[inline]
    pub fn run(&self, dev: i32, call: &Call<'_>, real: Real<'_>) -> i32 {
        self.run_in(dev, call, None, None, real)
    }

    /// [`run`](Self::run) by a thread holding a row of counts in the stats
    /// segment (`row`: [`take_thread_calls`](Self::take_thread_calls) on
    /// this thread, not given back): a launch counts itself there; `here`:
    /// [`Here::now`] of this thread, kept by the caller (a launch then looks
    /// up no thread-local of its own for the publisher and the heat table),
    /// None: looked up when needed.
    pub fn run_in(
        &self,
        dev: i32,
        call: &Call<'_>,
        row: Option<&ThreadCalls>,
        here: Option<Here>,
        real: Real<'_>,
    ) -> i32 {
        if let Call::Launch(ref l) = *call {
            if !self.failed() {
                return self.run_launch(dev, l, row, here, real);
            }
        }
        self.run_other(dev, call, real)
    }

    /// `run` of every call but a live engine's launch (out of line: `run`
    /// inlines only the launch path).
    #[inline(never)]
    fn run_other(&self, dev: i32, call: &Call<'_>, real: Real<'_>) -> i32 {
        if self.failed() {
            return self.run_failed(call, real);
        }
        match *call {
            Call::Copy { copy, q } => self.run_copy(dev, &copy, q, real),
            Call::CopyBatch { copies, q } => self.run_batch(dev, copies, q, real),
            Call::Memset { addr, bytes, q } => {
                let rc = match self.tiering() {
                    Some(_) => {
                        let rs = [Range {
                            addr,
                            len: bytes,
                            write: true,
                            whole: false,
                        }];
                        self.resident(
                            dev,
                            b"memset",
                            OpClass::Layout,
                            q,
                            &rs,
                            true,
                            Api::Acl,
                            None,
                            real,
                        )
                    }
                    None => self.device_call(dev, Api::Acl, real),
                };
                if rc == 0 && bytes > 0 {
                    self.memset(dev, q.stream, addr, bytes);
                }
                rc
            }
            Call::Launch(ref l) => self.run_launch(dev, l, None, None, real),
            Call::Collective { name, ranges, q } => {
                let rc = self.resident(
                    dev,
                    name,
                    OpClass::Communication,
                    q,
                    ranges,
                    false,
                    Api::Hccl,
                    None,
                    real,
                );
                if rc == 0 {
                    self.collective(dev, q.stream, name, ranges);
                }
                rc
            }
            Call::Kernel { blob, q, api } => {
                let mut rs = [Range::ZERO; MAX_OP_RANGES];
                let mut wide = Vec::new();
                let rs = match self.kernel_ranges(blob, &mut rs, &mut wide) {
                    Some(n) => &rs[..n],
                    // more pointers than the array holds: every one, in a
                    // Vec (a rare kernel; the common one allocates nothing)
                    None => &wide[..],
                };
                let rc = self.resident(
                    dev,
                    b"kernel",
                    OpClass::Other,
                    q,
                    rs,
                    false,
                    api,
                    None,
                    real,
                );
                // an unreadable blob (null, or outside 8 B..1 MiB) is not counted
                if rc == 0 && !blob.is_empty() {
                    self.kernel_args(dev, q.stream, rs);
                }
                rc
            }
            Call::OpaqueKernel { q } => {
                let rc = real();
                if rc == 0 {
                    self.opaque_launch(dev, q.stream);
                }
                rc
            }
            Call::GraphReplay { model, q } => {
                // everything the graph touched at capture is resident first
                let rc = match self.tiering() {
                    Some(_) => {
                        let rs = self.graph_ranges(model);
                        self.resident(
                            dev,
                            b"graph replay",
                            OpClass::Other,
                            q,
                            &rs,
                            false,
                            Api::Acl,
                            None,
                            real,
                        )
                    }
                    None => self.device_call(dev, Api::Acl, real),
                };
                if rc == 0 {
                    self.graph_replay(dev, q.stream, model);
                }
                rc
            }
            _ => self.detour(dev, call, real),
        }
    }

    /// The residency manager when it has something to manage.
    #[inline]
    pub(super) fn tiering(&self) -> Option<&Residency> {
        self.residency.as_ref().filter(|r| r.active())
    }

    /// The real call of device work; a lost device is noticed.
    #[inline]
    fn device_call(&self, dev: i32, api: Api, real: Real<'_>) -> i32 {
        let rc = real();
        if api.device_lost(rc) {
            self.device_lost(dev);
        }
        rc
    }

    /// The residency protocol around device work touching `ranges`: every
    /// managed chunk they cover is resident (and pinned) before the call,
    /// its use is recorded after. `overwrite`: write ranges replace whole
    /// chunks (copies, memsets), which then need no copy-in.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn resident(
        &self,
        dev: i32,
        what: &[u8],
        class: OpClass,
        q: Queue,
        ranges: &[Range],
        overwrite: bool,
        api: Api,
        here: Option<Here>,
        real: Real<'_>,
    ) -> i32 {
        let Some(r) = self.tiering() else {
            return self.device_call(dev, api, real);
        };
        // a synchronous call, or one on a capturing stream (whose work is
        // recorded, not run, and may not be ordered by u3m's events), is
        // ordered by the host
        let host = q.sync || self.is_capturing(q.stream);
        let order = if host {
            Order::Host
        } else {
            Order::Stream(q.stream)
        };
        self.maybe_test_panic();
        // background rounds due on the runtime's clock run before the call
        // and after it (publish.rs)
        let _paced = self.publisher.pace_call_in(here);
        // the call's pins, filled in place (never moved: every call's path)
        let mut tok = Token::default();
        let (prepared, stalled) = r.prepare_timed(
            &mut tok,
            dev.max(0) as u32,
            class as u8,
            ranges,
            overwrite,
            order,
            here,
        );
        // the time calls spend in u3m before they can run (the stall
        // account): waiting for the residency lock, for fault-ins, for
        // copy-ins in flight; a call that found its memory resident and the
        // lock free stalled for nothing and reads no clock
        if let Some(ns) = stalled {
            self.ops.stall_ns.fetch_add(ns, Relaxed);
        }
        if let Err(e) = prepared {
            // the call is not made; a device found gone on the way is
            // noticed as if the call had said so
            if let Some(o) = r.take_oversize() {
                self.say_oversize(what, &o);
            }
            let rc = api.residency_error(e);
            if api.device_lost(rc) {
                self.device_lost(dev);
            }
            self.explain_child_refusal(rc);
            return rc;
        }
        let rc = self.device_call(dev, api, real);
        // a synchronous call has finished with the memory on return; a
        // captured call has not run: replays are made resident on their own
        r.finish_in(&mut tok, (!host).then_some(q.stream), rc == 0);
        // nothing to free: forgotten in place (no drop call); else dropped
        if tok.holds_nothing() {
            std::mem::forget(tok);
        }
        // the policy's buffered accesses, when due, outside the residency
        // locks (policy/pending.rs)
        r.after_call();
        rc
    }

    /// A copy: a synchronous read of a lost device's managed memory is
    /// served from u3m's DRAM/NVMe copies, before and after the real call.
    fn run_copy(&self, dev: i32, c: &Memcpy, q: Queue, real: Real<'_>) -> i32 {
        let read_back = q.sync && c.kind.reads_device() && c.bytes > 0;
        if read_back {
            if let Some(rc) = self.read_lost(c) {
                return rc;
            }
        }
        let rc = match self.tiering() {
            Some(_) => match self.child_copy(c, q.sync) {
                Some(rc) => rc,
                None => {
                    let (rs, n) = c.ranges();
                    self.resident(
                        dev,
                        b"copy",
                        OpClass::Layout,
                        q,
                        &rs[..n],
                        c.whole,
                        Api::Acl,
                        None,
                        real,
                    )
                }
            },
            None => self.device_call(dev, Api::Acl, real),
        };
        if read_back && Api::Acl.device_lost(rc) {
            if let Some(rc) = self.read_lost(c) {
                return rc;
            }
        }
        if rc == 0 && c.bytes > 0 {
            self.observe_copy(dev, q.stream, c);
        }
        rc
    }

    /// A device-to-host read from a lost device's managed memory (None: not
    /// such memory, or no device is lost).
    fn read_lost(&self, c: &Memcpy) -> Option<i32> {
        let r = self.residency.as_ref()?;
        if !r.any_lost() {
            return None;
        }
        // SAFETY: the hooks decoded `dst` from the program's host pointer,
        // valid for `bytes` of writes for the duration of the copy
        let res = unsafe { r.read_lost(c.src, c.dst as *mut u8, c.bytes) }?;
        Some(AclError::raw_of(&res))
    }

    /// A batch of copies: every device range resident for the one call.
    fn run_batch(&self, dev: i32, copies: &[Memcpy], q: Queue, real: Real<'_>) -> i32 {
        let rc = match self.tiering() {
            Some(_) => {
                // a batch of up to BATCH_ON_STACK copies gathers its ranges
                // on the stack (no heap allocation per call); a larger one
                // in a Vec
                const BATCH_ON_STACK: usize = 16;
                let copies = &copies[..copies.len().min(1 << 16)];
                let none = Range {
                    addr: 0,
                    len: 0,
                    write: false,
                    whole: false,
                };
                let mut on_stack = [none; 2 * BATCH_ON_STACK];
                let on_heap: Vec<Range>;
                let rs: &[Range] = if copies.len() <= BATCH_ON_STACK {
                    let mut n = 0;
                    for c in copies {
                        let (r, k) = c.ranges();
                        on_stack[n..n + k].copy_from_slice(&r[..k]);
                        n += k;
                    }
                    &on_stack[..n]
                } else {
                    on_heap = copies
                        .iter()
                        .flat_map(|c| {
                            let (r, k) = c.ranges();
                            r.into_iter().take(k)
                        })
                        .collect();
                    &on_heap
                };
                self.resident(
                    dev,
                    b"batch copy",
                    OpClass::Layout,
                    q,
                    rs,
                    true,
                    Api::Acl,
                    None,
                    real,
                )
            }
            None => self.device_call(dev, Api::Acl, real),
        };
        if rc == 0 {
            for c in copies {
                self.observe_copy(dev, q.stream, c);
            }
        }
        rc
    }

    #[inline(always)]
    fn run_launch(
        &self,
        dev: i32,
        l: &Launch<'_>,
        row: Option<&ThreadCalls>,
        here: Option<Here>,
        real: Real<'_>,
    ) -> i32 {
        // this thread's `LAST` (perthread.rs), looked up once (or handed
        // down by the glue, which keeps it: `run_in`) for the publisher's
        // count of calls in progress and the heat buffer below
        let here = match here {
            Some(h) => Some(h),
            None => here_now(),
        };
        let rc = match l.kind {
            LaunchKind::Model => real(),
            _ => self.resident(
                dev,
                l.name.unwrap_or(b"operator"),
                l.class,
                l.q,
                l.resident.unwrap_or(l.ranges),
                false,
                l.api,
                here,
                real,
            ),
        };
        if rc == 0 {
            if l.kind == LaunchKind::Aclnn {
                self.aclnn_launches.fetch_add(1, Relaxed);
            }
            if let Some(name) = l.name {
                match l.op_hash {
                    // classified by the hook: `class` is the name's class
                    Some(h) => self.op_here(
                        dev,
                        l.q.stream,
                        name,
                        (l.class, h),
                        l.ranges,
                        l.flops,
                        here,
                        row,
                    ),
                    None => self.op(dev, l.q.stream, name, l.ranges, l.flops),
                }
            }
        }
        rc
    }
}

/// [`Here::now`] out of line: where the caller may hand its thread's
/// `Here` down, the look-up is made only without one (inline, the compiler
/// calls `__tls_get_addr` on every call and then picks).
#[cold]
#[inline(never)]
fn here_now() -> Option<Here> {
    Here::now()
}
