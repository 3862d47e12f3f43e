// Transfer codecs: keys cross PCIe frame-of-reference coded and are decoded
// here into their 64-bit form. The host splits each staging fill into segments
// of 2^SF_SEG_LOG2 keys; a segment whose keys all lie within 2^31 of its first
// key is sent as 32-bit offsets from base = first key - 2^31 (half the bytes of
// the raw keys), any other as offsets split into low and high 32-bit words.
// Layout of one fill of capacity `cap` keys (bytes):
//   [0, SF_SEGS*8)                 per-segment base
//   [SF_SEGS*8, SF_SEGS*12)        per-segment flag: 1 = wide (high words sent)
//   [SF_DESC, SF_DESC + 4n)        low 32 bits of key - base, for the n keys
//   [high_off, high_off + 4n)      high 32 bits (read only for wide segments); high_off = SF_DESC + 4 cap
#include "common.cuh"

// SF_SEG_LOG2, SF_SEGS, SF_DESC and SF_KEPT_WORDS come from the host: -D options from src/gpu/transfer.rs.

extern "C" __global__ void decode_for(const unsigned char* fill, u64 n, u64 high_off, u64* dst) {
    const u64* base = (const u64*)fill;
    const u32* wide = (const u32*)(fill + SF_SEGS * 8);
    const u32* low = (const u32*)(fill + SF_DESC);
    const u32* high = (const u32*)(fill + high_off);
    SF_FOR(i, n) {
        u64 s = i >> SF_SEG_LOG2;
        u64 v = low[i];
        if (wide[s]) v |= (u64)high[i] << 32;
        dst[i] = base[s] + v;
    }
}

// out[0] = min, out[1] = max of keys[0..n) (out preset to {all ones, 0}):
// a warp reduction, then one atomic pair per warp.
extern "C" __global__ void min_max(const u64* keys, u64 n, u64* out) {
    u64 lo = ~0ULL, hi = 0;
    SF_FOR(i, n) { u64 k = keys[i]; lo = k < lo ? k : lo; hi = k > hi ? k : hi; }
    for (int o = 16; o > 0; o >>= 1) {
        u64 l2 = __shfl_down_sync(0xffffffffu, lo, o), h2 = __shfl_down_sync(0xffffffffu, hi, o);
        lo = l2 < lo ? l2 : lo; hi = h2 > hi ? h2 : hi;
    }
    if ((threadIdx.x & 31) == 0) { atomicMin(&out[0], lo); atomicMax(&out[1], hi); }
}

// The return trip of kept keys: the keys of the rows whose selection bit is
// set, in row order, so the host need not cut the key column out of its
// batches (it has the other columns to filter, and the device already holds
// the decoded keys). Blocks of SF_KEPT_WORDS selection words (32 rows each):
// count_kept writes each block's kept count, the host turns the counts into
// offsets, compact_kept writes each block's kept keys from its offset on.

// Selection word w with the bits past row n cleared.
__device__ __forceinline__ u32 kept_word(const u32* sel, u64 w, u64 n) {
    if (w * 32 >= n) return 0;
    u32 bits = sel[w];
    u64 valid = n - w * 32;
    return valid >= 32 ? bits : bits & ((1u << valid) - 1);
}

extern "C" __global__ void count_kept(const u32* sel, u64 n, u32* counts) {
    __shared__ u32 warp_sums[SF_KEPT_WORDS / 32];
    u32 c = __popc(kept_word(sel, (u64)blockIdx.x * SF_KEPT_WORDS + threadIdx.x, n));
    for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 t = 0;
        for (int i = 0; i < SF_KEPT_WORDS / 32; i++) t += warp_sums[i];
        counts[blockIdx.x] = t;
    }
}

// Launched with SF_KEPT_WORDS threads per block; offsets[b] = kept rows before block b.
extern "C" __global__ void compact_kept(const u32* sel, u64 n, const u64* keys, const u64* offsets, u64* out) {
    __shared__ u32 warp_sums[SF_KEPT_WORDS / 32];
    u64 w = (u64)blockIdx.x * SF_KEPT_WORDS + threadIdx.x;
    u32 bits = kept_word(sel, w, n);
    u32 c = __popc(bits), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 incl = sf_warp_inclusive_scan<u32>(c);
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    u32 before = 0;
    for (u32 i = 0; i < warp; i++) before += warp_sums[i];
    u64 at = offsets[blockIdx.x] + before + incl - c;
    while (bits) {
        u32 b = __ffs(bits) - 1;
        out[at++] = keys[w * 32 + b];
        bits &= bits - 1;
    }
}

// The aggregates of the kept rows of one decoded column of signed 64-bit
// lanes, so a count / sum / min / max over a selection's rows never brings
// the rows back: out = {rows kept with a value, their wrapping sum, min,
// max}, preset to {0, 0, INT64_MAX, INT64_MIN}. A row counts where its
// selection bit is set and (with has_valid) its validity bit too. A warp
// reduction, then one atomic of each per warp.
extern "C" __global__ void reduce_kept(const u32* sel, const u32* valid, u64 has_valid, u64 n, const i64* values,
                                       u64* out) {
    u64 count = 0, sum = 0;
    i64 lo = 0x7fffffffffffffffLL, hi = -0x7fffffffffffffffLL - 1;
    SF_FOR(i, n) {
        u32 w = sel[i >> 5];
        if (has_valid) w &= valid[i >> 5];
        if ((w >> (i & 31)) & 1u) {
            i64 v = values[i];
            count++;
            sum += (u64)v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_down_sync(0xffffffffu, count, o);
        sum += __shfl_down_sync(0xffffffffu, sum, o);
        i64 l2 = __shfl_down_sync(0xffffffffu, lo, o), h2 = __shfl_down_sync(0xffffffffu, hi, o);
        lo = l2 < lo ? l2 : lo;
        hi = h2 > hi ? h2 : hi;
    }
    if ((threadIdx.x & 31) == 0 && count > 0) {
        atomicAdd(&out[0], count);
        atomicAdd(&out[1], sum);
        atomicMin((long long*)&out[2], (long long)lo);
        atomicMax((long long*)&out[3], (long long)hi);
    }
}

// One column of a composite key packed into the key: for each row whose
// selection bit is set, key = key * range + (value - lo) (the first column,
// first != 0: key = value - lo), so a key of several exact columns becomes one
// exact 64-bit key (mixed radix; the host checked that the ranges multiply to
// less than 2^64). A kept row whose value lies outside [lo, lo + range) sets
// err[0] (the host then packs nothing); rows not kept are left as they were.
extern "C" __global__ void pack_key_column(const u32* sel, u64 n, const u64* values, u64 lo, u64 range, u64 first,
                                           u64* keys, u32* err) {
    SF_FOR(i, n) {
        if (!((sel[i >> 5] >> (i & 31)) & 1u)) continue;
        const u64 slot = values[i] - lo;
        if (slot >= range) {
            atomicOr(err, 1u);
            continue;
        }
        keys[i] = first ? slot : keys[i] * range + slot;
    }
}
