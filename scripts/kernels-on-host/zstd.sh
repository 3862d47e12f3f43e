#!/usr/bin/env bash
# kernels/zstd.cu's zs_pages compiled as C++ (warp_shim.h: an emulated warp of
# host threads) and run over data compressed by the zstd command line tool at
# several levels (integer columns as the bench writes them, sorted and small
# integers, text, incompressible bytes, runs of one byte, empty and tiny
# inputs, several frames back to back, checksums on and off), each compared
# with its original; damaged frames must fail or stay inside their buffers
# (one lane, once more under AddressSanitizer + UBSan). Lanes: 1, 4 and 32
# (level 3 frames), undamaged; rings of 64
# bytes (flushed often, most batches written to `body` directly) and 4096.
# Needs g++, python3 and zstd.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
{
  echo '#include "warp_shim.h"'
  sed '/#pragma once/d' "$root/kernels/common.cuh"
  sed '/#include "common.cuh"/d' "$root/kernels/zstd.cu"
} > "$out/kernels_host.h"
cp "$here/warp_shim.h" "$here/zstd_harness.cpp" "$out/"
cd "$out"
mkdir data
python3 - <<'PY'
import random, struct
r = random.Random(7)
def w(name, b): open("data/" + name, "wb").write(b)
w("keys", b"".join(struct.pack("<q", r.randrange(0, 400_000_000)) for _ in range(40000)))
# Batches longer than the ring, then matches reaching back before them (level 19).
w("keys100k", b"".join(struct.pack("<q", r.randrange(0, 400_000_000)) for _ in range(100000)))
w("sorted", b"".join(struct.pack("<q", v) for v in sorted(r.randrange(0, 10**12) for _ in range(30000))))
w("small32", b"".join(struct.pack("<i", r.randrange(-50, 50)) for _ in range(50000)))
words = ["set", "fusion", "parquet", "zstd", "warp", "literal", "match", "offset", "the", "a"]
w("text", " ".join(r.choice(words) for _ in range(60000)).encode())
w("random", bytes(r.randrange(256) for _ in range(200000)))
w("zeros", bytes(300000))
w("mixed", b"".join([bytes(r.randrange(256) for _ in range(5000)) + bytes(7000) + b"abc" * 3000 for _ in range(40)]))
w("empty", b"")
w("one", b"x")
w("five", b"hello")
w("dates", b"".join(struct.pack("<i", 19000 + (i // 300)) for i in range(100000)))
PY
: > list
for f in data/*; do
  for lvl in 1 3 9 19; do
    zstd -q -f -$lvl --no-check "$f" -o "$f.$lvl.zst"; echo "$f.$lvl.zst $f" >> list
  done
  zstd -q -f -3 -C "$f" -o "$f.c.zst"; echo "$f.c.zst $f" >> list
  zstd -q -f --ultra -22 "$f" -o "$f.22.zst"; echo "$f.22.zst $f" >> list
done
# ZS_FIXTURES: the GPU test's frames of the zstd crate too (their list, as
# SETFUSION_WRITE_ZSTD_FIXTURES=DIR cargo test --release --lib write_zstd_fixtures writes it).
if [ -n "${ZS_FIXTURES:-}" ]; then cat "$ZS_FIXTURES/list" >> list; fi
# Two frames back to back.
cat data/keys data/text > data/two; cat data/keys.3.zst data/text.1.zst > data/two.zst; echo "data/two.zst data/two" >> list
g++ -O2 -std=c++20 -w -pthread -DZS_WARPS=1 -o harness zstd_harness.cpp
echo -n "zs_pages, ring 4096, 1 lane: " && ./harness list 1
echo -n "zs_pages, ring 4096, 4 lanes: " && ./harness list 4 undamaged
# A whole emulated warp is slow (a barrier a step): level 3 frames, undamaged.
grep '\.3\.zst' list > list3
echo -n "zs_pages, ring 4096, 32 lanes: " && ./harness list3 32 undamaged
g++ -O2 -std=c++20 -w -pthread -DZS_WARPS=1 -DZS_RING=64 -o harness64 zstd_harness.cpp
echo -n "zs_pages, ring 64, 4 lanes: " && ./harness64 list 4 undamaged
g++ -O1 -g -std=c++20 -w -pthread -DZS_WARPS=1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -o harness_san zstd_harness.cpp
echo -n "sanitizers, 1 lane: " && ./harness_san list 1
