#!/usr/bin/env python3
"""An independent port of setfusion's key hashes (src/keys.rs: hash_bytes,
hash_exact, hash_columns; kernels/row_hash.cu computes the same on the
device), written from their definitions in plain Python integers. It prints
the golden values that the tests `keys::tests::column_hash_golden_values` and
`algo::row_hash::tests::cpu_hash_golden_values` pin, so a change to either
side shows up as a mismatch against a second implementation.

    python3 scripts/golden-hashes.py
"""
import struct

M = (1 << 64) - 1
K = 0x9E3779B97F4A7C15
FINAL = 0xD6E8FEB86659FD93
COLUMNS_SEED = 0x452821E638D01377


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def hash_bytes(b: bytes) -> int:
    h = ((len(b) * K) & M) ^ 0x243F6A8885A308D3
    full = len(b) // 8 * 8
    for i in range(0, full, 8):
        v = int.from_bytes(b[i:i + 8], "little")
        h = rotl(((h ^ v) * K) & M, 29)
    tail = b[full:] + bytes(8 - (len(b) - full))
    h = ((h ^ int.from_bytes(tail[:8], "little")) * K) & M
    h ^= h >> 32
    h = (h * FINAL) & M
    return h ^ (h >> 32)


def hash_exact(image: int) -> int:
    """hash_bytes of a 64-bit image's 8 little-endian bytes."""
    return hash_bytes((image & M).to_bytes(8, "little"))


def step(h: int, column_hash: int) -> int:
    return rotl(((h ^ column_hash) * K) & M, 29)


def hash_columns(column_hashes, null_mask: int) -> int:
    h = COLUMNS_SEED
    for c in column_hashes:
        h = step(h, c)
    h = step(h, hash_exact(null_mask))
    h ^= h >> 32
    h = (h * FINAL) & M
    return h ^ (h >> 32)


def f64_image(v):
    """A double's key image, from its bits: -0.0 as 0.0, every other value (NaNs too) its own bits."""
    bits = struct.unpack("<Q", struct.pack("<d", v))[0] if isinstance(v, float) else v
    return 0 if bits == 0x8000000000000000 else bits


def row(values):
    """A composite key's hash: (kind, value) per column, None for NULL (hashed as 0 / '' plus the mask bit)."""
    hashes, mask = [], 0
    for c, (kind, v) in enumerate(values):
        if v is None:
            mask |= 1 << c
            hashes.append(hash_bytes(b"") if kind == "str" else hash_exact(0))
        elif kind == "str":
            hashes.append(hash_bytes(v.encode()))
        elif kind == "f64":
            hashes.append(hash_exact(f64_image(v)))
        else:
            hashes.append(hash_exact(v & M))
    return hash_columns(hashes, mask)


def main():
    print("algo::row_hash::tests::cpu_hash_golden_values")
    for r in [b"", b"a", b"abcdefgh", b"abcdefghi", b"setfusion row hash!"]:
        print(f"  hash_bytes({r!r}) = {hash_bytes(r):#018x}")
    print(f"  hash_bytes(0..32) = {hash_bytes(bytes(range(32))):#018x}")
    print("keys::tests::column_hash_golden_values")
    print(f"  hash_exact(1) = {hash_exact(1):#018x}")
    strings = ["a", None, "", "a", "a", "a"]
    ints = [1, 1, 1, None, 0, -1]
    for s, i in zip(strings, ints):
        print(f"  (Utf8 {s!r}, Int64 {i}) = {row([('str', s), ('int', i)]):#018x}")
    dates = [19000, 19000, None]
    views = ["setfusion row hash!", "setfusion row hash!", None]
    floats = [-0.0, 0xFFF8000000000000, None]  # -0.0, -NaN (Rust's -f64::NAN, given by its bits)
    for d, v, f in zip(dates, views, floats):
        print(f"  (Date32 {d}, Utf8View {v!r}, Float64 {f}) = {row([('int', d), ('str', v), ('f64', f)]):#018x}")


if __name__ == "__main__":
    main()
