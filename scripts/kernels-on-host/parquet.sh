#!/usr/bin/env bash
# kernels/parquet_decode.cu's real CUDA source, compiled as C++ with shim.h
# (one block of one thread) and run over page tables of files written by
# arrow-rs (the Rust test scan::tests::write_kernel_fixtures writes them, with
# arrow-rs's decoded keys as the expectation), then with corrupted bytes under
# AddressSanitizer + UBSan. Needs g++ and cargo (the fixtures come from the
# crate's test binary). It checks the kernels' logic, not the launch code nor
# CUDA's memory model with many threads; the GPU tests do that.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/fixtures"
# PQ_FIXTURES: a folder of fixtures already written (skips the cargo step; write
# them with SETFUSION_DEVICE_ZSTD=1, so that their ZSTD pages reach zs_pages).
if [ -n "${PQ_FIXTURES:-}" ]; then cp -r "$PQ_FIXTURES"/. "$out/fixtures/"; else
  (cd "$root" && SETFUSION_DEVICE_ZSTD=1 SETFUSION_WRITE_PQ_FIXTURES="$out/fixtures" cargo test --release --lib scan::tests::write_kernel_fixtures -- --nocapture >/dev/null)
fi
{
  echo '#include "shim.h"'
  echo 'static inline unsigned atomicMax(unsigned* p, unsigned v) { auto o = *p; if (v > o) *p = v; return o; }'
  echo 'static inline int __popc(unsigned x) { return __builtin_popcount(x); }'
  sed '/#pragma once/d' "$root/kernels/common.cuh"
  sed '/#include "common.cuh"/d' "$root/kernels/parquet_decode.cu"
  sed '/#include "common.cuh"/d' "$root/kernels/zstd.cu"
} > "$out/kernels_host.h"
cp "$here/shim.h" "$here/parquet_harness.cpp" "$out/"
cd "$out"
g++ -O2 -std=c++17 -w -DZS_WARPS=1 -o harness parquet_harness.cpp
echo -n "parquet_decode: " && ./harness fixtures
g++ -O1 -g -std=c++17 -w -DZS_WARPS=1 -D_GLIBCXX_SANITIZE_VECTOR -fsanitize=address,undefined -fno-sanitize-recover=undefined -o harness_san parquet_harness.cpp
echo -n "parquet_decode under sanitizers: " && ./harness_san fixtures
