#!/usr/bin/env bash
# Tuning sweep of kernels/radix_sort.cu's constants on the GPU machine (nvcc,
# no Rust): each variant is the harness built with -D overrides and without
# CUB / thrust (-DNO_REF), timed at 2^28 (every result verified on the
# device); then the full harness (CPU checks, CUB and thrust, 2^LO..2^HI) with
# the repository's constants. Usage: bash benches/cuda/sweep.sh [LO] [HI]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}/sweep; mkdir -p "$out"
declare -A F=(
  [base]=""
  [i15h256]="-DRS_ITEMS_U32=15 -DRS_HIST_THREADS=256"
  [i15]="-DRS_ITEMS_U32=15"
  [i17]="-DRS_ITEMS_U32=17"
  [h256]="-DRS_HIST_THREADS=256"
  [h1024]="-DRS_HIST_THREADS=1024"
)
build() { local name=$1; shift; nvcc -O3 -arch=sm_90 -std=c++17 -Ikernels "$@" benches/cuda/radix_sort_bench.cu -o "$out/$name" > "$out/$name.log" 2>&1 || { echo "BUILD FAIL $name"; head -5 "$out/$name.log"; }; }
t0=$(date +%s)
for n in "${!F[@]}"; do build "$n" -DNO_REF ${F[$n]} & done
build full &
wait
echo "compile $(( $(date +%s) - t0 )) s"
for n in base i15h256 i15 i17 h256 h1024; do
  [ -x "$out/$n" ] || continue
  for r in 1 2; do "$out/$n" 28 28 quick > "$out/$n.$r.out" 2>&1; done
  echo "== $n (${F[$n]:-repository constants})"
  grep -h "mine" "$out/$n".*.out | sed 's/  cub.*verified/ verified/'
done
echo "== full harness, repository constants"
"$out/full" "${1:-26}" "${2:-30}" 2>&1 | grep -v "^device"
