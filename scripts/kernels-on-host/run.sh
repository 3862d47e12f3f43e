#!/usr/bin/env bash
# The segmented list kernels' real CUDA source (kernels/segmented.cu's scans
# and segment ids, kernels/multiset.cu's Balanced Path walk and k-way step,
# kernels/sorted_intersect.cu's GTWJ), compiled as C++ with shims
# (shim.h: one block of one thread, so every SF_FOR loop runs serially) and run
# in the launchers' order against a counting reference, for machines without a
# GPU: rows of uneven lengths, NULL rows, dense and whole-u64 key domains, both
# key flips, several MS_BP_VT / SI_GTWJ_SEQ_LOG2 values, and once under
# AddressSanitizer + UBSan. Needs g++ and python3. It checks the kernels'
# logic, not the Rust launch code (argument order, buffer sizes), nor CUDA's
# memory model; the GPU tests do that.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
{
  echo '#include "shim.h"'
  sed '/#pragma once/d' "$root/kernels/common.cuh"
  for f in segmented multiset sorted_intersect; do sed '/#include "common.cuh"/d' "$root/kernels/$f.cu"; done
} > "$out/kernels_host.h"
cp "$here/shim.h" "$here/harness.cpp" "$out/"
cd "$out"
for vt in 1 2 5 16 33; do
  for seq in 0 3 7; do
    g++ -O2 -std=c++17 -w -DMS_BP_VT=$vt -DSI_GTWJ_SEQ_LOG2=$seq -o harness harness.cpp
    echo -n "MS_BP_VT=$vt SI_GTWJ_SEQ_LOG2=$seq: " && ./harness
  done
done
g++ -O1 -g -std=c++17 -w -D_GLIBCXX_SANITIZE_VECTOR -fsanitize=address,undefined -fno-sanitize-recover=undefined -o harness_san harness.cpp
echo -n "sanitizers, defaults: " && ./harness_san
