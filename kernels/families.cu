// Intersection of two families of sets (seed 000, Fort, Sellarès and
// Valladares). Host side: src/algo/families.rs.
//
// A slice of left sets is processed as in the paper's phase C, count then
// fill, over the right family's inverted lists (element -> right sets):
//   fam_count       a warp per left set walks its elements in order and, for
//                   each, the right sets holding it: matrix[row * k + j]++;
//   fam_row_totals  per left set, its non-empty pairs and their elements;
//   fam_compact     (after a host scan of those totals) each non-empty pair's
//                   right set and element offset, in right-set order; the
//                   matrix entry becomes the pair's number (phase D);
//   fam_fill        the same walk as fam_count writes the elements. The
//                   warp owns its row's pairs and walks elements in order, so
//                   every intersection comes out sorted with no atomics.
// Duplicate removal (phase E, the distinct level) groups the pairs by a
// 64-bit hash of their elements in an open-addressing table (fam_group) and
// verifies each pair against its group's first pair exactly
// (fam_group_verify); a mismatch is a hash collision, which the host resolves.
// fam_group_compact and fam_gather lay the distinct sets out, fam_order_keys
// and a radix sort order them by (size, leading elements), and, when one
// slice holds every pair, fam_out_order and fam_out_values write the output
// columns in that order (the host orders only the sets whose keys tie).
//
// A warp per left set (rather than the paper's thread per matrix entry of
// the intersection with a binary search) keeps each row's writes in one warp:
// an element's right sets are spread over the lanes, distinct within one
// element, and __syncwarp orders one element's writes before the next's.

#include "common.cuh"

// FAM_THREADS comes from the host: a -D option from src/algo/families.rs.

// The walk shared by fam_count and fam_fill: for each element of left set
// `first + row` (in order), the right sets j >= from holding it; calls
// body(e, j) once per (element, j) on some lane of the warp.
template <typename Body>
__device__ __forceinline__ void fam_walk(const u64* left_offsets, const u32* left_elements, u64 first, u64 row,
                                         const u32* right_from, u32 self_form, const u32* inv_offsets,
                                         const u32* inv_sets, Body body) {
    const u32 lane = threadIdx.x & 31;
    const u64 i = first + row;
    const u32 from = self_form ? right_from[i] : 0u;
    for (u64 x = left_offsets[i]; x < left_offsets[i + 1]; ++x) {
        const u32 e = left_elements[x];
        const u32* list = inv_sets + inv_offsets[e];
        const u32 n = inv_offsets[e + 1] - inv_offsets[e];
        const u32 start = from ? sf_lower_bound<u32, u32>(list, n, from) : 0u;
        for (u32 t = start + lane; t < n; t += 32) body(e, list[t]);
        __syncwarp();
    }
}

// Count every pair's intersection size: matrix[row * k + j] for the slice's
// rows [0, nrows) (left sets first + row). One warp per row.
extern "C" __global__ void fam_count(const u64* left_offsets, const u32* left_elements, u64 first, u64 nrows,
                                     const u32* right_from, u32 self_form, const u32* inv_offsets,
                                     const u32* inv_sets, u64 k, u32* matrix) {
    const u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= nrows) return;
    u32* counts = matrix + row * k;
    fam_walk(left_offsets, left_elements, first, row, right_from, self_form, inv_offsets, inv_sets,
             [&](u32, u32 j) { counts[j] += 1; });
}

// Per row: totals[2 * row] = its non-empty pairs, totals[2 * row + 1] = their elements.
extern "C" __global__ void fam_row_totals(const u32* matrix, u64 nrows, u64 k, u64* totals) {
    const u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= nrows) return;
    const u32 lane = threadIdx.x & 31;
    const u32* counts = matrix + row * k;
    u64 pairs = 0, elems = 0;
    for (u64 j = lane; j < k; j += 32) {
        const u32 c = counts[j];
        pairs += c != 0;
        elems += c;
    }
    for (int off = 16; off > 0; off >>= 1) {
        pairs += __shfl_down_sync(0xffffffffu, pairs, off);
        elems += __shfl_down_sync(0xffffffffu, elems, off);
    }
    if (lane == 0) {
        totals[2 * row] = pairs;
        totals[2 * row + 1] = elems;
    }
}

