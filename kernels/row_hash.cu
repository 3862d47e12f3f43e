// Row hashing and exact verification of hashed keys on the device.
//
// Keys that are not one fixed-width column arrive in one of two layouts:
// - offsets: row i of a side is data[offsets[i] .. offsets[i + 1]) (Arrow
//   row-format bytes, or a string column's values with rebased offsets);
// - views: a Utf8View / BinaryView column as Arrow holds it. Row i's 16-byte
//   view is words 2i, 2i + 1: its length in the low 32 bits; up to 12 bytes
//   inline right after it, longer values at (buffer index, offset) in the
//   high words. The batches' value buffers are concatenated in `data`; batch
//   b (rows batch_rows[b] .. batch_rows[b + 1]) finds its buffer k at byte
//   buf_pos[batch_bufs[b] + k]. The view words are padded with two zeroed
//   words, so inline bytes are read like any others.
// - fixed: row i is the 8-byte little-endian word vals[i] (an exact key
//   column's 64-bit image, or the NULL masks below); no offsets array.
// - spans: row i is at a device address of its own (a Parquet BYTE_ARRAY
//   value in the decoder's page bodies), verified, numbered by the literal
//   it equals or matched with a LIKE pattern (RhSpans).
// Each row becomes one
// 64-bit hash, bit-identical to `keys::hash_bytes` (src/keys.rs, its CPU twin),
// so the hash-table kernels can select on it. A hash is only a candidate
// match: `verify_insert` + `verify_check` then prove that equal hashes always
// mean equal bytes, over both sides together, and raise a flag otherwise (the
// host then recomputes that operator exactly, so no collision changes a result).
//
// Composite keys of exact and string / binary columns (keys::ColumnKeys) are
// hashed column by column: each side's hashes start at RH_SEED (fill_u64),
// each key column, in its own layout (fixed for exact columns, offsets or
// views for strings), folds its rows' hash_bytes in (`combine_*`:
// h = rotl((h ^ column_hash) * K, 29)), and `combine_finish` folds in the
// hash of the row's NULL mask (bit c: column c is NULL; 0 without a mask
// buffer) and mixes: `keys::hash_columns`, bit for bit. NULL slots hold 0 /
// empty values (the host makes them so). Verification then runs
// `verify_check_*` once per key column and once on the masks against one
// table of representatives: if every column and the mask of every row equal
// those of its hash's representative, equal hashes mean equal tuples.
//
// One thread per row: rows are short (typically 8-100 bytes) and the hash is
// a sequential chain over 8-byte chunks, so a warp per row would idle most
// lanes. Adjacent threads read adjacent rows, which keeps loads mostly
// coalesced. Bytes are read as aligned 64-bit words and shifted into place
// (unaligned 8-byte loads fault on the device); the host pads every data
// buffer to a multiple of 8 bytes plus one zeroed word, so the word after the
// last data byte may always be read.
#include "common.cuh"

// RH_EMPTY and RH_NO_ROW come from the host: -D options from src/algo/row_hash.rs.
#define RH_K SF_HASH_K

// Where a row's bytes are: a padded word array, the byte position in it, the length.
struct RhRow {
    const u64* words;
    u64 start;
    u64 len;
};

// Offsets layout (32- or 64-bit offsets).
template <typename O>
struct RhOffsets {
    const O* off;
    const u64* words;
    __device__ __forceinline__ RhRow row(u64 i) const {
        u64 s = (u64)off[i];
        return RhRow{words, s, (u64)off[i + 1] - s};
    }
};

