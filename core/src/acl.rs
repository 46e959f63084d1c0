//! The CANN vocabulary the engine speaks: a typed ACL error (the raw
//! `aclError` exists only at the hook boundary and inside `Runtime`
//! implementations) and the copy-direction rule — which sides of an
//! `aclrtMemcpyKind` are device memory — used by residency and observation
//! alike. Values are the real headers' (torch_npu 2.14.0: acl/acl_base_rt.h,
//! acl/error_codes/rt_error_codes.h, acl/acl_rt.h).

use std::fmt;
use std::num::NonZeroI32;

use crate::trace::event::CopyKind;

/// An ACL runtime error code: never ACL_SUCCESS (0). `Result<T, AclError>`
/// is what engine code returns; `raw()` converts at the C boundary.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclError(NonZeroI32);

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident = $v:expr; )*) => {
        impl AclError {
            $( $(#[$doc])* pub const $name: AclError = AclError(match NonZeroI32::new($v) {
                Some(v) => v,
                None => panic!("0 is not an error"),
            }); )*

            /// The header's name of a code this module knows.
            pub fn name(self) -> Option<&'static str> {
                match self.0.get() {
                    $( $v => Some(concat!("ACL_ERROR_", stringify!($name))), )*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// ACL_ERROR_INVALID_PARAM: an argument the ACL layer rejects.
    INVALID_PARAM = 100000;
    /// ACL_ERROR_RT_PARAM_INVALID: an argument the runtime rejects.
    RT_PARAM_INVALID = 107000;
    /// ACL_ERROR_RT_STREAM_CONTEXT: a stream used while another device is
    /// the thread's current one.
    RT_STREAM_CONTEXT = 107003;
    /// ACL_ERROR_RT_DEVICE_TASK_ABORT: the device has gone away (card failure).
    RT_DEVICE_TASK_ABORT = 107022;
    /// ACL_ERROR_RT_FEATURE_NOT_SUPPORT: also what u3m returns for a hooked
    /// function the underlying runtime lacks.
    RT_FEATURE_NOT_SUPPORT = 207000;
    /// ACL_ERROR_RT_MEMORY_ALLOCATION: out of (device or host) memory.
    RT_MEMORY_ALLOCATION = 207001;
    /// ACL_ERROR_RT_MEMORY_FREE: a free the runtime refuses (e.g. a
    /// physical handle that is still mapped).
    RT_MEMORY_FREE = 207002;
    /// ACL_ERROR_RT_FAILURE: an unspecified runtime failure.
    RT_FAILURE = 500003;
    /// ACL_ERROR_RT_DEVICE_MEM_ERROR: a device MMU fault (work touched
    /// unmapped device memory).
    RT_DEVICE_MEM_ERROR = 507053;
}

impl AclError {
    /// The error a raw `aclError` names; None for ACL_SUCCESS.
    #[inline]
    pub const fn from_raw(rc: i32) -> Option<AclError> {
        match NonZeroI32::new(rc) {
            Some(v) => Some(AclError(v)),
            None => None,
        }
    }

    /// A raw return code as a result: Ok for ACL_SUCCESS.
    #[inline]
    pub const fn check(rc: i32) -> Result<(), AclError> {
        match AclError::from_raw(rc) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The raw code, for the C caller.
    #[inline]
    pub const fn raw(self) -> i32 {
        self.0.get()
    }

    /// The raw code of a result: 0 for Ok.
    #[inline]
    pub fn raw_of<T>(r: &Result<T, AclError>) -> i32 {
        match r {
            Ok(_) => 0,
            Err(e) => e.raw(),
        }
    }
}

impl fmt::Debug for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.raw()),
            None => write!(f, "ACL error {}", self.raw()),
        }
    }
}

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for AclError {}

/// Where one side of a copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Host,
    Device,
    /// ACL_MEMCPY_DEFAULT (and kinds this module does not know): the runtime
    /// decides by the address. Treated as possibly device memory: a host
    /// address simply matches no device allocation.
    Either,
}

impl Side {
    /// Whether the engine must treat this side as device memory.
    #[inline]
    pub fn maybe_device(self) -> bool {
        !matches!(self, Side::Host)
    }
}

/// `aclrtMemcpyKind`, as the program passed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemcpyKind(pub i32);

