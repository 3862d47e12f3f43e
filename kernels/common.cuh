// Shared helpers for every setfusion kernel family. Inlined into each .cu by
// the runtime before NVRTC compiles it (NVRTC sees no file system).
#pragma once
typedef unsigned long long u64;
typedef unsigned int u32;
typedef long long i64;

// Grid-stride loop over [0, n).
#define SF_FOR(i, n) for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); i += (u64)gridDim.x * blockDim.x)

// 64-bit finaliser (splitmix64): spreads clustered integer keys over the table.
__device__ __forceinline__ u64 sf_mix64(u64 x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

// Grid-stride loop over [0, n rounded up to 32): every lane of a warp runs the
// same iterations, so the body may use warp votes (rows i >= n are padding).
#define SF_FOR_WARPS(i, n) for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (((u64)(n) + 31) & ~31ULL); i += (u64)gridDim.x * blockDim.x)

// Write one bit per row, LSB first in 32-bit words (the Arrow boolean layout on
// little-endian hosts). Called by all lanes of a warp inside SF_FOR_WARPS.
__device__ __forceinline__ void sf_store_bit(u32* words, u64 i, u64 n, bool bit) {
    unsigned mask = __ballot_sync(0xffffffffu, bit && i < n);
    if ((threadIdx.x & 31) == 0) words[i >> 5] = mask;
}
