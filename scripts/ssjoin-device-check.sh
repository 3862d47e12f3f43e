#!/usr/bin/env bash
# The similarity join's device preprocessing on the GPU machine (issue 13):
# its tests with SETFUSION_REQUIRE_GPU=1 (device output against the CPU twin
# and the former single-threaded preprocessing), the preprocessing times, the
# doctor's self-checks, and `bench ssjoin` on the 100k-set collections at
# 0.5 / 0.6 (join alone and SQL end to end, CPU and GPU backends).
# Build here first: scripts/gpu-bundle.sh. Then, on the GPU machine, from the
# repository root:   bash scripts/ssjoin-device-check.sh
# Writes under $OUT (default /tmp/setfusion-out): ssjoin.md (the benchmark's
# table), ssjoin-check.txt (everything printed). About 1-2 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
B="${BUNDLE:-bundle}"
out="${OUT:-/tmp/setfusion-out}"
mkdir -p "$out"
log="$out/ssjoin-check.txt"
: > "$log"
for f in "$B"/setfusion.xz "$B"/test-lib.xz; do
  [ -f "$f" ] && [ ! -f "${f%.xz}" ] && xz -d -k "$f"
done
chmod +x "$B/setfusion" "$B/test-lib"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
export SETFUSION_REQUIRE_GPU=1
rc=0
step() {
  local name="$1"; shift
  echo "== $name" | tee -a "$log"
  timeout 240 "$@" 2>&1 | tee -a "$log"
  local r=${PIPESTATUS[0]}
  [ "$r" -eq 0 ] || { echo "== $name FAILED (exit $r)" | tee -a "$log"; rc=1; }
}
# Device vs CPU twin (and the CPU twin vs the reference), and the GPU join on device-preprocessed input.
step "ssjoin_prep tests" "$B/test-lib" ssjoin_prep --test-threads=1 --nocapture
step "ssjoin GPU join test" "$B/test-lib" algo::ssjoin::tests::gpu_matches_brute_force --test-threads=1
# Reference (1 thread), CPU twin (all cores), device: best of 5 on the 100k-set collections.
step "preprocessing times" "$B/test-lib" preprocess_timing --ignored --nocapture --test-threads=1
# Every kernel family compiles; ssjoin_prep's self-check against the CPU twin is among the checks.
step "doctor" "$B/setfusion" doctor
step "bench ssjoin" env SSJOIN_BENCH_OUT="$out/ssjoin.md" "$B/setfusion" bench ssjoin \
  --collections uniform,zipf --sets 100000 --thresholds 0.5,0.6 --reps 3 --no-nlj
grep -E "^test result|FAILED|panicked|declined|UNIFORM-100k:|ZIPF-100k:|ssjoin_prep" "$log" | head -40
echo "exit $rc; full log: $log; table: $out/ssjoin.md"
exit $rc
