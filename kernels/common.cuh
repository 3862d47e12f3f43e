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

// ---- keys::hash_bytes on the device (row_hash's string keys, and the
// Parquet decoder's BYTE_ARRAY keys, hash the same way).
#define SF_HASH_K 0x9E3779B97F4A7C15ULL

__device__ __forceinline__ u64 sf_rotl(u64 x, int r) { return (x << r) | (x >> (64 - r)); }

// The 8 bytes at byte position `pos` of a padded, 8-aligned buffer, little-endian.
__device__ __forceinline__ u64 sf_load8(const u64* __restrict__ words, u64 pos) {
    u64 w = pos >> 3;
    unsigned sh = (unsigned)(pos & 7) * 8;
    u64 lo = words[w];
    if (sh == 0) return lo;
    return (lo >> sh) | (words[w + 1] << (64 - sh));
}

// keys::hash_bytes over the bytes [start, start + len) of an 8-aligned buffer
// whose word after the last byte may be read (its bytes are masked off).
__device__ __forceinline__ u64 sf_hash_bytes(const u64* __restrict__ words, u64 start, u64 len) {
    u64 h = (len * SF_HASH_K) ^ 0x243F6A8885A308D3ULL;
    u64 end = start + len;
    u64 pos = start;
    unsigned sh = (unsigned)(start & 7) * 8;
    if (len >= 8) {
        // Rolling window: every full chunk needs one new aligned word. `cur`
        // holds the word containing `pos`; the word after it contains byte
        // pos + 7 < end when sh != 0, and is the next chunk's word otherwise,
        // so it is read in bounds in both cases.
        u64 w = pos >> 3;
        u64 cur = words[w];
        while (pos + 8 <= end) {
            u64 next = words[w + 1];
            u64 v = sh == 0 ? cur : (cur >> sh) | (next << (64 - sh));
            h = sf_rotl((h ^ v) * SF_HASH_K, 29);
            cur = next;
            ++w;
            pos += 8;
        }
    }
    u64 r = end - pos;  // 0..7 tail bytes, zero-padded like the CPU twin
    u64 tail = 0;
    if (r) tail = sf_load8(words, pos) & (~0ULL >> (64 - 8 * r));
    h = (h ^ tail) * SF_HASH_K;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ULL;
    return h ^ (h >> 32);
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

// ---- sorted-array searches, shared by the merge-like families (sort_setops,
// multiset, sorted_intersect); I is the index type (int in shared memory,
// i64 or u32 in global memory).

template <typename I> __device__ __forceinline__ I sf_min(I a, I b) { return a < b ? a : b; }
template <typename I> __device__ __forceinline__ I sf_max(I a, I b) { return a > b ? a : b; }

// First i in [0, n) with a[i] >= x (n if none), over any ordered values.
template <typename T, typename I> __device__ __forceinline__ I sf_lower_bound(const T* a, I n, T x) {
    I lo = 0, hi = n;
    while (lo < hi) {
        const I mid = lo + ((hi - lo) >> 1);
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Merge Path lower-bound search on diagonal `diag` of the merge of a[0, na)
// and b[0, nb): the number of A elements among the first `diag` merged
// elements (A before B on ties). sorted_intersect's tiles and
// overlap_search's pieces of a pair.
template <typename T>
__device__ __forceinline__ i64 sf_merge_path(const T* a, i64 na, const T* b, i64 nb, i64 diag) {
    i64 lo = diag > nb ? diag - nb : 0;
    i64 hi = diag < na ? diag : na;
    while (lo < hi) {
        i64 mid = (lo + hi) >> 1;
        if (a[mid] <= b[diag - 1 - mid]) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// First i in [0, n) with a[i] >= x (n if none).
template <typename I> __device__ I sf_lower_bound_u64(const u64* a, I n, u64 x) { return sf_lower_bound<u64, I>(a, n, x); }

// First i in [0, n) with a[i] > x (n if none).
template <typename I> __device__ I sf_upper_bound_u64(const u64* a, I n, u64 x) {
    I lo = 0, hi = n;
    while (lo < hi) {
        const I mid = lo + ((hi - lo) >> 1);
        if (!(x < a[mid])) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Inclusive scan across the warp: lane i (threadIdx.x % 32) gets the sum of
// the values of lanes 0..=i. Lanes past `lanes` take part but their sums are
// unused; every lane of `mask` must call it (Kogge-Stone over __shfl_up_sync).
template <typename T>
__device__ __forceinline__ T sf_warp_inclusive_scan(T v, unsigned lanes = 32u, unsigned mask = 0xffffffffu) {
    const unsigned lane = threadIdx.x & 31u;
#pragma unroll
    for (unsigned d = 1; d < lanes; d <<= 1) {
        const T y = __shfl_up_sync(mask, v, d);
        if (lane >= d) v += y;
    }
    return v;
}

// moderngpu BalancedPath<Duplicates = true>: where cross-diagonal `diag` of
// the merge of a[0, na) and b[0, nb) meets the Balanced Path, which pairs the
// r-th copy of a key in A with the r-th copy in B. Returns the A index; the B
// index is diag - result + *star (a starred diagonal gives the B element at
// diag - result to the left side, so a key-rank pair is never split).
// Plain binary searches (moderngpu biases them towards short duplicate runs;
// correctness is the same).
template <typename I> __device__ I sf_balanced_path(const u64* a, I na, const u64* b, I nb, I diag, int* star) {
    // Merge Path, lower-bound flavour: on ties A's elements come first.
    I lo = diag > nb ? diag - nb : 0, hi = sf_min(diag, na);
    while (lo < hi) {
        const I mid = lo + ((hi - lo) >> 1);
        if (!(b[diag - 1 - mid] < a[mid])) lo = mid + 1; else hi = mid;
    }
    I ai = lo;
    const I bi = diag - lo;
    *star = 0;
    if (bi < nb) {
        const u64 x = b[bi];
        // Where the Merge Path entered x's run in both inputs (where Balanced Path diverged).
        const I a_start = sf_lower_bound_u64<I>(a, ai, x);
        const I b_start = sf_lower_bound_u64<I>(b, bi, x);
        const I a_run = ai - a_start;
        I b_run = bi - b_start;
        const I x_count = a_run + b_run;
        // Spread the run evenly over A and B, bounded by B's run of x.
        I b_adv = sf_max(x_count >> 1, x_count - a_run);
        const I b_end = sf_min(nb, b_start + b_adv + 1);
        const I b_run_end = bi + sf_upper_bound_u64<I>(b + bi, b_end - bi, x);
        b_run = b_run_end - b_start;
        b_adv = sf_min(b_adv, b_run);
        const I a_adv = x_count - b_adv;
        *star = (a_adv == b_adv + 1) && (b_adv < b_run);
        ai = a_start + a_adv;
    }
    return ai;
}

// Ascending bitonic sort of s[0..p), p a power of two, by the whole block;
// s is written before the call and read after it (both sides synchronise).
template <typename T>
__device__ void block_bitonic_sort(T* s, u32 p) {
    __syncthreads();
    for (u32 k = 2; k <= p; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = threadIdx.x; i < p; i += blockDim.x) {
                u32 l = i ^ j;
                if (l > i) {
                    T a = s[i], b = s[l];
                    bool up = (i & k) == 0;
                    if ((a > b) == up) {
                        s[i] = b;
                        s[l] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}