// Views layout.
struct RhViews {
    const u64* views;
    const u32* batch_rows;  // nbatches + 1 entries, ascending
    u32 nbatches;
    const u32* batch_bufs;  // nbatches entries
    const u64* buf_pos;
    const u64* data;
    __device__ __forceinline__ RhRow row(u64 i) const {
        u64 v0 = views[2 * i], v1 = views[2 * i + 1];
        u64 len = v0 & 0xffffffffULL;
        if (len <= 12) return RhRow{views, 16 * i + 4, len};
        // The batch of row i: the last b with batch_rows[b] <= i (batch_rows[0] = 0 <= i < batch_rows[nbatches]).
        u32 lo = 0, hi = nbatches;
        while (hi - lo > 1) {
            u32 mid = (lo + hi) >> 1;
            if ((u64)batch_rows[mid] <= i) lo = mid; else hi = mid;
        }
        return RhRow{data, buf_pos[batch_bufs[lo] + (u32)v1] + (v1 >> 32), len};
    }
};

// Fixed layout: an exact column's 64-bit images (or the NULL masks).
struct RhFixed {
    const u64* vals;
    __device__ __forceinline__ RhRow row(u64 i) const { return RhRow{vals, 8 * i, 8}; }
};

// Spans layout: row i's bytes lie anywhere in device memory, at the address
// spans[2i] (its length spans[2i + 1]), each in a buffer padded so that the
// word after its last byte may be read: a BYTE_ARRAY key's value where the
// Parquet decoder left it (kernels/parquet_decode.cu). A NULL row is (0, 0)
// and reads nothing.
struct RhSpans {
    const u64* spans;
    __device__ __forceinline__ RhRow row(u64 i) const {
        u64 a = spans[2 * i];
        return RhRow{(const u64*)(a & ~7ULL), a & 7, spans[2 * i + 1]};
    }
};

// keys::hash_exact: keys::hash_bytes of v's 8 little-endian bytes.
__device__ __forceinline__ u64 rh_hash_u64(u64 v) {
    u64 h = (8 * RH_K) ^ 0x243F6A8885A308D3ULL;
    h = sf_rotl((h ^ v) * RH_K, 29);
    h = h * RH_K;  // the empty tail
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ULL;
    return h ^ (h >> 32);
}

// keys::COLUMNS_SEED and keys::hash_columns_step.
#define RH_SEED 0x452821E638D01377ULL
__device__ __forceinline__ u64 rh_step(u64 h, u64 column_hash) { return sf_rotl((h ^ column_hash) * RH_K, 29); }

template <typename S>
__device__ __forceinline__ void rh_hash_rows(S side, u64 n, u64* __restrict__ out) {
    SF_FOR(i, n) {
        RhRow r = side.row(i);
        out[i] = sf_hash_bytes(r.words, r.start, r.len);
    }
}

// One hash per row. offsets: n + 1 entries; words: the padded data bytes.
extern "C" __global__ void hash_rows_u32(const u32* offsets, const u64* words, u64 n, u64* out) {
    rh_hash_rows(RhOffsets<u32>{offsets, words}, n, out);
}
extern "C" __global__ void hash_rows_u64(const u64* offsets, const u64* words, u64 n, u64* out) {
    rh_hash_rows(RhOffsets<u64>{offsets, words}, n, out);
}
// One hash per view.
extern "C" __global__ void hash_views(const u64* views, const u32* batch_rows, u32 nbatches, const u32* batch_bufs,
                                      const u64* buf_pos, const u64* data, u64 n, u64* out) {
    rh_hash_rows(RhViews{views, batch_rows, nbatches, batch_bufs, buf_pos, data}, n, out);
}

extern "C" __global__ void hash_fixed(const u64* vals, u64 n, u64* out) {
    SF_FOR(i, n) out[i] = rh_hash_u64(vals[i]);
}