impl MemcpyKind {
    pub const HOST_TO_HOST: MemcpyKind = MemcpyKind(0);
    pub const HOST_TO_DEVICE: MemcpyKind = MemcpyKind(1);
    pub const DEVICE_TO_HOST: MemcpyKind = MemcpyKind(2);
    pub const DEVICE_TO_DEVICE: MemcpyKind = MemcpyKind(3);
    pub const DEFAULT: MemcpyKind = MemcpyKind(4);
    /// Host to device through a runtime staging buffer: the source is host
    /// memory, the destination device memory.
    pub const HOST_TO_BUF_TO_DEVICE: MemcpyKind = MemcpyKind(5);
    /// Device to device on one device.
    pub const INNER_DEVICE_TO_DEVICE: MemcpyKind = MemcpyKind(6);
    /// Device to device across devices.
    pub const INTER_DEVICE_TO_DEVICE: MemcpyKind = MemcpyKind(7);

    /// The rule, in one place: (destination, source) sides of a copy of
    /// this kind. Residency makes the device sides resident; the heat table,
    /// the stats and the trace see the same sides.
    #[inline]
    pub fn sides(self) -> (Side, Side) {
        use Side::*;
        match self.0 {
            0 => (Host, Host),
            1 | 5 => (Device, Host),
            2 => (Host, Device),
            3 | 6 | 7 => (Device, Device),
            _ => (Either, Either),
        }
    }

    /// The direction the trace records; None when the runtime decides by
    /// address (ACL_MEMCPY_DEFAULT, unknown kinds): the recorder resolves
    /// it from the live allocations.
    #[inline]
    pub fn direction(self) -> Option<CopyKind> {
        match self.sides() {
            (Side::Host, Side::Host) => Some(CopyKind::H2H),
            (Side::Device, Side::Host) => Some(CopyKind::H2D),
            (Side::Host, Side::Device) => Some(CopyKind::D2H),
            (Side::Device, Side::Device) => Some(CopyKind::D2D),
            _ => None,
        }
    }

    /// The host may be reading device memory back (the source may be on the
    /// device, the destination on the host): what a lost device's host
    /// copies can serve.
    #[inline]
    pub fn reads_device(self) -> bool {
        let (d, s) = self.sides();
        d != Side::Device && s.maybe_device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_their_raw_codes() {
        assert_eq!(AclError::check(0), Ok(()));
        for rc in [
            100000, 107000, 107022, 207000, 207001, 207002, 500003, 507053, -1, 42,
        ] {
            let e = AclError::from_raw(rc).unwrap();
            assert_eq!(e.raw(), rc);
            assert_eq!(AclError::check(rc), Err(e));
        }
        assert_eq!(AclError::RT_MEMORY_ALLOCATION.raw(), 207001);
        assert_eq!(AclError::RT_DEVICE_TASK_ABORT.raw(), 107022);
        assert_eq!(
            format!("{:?}", AclError::RT_MEMORY_ALLOCATION),
            "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)"
        );
        assert_eq!(
            format!("{}", AclError::from_raw(42).unwrap()),
            "ACL error 42"
        );
        assert_eq!(std::mem::size_of::<Result<(), AclError>>(), 4);
    }

    /// Every aclrtMemcpyKind of acl_rt.h (ACL_MEMCPY_HOST_TO_HOST = 0 ...
    /// ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7) and an unknown value.
    #[test]
    fn copy_sides_for_every_kind() {
        use Side::*;
        let want = [
            (0, (Host, Host), Some(CopyKind::H2H)),
            (1, (Device, Host), Some(CopyKind::H2D)),
            (2, (Host, Device), Some(CopyKind::D2H)),
            (3, (Device, Device), Some(CopyKind::D2D)),
            (4, (Either, Either), None),
            (5, (Device, Host), Some(CopyKind::H2D)),
            (6, (Device, Device), Some(CopyKind::D2D)),
            (7, (Device, Device), Some(CopyKind::D2D)),
            (8, (Either, Either), None),
            (-1, (Either, Either), None),
        ];
        for (k, sides, dir) in want {
            let kind = MemcpyKind(k);
            assert_eq!(kind.sides(), sides, "kind {k}");
            assert_eq!(kind.direction(), dir, "kind {k}");
            // the trace's own direction agrees with the rule
            if let Some(d) = dir {
                assert_eq!(d.dst_on_device(), sides.0 == Device, "kind {k}");
                assert_eq!(d.src_on_device(), sides.1 == Device, "kind {k}");
            }
        }
        let reads: Vec<i32> = (0..8).filter(|&k| MemcpyKind(k).reads_device()).collect();
        assert_eq!(reads, vec![2, 4]);
    }
}
