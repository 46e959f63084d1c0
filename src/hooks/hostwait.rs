//! Hooks of device work that waits for the host: a host function or
//! callback run in stream order (it may call the runtime, which u3m hooks,
//! or wait for the program's other threads), a wait on a notify another
//! thread records later. Each tells the engine before queuing the work
//! (`Engine::program_waits_on_host`): from then on u3m never orders its own
//! streams after program work, since it waits for those streams with a
//! device's lock held in places (U3M_HANDOFF, core/src/residency/migrate.rs
//! `may_order_after_program`). The calls themselves touch no device memory
//! u3m can see and run unchanged. (`aclrtValueWait`, a stream-ordered read
//! of a device word, does the same in copy.rs.)
//!
//! Safety: every `pub unsafe fn` here is a hook handler,
//! `unsafe fn(&Cx, Real<args::NAME>, args::NAME)`; its contract is the C
//! prototype's (table.rs).

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;

pub unsafe fn launch_host_func(
    cx: &Cx,
    real: Real<aclrtLaunchHostFunc>,
    a: aclrtLaunchHostFunc,
) -> aclError {
    cx.note(|e| e.program_waits_on_host());
    real.call(a)
}

pub unsafe fn launch_callback(
    cx: &Cx,
    real: Real<aclrtLaunchCallback>,
    a: aclrtLaunchCallback,
) -> aclError {
    cx.note(|e| e.program_waits_on_host());
    real.call(a)
}

pub unsafe fn wait_notify(
    cx: &Cx,
    real: Real<aclrtWaitAndResetNotify>,
    a: aclrtWaitAndResetNotify,
) -> aclError {
    cx.note(|e| e.program_waits_on_host());
    real.call(a)
}

pub unsafe fn wait_cnt_notify(
    cx: &Cx,
    real: Real<aclrtCntNotifyWaitWithTimeout>,
    a: aclrtCntNotifyWaitWithTimeout,
) -> aclError {
    cx.note(|e| e.program_waits_on_host());
    real.call(a)
}