// ---- Composite keys, column by column --------------------------------------
// acc[i] = rh_step(acc[i], hash of row i of this column); same arguments as the hash kernels.
template <typename S>
__device__ __forceinline__ void rh_combine_rows(S side, u64 n, u64* __restrict__ acc) {
    SF_FOR(i, n) {
        RhRow r = side.row(i);
        acc[i] = rh_step(acc[i], sf_hash_bytes(r.words, r.start, r.len));
    }
}
extern "C" __global__ void combine_rows_u32(const u32* offsets, const u64* words, u64 n, u64* acc) {
    rh_combine_rows(RhOffsets<u32>{offsets, words}, n, acc);
}
extern "C" __global__ void combine_rows_u64(const u64* offsets, const u64* words, u64 n, u64* acc) {
    rh_combine_rows(RhOffsets<u64>{offsets, words}, n, acc);
}
extern "C" __global__ void combine_views(const u64* views, const u32* batch_rows, u32 nbatches, const u32* batch_bufs,
                                         const u64* buf_pos, const u64* data, u64 n, u64* acc) {
    rh_combine_rows(RhViews{views, batch_rows, nbatches, batch_bufs, buf_pos, data}, n, acc);
}
extern "C" __global__ void combine_fixed(const u64* vals, u64 n, u64* acc) {
    SF_FOR(i, n) acc[i] = rh_step(acc[i], rh_hash_u64(vals[i]));
}
// keys::hash_columns_finish: the NULL mask's hash (masks[i], or 0 when
// has_masks == 0: masks is then not read), then the final mix.
extern "C" __global__ void combine_finish(u64* acc, u64 n, const u64* masks, u32 has_masks) {
    SF_FOR(i, n) {
        u64 h = rh_step(acc[i], rh_hash_u64(has_masks ? masks[i] : 0));
        h ^= h >> 32;
        h *= 0xD6E8FEB86659FD93ULL;
        acc[i] = h ^ (h >> 32);
    }
}

// ---- Verification ---------------------------------------------------------
// Open addressing on the 64-bit hash (capacity a power of two, at least twice
// the rows, so probing always ends). keys: cap + 1 entries set to RH_EMPTY;
// reps: cap + 1 entries set to RH_NO_ROW. The all-ones hash (the empty
// marker) uses the extra slot `cap` = mask + 1, whose key word is unused.
// Row g of the combined input is build row g for g < nb, else probe row g - nb.

__device__ __forceinline__ u64 rh_slot_insert(u64* keys, u64 mask, u64 h) {
    if (h == RH_EMPTY) return mask + 1;
    u64 s = sf_mix64(h) & mask;
    while (true) {
        u64 cur = keys[s];
        if (cur == h) return s;
        if (cur == RH_EMPTY) {
            u64 prev = atomicCAS(&keys[s], RH_EMPTY, h);
            if (prev == RH_EMPTY || prev == h) return s;
        }
        s = (s + 1) & mask;
    }
}

// The slot of an inserted hash; ~0 if absent (cannot happen after verify_insert).
__device__ __forceinline__ u64 rh_slot_find(const u64* keys, u64 mask, u64 h) {
    if (h == RH_EMPTY) return mask + 1;
    u64 s = sf_mix64(h) & mask;
    while (true) {
        u64 cur = keys[s];
        if (cur == h) return s;
        if (cur == RH_EMPTY) return RH_EMPTY;
        s = (s + 1) & mask;
    }
}

// Pass 1: every row's hash gets a slot; the slot's representative is the
// smallest row index with that hash (deterministic, independent of timing).
extern "C" __global__ void verify_insert(const u64* bh, u64 nb, const u64* ph, u64 np, u64* keys, u32* reps, u64 mask) {
    SF_FOR(g, nb + np) {
        u64 h = g < nb ? bh[g] : ph[g - nb];
        u64 s = rh_slot_insert(keys, mask, h);
        atomicMin(&reps[s], (u32)g);
    }
}

// Do two rows hold the same bytes?
__device__ __forceinline__ bool rh_rows_equal(const u64* __restrict__ wa, u64 sa, const u64* __restrict__ wb, u64 sb, u64 len) {
    u64 i = 0;
    for (; i + 8 <= len; i += 8)
        if (sf_load8(wa, sa + i) != sf_load8(wb, sb + i)) return false;
    u64 r = len - i;
    if (r == 0) return true;
    u64 m = ~0ULL >> (64 - 8 * r);
    return ((sf_load8(wa, sa + i) ^ sf_load8(wb, sb + i)) & m) == 0;
}

