//! The DRAM store: pinned host memory obtained in large slabs (never beyond a
//! byte limit) and carved by the pool. Pool offsets are host addresses, so a
//! slot's pointer is its offset.
//!
//! The store never calls ACL: a `HostAllocator` supplies the slabs —
//! aclrtMallocHost/aclrtFreeHost inside libu3m.so, mmap in tests. Methods take
//! `&mut self`; the owner wraps the store in a lock.

use std::collections::BTreeMap;

use super::pool::{self, Pool, SegmentId};
use super::{StoreError, StoreStats};

/// Supplies pinned host memory in slab-sized pieces.
pub trait HostAllocator: Send {
    /// `bytes` of host memory, or the allocator's error code.
    fn alloc(&self, bytes: usize) -> Result<*mut u8, i32>;
    /// Returns a region `alloc` gave out; `bytes` is what was asked for.
    fn free(&self, ptr: *mut u8, bytes: usize);
}

impl<A: HostAllocator + ?Sized> HostAllocator for Box<A> {
    fn alloc(&self, bytes: usize) -> Result<*mut u8, i32> {
        (**self).alloc(bytes)
    }
    fn free(&self, ptr: *mut u8, bytes: usize) {
        (**self).free(ptr, bytes)
    }
}

/// A piece of DRAM the store handed out. Not `Clone`: give it back once.
#[derive(Debug, PartialEq, Eq)]
pub struct DramSlot {
    pub ptr: *mut u8,
    /// Bytes asked for (the pool reserves it rounded up to 32).
    pub len: u64,
}

// SAFETY: a slot is an address and a length; the store that owns the memory
// is what synchronises access to its bookkeeping.
unsafe impl Send for DramSlot {}
unsafe impl Sync for DramSlot {}

impl DramSlot {
    /// The slot's bytes.
    ///
    /// # Safety
    /// The slot must be live in its store, and no one may write it meanwhile.
    pub unsafe fn as_slice(&self) -> &[u8] {
        std::slice::from_raw_parts(self.ptr, self.len as usize)
    }

    /// # Safety
    /// The slot must be live in its store, and this the only access to it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr, self.len as usize)
    }
}

struct Slab {
    ptr: *mut u8,
    bytes: usize,
}

pub struct DramStore<A: HostAllocator = Box<dyn HostAllocator>> {
    pool: Pool,
    slabs: BTreeMap<SegmentId, Slab>,
    limit: u64,
    slab_bytes: u64,
    /// Bytes of all slabs as the allocator gave them (before alignment).
    held: u64,
    alloc: A,
    grows: u64,
    releases: u64,
    grow_failures: u64,
}

// SAFETY: the slabs are plain host memory owned by the store; the allocator is
// Send. Callers serialise access with a lock.
unsafe impl<A: HostAllocator> Send for DramStore<A> {}

impl<A: HostAllocator> DramStore<A> {
    /// A store that grows by `slab_bytes` at a time up to `limit_bytes`.
    /// Nothing is allocated until the first `alloc`.
    pub fn new(limit_bytes: u64, slab_bytes: u64, alloc: A) -> DramStore<A> {
        DramStore {
            pool: Pool::new(),
            slabs: BTreeMap::new(),
            limit: limit_bytes,
            slab_bytes: slab_bytes.max(pool::ALIGN),
            held: 0,
            alloc,
            grows: 0,
            releases: 0,
            grow_failures: 0,
        }
    }

    /// `len` bytes of DRAM, growing a slab when no free block fits.
    /// `Full` when the limit would be passed; `HostAlloc` when the allocator
    /// refuses even the smallest slab that would hold the request.
    pub fn alloc(&mut self, len: u64) -> Result<DramSlot, StoreError> {
        if let Some(off) = self.pool.alloc(len) {
            return Ok(DramSlot {
                ptr: off as *mut u8,
                len,
            });
        }
        self.grow(len)?;
        match self.pool.alloc(len) {
            Some(off) => Ok(DramSlot {
                ptr: off as *mut u8,
                len,
            }),
            None => Err(StoreError::Full),
        }
    }

    /// Adds a slab that can hold `len`: `slab_bytes`, or bigger for a big
    /// request, or — when pinned memory is short — halved down to what the
    /// request needs.
    fn grow(&mut self, len: u64) -> Result<(), StoreError> {
        // Allocators return page-aligned memory, so a slab of `need` bytes
        // holds the request; one that does not leaves the request `Full`.
        let need = pool::align_up(len.max(1)).ok_or(StoreError::Full)?;
        let room = self.limit.saturating_sub(self.held);
        if need > room {
            return Err(StoreError::Full);
        }
        let mut size = self.slab_bytes.max(need).min(room);
        loop {
            match self.alloc.alloc(size as usize) {
                Ok(p) if !p.is_null() => {
                    let id = match self.pool.add_segment(p as u64, size) {
                        Ok(id) => id,
                        Err(_) => {
                            // An allocator handing out overlapping memory is
                            // broken; do not use what it gave.
                            self.alloc.free(p, size as usize);
                            self.grow_failures += 1;
                            return Err(StoreError::HostAlloc(-1));
                        }
                    };
                    self.slabs.insert(
                        id,
                        Slab {
                            ptr: p,
                            bytes: size as usize,
                        },
                    );
                    self.held += size;
                    self.grows += 1;
                    return Ok(());
                }
                r => {
                    self.grow_failures += 1;
                    let code = r.err().unwrap_or(-1);
                    let smaller = (size / 2).max(need);
                    if smaller >= size {
                        return Err(StoreError::HostAlloc(code));
                    }
                    size = smaller;
                }
            }
        }
    }

    /// Gives a slot back. `BadSlot` if this store did not hand it out or it was
    /// already freed.
    pub fn free(&mut self, slot: DramSlot) -> Result<(), StoreError> {
        self.pool
            .free(slot.ptr as u64)
            .map(|_| ())
            .map_err(|_| StoreError::BadSlot)
    }

    /// Returns every slab that holds no live slot to the allocator; the
    /// bytes released.
    pub fn shrink(&mut self) -> u64 {
        let mut released = 0;
        for id in self.pool.free_segments() {
            if self.pool.remove_segment(id).is_ok() {
                if let Some(s) = self.slabs.remove(&id) {
                    self.alloc.free(s.ptr, s.bytes);
                    self.held -= s.bytes as u64;
                    released += s.bytes as u64;
                    self.releases += 1;
                }
            }
        }
        released
    }

    /// Bytes in live slots (rounded to 32).
    pub fn used(&self) -> u64 {
        self.pool.used()
    }

    /// Bytes held from the allocator.
    pub fn capacity(&self) -> u64 {
        self.held
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// used / limit: the figure the 95 % spill watermark is compared with.
    pub fn fill_fraction(&self) -> f64 {
        if self.limit == 0 {
            1.0
        } else {
            self.used() as f64 / self.limit as f64
        }
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            capacity: self.held,
            grows: self.grows,
            releases: self.releases,
            grow_failures: self.grow_failures,
            ..StoreStats::from_pool(self.limit, &self.pool.stats())
        }
    }
}

impl<A: HostAllocator> Drop for DramStore<A> {
    /// Returns every slab, live slots included: the store owns their memory.
    fn drop(&mut self) {
        for (_, s) in std::mem::take(&mut self.slabs) {
            self.alloc.free(s.ptr, s.bytes);
        }
    }
}