// Removal of empty intersections: each non-empty pair of row `row` gets the
// number bases[2 * row] + (its rank among the row's non-empty pairs), its
// right set in right[number] and its elements' offset in offsets[number]
// (bases[2 * row + 1] + the counts before it); the matrix entry becomes the
// number. offsets[total_pairs] = total_elems closes the offsets.
extern "C" __global__ void fam_compact(u32* matrix, u64 nrows, u64 k, const u64* bases, u32* right, u64* offsets,
                                       u64 total_pairs, u64 total_elems) {
    const u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row == 0 && (threadIdx.x & 31) == 0) offsets[total_pairs] = total_elems;
    if (row >= nrows) return;
    const u32 lane = threadIdx.x & 31;
    u32* counts = matrix + row * k;
    u64 pair = bases[2 * row], elem = bases[2 * row + 1];
    for (u64 j0 = 0; j0 < k; j0 += 32) {
        const u64 j = j0 + lane;
        const u32 c = j < k ? counts[j] : 0u;
        const unsigned nonempty = __ballot_sync(0xffffffffu, c != 0);
        // Inclusive warp scan of the counts.
        const u64 incl = sf_warp_inclusive_scan<u64>(c);
        if (c != 0) {
            const u64 number = pair + __popc(nonempty & ((1u << lane) - 1u));
            right[number] = (u32)j;
            offsets[number] = elem + incl - c;
            counts[j] = (u32)number;
        }
        pair += __popc(nonempty);
        elem += __shfl_sync(0xffffffffu, incl, 31);
    }
}

// Write every intersection's elements (the walk of fam_count, in element
// order): pair p = matrix[row * k + j] receives e at offsets[p] + cursor[p].
extern "C" __global__ void fam_fill(const u64* left_offsets, const u32* left_elements, u64 first, u64 nrows,
                                    const u32* right_from, u32 self_form, const u32* inv_offsets,
                                    const u32* inv_sets, u64 k, const u32* matrix, const u64* offsets, u32* cursor,
                                    u32* elements) {
    const u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= nrows) return;
    const u32* numbers = matrix + row * k;
    fam_walk(left_offsets, left_elements, first, row, right_from, self_form, inv_offsets, inv_sets,
             [&](u32 e, u32 j) {
                 const u32 p = numbers[j];
                 elements[offsets[p] + cursor[p]] = e;
                 cursor[p] += 1;
             });
}

// A 64-bit hash of a sorted set (set_hash in src/algo/families.rs).
__device__ __forceinline__ u64 fam_set_hash(const u32* elems, u64 n) {
    u64 h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    for (u64 x = 0; x < n; ++x) h = sf_mix64(h ^ (u64)elems[x]);
    return sf_mix64(h);
}

// Group pairs by their set's hash: slot_of[p] = the table slot of its hash
// (keys: 0 = empty, so hash 0 is stored as 1); first[slot] keeps
// 0xffffffff - (the group's smallest pair number) through atomicMax on a
// zeroed table. slots is a power of two of at least 2n.
extern "C" __global__ void fam_group(const u64* offsets, const u32* elements, u64 n, u32* slot_of, u64* keys,
                                     u32* first, u64 slots) {
    SF_FOR(p, n) {
        u64 key = fam_set_hash(elements + offsets[p], offsets[p + 1] - offsets[p]);
        if (key == 0) key = 1;
        u64 slot = key & (slots - 1);
        while (true) {
            const u64 prev = atomicCAS(&keys[slot], 0ULL, key);
            if (prev == 0ULL || prev == key) break;
            slot = (slot + 1) & (slots - 1);
        }
        slot_of[p] = (u32)slot;
        atomicMax(&first[slot], 0xffffffffu - (u32)p);
    }
}

// Verify every pair against its group's first pair, element by element:
// equal adds one to the group's frequency, different (a hash collision)
// counts in counters[0].
extern "C" __global__ void fam_group_verify(const u64* offsets, const u32* elements, u64 n, const u32* slot_of,
                                            const u32* first, u64* freq, u64* counters) {
    SF_FOR(p, n) {
        const u32 slot = slot_of[p];
        const u64 q = 0xffffffffu - first[slot];
        const u64 len = offsets[p + 1] - offsets[p];
        bool same = len == offsets[q + 1] - offsets[q];
        for (u64 x = 0; same && x < len; ++x) same = elements[offsets[p] + x] == elements[offsets[q] + x];
        if (same) atomicAdd(&freq[slot], 1ULL);
        else atomicAdd(&counters[0], 1ULL);
    }
}

