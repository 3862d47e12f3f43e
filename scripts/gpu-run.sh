#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-bundle.sh
# was run on the build machine:  bash bundle/run.sh [doctor|test|demo|bench-setops|bench-ssjoin|all]
set -uo pipefail
cd "$(dirname "$0")"
B="$(basename "$PWD")"   # the bundle folder
for f in *.xz; do [ -f "${f%.xz}" ] || xz -d -k "$f"; done
chmod +x setfusion test-* 2>/dev/null
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
export SETFUSION_REQUIRE_GPU=1 SETFUSION_DATA_DIR="$PWD/data" SETFUSION_ROOT="$(cd .. && pwd)"
out="${OUT:-/tmp/setfusion-out}"; mkdir -p "$out"
what="${1:-all}"
rc=0
cd ..   # the repository root: tests find sql-tests/ here
# Test binaries also know their build-time paths (/work/main, /work/shared/data):
# recreate them here when this machine lacks them.
root="$PWD"
if [ ! -e /work/main/Cargo.toml ]; then mkdir -p /work && ln -sfn "$root" /work/main 2>/dev/null || true; fi
if [ ! -e /work/shared/data/dblp_t_18k.txt ]; then mkdir -p /work/shared/data && cp $B/data/* /work/shared/data/ 2>/dev/null || true; fi
# tests/all starts the CLI where cargo built it (CARGO_BIN_EXE_setfusion: the cluster test).
if [ ! -e target/release/setfusion ] && [ -e "$B/setfusion" ]; then mkdir -p target/release && ln -sfn "$root/$B/setfusion" target/release/setfusion; fi
if [[ $what == doctor || $what == all || $what == test ]]; then
  $B/setfusion doctor 2>&1 | tee "$out/doctor.txt" || rc=1
fi
if [[ $what == test || $what == all ]]; then
  for t in $B/test-*; do
    [[ $t == *.xz || $t == *.txt ]] && continue
    echo "== $t" | tee -a "$out/tests.txt"
    "$t" --test-threads=2 > "$out/last-test.log" 2>&1; r=$?
    cat "$out/last-test.log" >> "$out/tests.txt"
    grep -E "^test result|FAILED|panicked|skipping|failed|^test .*(ok|FAILED)$" "$out/last-test.log" | tail -60
    [ $r -eq 0 ] || rc=1
  done
fi
if [[ $what == demo || $what == all ]]; then
  $B/setfusion demo 2>&1 | tee "$out/demo.txt" || rc=1
fi
if [[ $what == bench-* ]]; then
  SETFUSION_BENCH_OUT="$out/${what}.md" SSJOIN_BENCH_OUT="$out/${what}.md" \
    $B/setfusion bench "${what#bench-}" "${@:2}" 2>&1 | tee "$out/${what}.txt" || rc=1
fi
exit $rc
