// Compiled by tests/torch_npu.rs (torch_hint_layout_is_the_wheels) with the
// torch and torch_npu wheels' own headers: reports the layout libu3m.so's
// torch_hints relies on (src/torch_layout.rs), so that a row there is
// checked, never guessed.
#include <torch_npu/csrc/core/npu/NPUCachingAllocator.h>

#include <cstddef>
#include <cstring>
#include <typeinfo>

using namespace c10_npu::NPUCachingAllocator;

// o[0] attach slot, o[1..3] TraceEntry offsets of action_, addr_, size_,
// o[4] FREE_COMPLETED, o[5] sizeof(AllocatorTraceTracker), o[6] sizeof(void*)
extern "C" void probe_layout(long *o) {
  // Itanium ABI: a pointer to a virtual member function holds 1 + the
  // vtable offset of its slot in bytes
  auto pm = &NPUAllocator::attachAllocatorTraceTracker;
  static_assert(sizeof(pm) == 2 * sizeof(long), "Itanium member function pointer");
  long v = 0;
  std::memcpy(&v, &pm, sizeof v);
  o[0] = (v & 1) ? (v - 1) / (long)sizeof(void *) : -1;
  o[1] = offsetof(TraceEntry, action_);
  o[2] = offsetof(TraceEntry, addr_);
  o[3] = offsetof(TraceEntry, size_);
  o[4] = TraceEntry::FREE_COMPLETED;
  o[5] = sizeof(AllocatorTraceTracker);
  o[6] = sizeof(void *);
}

// The allocator's dynamic type, once torch_npu has made it.
extern "C" const char *probe_class() {
  NPUAllocator *a = allocator.load();
  return a ? typeid(*a).name() : "";
}
