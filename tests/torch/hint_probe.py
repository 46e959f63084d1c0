"""Prints torch_npu's caching-allocator layout as tests/torch/hint_probe.cpp
(compiled with the wheels' headers) reports it, once torch_npu has made its
allocator, and whether libtorch_npu.so exports the allocator symbol.

usage: hint_probe.py PROBE.so ALLOCATOR_SYMBOL"""
import ctypes
import os
import sys

import torch
import torch_npu  # noqa: F401

probe = ctypes.CDLL(sys.argv[1])
torch.zeros(1, device="npu")  # the first allocation: the allocator exists
o = (ctypes.c_long * 7)()
probe.probe_layout(o)
probe.probe_class.restype = ctypes.c_char_p
lib = ctypes.CDLL("libtorch_npu.so", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
try:
    ctypes.c_void_p.in_dll(lib, sys.argv[2])
    exported = 1
except ValueError:
    exported = 0
print(f"version={torch_npu.__version__}")
print(f"class={probe.probe_class().decode()}")
for k, v in zip(["attach_slot", "action", "addr", "size", "free_completed", "std_function", "pointer"], o):
    print(f"{k}={v}")
print(f"exported={exported}")
