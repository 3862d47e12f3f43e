// Overlap counts of every pair of sets of two families by bitmaps (seed 004's
// BI techniques, MISI). Host side: src/algo/overlap.rs.
//
// The universe (dense element ids) is cut into chunks; for one chunk:
//   ovl_bits  writes each set's row of `words` 32-bit words over the chunk: a
//             block per set, a thread per run of words, whose elements it
//             finds by one binary search (the sets are ascending);
//   ovl_popc  adds popc(L[i] & R[j]) over the chunk's words to counts[i][j],
//             a tiled "popcount GEMM": a block computes a 64 x 64 tile of
//             counts, staging 32 words of its 64 left and 64 right rows in
//             shared memory at a time; each thread owns a 4 x 4 sub-tile.
// Seed 004's BI-naive gives each pair its own pass over both bitmaps (no
// reuse); the tile reads each word once per 64 pairs, so the kernel is bound
// by popc throughput, not memory. BI-dynamic's probing (one random bitmap
// read per element) costs about as many operations as a word per 32 ids,
// at random addresses; here the operations are regular.

#include "common.cuh"

#define OVL_TILE 64
#define OVL_KWORDS 32
#define OVL_WPT 32

// The bitmaps of sets [first, first + nsets) over ids [lo, lo + 32 * words) (lo a multiple of
// 32): row s gets every one of its `words` words written, so the rows need no zeroing. A block
// per set; a thread builds OVL_WPT consecutive words from its run of the (ascending) set, found
// by one binary search. Measured on the H100 (10^9 elements, 12.5 GB of rows): ~1.3 s, as with an
// atomicOr per element, and ~1.5 s with tiles built in shared memory: the time is the binary
// searches' dependent loads (~20 a search, one search per 32 words), not the stores. To do: find
// each run's start while scanning the previous run, one search per block.
extern "C" __global__ void ovl_bits(const u64* offsets, const u32* elements, u64 first, u64 nsets, u32 lo,
                                    u64 words, u32* bits) {
    for (u64 s = blockIdx.x; s < nsets; s += gridDim.x) {
        const u64 begin = offsets[first + s], n = offsets[first + s + 1] - begin;
        const u32* set = elements + begin;
        u32* row = bits + s * words;
        for (u64 w0 = (u64)threadIdx.x * OVL_WPT; w0 < words; w0 += (u64)blockDim.x * OVL_WPT) {
            const u64 id0 = (u64)lo + w0 * 32;
            u64 x = id0 > 0xffffffffull ? n : sf_lower_bound<u32, u64>(set, n, (u32)id0);
            const u64 w_end = w0 + OVL_WPT < words ? w0 + OVL_WPT : words;
            for (u64 w = w0; w < w_end; ++w) {
                const u64 hi = (u64)lo + (w + 1) * 32;
                u32 word = 0;
                while (x < n && (u64)set[x] < hi) {
                    word |= 1u << ((set[x] - lo) & 31u);
                    ++x;
                }
                row[w] = word;
            }
        }
    }
}

// counts[i * ldc + j] += popc over w of (left[i * words + w] & right[j * words + w]) for
// i < nl, j < nr. In the self form (self_form = 1, left and right the same rows shifted by
// `right_offset`: right row j is set right_offset + j) tiles wholly below the diagonal
// (every j + right_offset <= i + left_offset) are skipped. Block: 256 threads, a 64 x 64 tile
// over the words [blockIdx.z * split, (blockIdx.z + 1) * split): a thousand sets make only
// ~130 tiles, too few blocks to fill the device, so the words are split across blocks too
// and each block adds its sums with atomics.
extern "C" __global__ void __launch_bounds__(256) ovl_popc(const u32* left, const u32* right, u64 words, u64 nl,
                                                            u64 nr, u32 self_form, u64 left_offset,
                                                            u64 right_offset, u32* counts, u64 ldc, u64 split) {
    __shared__ u32 ls[OVL_TILE][OVL_KWORDS + 1];
    __shared__ u32 rs[OVL_TILE][OVL_KWORDS + 1];
    const u64 i0 = (u64)blockIdx.y * OVL_TILE, j0 = (u64)blockIdx.x * OVL_TILE;
    if (self_form && right_offset + j0 + OVL_TILE - 1 <= left_offset + i0) return;
    const u32 tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    u32 acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = 0;
    const u64 w_begin = (u64)blockIdx.z * split;
    const u64 w_end = w_begin + split < words ? w_begin + split : words;
    for (u64 w0 = w_begin; w0 < w_end; w0 += OVL_KWORDS) {
        // Stage 64 rows x 32 words of each side: 2048 words, 8 a thread, rows of 32 consecutive words.
        for (u32 t = threadIdx.x; t < OVL_TILE * OVL_KWORDS; t += blockDim.x) {
            const u32 row = t / OVL_KWORDS, w = t % OVL_KWORDS;
            const bool in_w = w0 + w < w_end;
            ls[row][w] = (i0 + row < nl && in_w) ? left[(i0 + row) * words + w0 + w] : 0u;
            rs[row][w] = (j0 + row < nr && in_w) ? right[(j0 + row) * words + w0 + w] : 0u;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 w = 0; w < OVL_KWORDS; ++w) {
            u32 a[4], b[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) a[r] = ls[ty * 4 + r][w];
#pragma unroll
            for (int c = 0; c < 4; ++c) b[c] = rs[tx * 4 + c][w];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] += __popc(a[r] & b[c]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const u64 i = i0 + ty * 4 + r;
        if (i >= nl) continue;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u64 j = j0 + tx * 4 + c;
            if (j < nr && acc[r][c]) atomicAdd(counts + i * ldc + j, acc[r][c]);
        }
    }
}
