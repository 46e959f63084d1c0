//! Virtual-memory hooks: reservations, physical handles (tier mode hands
//! out its own for plain, non-shareable ones), mappings (expandable
//! segments), and shareable-handle IPC (whose memory must never move).
//!
//! Safety: every `pub unsafe fn` here is a hook handler,
//! `unsafe fn(&Cx, Real<args::NAME>, args::NAME)`; its contract is the C
//! prototype's (table.rs): the arguments are the program's, valid as that
//! function documents them, and `real` is the next definition of the name.
//! Pointers are read only where the runtime itself would read them.

use std::cell::Cell;

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use crate::init::current_device;
use u3m_core::engine::{Call, Out};

pub unsafe fn reserve(
    cx: &Cx,
    real: Real<aclrtReserveMemAddress>,
    a: aclrtReserveMemAddress,
) -> aclError {
    let call = Call::Reserve {
        size: a.size as u64,
        out: Out::new(a.vir_ptr),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn release(
    cx: &Cx,
    real: Real<aclrtReleaseMemAddress>,
    a: aclrtReleaseMemAddress,
) -> aclError {
    let call = Call::Release {
        va: a.vir_ptr as u64,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn malloc_physical(
    cx: &Cx,
    real: Real<aclrtMallocPhysical>,
    a: aclrtMallocPhysical,
) -> aclError {
    let prop = a.prop.as_ref();
    let call = Call::MallocPhysical {
        device: prop
            .map(|p| p.location.id as i32)
            .unwrap_or(current_device()),
        size: a.size as u64,
        shareable: prop.map(|p| p.handle_type != 0).unwrap_or(false),
        plain: prop.is_some() && a.flags == 0,
        out: Out::new(a.handle),
    };
    super::alloc::allocated(cx.run(&call, || real.call(a)))
}

pub unsafe fn free_physical(
    cx: &Cx,
    real: Real<aclrtFreePhysical>,
    a: aclrtFreePhysical,
) -> aclError {
    let call = Call::FreePhysical {
        handle: a.handle as u64,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn map(cx: &Cx, real: Real<aclrtMapMem>, a: aclrtMapMem) -> aclError {
    let call = Call::Map {
        va: a.vir_ptr as u64,
        size: a.size as u64,
        offset: a.offset as u64,
        handle: a.handle as u64,
        flags: a.flags,
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn unmap(cx: &Cx, real: Real<aclrtUnmapMem>, a: aclrtUnmapMem) -> aclError {
    let call = Call::Unmap {
        va: a.vir_ptr as u64,
    };
    cx.run(&call, || real.call(a))
}

/// The handle the runtime exports may be u3m's substitute for one of its
/// own handles.
pub unsafe fn export_shareable(
    cx: &Cx,
    real: Real<aclrtMemExportToShareableHandle>,
    a: aclrtMemExportToShareableHandle,
) -> aclError {
    let pass = Cell::new(a.handle as u64);
    let call = Call::ExportHandle {
        handle: a.handle as u64,
        pass: &pass,
    };
    cx.run(&call, || {
        let mut a = a;
        a.handle = pass.get() as aclrtDrvMemHandle;
        real.call(a)
    })
}

pub unsafe fn import_shareable(
    cx: &Cx,
    real: Real<aclrtMemImportFromShareableHandle>,
    a: aclrtMemImportFromShareableHandle,
) -> aclError {
    let call = Call::ImportHandle {
        device: a.device_id,
        out: Out::new(a.handle),
    };
    cx.run(&call, || real.call(a))
}

pub unsafe fn set_pid_shareable(
    _cx: &Cx,
    real: Real<aclrtMemSetPidToShareableHandle>,
    a: aclrtMemSetPidToShareableHandle,
) -> aclError {
    real.call(a)
}

/// A device range exported to other processes: it must never move (tier
/// mode makes it resident and pins it first).
pub unsafe fn ipc_export_key(
    cx: &Cx,
    real: Real<aclrtIpcMemGetExportKey>,
    a: aclrtIpcMemGetExportKey,
) -> aclError {
    let call = Call::IpcExport {
        addr: a.dev_ptr as u64,
        size: a.size as u64,
    };
    cx.run(&call, || real.call(a))
}

/// Another process's allocation mapped into this one: not u3m's to move.
pub unsafe fn ipc_import_key(
    cx: &Cx,
    real: Real<aclrtIpcMemImportByKey>,
    a: aclrtIpcMemImportByKey,
) -> aclError {
    cx.run(&Call::IpcImport, || real.call(a))
}

pub unsafe fn ipc_close(_cx: &Cx, real: Real<aclrtIpcMemClose>, a: aclrtIpcMemClose) -> aclError {
    real.call(a)
}
