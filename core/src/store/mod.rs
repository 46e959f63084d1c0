//! The stores behind the DRAM and NVMe tiers (the placement levels below
//! HBM): pinned host DRAM and an NVMe swap file, each carved by the seed's
//! pool allocator. docs/stores.md describes them.

pub mod dram;
pub mod nvme;
pub mod pool;

use std::fmt;
use std::path::PathBuf;

/// Why a store could not take or return data. No store operation panics or lets
/// a signal through for these conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The store's configured byte limit is reached (U3M_DRAM_BYTES /
    /// U3M_SWAP_BYTES), or the request is larger than the limit.
    Full,
    /// The filesystem holding the swap file is out of space (ENOSPC).
    NoSpace,
    /// Any other I/O error on the swap file, as an errno.
    Io(i32),
    /// The host allocator (aclrtMallocHost) refused a slab, with its code.
    HostAlloc(i32),
    /// `free`, `read` or `write` of a slot this store did not hand out, or has
    /// already taken back; or a buffer longer than the slot.
    BadSlot,
    /// The swap directory is unusable; `what` says why, naming no data.
    SwapDir { dir: PathBuf, what: String },
}

impl StoreError {
    /// An `io::Error` as a store error: ENOSPC is `NoSpace`, the rest `Io`.
    pub fn from_io(e: &std::io::Error) -> StoreError {
        match e.raw_os_error() {
            Some(libc::ENOSPC) => StoreError::NoSpace,
            Some(n) => StoreError::Io(n),
            None => StoreError::Io(libc::EIO),
        }
    }

    pub fn from_errno(n: i32) -> StoreError {
        if n == libc::ENOSPC {
            StoreError::NoSpace
        } else {
            StoreError::Io(n)
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Full => write!(f, "store full (byte limit reached)"),
            StoreError::NoSpace => write!(f, "no space left on the swap device"),
            StoreError::Io(n) => write!(
                f,
                "swap I/O error: {}",
                std::io::Error::from_raw_os_error(*n)
            ),
            StoreError::HostAlloc(c) => write!(f, "pinned host allocation failed (code {c})"),
            StoreError::BadSlot => write!(f, "slot not owned by this store"),
            StoreError::SwapDir { dir, what } => {
                write!(f, "swap directory {}: {what}", dir.display())
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// One store's figures, for the stats segment. Byte figures count the pool's
/// rounded (32-byte) sizes; the I/O counters stay 0 for DRAM.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StoreStats {
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

impl StoreStats {
    pub(crate) fn from_pool(limit: u64, p: &pool::PoolStats) -> StoreStats {
        StoreStats {
            limit,
            capacity: p.total,
            used: p.used,
            free: p.free,
            largest_free: p.largest_free,
            fragmentation: p.fragmentation,
            allocs: p.allocs,
            free_blocks: p.free_blocks,
            segments: p.segments,
            ..StoreStats::default()
        }
    }
}
