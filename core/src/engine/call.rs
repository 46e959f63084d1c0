//! A hooked call, decoded once. libu3m.so's hooks turn each call's C
//! arguments into a `Call` — what device memory it touches (and whether it
//! writes it), on which stream, whether the host waits for it, what it
//! allocates — and hand it to `Engine::run` together with the real function.
//! The engine runs the whole sequence (observation, residency, the real
//! call, device loss, retry) and returns the C return code. Nothing here
//! knows C prototypes; pointer-sized out-parameters are `Out`s.

use crate::acl::MemcpyKind;
use crate::heat::PinReason;
use crate::opclass::OpClass;

pub use super::{AllocApi, Range};

/// Which return codes a call's API speaks: what a residency failure before
/// the call becomes, and whether ACL_ERROR_RT_DEVICE_TASK_ABORT from it
/// means the card is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// aclError (the runtime).
    Acl,
    /// aclnnStatus (operator library).
    Aclnn,
    /// HcclResult: a residency failure is HCCL_E_MEMORY.
    Hccl,
    /// rtError_t (the lower runtime layer).
    Rt,
}

/// HcclResult HCCL_E_MEMORY (hccl_types.h).
const HCCL_E_MEMORY: i32 = 3;

impl Api {
    /// The code returned when the memory a call needs cannot be made
    /// resident (the call is not made).
    pub fn residency_error(self, e: crate::acl::AclError) -> i32 {
        match self {
            Api::Hccl => HCCL_E_MEMORY,
            Api::Acl | Api::Aclnn | Api::Rt => e.raw(),
        }
    }

    /// Whether a return code says the device is gone.
    pub fn device_lost(self, rc: i32) -> bool {
        self == Api::Acl && rc == crate::acl::AclError::RT_DEVICE_TASK_ABORT.raw()
    }
}

/// Where a call's device work is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queue {
    /// The stream (0: the default stream).
    pub stream: u64,
    /// The call completes before it returns (aclrtMemcpy, aclrtMemset, ...).
    pub sync: bool,
}

impl Queue {
    /// A synchronous call.
    pub const SYNC: Queue = Queue {
        stream: 0,
        sync: true,
    };

    /// Work queued on `stream`.
    #[inline]
    pub const fn on(stream: u64) -> Queue {
        Queue {
            stream,
            sync: false,
        }
    }
}

/// One copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memcpy {
    pub kind: MemcpyKind,
    pub dst: u64,
    /// Bytes the destination spans (a pitched copy spans more than it moves).
    pub dspan: u64,
    pub src: u64,
    pub sspan: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// The destination is overwritten whole over its span (not pitched), so
    /// chunks it covers entirely need no copy-in.
    pub whole: bool,
}

impl Memcpy {
    pub const ZERO: Memcpy = Memcpy {
        kind: MemcpyKind::HOST_TO_HOST,
        dst: 0,
        dspan: 0,
        src: 0,
        sspan: 0,
        bytes: 0,
        whole: true,
    };

    /// `bytes` from `src` to `dst`.
    #[inline]
    pub fn linear(kind: MemcpyKind, dst: u64, src: u64, bytes: u64) -> Memcpy {
        Memcpy {
            kind,
            dst,
            dspan: bytes,
            src,
            sspan: bytes,
            bytes,
            whole: true,
        }
    }

    /// `height` rows of `width` bytes, rows `dpitch` / `spitch` apart
    /// (aclrtMemcpy2d).
    #[inline]
    pub fn pitched(
        kind: MemcpyKind,
        dst: u64,
        dpitch: u64,
        src: u64,
        spitch: u64,
        width: u64,
        height: u64,
    ) -> Memcpy {
        let span = |pitch: u64| {
            if height == 0 {
                0
            } else {
                pitch.saturating_mul(height - 1).saturating_add(width)
            }
        };
        Memcpy {
            kind,
            dst,
            dspan: span(dpitch),
            src,
            sspan: span(spitch),
            bytes: width.saturating_mul(height),
            // a pitched destination is not overwritten whole unless the
            // pitch is the width
            whole: dpitch == width,
        }
    }

    /// Its device ranges by the one copy-direction rule
    /// (`MemcpyKind::sides`): the source read, the destination written.
    #[inline]
    pub fn ranges(&self) -> ([Range; 2], usize) {
        super::copy_ranges(self.kind, self.dst, self.dspan, self.src, self.sspan)
    }
}

/// What kind of launch, for what the engine counts and observes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchKind {
    /// aclopExecute and friends.
    Aclop,
    /// An aclnn operator's execute phase.
    Aclnn,
    /// A small stream operation on device memory (cache maintenance, a
    /// device word written or waited on).
    Stream,
    /// aclmdlExecute: observed only (its datasets are not made resident).
    Model,
}

/// An operator launch.
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    pub kind: LaunchKind,
    /// The name the heat table and the trace see (None: not observed).
    pub name: Option<&'a [u8]>,
    /// Operator class, for the placement policy.
    pub class: OpClass,
    /// `classify_bytes(name).1` when `class` is `classify_bytes(name).0`
    /// (the hook classified the name once: the heat table reuses both);
    /// None: the engine classifies the name itself when it observes it.
    pub op_hash: Option<u64>,
    /// Every device range: inputs read, outputs written.
    pub ranges: &'a [Range],
    /// What residency must cover when it is not `ranges` (an aclnn launch
    /// whose tensors another thread created: every live tensor).
    pub resident: Option<&'a [Range]>,
    pub flops: Option<u64>,
    pub q: Queue,
    pub api: Api,
}

