// Sorted-set intersection by Merge Path (seed 003 fast sorted-list intersection;
// seed 002's partitioning without duplicates). Inputs are strictly increasing
// (sets). One tile of NV = NT*VT merge steps per block: a global partition
// search finds each tile's start, the tile is staged in shared memory, and each
// thread walks VT steps of the merge. Tile shapes are template parameters; the
// launcher picks one of the instantiations below (the benchmark measures all).
#include "common.cuh"

// Merge Path lower-bound search on diagonal `diag`: number of A elements
// among the first `diag` merged elements (A before B on ties).
template <typename T>
__device__ __forceinline__ i64 merge_path(const T* a, i64 na, const T* b, i64 nb, i64 diag) {
    i64 lo = diag > nb ? diag - nb : 0;
    i64 hi = diag < na ? diag : na;
    while (lo < hi) {
        i64 mid = (lo + hi) >> 1;
        if (a[mid] <= b[diag - 1 - mid]) lo = mid + 1; else hi = mid;
    }
    return lo;
}

template <typename T>
__device__ void partitions(const T* a, i64 na, const T* b, i64 nb, i64* parts, i64 nparts, i64 nv) {
    SF_FOR(i, nparts) {
        i64 diag = (i64)i * nv;
        i64 total = na + nb;
        if (diag > total) diag = total;
        parts[i] = merge_path(a, na, b, nb, diag);
    }
}

// Count |A ∩ B| (into *count) and optionally set bit i of `flags` for each
// matching A[i]. A match is counted when an A element is consumed while the
// head of B equals it: with A-first tie-breaking that head is the only B
// element that can equal it.
template <int NT, int VT, typename T>
__device__ void intersect_tile(const T* a, i64 na, const T* b, i64 nb, const i64* parts,
                               unsigned long long* count, u32* flags) {
    constexpr int NV = NT * VT;
    // The tile's A run, then its B run, then (if any) the next B element: the
    // head of B when the tile ends on A.
    __shared__ T s[NV + 1];
    i64 tile = blockIdx.x;
    i64 d0 = tile * NV, d1 = d0 + NV;
    if (d1 > na + nb) d1 = na + nb;
    i64 a0 = parts[tile], a1 = parts[tile + 1];
    i64 b0 = d0 - a0, b1 = d1 - a1;
    int la = (int)(a1 - a0), lb = (int)(b1 - b0);
    bool b_more = b1 < nb;
    int n = la + lb;
    // All VT loads of a thread are issued before the first shared store, so
    // their latencies overlap (a load-store loop would wait on each in turn).
    T r[VT];
#pragma unroll
    for (int j = 0; j < VT; ++j) {
        int i = threadIdx.x + j * NT;
        if (i < n) r[j] = i < la ? a[a0 + i] : b[b0 + (i - la)];
    }
#pragma unroll
    for (int j = 0; j < VT; ++j) {
        int i = threadIdx.x + j * NT;
        if (i < n) s[i] = r[j];
    }
    if (threadIdx.x == 0 && b_more) s[n] = b[b1];
    __syncthreads();
    const T* sa = s;
    const T* sb = s + la;
    int diag = threadIdx.x * VT;
    u32 local = 0;
    if (diag < n) {
        int lo = diag > lb ? diag - lb : 0, hi = diag < la ? diag : la;
        while (lo < hi) { int mid = (lo + hi) >> 1; if (sa[mid] <= sb[diag - 1 - mid]) lo = mid + 1; else hi = mid; }
        int ia = lo, ib = diag - lo;
#pragma unroll
        for (int k = 0; k < VT; ++k) {
            if (ia + ib >= n) break;
            bool b_has = ib < lb || b_more;
            T va = sa[ia < la ? ia : 0];
            T vb = sb[ib];  // ib <= lb, and sb[lb] exists (the next B element) when b_more
            if (ia < la && (ib >= lb || va <= vb)) {
                if (b_has && va == vb) {
                    ++local;
                    if (flags) atomicOr(&flags[(a0 + ia) >> 5], 1u << ((a0 + ia) & 31));
                }
                ++ia;
            } else {
                ++ib;
            }
        }
    }
    // warp reduce, then one atomic per warp
    for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, (unsigned long long)local);
}

extern "C" __global__ void partitions_u32(const u32* a, i64 na, const u32* b, i64 nb, i64* parts, i64 nparts, i64 nv) { partitions(a, na, b, nb, parts, nparts, nv); }
extern "C" __global__ void partitions_u64(const u64* a, i64 na, const u64* b, i64 nb, i64* parts, i64 nparts, i64 nv) { partitions(a, na, b, nb, parts, nparts, nv); }

#define SF_INTERSECT_U32(NT_, VT_)                                                                                  \
    extern "C" __global__ void __launch_bounds__(NT_) intersect_u32_##NT_##x##VT_(                                  \
        const u32* a, i64 na, const u32* b, i64 nb, const i64* parts, unsigned long long* count, u32* flags) {      \
        intersect_tile<NT_, VT_>(a, na, b, nb, parts, count, flags);                                               \
    }
#define SF_INTERSECT(NT_, VT_)                                                                                      \
    SF_INTERSECT_U32(NT_, VT_)                                                                                      \
    extern "C" __global__ void __launch_bounds__(NT_) intersect_u64_##NT_##x##VT_(                                  \
        const u64* a, i64 na, const u64* b, i64 nb, const i64* parts, unsigned long long* count, u32* flags) {      \
        intersect_tile<NT_, VT_>(a, na, b, nb, parts, count, flags);                                               \
    }

// Keep in step with TILE_SHAPES / TILE_SHAPES_U32 in src/algo/sorted_intersect.rs.
SF_INTERSECT(128, 11)
SF_INTERSECT(128, 15)
SF_INTERSECT(256, 7)
SF_INTERSECT(256, 11)
SF_INTERSECT(256, 15)
SF_INTERSECT(256, 19)
SF_INTERSECT(512, 9)
SF_INTERSECT_U32(256, 23)
SF_INTERSECT_U32(256, 27)
