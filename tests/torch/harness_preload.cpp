// Test-harness preload for running torch_npu on the CUDA build of torch.
// NOT part of u3m: it never goes into libu3m.so and only the torch_npu test
// tier (tests/torch_npu.rs, docs/torch-npu.md) loads it.
//
// Why: torch==2.14.0's only x86-64 build on PyPI is the CUDA one. Its
// libc10_cuda.so registers device allocator-config keys (for example
// `pinned_reserve_segment_size_mb`) into c10's process-wide key set
// (c10::CachingAllocator::AcceleratorAllocatorConfig::getMutableKeys()) when
// it loads. torch_npu expects a CPU build of torch and registers its own keys,
// some with the same names, through the inline
// AcceleratorAllocatorConfig::registerDeviceConfigParserHook, which fails with
// "Duplicated key ... found in device-specific configuration parser hook
// registration" and aborts the import.
//
// What: this object interposes getMutableKeys(). Callers whose code lies in
// libtorch_npu.so get a key set of their own: a copy of c10's set without the
// keys libc10_cuda.so registered (read from libc10_cuda's exported static
// CUDAAllocatorConfig::getKeys()::keys), i.e. exactly the set a CPU build of
// torch has, so torch_npu's registration and its validation of
// PYTORCH_NPU_ALLOC_CONF keys (expandable_segments, ...) behave as they do
// there. Every other caller (libc10 itself, libc10_cuda) gets the real set,
// fetched from libc10.so through a dlopen(RTLD_NOLOAD) handle.
//
// It is C++ because the private key set must be a real
// std::unordered_set<std::string> that torch_npu inserts into.
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_set>

namespace {

using KeySet = std::unordered_set<std::string>;
using GetKeysFn = KeySet &(*)();

void die(const char *msg)
{
    std::fprintf(stderr, "torch-harness-preload: %s\n", msg);
    std::abort();
}

GetKeysFn real_get_mutable_keys()
{
    static GetKeysFn fn = [] {
        // libc10.so is already loaded by whoever calls us (torch links it);
        // a handle-local lookup finds its own definition, not ours.
        void *h = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) die("libc10.so is not loaded; the caller is not torch");
        void *p = dlsym(h, "_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig14getMutableKeysB5cxx11Ev");
        if (!p) die("libc10.so lacks AcceleratorAllocatorConfig::getMutableKeys (torch version mismatch?)");
        return reinterpret_cast<GetKeysFn>(p);
    }();
    return fn;
}

// 1 if `addr` lies in libtorch_npu.so.
bool from_torch_npu(const void *addr)
{
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname) return false;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return strcmp(base, "libtorch_npu.so") == 0;
}

// c10's keys as a CPU build of torch has them: the real set minus the keys of
// CUDAAllocatorConfig (its getKeys() static, exported as a unique symbol).
KeySet *cpu_build_keys()
{
    KeySet *keys = new KeySet(real_get_mutable_keys()());   // never destroyed: static destructors use it
    void *h = dlopen("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return keys;   // no CUDA allocator loaded: nothing to remove
    const char *guard = static_cast<const char *>(
        dlsym(h, "_ZGVZN3c104cuda20CUDACachingAllocator19CUDAAllocatorConfig7getKeysB5cxx11EvE4keys"));
    const KeySet *cuda = static_cast<const KeySet *>(
        dlsym(h, "_ZZN3c104cuda20CUDACachingAllocator19CUDAAllocatorConfig7getKeysB5cxx11EvE4keys"));
    if (guard && cuda && *guard) {   // initialised: CUDA registered these
        for (const auto &k : *cuda) keys->erase(k);
    } else if (!guard || !cuda) {
        die("libc10_cuda.so lacks CUDAAllocatorConfig::getKeys()::keys (torch version mismatch?)");
    }
    dlclose(h);
    return keys;
}

}  // namespace

// c10::CachingAllocator::AcceleratorAllocatorConfig::getMutableKeys[abi:cxx11]()
KeySet &harness_get_mutable_keys() __asm__("_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig14getMutableKeysB5cxx11Ev");
__attribute__((visibility("default"))) KeySet &harness_get_mutable_keys()
{
    if (from_torch_npu(__builtin_return_address(0))) {
        static KeySet *npu_keys = [] {
            KeySet *k = cpu_build_keys();
            if (std::getenv("TORCH_HARNESS_VERBOSE"))
                std::fprintf(stderr, "torch-harness-preload: torch_npu gets its own allocator-config key set "
                                     "(%zu keys, as in a CPU build of torch)\n", k->size());
            return k;
        }();
        return *npu_keys;
    }
    return real_get_mutable_keys()();
}
