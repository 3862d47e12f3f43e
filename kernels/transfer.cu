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

#define SF_SEG_LOG2 16
#define SF_SEGS 128
#define SF_DESC 4096

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
