"""Raw snappy (no framing) in pure Python, for benches/cuda/page_pages.py where
python-snappy is not installed: the reference compressor's shape (64 KiB
fragments, a 4-byte hash table per fragment, greedy matches, the skip
heuristic over incompressible input), so its pages hold elements like the
parquet crate's `snap` writes. `decompress` checks every page made."""
def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7f; n >>= 7
        if n: out.append(b | 0x80)
        else: out.append(b); return bytes(out)
def _lit(out, s):
    n = len(s) - 1
    if n < 60: out.append(n << 2)
    elif n < 256: out += bytes([60 << 2, n])
    elif n < 65536: out += bytes([61 << 2, n & 0xff, n >> 8])
    else: out += bytes([62 << 2, n & 0xff, (n >> 8) & 0xff, n >> 16])
    out += s
def _copy(out, off, ln):
    while ln >= 68:
        out += bytes([2 | (63 << 2), off & 0xff, off >> 8]); ln -= 64
    if ln > 64:
        out += bytes([2 | (59 << 2), off & 0xff, off >> 8]); ln -= 60
    if ln < 12 and off < 2048:
        out += bytes([1 | ((ln - 4) << 2) | ((off >> 8) << 5), off & 0xff])
    else:
        out += bytes([2 | ((ln - 1) << 2), off & 0xff, off >> 8])
def compress(data):
    out = bytearray(_varint(len(data)))
    for f0 in range(0, len(data), 65536):
        frag = data[f0:f0 + 65536]
        n = len(frag); table = {}; i = 0; lit = 0
        if n < 15:
            if n: _lit(out, frag)
            continue
        limit = n - 4
        skip = 32
        while i <= limit:
            key = frag[i:i + 4]
            cand = table.get(key)
            table[key] = i
            if cand is not None and i - cand < 65536:
                if lit < i: _lit(out, frag[lit:i])
                ln = 4
                while i + ln < n and frag[cand + ln] == frag[i + ln]: ln += 1
                _copy(out, i - cand, ln)
                i += ln; lit = i; skip = 32
            else:
                i += skip >> 5; skip += 1
        if lit < n: _lit(out, frag[lit:])
    return bytes(out)
def decompress(s):
    pos = 0; n = 0; sh = 0
    while True:
        b = s[pos]; pos += 1; n |= (b & 0x7f) << sh; sh += 7
        if not b & 0x80: break
    out = bytearray()
    while pos < len(s):
        t = s[pos]; pos += 1
        if t & 3 == 0:
            l = t >> 2
            if l >= 60:
                e = l - 59; l = int.from_bytes(s[pos:pos + e], 'little'); pos += e
            l += 1; out += s[pos:pos + l]; pos += l
        else:
            if t & 3 == 1: l = 4 + ((t >> 2) & 7); off = ((t >> 5) << 8) | s[pos]; pos += 1
            elif t & 3 == 2: l = 1 + (t >> 2); off = int.from_bytes(s[pos:pos + 2], 'little'); pos += 2
            else: l = 1 + (t >> 2); off = int.from_bytes(s[pos:pos + 4], 'little'); pos += 4
            for _ in range(l): out.append(out[-off])
    assert len(out) == n
    return bytes(out)
