//! What the tiering engine needs from a device runtime. libu3m.so implements
//! it with the real CANN functions (never through its own hooks); the
//! offline replayer implements it with a cost model. One engine, two drivers.
//! Handles, streams, events and device addresses are plain integers here.

pub const CHUNK: u64 = 2 << 20;

pub trait Runtime: Send + Sync {
    /// Makes `dev` the calling thread's device (background threads only).
    fn set_device(&self, dev: u32) -> i32;
    /// A 2 MiB-granular physical allocation on `dev`.
    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, i32>;
    fn free_physical(&self, handle: u64) -> i32;
    /// A device VA range on the calling thread's device.
    fn reserve(&self, bytes: u64) -> Result<u64, i32>;
    fn release(&self, va: u64) -> i32;
    fn map(&self, va: u64, bytes: u64, handle: u64) -> i32;
    fn unmap(&self, va: u64) -> i32;
    /// A stream on the calling thread's device.
    fn create_stream(&self) -> Result<u64, i32>;
    /// aclrtMemcpyAsync with an aclrtMemcpyKind.
    fn memcpy_async(&self, dst: u64, src: u64, bytes: u64, kind: i32, stream: u64) -> i32;
    fn sync_stream(&self, stream: u64) -> i32;
    fn create_event(&self) -> Result<u64, i32>;
    fn record_event(&self, event: u64, stream: u64) -> i32;
    /// Ok(true) once everything before the event's latest record has run.
    fn event_done(&self, event: u64) -> Result<bool, i32>;
    fn sync_event(&self, event: u64) -> i32;
    fn stream_wait(&self, stream: u64, event: u64) -> i32;
    /// Pinned host memory.
    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, i32>;
    fn free_host(&self, ptr: *mut u8) -> i32;
    /// aclrtGetMemInfo(ACL_HBM_MEM) on the calling thread's device: (free, total).
    fn mem_info(&self) -> Result<(u64, u64), i32>;
}

pub const MEMCPY_H2D: i32 = 1;
pub const MEMCPY_D2H: i32 = 2;
pub const MEMCPY_D2D: i32 = 3;
