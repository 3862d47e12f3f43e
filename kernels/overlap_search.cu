// Overlap counts of pairs of sets by partitioned search: seed 004's IP-OBS
// (MISI and SISI), IP's grid-level diagonal partitioning in front of a
// block-level OBS. Host side: src/algo/overlap.rs (`search_counts_gpu`; its
// CPU twin `search_counts_cpu` runs the same tiles).
//
// A batch of pairs (left set, right set) is cut into tiles of `nv` steps of
// each pair's merge:
//   ovs_partitions  for every tile of the batch, its pair and where its first
//                   diagonal meets the Merge Path (A first on ties): a thread
//                   a tile, a binary search in global memory. These are the
//                   seed's diagonals (8 bytes a tile); the host sizes the
//                   batch so they fit the budget (its case B6 tiles them);
//   ovs_count       a block a tile: the larger of the tile's two pieces is
//                   staged in shared memory and each thread looks elements of
//                   the smaller piece up in it. OBS caches the top levels of
//                   the larger set's search tree in shared memory; a tile is
//                   at most OVS_MAX_NV + 1 elements, so here the whole tree
//                   is cached. The block's matches go to the pair's count.
// Sets hold distinct ascending ids, so a match A[p] = B[q] takes adjacent
// steps of the merge, A[p] first. It is counted by the tile holding B[q]:
// every tile's A piece is widened by the A element before it (A[a0 - 1]),
// which is A[p] where a tile boundary falls between the two.

#include "common.cuh"

#define OVS_MAX_NV 4096

// The tile's set `s` of a family: its first element and length.
__device__ __forceinline__ const u32* ovs_set(const u64* offsets, const u32* elements, u32 s, u64* n) {
    const u64 begin = offsets[s];
    *n = offsets[s + 1] - begin;
    return elements + begin;
}

// Tiles [0, ntiles) of the batch's pairs: pair p (left set pairs[2p], right
// set pairs[2p + 1]) owns tiles [tile_start[p], tile_start[p + 1]). Writes
// tile_pair[t] = p and tile_a0[t] = the A elements before the tile's first
// merge step (t - tile_start[p]) * nv.
extern "C" __global__ void ovs_partitions(const u64* l_offsets, const u32* l_elements, const u64* r_offsets,
                                          const u32* r_elements, const u32* pairs, const u64* tile_start,
                                          u64 npairs, u64 ntiles, u64 nv, u32* tile_pair, u32* tile_a0) {
    SF_FOR(t, ntiles) {
        const u64 p = sf_upper_bound_u64<u64>(tile_start, npairs + 1, t) - 1;
        u64 na, nb;
        const u32* a = ovs_set(l_offsets, l_elements, pairs[2 * p], &na);
        const u32* b = ovs_set(r_offsets, r_elements, pairs[2 * p + 1], &nb);
        const i64 diag = (i64)((t - tile_start[p]) * nv);
        tile_pair[t] = (u32)p;
        tile_a0[t] = (u32)sf_merge_path<u32>(a, (i64)na, b, (i64)nb, diag);
    }
}

// counts[(i - row0) * ldc + j] += the matches of every tile of pair (i, j):
// |A[a0 - 1 (if a0 > 0), a1) ∩ B[b0, b1)| of its tile, the smaller piece
// looked up in the larger, staged in shared memory. A block a tile (grid
// stride); nv <= OVS_MAX_NV.
extern "C" __global__ void __launch_bounds__(256) ovs_count(const u64* l_offsets, const u32* l_elements,
                                                             const u64* r_offsets, const u32* r_elements,
                                                             const u32* pairs, const u64* tile_start, u64 ntiles,
                                                             u64 nv, const u32* tile_pair, const u32* tile_a0,
                                                             u64 row0, u64 ldc, u32* counts) {
    __shared__ u32 larger[OVS_MAX_NV + 1];
    __shared__ u32 block_hits;
    for (u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const u64 p = tile_pair[t];
        const u32 i = pairs[2 * p], j = pairs[2 * p + 1];
        u64 na, nb;
        const u32* a = ovs_set(l_offsets, l_elements, i, &na);
        const u32* b = ovs_set(r_offsets, r_elements, j, &nb);
        const u64 d0 = (t - tile_start[p]) * nv;
        const u64 d1 = d0 + nv < na + nb ? d0 + nv : na + nb;
        const u64 a0 = tile_a0[t];
        const u64 a1 = t + 1 < tile_start[p + 1] ? (u64)tile_a0[t + 1] : na;
        const u64 b0 = d0 - a0, b1 = d1 - a1;
        const u64 a_from = a0 > 0 ? a0 - 1 : 0;
        const u32 la = (u32)(a1 - a_from), lb = (u32)(b1 - b0);
        const bool a_smaller = la <= lb;
        const u32* small = a_smaller ? a + a_from : b + b0;
        const u32* large = a_smaller ? b + b0 : a + a_from;
        const u32 ns = a_smaller ? la : lb, nl = a_smaller ? lb : la;
        if (threadIdx.x == 0) block_hits = 0;
        for (u32 x = threadIdx.x; x < nl; x += blockDim.x) larger[x] = large[x];
        __syncthreads();
        u32 hits = 0;
        for (u32 x = threadIdx.x; x < ns; x += blockDim.x) {
            const u32 v = small[x];
            const u32 at = sf_lower_bound<u32, u32>(larger, nl, v);
            hits += (at < nl && larger[at] == v) ? 1u : 0u;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) hits += __shfl_down_sync(0xffffffffu, hits, o);
        if ((threadIdx.x & 31) == 0 && hits) atomicAdd(&block_hits, hits);
        __syncthreads();
        if (threadIdx.x == 0 && block_hits) atomicAdd(counts + ((u64)i - row0) * ldc + j, block_hits);
        // `larger` and `block_hits` are the next tile's.
        __syncthreads();
    }
}
