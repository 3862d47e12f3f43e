// Similarity-join preprocessing on the device; the launcher and the CPU twin
// that defines the output are src/algo/ssjoin_prep.rs.
//
// Inputs: the raw sets of both collections back to back (CSR: elems, offs;
// any order, duplicates allowed), every element in [lo, lo + span).
//   1. dedup_count_small / dedup_count_large: each set is sorted and
//      deduplicated in place (its distinct elements move to the front of its
//      range, their number to sizes[set]), and each distinct element counts
//      one for its document frequency: df[element - lo] (atomics).
//   2. (host) ranks in ascending (df, element) order over the df table, the
//      sets' output order (by size, then id) and each set's first output
//      position dst[set].
//   3. map_small / map_large: each set's distinct elements become their
//      ranks, sorted, written at tokens[dst[set]..].
// Sets of at most PREP_SMALL elements take one thread each (a sort in the
// thread's local array); larger ones, at most PREP_LARGE, one block each (a
// bitonic sort in shared memory), listed by the host.
#include "common.cuh"

// PREP_SMALL, PREP_LARGE and PREP_BLOCK come from the host: -D options from src/algo/ssjoin_prep.rs.

template <typename T>
__device__ __forceinline__ void insertion_sort(T* a, u32 n) {
    for (u32 i = 1; i < n; ++i) {
        T x = a[i];
        u32 j = i;
        while (j > 0 && a[j - 1] > x) {
            a[j] = a[j - 1];
            --j;
        }
        a[j] = x;
    }
}

extern "C" __global__ void dedup_count_small(u64* elems, const u64* offs, u64 n_sets, u64 lo, u32* df, u32* sizes) {
    SF_FOR(i, n_sets) {
        u64 a = offs[i];
        u32 n = (u32)(offs[i + 1] - a);
        if (n > PREP_SMALL) continue;  // listed for dedup_count_large
        u64 buf[PREP_SMALL];
        for (u32 j = 0; j < n; ++j) buf[j] = elems[a + j];
        insertion_sort(buf, n);
        u32 m = 0;
        for (u32 j = 0; j < n; ++j) {
            if (j == 0 || buf[j] != buf[j - 1]) {
                elems[a + m] = buf[j];
                ++m;
                atomicAdd(&df[buf[j] - lo], 1u);
            }
        }
        sizes[i] = m;
    }
}

extern "C" __global__ void __launch_bounds__(PREP_BLOCK)
dedup_count_large(u64* elems, const u64* offs, const u32* large, u64 n_large, u64 lo, u32* df, u32* sizes) {
    __shared__ u64 s[PREP_LARGE];
    for (u64 g = blockIdx.x; g < n_large; g += gridDim.x) {
        u32 set = large[g];
        u64 a = offs[set];
        u32 n = (u32)(offs[set + 1] - a);
        u32 p = 1;
        while (p < n) p <<= 1;
        // Padding sorts last; only the first n values are read back.
        for (u32 j = threadIdx.x; j < p; j += blockDim.x) s[j] = j < n ? elems[a + j] : ~0ULL;
        block_bitonic_sort(s, p);
        for (u32 j = threadIdx.x; j < n; j += blockDim.x) {
            if (j == 0 || s[j] != s[j - 1]) atomicAdd(&df[s[j] - lo], 1u);
        }
        // The compaction is serial: large sets are few.
        if (threadIdx.x == 0) {
            u32 m = 0;
            for (u32 j = 0; j < n; ++j) {
                if (j == 0 || s[j] != s[j - 1]) {
                    elems[a + m] = s[j];
                    ++m;
                }
            }
            sizes[set] = m;
        }
        __syncthreads();
    }
}

extern "C" __global__ void map_small(const u64* elems, const u64* offs, u64 n_sets, const u32* sizes, u64 lo,
                                     const u32* rank, const u32* dst, u32* tokens) {
    SF_FOR(i, n_sets) {
        u64 a = offs[i];
        if (offs[i + 1] - a > PREP_SMALL) continue;  // listed for map_large
        u32 m = sizes[i];
        u32 buf[PREP_SMALL];
        for (u32 j = 0; j < m; ++j) buf[j] = rank[elems[a + j] - lo];
        insertion_sort(buf, m);
        u32* out = tokens + dst[i];
        for (u32 j = 0; j < m; ++j) out[j] = buf[j];
    }
}

extern "C" __global__ void __launch_bounds__(PREP_BLOCK)
map_large(const u64* elems, const u64* offs, const u32* large, u64 n_large, const u32* sizes, u64 lo,
          const u32* rank, const u32* dst, u32* tokens) {
    __shared__ u32 s[PREP_LARGE];
    for (u64 g = blockIdx.x; g < n_large; g += gridDim.x) {
        u32 set = large[g];
        u64 a = offs[set];
        u32 m = sizes[set];
        u32 p = 1;
        while (p < m) p <<= 1;
        for (u32 j = threadIdx.x; j < p; j += blockDim.x) s[j] = j < m ? rank[elems[a + j] - lo] : 0xffffffffu;
        block_bitonic_sort(s, p);
        u32* out = tokens + dst[set];
        for (u32 j = threadIdx.x; j < m; j += blockDim.x) out[j] = s[j];
        __syncthreads();
    }
}
