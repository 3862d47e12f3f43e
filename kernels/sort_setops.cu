// Sort-based multiset operators (seed 002, moderngpu "Multisets"): semi/anti
// join and INTERSECT / EXCEPT [ALL] on 64-bit keys, by
//   1. (not here: kernels/radix_sort.cu, src/algo/radix_sort.rs) a stable
//      Onesweep LSD radix sort of the probe side A (keys with their original
//      row index) and of the build side B (keys only), over only the bits the
//      key domain needs (keys are sorted as key - lo, so a 4e8 wide domain
//      takes 4 passes, not 8). A starts in row order, so among equal probe
//      keys the sorted order is row order: rank = occurrence number.
//   2. Balanced Path partitioning of the merge of sorted A and sorted B into
//      tiles of BP_NV inputs (+-1: a "starred" diagonal moves one B element to
//      the left tile so that the r-th copy of a key in A and the r-th copy in
//      B always land in the same tile), then per thread inside the tile.
//   3. A serial multiset merge per thread (std::set_* semantics): equal keys
//      advance both cursors, so A's r-th copy of x is "matched" exactly when
//      B has more than r copies, i.e. rank < n_b. Per A element:
//        semi: n_b > 0                    anti: n_b == 0
//        intersect all: rank < n_b        except all: rank >= n_b
//        intersect: rank == 0 && n_b > 0  except: rank == 0 && n_b == 0
//      (rank == 0: the previous A key differs; n_b > 0 for an unmatched A
//      element: the previous B key is equal, since all of B's copies precede
//      it on the path). A kept element sets the bit of its original row.
// Output: one bit per probe row, LSB first in u32 words (pre-zeroed).
#include "common.cuh"

// SEMI .. EXCEPT_ALL (the SetOp codes) come from the host: -D options from src/algo/select/mod.rs.


// ---------------------------------------------------------------- Balanced Path
// BP_NT (threads per tile) and BP_VT (inputs per thread) come from the host: -D options from src/algo/select/sort.rs.
#define BP_NV (BP_NT * BP_VT)
#define STAR_BIT 0x8000000000000000ULL

// sf_balanced_path (common.cuh) finds each tile's and each thread's start.

// parts[t] = A index where diagonal min(t * BP_NV, na + nb) meets the
// Balanced Path, with the star flag in bit 63; t in [0, ntiles].
extern "C" __global__ void bp_partition(const u64* a, u64 na, const u64* b, u64 nb, u64 ntiles, u64* parts) {
    SF_FOR(t, ntiles + 1) {
        const i64 diag = sf_min((i64)(t * BP_NV), (i64)(na + nb));
        int star = 0;
        const i64 ai = sf_balanced_path<i64>(a, (i64)na, b, (i64)nb, diag, &star);
        parts[t] = (u64)ai | (star ? STAR_BIT : 0ULL);
    }
}

// The keep rule for one A element (see the header).
__device__ __forceinline__ bool sp_keep(int op, bool matched, bool first, bool present) {
    switch (op) {
    case SEMI: return present;
    case ANTI: return !present;
    case INTERSECT_DISTINCT: return first && present;
    case INTERSECT_ALL: return matched;
    case EXCEPT_DISTINCT: return first && !present;
    default: return !matched; // EXCEPT_ALL
    }
}

// One block per tile: load the tile's A and B ranges into shared memory,
// split them over the threads by Balanced Path (BP_VT +-1 inputs each), and
// let each thread run the serial multiset merge over its slots.
// a: sorted probe keys, a_rows: their original rows, b: sorted build keys.
extern "C" __global__ void bp_select(const u64* a, const u32* a_rows, u64 na, const u64* b, u64 nb, const u64* parts,
                                     int op, u32* out) {
    __shared__ u64 keys[BP_NV + 1]; // a tile holds at most BP_NV + 1 inputs (a stolen B element)
    __shared__ int start_a[BP_NT + 1], start_b[BP_NT + 1];
    const int tid = threadIdx.x;
    const i64 t = blockIdx.x;
    const u64 p0 = parts[t], p1 = parts[t + 1];
    const i64 a0 = (i64)(p0 & ~STAR_BIT), a1 = (i64)(p1 & ~STAR_BIT);
    const int s0 = (p0 & STAR_BIT) ? 1 : 0, s1 = (p1 & STAR_BIT) ? 1 : 0;
    const i64 total = (i64)(na + nb);
    const i64 b0 = t * BP_NV - a0 + s0;
    const i64 b1 = sf_min(total, (t + 1) * BP_NV) - a1 + s1;
    const int ac = (int)(a1 - a0), bc = (int)(b1 - b0);
    for (int i = tid; i < ac; i += BP_NT) keys[i] = a[a0 + i];
    for (int i = tid; i < bc; i += BP_NT) keys[ac + i] = b[b0 + i];
    // The keys just before the tile: rank == 0 and n_b > 0 look one element back.
    const bool has_aprev = a0 > 0, has_bprev = b0 > 0;
    const u64 aprev = has_aprev ? a[a0 - 1] : 0, bprev = has_bprev ? b[b0 - 1] : 0;
    __syncthreads();
    const u64* sa = keys;
    const u64* sb = keys + ac;
    // This thread's first slot: local diagonal tid * BP_VT - s0 (the tile
    // itself starts s0 past its global diagonal). Thread 0 starts at (0, 0).
    int ia = 0, ib = 0;
    const int d = tid * BP_VT - s0;
    if (d > 0) {
        const int dd = sf_min(d, ac + bc);
        int star = 0;
        ia = sf_balanced_path<int>(sa, ac, sb, bc, dd, &star);
        ib = dd - ia + star;
    }
    start_a[tid] = ia;
    start_b[tid] = ib;
    if (tid == 0) {
        start_a[BP_NT] = ac;
        start_b[BP_NT] = bc;
    }
    __syncthreads();
    // Run slots until reaching the next thread's start; a matched pair that
    // straddles it (a starred split) is finished here, as the next thread's
    // start already skips its B element.
    const int end = start_a[tid + 1] + start_b[tid + 1];
    while (ia + ib < end) {
        if (ia >= ac) { ++ib; continue; } // B-only slot
        const u64 ak = sa[ia];
        const bool b_in = ib < bc;
        const u64 bk = b_in ? sb[ib] : 0;
        if (b_in && bk < ak) { ++ib; continue; } // B-only slot
        const bool matched = b_in && bk == ak;
        const bool first = ia > 0 ? sa[ia - 1] != ak : !(has_aprev && aprev == ak);
        // Unmatched: all of B's copies of ak (if any) precede this slot, the last just before ib.
        const bool present = matched || (ib > 0 ? sb[ib - 1] == ak : (has_bprev && bprev == ak));
        if (sp_keep(op, matched, first, present)) {
            const u32 row = a_rows[a0 + ia];
            atomicOr(&out[row >> 5], 1u << (row & 31));
        }
        ++ia;
        if (matched) ++ib;
    }
}