// Pass 2 (a separate launch, so every representative is final): each row
// that is not its hash's representative compares its bytes with it. Any
// difference is a collision: *flag = 1. Rows stop early once it is set.
template <typename S>
__device__ __forceinline__ void rh_verify_check(const u64* bh, u64 nb, const u64* ph, u64 np, const u64* keys,
                                                const u32* reps, u64 mask, S b_side, S p_side, u32* flag) {
    SF_FOR(g, nb + np) {
        if (*(volatile u32*)flag) return;
        bool build = g < nb;
        u64 h = build ? bh[g] : ph[g - nb];
        u64 s = rh_slot_find(keys, mask, h);
        if (s == RH_EMPTY) { *flag = 1; return; }  // impossible; fail safe (exact recompute)
        u64 r = reps[s];
        if (r == g) continue;
        RhRow a = build ? b_side.row(g) : p_side.row(g - nb);
        RhRow c = r < nb ? b_side.row(r) : p_side.row(r - nb);
        // The same bytes (rows of one dictionary entry point at it): equal without reading them.
        if (a.words == c.words && a.start == c.start && a.len == c.len) continue;
        if (a.len != c.len || !rh_rows_equal(a.words, a.start, c.words, c.start, a.len)) { *flag = 1; return; }
    }
}

extern "C" __global__ void verify_check_u32(const u64* bh, u64 nb, const u64* ph, u64 np, const u64* keys, const u32* reps,
                                            u64 mask, const u32* b_off, const u64* b_words, const u32* p_off,
                                            const u64* p_words, u32* flag) {
    rh_verify_check(bh, nb, ph, np, keys, reps, mask, RhOffsets<u32>{b_off, b_words}, RhOffsets<u32>{p_off, p_words}, flag);
}
extern "C" __global__ void verify_check_u64(const u64* bh, u64 nb, const u64* ph, u64 np, const u64* keys, const u32* reps,
                                            u64 mask, const u64* b_off, const u64* b_words, const u64* p_off,
                                            const u64* p_words, u32* flag) {
    rh_verify_check(bh, nb, ph, np, keys, reps, mask, RhOffsets<u64>{b_off, b_words}, RhOffsets<u64>{p_off, p_words}, flag);
}
extern "C" __global__ void verify_check_views(const u64* bh, u64 nb, const u64* ph, u64 np, const u64* keys,
                                              const u32* reps, u64 mask, const u64* b_views, const u32* b_batch_rows,
                                              u32 b_nbatches, const u32* b_batch_bufs, const u64* b_buf_pos,
                                              const u64* b_data, const u64* p_views, const u32* p_batch_rows,
                                              u32 p_nbatches, const u32* p_batch_bufs, const u64* p_buf_pos,
                                              const u64* p_data, u32* flag) {
    rh_verify_check(bh, nb, ph, np, keys, reps, mask,
                    RhViews{b_views, b_batch_rows, b_nbatches, b_batch_bufs, b_buf_pos, b_data},
                    RhViews{p_views, p_batch_rows, p_nbatches, p_batch_bufs, p_buf_pos, p_data}, flag);
}

extern "C" __global__ void verify_check_fixed(const u64* bh, u64 nb, const u64* ph, u64 np, const u64* keys,
                                              const u32* reps, u64 mask, const u64* b_vals, const u64* p_vals, u32* flag) {
    rh_verify_check(bh, nb, ph, np, keys, reps, mask, RhFixed{b_vals}, RhFixed{p_vals}, flag);
}

extern "C" __global__ void verify_check_spans(const u64* bh, u64 nb, const u64* ph, u64 np, const u64* keys,
                                              const u32* reps, u64 mask, const u64* b_spans, const u64* p_spans, u32* flag) {
    rh_verify_check(bh, nb, ph, np, keys, reps, mask, RhSpans{b_spans}, RhSpans{p_spans}, flag);
}

