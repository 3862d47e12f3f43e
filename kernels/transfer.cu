// Transfer codecs: keys cross PCIe frame-of-reference coded and are decoded
// here into their 64-bit form. The host splits each staging fill into segments
// of SF_SEG keys; a segment whose values span less than 2^32 is sent as 32-bit
// offsets from its minimum (half the bytes of the raw keys), a wider one as
// offsets split into low and high 32-bit words. Layout of one fill (bytes):
//   [0, SF_SEGS*8)                 per-segment base (its minimum key)
//   [SF_SEGS*8, SF_SEGS*12)        per-segment flag: 1 = wide (high words sent)
//   [SF_DESC, SF_DESC + 4n)        low 32 bits of key - base, for the n keys
//   [high_off, high_off + 4n)      high 32 bits (read only for wide segments)
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