/// A pointer-sized out-parameter of the C call (`void **`, `size_t *`, a
/// handle out). Null is allowed: the runtime reports it.
#[derive(Clone, Copy, Debug)]
pub struct Out(*mut u64);

impl Out {
    pub const NULL: Out = Out(std::ptr::null_mut());

    /// # Safety
    /// `p` is null or valid for reads and writes of one `T` for as long as
    /// the call runs; `T` is 8 bytes (a pointer, `size_t`, `uint64_t`).
    #[inline]
    pub unsafe fn new<T>(p: *mut T) -> Out {
        assert!(std::mem::size_of::<T>() == 8, "an Out is pointer-sized");
        Out(p as *mut u64)
    }

    #[inline]
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// What the call wrote (None: null).
    #[inline]
    pub fn get(self) -> Option<u64> {
        if self.0.is_null() {
            None
        } else {
            // SAFETY: non-null, and valid for one u64 read while the
            // call runs (`Out::new`'s contract).
            Some(unsafe { self.0.read_unaligned() })
        }
    }

    /// Writes the value u3m produced (no-op for null).
    #[inline]
    pub fn set(self, v: u64) {
        if !self.0.is_null() {
            // SAFETY: non-null, valid for one u64 write (`Out::new`).
            unsafe { self.0.write_unaligned(v) }
        }
    }
}

/// A hooked call, decoded.
#[derive(Debug)]
pub enum Call<'a> {
    // ---- device work: made resident before, observed after ----
    /// aclrtMemcpy, aclrtMemcpyAsync, aclrtMemcpy2d(Async).
    Copy {
        copy: Memcpy,
        q: Queue,
    },
    /// aclrtMemcpyBatch(Async): every entry, each with its own kind.
    CopyBatch {
        copies: &'a [Memcpy],
        q: Queue,
    },
    /// aclrtMemset(Async), aclrtMemsetD32(Async): `bytes` at `addr` written.
    Memset {
        addr: u64,
        bytes: u64,
        q: Queue,
    },
    Launch(Launch<'a>),
    /// An HCCL collective or point-to-point transfer.
    Collective {
        name: &'a [u8],
        ranges: &'a [Range],
        q: Queue,
    },
    /// A kernel launch whose device pointers hide in an argument blob
    /// (pointer-sized slots inside live allocations are its ranges).
    Kernel {
        blob: &'a [u8],
        q: Queue,
        api: Api,
    },
    /// A kernel launch whose arguments u3m cannot read (an args handle).
    OpaqueKernel {
        q: Queue,
    },
    /// A captured graph replayed: everything it touched at capture.
    GraphReplay {
        model: u64,
        q: Queue,
    },

    // ---- allocation: the engine may own these ----
    /// aclrtMalloc family; `out` receives the device pointer. `policy` is
    /// the program's aclrtMemMallocPolicy, unchecked.
    Malloc {
        api: AllocApi,
        size: u64,
        policy: i32,
        out: Out,
    },
    /// aclrtFree.
    Free {
        ptr: u64,
    },
    /// aclrtMallocHost(WithCfg); `out` receives the host pointer.
    MallocHost {
        size: u64,
        out: Out,
    },
    FreeHost {
        ptr: u64,
    },
    /// aclrtHostRegister: `alias` receives the device alias of the host
    /// range; aclrtHostRegisterV2 (`alias` None) maps it at the host address
    /// itself.
    HostRegister {
        host: u64,
        size: u64,
        alias: Option<Out>,
    },
    HostUnregister {
        host: u64,
    },
    /// aclrtGetMemInfo: tier mode reports the virtual capacity.
    MemInfo {
        attr: i32,
        free: Out,
        total: Out,
    },
    /// aclrtResetDevice: the runtime drops everything on `device`.
    ResetDevice {
        device: i32,
    },
    /// aclrtIpcMemGetExportKey: the range must never move.
    IpcExport {
        addr: u64,
        size: u64,
    },
    /// aclrtIpcMemImportByKey: another process's memory.
    IpcImport,
    /// Memory HCCL or another party holds the pages of: never moved.
    Pin {
        addr: u64,
        len: u64,
        reason: PinReason,
    },

    // ---- virtual memory ----
    /// aclrtReserveMemAddress; `out` receives the VA.
    Reserve {
        size: u64,
        out: Out,
    },
    Release {
        va: u64,
    },
    /// aclrtMallocPhysical on `device`; u3m hands out its own handle for a
    /// non-shareable one (`plain`: a property given, flags 0).
    MallocPhysical {
        device: i32,
        size: u64,
        shareable: bool,
        plain: bool,
        out: Out,
    },
    FreePhysical {
        handle: u64,
    },
    /// aclrtMapMem (`flags` as passed).
    Map {
        va: u64,
        size: u64,
        offset: u64,
        handle: u64,
        flags: u64,
    },
    Unmap {
        va: u64,
    },
    /// aclrtMemExportToShareableHandle: the handle the real call receives is
    /// `pass` (u3m substitutes the real handle behind one of its own).
    ExportHandle {
        handle: u64,
        pass: &'a std::cell::Cell<u64>,
    },
    /// aclrtMemImportFromShareableHandle; `out` receives the handle.
    ImportHandle {
        device: i32,
        out: Out,
    },

    // ---- graphs and lifecycle ----
    /// Capture begins on `stream` (aclmdlRICaptureBegin, ...ToModelBegin).
    CaptureBegin {
        stream: u64,
    },
    /// aclmdlRICaptureEnd; `out` receives the graph.
    CaptureEnd {
        stream: u64,
        out: Out,
    },
    GraphDestroy {
        model: u64,
    },
    /// aclFinalize: flush before the runtime goes.
    Finalize,
}