// One entry per group (a used slot): group_pair[g] = its first pair,
// group_freq[g] = its frequency; counters[1] counts the groups and
// counters[2] their elements.
extern "C" __global__ void fam_group_compact(const u64* offsets, const u32* first, const u64* freq, u64 slots,
                                             u32* group_pair, u64* group_freq, u64* counters) {
    SF_FOR(s, slots) {
        const u64 f = freq[s];
        if (f == 0) continue;
        const u32 p = 0xffffffffu - first[s];
        const u64 g = atomicAdd(&counters[1], 1ULL);
        group_pair[g] = p;
        group_freq[g] = f;
        atomicAdd(&counters[2], offsets[p + 1] - offsets[p]);
    }
}

// Copy each group's set to gathered[group_pos[g]...] (space claimed through
// counters[3]); group_pair[g] becomes the set's size.
extern "C" __global__ void fam_gather(const u64* offsets, const u32* elements, u64 groups, u32* group_pair,
                                      u64* group_pos, u32* gathered, u64* counters) {
    SF_FOR(g, groups) {
        const u32 p = group_pair[g];
        const u64 len = offsets[p + 1] - offsets[p];
        const u64 pos = atomicAdd(&counters[3], len);
        for (u64 x = 0; x < len; ++x) gathered[pos + x] = elements[offsets[p] + x];
        group_pos[g] = pos;
        group_pair[g] = (u32)len;
    }
}

// Ordering keys of the gathered groups, for a radix sort by (size, then
// elements): bits 48..63 hold the size (capped at 0xffff), bits 0..47 the
// first min(size, 48 / bits) elements, each `bits` wide, most significant
// first. Sets whose key holds all of them are ordered by it completely;
// the host orders ties among the rest. order[g] = g.
extern "C" __global__ void fam_order_keys(u64 groups, const u64* group_pos, const u32* group_len, const u32* gathered,
                                          u32 bits, u64* keys, u32* order) {
    const u32 cap = 48 / bits;
    SF_FOR(g, groups) {
        const u32 len = group_len[g];
        u64 key = (u64)(len < 0xffffu ? len : 0xffffu) << 48;
        const u32* set = gathered + group_pos[g];
        for (u32 x = 0; x < cap && x < len; ++x) key |= (u64)set[x] << (48 - (x + 1) * bits);
        keys[g] = key;
        order[g] = (u32)g;
    }
}

// The output of the distinct level, in the order of the sorted keys: the i-th
// set's size and frequency (out_len, out_freq). A set whose key equals the
// one before while it is longer than a key holds (cap elements) ties with it:
// ties[0] counts those i, and the first tie_cap of them land in tie_at (in
// no order); the host orders the runs they make.
extern "C" __global__ void fam_out_order(u64 groups, const u32* order, const u32* group_len, const u64* group_freq,
                                         const u64* keys, u32 cap, u32* out_len, u64* out_freq, u64* ties,
                                         u32* tie_at, u64 tie_cap) {
    SF_FOR(i, groups) {
        const u32 g = order[i];
        const u32 len = group_len[g];
        out_len[i] = len;
        out_freq[i] = group_freq[g];
        if (i > 0 && len > cap && keys[i] == keys[i - 1]) {
            const u64 t = atomicAdd(ties, 1ULL);
            if (t < tie_cap) tie_at[t] = (u32)i;
        }
    }
}

// The i-th set's elements at its output offset (an exclusive scan of
// out_len), as the caller's values: values[out_offsets[i] + x] =
// id_values[element id] ^ flip (flip turns order-preserving keys of signed
// integers back into their two's complement bits).
extern "C" __global__ void fam_out_values(u64 groups, const u32* order, const u64* group_pos, const u32* out_offsets,
                                          const u32* gathered, const u64* id_values, u64 flip, u64* values) {
    SF_FOR(i, groups) {
        const u32* set = gathered + group_pos[order[i]];
        const u32 at = out_offsets[i];
        const u32 len = out_offsets[i + 1] - at;
        for (u32 x = 0; x < len; ++x) values[(u64)at + x] = id_values[set[x]] ^ flip;
    }
}
