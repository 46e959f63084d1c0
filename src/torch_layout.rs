//! The torch_npu caching-allocator layouts `torch_hints` knows. Each row is
//! checked against that wheel's own headers and allocator by
//! tests/torch_npu.rs (`torch_hint_layout_is_the_wheels`), which compiles a
//! probe with them: a wrong row would call the wrong virtual function, so
//! a version not listed here gets no hints at all.

/// One torch_npu build's layout.
pub struct Layout {
    /// torch_npu's `__version__` (torch_npu/version.py), exactly.
    pub version: &'static str,
    /// The RTTI name of the allocator's dynamic type (what
    /// `c10_npu::NPUCachingAllocator::allocator` points at).
    pub class: &'static str,
    /// The vtable slot (in pointers) of
    /// `NPUAllocator::attachAllocatorTraceTracker(AllocatorTraceTracker)`.
    pub attach_slot: usize,
    /// Byte offsets in `TraceEntry` of `action_` (an int enum), `addr_`
    /// and `size_` (64-bit each).
    pub action: usize,
    pub addr: usize,
    pub size: usize,
    /// `TraceEntry::FREE_COMPLETED`: a freed block is back in the pool.
    pub free_completed: i32,
}

/// `c10_npu::NPUCachingAllocator::allocator`, a `std::atomic<NPUAllocator*>`
/// libtorch_npu.so exports.
pub const ALLOCATOR_SYMBOL: &std::ffi::CStr = c"_ZN7c10_npu19NPUCachingAllocator9allocatorE";

/// `sizeof(std::function<void(const TraceEntry&)>)` in libstdc++: the
/// stored functor (16 bytes), the manager and the invoker.
pub const STD_FUNCTION_BYTES: usize = 32;

pub const KNOWN: &[Layout] = &[Layout {
    version: "2.14.0",
    class: "N7c10_npu19NPUCachingAllocator19NpuCachingAllocatorE",
    attach_slot: 57,
    action: 0,
    addr: 8,
    size: 40,
    free_completed: 2,
}];
