//! The storage tiers below HBM: pinned host DRAM and an NVMe swap file, each
//! carved by the seed's pool allocator. docs/tiers.md describes them.

pub mod dram;
pub mod nvme;
pub mod pool;

use std::fmt;
use std::path::PathBuf;

/// Why a tier could not take or return data. No tier operation panics or lets
/// a signal through for these conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierError {
    /// The tier's configured byte limit is reached (U3M_DRAM_BYTES /
    /// U3M_SWAP_BYTES), or the request is larger than the limit.
    Full,
    /// The filesystem holding the swap file is out of space (ENOSPC).
    NoSpace,
    /// Any other I/O error on the swap file, as an errno.
    Io(i32),
    /// The host allocator (aclrtMallocHost) refused a slab, with its code.
    HostAlloc(i32),
    /// `free`, `read` or `write` of a slot this tier did not hand out, or has
    /// already taken back; or a buffer longer than the slot.
    BadSlot,
    /// The swap directory is unusable; `what` says why, naming no data.
    SwapDir { dir: PathBuf, what: String },
}

impl TierError {
    /// An `io::Error` as a tier error: ENOSPC is `NoSpace`, the rest `Io`.
    pub fn from_io(e: &std::io::Error) -> TierError {
        match e.raw_os_error() {
            Some(libc::ENOSPC) => TierError::NoSpace,
            Some(n) => TierError::Io(n),
            None => TierError::Io(libc::EIO),
        }
    }

    pub fn from_errno(n: i32) -> TierError {
        if n == libc::ENOSPC {
            TierError::NoSpace
        } else {
            TierError::Io(n)
        }
    }
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierError::Full => write!(f, "tier full (byte limit reached)"),
            TierError::NoSpace => write!(f, "no space left on the swap device"),
            TierError::Io(n) => write!(
                f,
                "swap I/O error: {}",
                std::io::Error::from_raw_os_error(*n)
            ),
            TierError::HostAlloc(c) => write!(f, "pinned host allocation failed (code {c})"),
            TierError::BadSlot => write!(f, "slot not owned by this tier"),
            TierError::SwapDir { dir, what } => {
                write!(f, "swap directory {}: {what}", dir.display())
            }
        }
    }
}

impl std::error::Error for TierError {}

/// One tier's figures, for the stats segment. Byte figures count the pool's
/// rounded (32-byte) sizes; the I/O counters stay 0 for DRAM.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierStats {
    pub limit: u64,
    /// Bytes obtained from the host allocator / the filesystem.
    pub capacity: u64,
    pub used: u64,
    pub free: u64,
    pub largest_free: u64,
    /// 1 − largest free block / total free; 0 when nothing is free.
    pub fragmentation: f64,
    pub allocs: u64,
    pub free_blocks: u64,
    /// Slabs (DRAM) or extents (NVMe) held now.
    pub segments: u64,
    /// Slabs / extents obtained and released so far.
    pub grows: u64,
    pub releases: u64,
    /// Growth attempts the host allocator or filesystem refused.
    pub grow_failures: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub io_errors: u64,
}

impl TierStats {
    pub(crate) fn from_pool(limit: u64, p: &pool::PoolStats) -> TierStats {
        TierStats {
            limit,
            capacity: p.total,
            used: p.used,
            free: p.free,
            largest_free: p.largest_free,
            fragmentation: p.fragmentation,
            allocs: p.allocs,
            free_blocks: p.free_blocks,
            segments: p.segments,
            ..TierStats::default()
        }
    }
}
