#!/usr/bin/env python3
"""Pages for benches/cuda/page_decompress_bench.cu: the `bench parquet` tables'
integer columns (tools/src/datagen.rs: a.k, b.k, a.p = row number), 20,000
little-endian INT64 values a page as arrow-rs writes PLAIN pages, each
compressed with the zstd command line tool at level 1 (the parquet crate's
default level) and with python-snappy (raw snappy, as the parquet crate's
`snap`; without it, benches/cuda/snappy_py.py). Kinds: a, b (the bench's keys),
p (row numbers), t (keys of 1 to 2,000,000, as TPC-H's l_partkey at SF10).
Without the zstd tool, only the snappy pages. Writes DIR/{zstd,snappy}.list
("compressed original" lines).
usage: page_pages.py DIR [PAGES_A_KIND]"""
import os, shutil, struct, subprocess, sys
try:
    import snappy
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import snappy_py as snappy

out = sys.argv[1]
per = int(sys.argv[2]) if len(sys.argv) > 2 else 24
os.makedirs(out, exist_ok=True)
kinds = {
    "a": lambda i: (i * 2654435761) % 400000000,
    "b": lambda i: (i * 40503 + 7) % 400000000,
    "p": lambda i: i,
    "t": lambda i: 1 + (i * 2654435761) % 2000000,
}
has_zstd = shutil.which("zstd") is not None
zl, sl = [], []
for name, f in kinds.items():
    for j in range(per):
        start = 1 + j * 4_000_000 + 20000 * 37
        raw = struct.pack("<20000q", *(f(i) for i in range(start, start + 20000)))
        base = os.path.join(out, f"{name}{j:03}")
        open(base + ".raw", "wb").write(raw)
        if has_zstd:
            subprocess.run(["zstd", "-q", "-f", "-1", "--no-check", base + ".raw", "-o", base + ".zst"], check=True)
            zl.append(f"{base}.zst {base}.raw")
        open(base + ".snappy", "wb").write(snappy.compress(raw))
        sl.append(f"{base}.snappy {base}.raw")
zl = [l.replace(out + "/", "") for l in zl]; sl = [l.replace(out + "/", "") for l in sl]
open(os.path.join(out, "zstd.list"), "w").write("\n".join(zl) + "\n")
open(os.path.join(out, "snappy.list"), "w").write("\n".join(sl) + "\n")
