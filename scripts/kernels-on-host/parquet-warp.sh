#!/usr/bin/env bash
# kernels/parquet_decode.cu's pq_snappy run as one emulated warp of LANES host
# threads (warp_shim.h: __syncwarp and __shfl_sync through a barrier) with a
# 256-byte ring, compared byte for byte with pq_snappy_serial on the fixture
# pages (see parquet.sh), intact and corrupted. Checks the warp logic (the
# speculative parse, the element chain, copies shorter than the warp, ring
# wrap and reads past the ring), not CUDA's memory model. Slow: every
# element takes several barriers; STEP runs every STEP-th case. Then
# pq_decode by blocks of LANES, 32 and 96 threads over every case, against
# arrow-rs's keys (its strided loops, per-thread word ranges and the DELTA
# shuffle scan with several threads and warps).
# usage: parquet-warp.sh [LANES: 1, 2, 4, ... 32 (default 4)] [STEP (default 3)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
lanes="${1:-4}"; step="${2:-3}"
# pq_warp_or's XOR butterfly needs a power of two of lanes (the device has 32):
# 3 lanes miscompare on the landed kernel too.
case "$lanes" in 1|2|4|8|16|32) ;; *) echo "parquet-warp.sh: LANES must be a power of two up to 32, not $lanes" >&2; exit 2 ;; esac
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/fixtures"
# PQ_FIXTURES: a folder of fixtures already written (skips the cargo step).
if [ -n "${PQ_FIXTURES:-}" ]; then cp -r "$PQ_FIXTURES"/. "$out/fixtures/"; else
  (cd "$root" && SETFUSION_DEVICE_ZSTD=1 SETFUSION_WRITE_PQ_FIXTURES="$out/fixtures" cargo test --release --lib scan::tests::write_kernel_fixtures -- --nocapture >/dev/null)
fi
{
  echo '#include "warp_shim.h"'
  sed '/#pragma once/d' "$root/kernels/common.cuh"
  sed '/#include "common.cuh"/d' "$root/kernels/parquet_decode.cu"
  sed '/#include "common.cuh"/d' "$root/kernels/zstd.cu"
} > "$out/kernels_host.h"
cp "$here/warp_shim.h" "$here/parquet_warp_harness.cpp" "$out/"
cd "$out"
g++ -O2 -std=c++20 -w -pthread -DPQ_SNAPPY_RING=256 -DZS_WARPS=1 -o harness parquet_warp_harness.cpp
echo -n "pq_snappy as a warp of $lanes lanes: " && ./harness fixtures "$lanes" 0 "$step"
# pq_decode by a block of LANES threads, of 32 (one full warp) and of 96 (three
# warps: DELTA's scan over the warps' sums) over every case.
cp "$here/parquet_decode_warp_harness.cpp" .
g++ -O2 -std=c++20 -w -pthread -DZS_WARPS=1 -o decode_harness parquet_decode_warp_harness.cpp
for n in "$lanes" 32 96; do echo -n "pq_decode as a block of $n threads: " && ./decode_harness fixtures "$n"; done