// Which literal each row of a spans column equals: 1 + the index of the
// first equal one, 0 for none and for a NULL row (address 0: a value's is
// never 0, even an empty one's; its validity, kept beside, makes it NULL).
// A string column compared with literals in a device scan's filter (`=`,
// `<>`, [NOT] IN) is read by the filter's program as this number
// (src/exec/device_scan.rs). Literal j is lit_words' bytes lit_at[j] ..
// lit_at[j + 1], padded like any row's.
extern "C" __global__ void match_literals_spans(const u64* spans, u64 n, const u64* lit_words, const u64* lit_at,
                                                u32 nlits, u64* out) {
    RhSpans side{spans};
    SF_FOR(i, n) {
        RhRow r = side.row(i);
        u64 number = 0;
        for (u32 j = 0; spans[2 * i] != 0 && j < nlits && number == 0; ++j) {
            u64 at = lit_at[j], len = lit_at[j + 1] - at;
            if (r.len == len && rh_rows_equal(r.words, r.start, lit_words, at, len)) number = j + 1;
        }
        out[i] = number;
    }
}

// Does row r hold `part` (plen bytes at byte `at` of pat) at byte `pos`?
__device__ __forceinline__ bool rh_part_at(RhRow r, u64 pos, const u64* pat, u64 at, u64 plen) {
    return rh_rows_equal(r.words, r.start + pos, pat, at, plen);
}

// Whether each row of a spans column matches a LIKE pattern whose only
// wildcard is `%` (src/exec/device_scan.rs splits it): its nparts non-empty
// pieces, piece k at bytes part_at[k] .. part_at[k + 1] of pat, the first
// anchored at the row's start (starts != 0: the pattern does not begin with
// `%`), the last at its end (ends != 0). 1 or 0; 0 for a NULL row (address
// 0), whose validity, kept beside, makes it NULL. Bytes, not characters:
// exact for UTF-8, where a piece's bytes found in a row are always whole
// characters. CPU twin: algo::row_hash::match_like_cpu.
extern "C" __global__ void match_like_spans(const u64* spans, u64 n, const u64* pat, const u64* part_at, u32 nparts,
                                            u32 starts, u32 ends, u64* out) {
    RhSpans side{spans};
    SF_FOR(i, n) {
        RhRow r = side.row(i);
        bool ok = spans[2 * i] != 0;
        u64 pos = 0, limit = r.len;
        u32 first = 0, last = nparts;
        if (ok && nparts == 0) ok = !(starts && ends) || r.len == 0;
        if (ok && nparts > 0 && starts) {
            const u64 plen = part_at[1] - part_at[0];
            ok = r.len >= plen && rh_part_at(r, 0, pat, part_at[0], plen);
            pos = plen;
            first = 1;
        }
        if (ok && nparts > 0 && ends) {
            if (first == nparts) {
                ok = r.len == pos;  // one piece, both ends anchored: the row is the piece
            } else {
                const u64 plen = part_at[nparts] - part_at[nparts - 1];
                ok = r.len >= pos + plen && rh_part_at(r, r.len - plen, pat, part_at[nparts - 1], plen);
                limit = r.len - plen;
                last = nparts - 1;
            }
        }
        // The middle pieces, each found leftmost after the one before (leftmost is
        // always right when `%` is the only wildcard).
        for (u32 k = first; ok && k < last; ++k) {
            const u64 at = part_at[k], plen = part_at[k + 1] - at;
            bool found = false;
            for (; pos + plen <= limit; ++pos) {
                if (rh_part_at(r, pos, pat, at, plen)) {
                    found = true;
                    break;
                }
            }
            ok = found;
            pos += plen;
        }
        out[i] = ok ? 1 : 0;
    }
}

// Fill n words of a buffer with a value (the table's empty markers).
extern "C" __global__ void fill_u64(u64* x, u64 n, u64 v) { SF_FOR(i, n) x[i] = v; }
extern "C" __global__ void fill_u32(u32* x, u64 n, u32 v) { SF_FOR(i, n) x[i] = v; }
