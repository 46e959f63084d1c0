//! Kernel launches whose device pointers hide in an opaque argument blob: the
//! engine scans the blob's pointer-sized slots for addresses inside live
//! device allocations (a heuristic: a slot that happens to hold such a value
//! is treated as an access). Launches whose arguments u3m cannot read at all
//! (an args handle) are counted as opaque.
//!
//! Safety: every `pub unsafe fn` here is a hook handler,
//! `unsafe fn(&Cx, Real<args::NAME>, args::NAME)`; its contract is the C
//! prototype's (table.rs): the arguments are the program's, valid as that
//! function documents them, and `real` is the next definition of the name.
//! Pointers are read only where the runtime itself would read them.

use std::ffi::c_void;

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use u3m_core::engine::{Api, Call, Queue};

/// The argument blob u3m reads: 8 bytes to 1 MiB (else none).
///
/// # Safety
/// aclrtLaunchKernel's contract: `args` is readable for `size` bytes while
/// the call runs (the returned slice does not outlive it).
unsafe fn blob<'a>(args: *const c_void, size: usize) -> &'a [u8] {
    if args.is_null() || !(8..=(1 << 20)).contains(&size) {
        &[]
    } else {
        std::slice::from_raw_parts(args as *const u8, size)
    }
}

fn kernel(blob: &[u8], stream: aclrtStream, api: Api) -> Call<'_> {
    Call::Kernel {
        blob,
        q: Queue::on(stream as u64),
        api,
    }
}

pub unsafe fn launch(cx: &Cx, real: Real<aclrtLaunchKernel>, a: aclrtLaunchKernel) -> aclError {
    let call = kernel(blob(a.args, a.args_size), a.stream, Api::Acl);
    cx.run(&call, || real.call(a))
}

pub unsafe fn launch_v2(
    cx: &Cx,
    real: Real<aclrtLaunchKernelV2>,
    a: aclrtLaunchKernelV2,
) -> aclError {
    let call = kernel(blob(a.args, a.args_size), a.stream, Api::Acl);
    cx.run(&call, || real.call(a))
}

pub unsafe fn launch_with_config(
    cx: &Cx,
    real: Real<aclrtLaunchKernelWithConfig>,
    a: aclrtLaunchKernelWithConfig,
) -> aclError {
    let call = Call::OpaqueKernel {
        q: Queue::on(a.stream as u64),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn launch_with_host_args(
    cx: &Cx,
    real: Real<aclrtLaunchKernelWithHostArgs>,
    a: aclrtLaunchKernelWithHostArgs,
) -> aclError {
    let call = kernel(blob(a.host_args, a.args_size), a.stream, Api::Acl);
    cx.run(&call, || real.call(a))
}

pub unsafe fn rt_kernel_launch(
    cx: &Cx,
    real: Real<rtKernelLaunch>,
    a: rtKernelLaunch,
) -> rtError_t {
    let call = kernel(blob(a.args, a.args_size as usize), a.stream, Api::Rt);
    cx.run(&call, || real.call(a))
}
