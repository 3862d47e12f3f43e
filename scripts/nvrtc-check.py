#!/usr/bin/env python3
"""Compile every kernels/*.cu with NVRTC for sm_90, without a GPU, to catch
compile errors before a device run. Needs libnvrtc.so.13 (e.g. from the
`nvidia-cuda-nvrtc` pip wheel): NVRTC_LIB=/path/to/libnvrtc.so.13.
Usage: python3 scripts/nvrtc-check.py [kernels/foo.cu ...]"""
import ctypes, glob, os, sys

lib_path = os.environ.get("NVRTC_LIB", "/tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13")
nv = ctypes.CDLL(lib_path)
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
common = open(os.path.join(root, "kernels", "common.cuh")).read()
files = sys.argv[1:] or sorted(glob.glob(os.path.join(root, "kernels", "*.cu")))
failed = 0
for f in files:
    src = open(f).read().replace('#include "common.cuh"', common).encode()
    prog = ctypes.c_void_p()
    name = os.path.basename(f).encode()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, name, 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17", b"--extra-device-vectorization"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace").strip()
    print(f"{os.path.basename(f)}: {'ok' if rc == 0 else 'FAILED'}")
    if text:
        print(text)
    failed |= rc != 0
sys.exit(1 if failed else 0)
