#!/usr/bin/env bash
# Build the release CLI (which also runs the benchmarks: `setfusion bench`) and
# the test binaries, and pack them
# with xz into bundle/ (git-ignored) for the GPU machine, which has no Rust
# toolchain. Then, on the GPU machine, from the repository root:
#     bash bundle/run.sh [doctor|test|demo|bench-setops|bench-ssjoin|all]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf bundle && mkdir -p bundle
cargo build --release --bins
# test binaries: each member's unit tests (test-setfusion, test-setfusion_tools,
# test-setfusion_ballista) and the one integration test binary (test-all)
cargo test --release --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = "test-" + t["name"]
        print(name, m["executable"])
' > bundle/tests.txt
while read -r name exe; do cp "$exe" "bundle/$name"; done < bundle/tests.txt
cp target/release/setfusion bundle/setfusion
mkdir -p bundle/data && cp ../shared/data/dblp_t_18k.txt bundle/data/ 2>/dev/null || true
cp scripts/gpu-run.sh bundle/run.sh
# Symbols are most of a DataFusion binary; stripped and xz -9e each is ~17-27 MB. A device call
# carries 64 MiB, so carry the files of bundle/ in two or three calls' worth of folders.
(cd bundle && for f in setfusion test-*; do [[ $f == *.txt ]] && continue; strip "$f"; xz -T2 -9e -f "$f"; done)
du -sh bundle; ls -la bundle
