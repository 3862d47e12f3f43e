// Segmented multiset list functions and k-way sorted intersection (issue 15;
// seed 002 moderngpu "Multisets", seed 003 SvS). Launcher: src/algo/multiset.rs.
//
// Keys are u64 in an order-preserving image (signed values have their sign bit
// flipped by the launcher); lists are segments [off[r], off[r + 1]) of one key
// array per side, with one validity byte per row (0: the row's result is NULL,
// its elements are ignored).
//
// The multiset rules are decided per element by counting, not by a merge walk
// (the parallel form of moderngpu's key-rank match): the element at position i
// of a sorted segment, with value v, has rank i - lower_bound(v) within its run
// of equal values, and the other list holds c copies of v (two binary searches
// in the other segment). For a value with m copies in A and n in B:
//   A side keeps rank < n (intersect all), rank >= n (except all, symmetric
//   difference), always (union all);
//   B side keeps rank >= m (union all, symmetric difference), never otherwise.
// That gives min(m,n) / max(m-n,0) / max(m,n) / |m-n| copies. Output positions
// come from exclusive scans of the keep flags: a kept A element goes after the
// row's kept A elements before it and the row's kept B elements of smaller
// value; a kept B element after the row's kept B elements before it and the
// row's kept A elements of smaller or equal value (ties: A first). The result
// is the sorted merge of the kept elements, written without a merge.
//
// Scans are three kernels (tile sums, one-block scan of the sums, tile scan
// with the tile's base); n < 2^32 and totals < 2^32 (the launcher checks).
#include "common.cuh"

#define MS_SCAN_THREADS 256
#define MS_SCAN_ITEMS 8
#define MS_SCAN_TILE (MS_SCAN_THREADS * MS_SCAN_ITEMS)

// First index in v[lo, hi) with v[index] >= x.
__device__ __forceinline__ u64 ms_lower_bound(const u64* v, u64 lo, u64 hi, u64 x) {
    while (lo < hi) {
        u64 mid = lo + ((hi - lo) >> 1);
        if (v[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// First index in v[lo, hi) with v[index] > x.
__device__ __forceinline__ u64 ms_upper_bound(const u64* v, u64 lo, u64 hi, u64 x) {
    while (lo < hi) {
        u64 mid = lo + ((hi - lo) >> 1);
        if (v[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// out[i] = in[i] ^ flip (the order-preserving key image, and back).
extern "C" __global__ void ms_xor(const u64* in, u64 n, u64 flip, u64* out) {
    SF_FOR(i, n) out[i] = in[i] ^ flip;
}

// mm[0] = min, mm[1] = max of v[0, n) (mm preset to (~0, 0)).
extern "C" __global__ void ms_min_max(const u64* v, u64 n, u64* mm) {
    u64 lo = ~0ULL, hi = 0;
    SF_FOR(i, n) {
        u64 x = v[i];
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    for (int o = 16; o > 0; o >>= 1) {
        u64 a = __shfl_down_sync(0xffffffffu, lo, o), b = __shfl_down_sync(0xffffffffu, hi, o);
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin((unsigned long long*)&mm[0], (unsigned long long)lo);
        atomicMax((unsigned long long*)&mm[1], (unsigned long long)hi);
    }
}

// seg[j] = r for every j in [off[r], off[r + 1]): one warp per row.
extern "C" __global__ void ms_seg_ids(const u32* off, u32 rows, u32* seg) {
    SF_FOR(t, (u64)rows * 32) {
        u32 r = (u32)(t >> 5), lane = (u32)(t & 31);
        u32 e = off[r + 1];
        for (u32 j = off[r] + lane; j < e; j += 32) seg[j] = r;
    }
}

// *first = the smallest i with v[i] > v[i + 1] inside one valid row (preset ~0).
extern "C" __global__ void ms_first_descent(const u64* v, const u32* seg, const unsigned char* valid, u64 n, u64* first) {
    SF_FOR(i, n > 0 ? n - 1 : 0) {
        if (seg[i] == seg[i + 1] && v[i] > v[i + 1] && valid[seg[i]])
            atomicMin((unsigned long long*)first, (unsigned long long)i);
    }
}

// out[i] = seg[i] << kbits | (v[i] - min); without seg (null), v[i] - min.
extern "C" __global__ void ms_compose(const u64* v, const u32* seg, u64 n, u64 min, u32 kbits, u64* out) {
    SF_FOR(i, n) {
        u64 k = v[i] - min;
        if (seg && kbits < 64) k |= (u64)seg[i] << kbits;
        out[i] = k;
    }
}

// v[i] = (c[i] & mask(kbits)) + min.
extern "C" __global__ void ms_split(const u64* c, u64 n, u64 min, u32 kbits, u64* v) {
    u64 mask = kbits >= 64 ? ~0ULL : ((1ULL << kbits) - 1);
    SF_FOR(i, n) v[i] = (c[i] & mask) + min;
}

extern "C" __global__ void ms_iota(u32* idx, u64 n) {
    SF_FOR(i, n) idx[i] = (u32)i;
}

// segk[i] = seg[idx[i]].
extern "C" __global__ void ms_gather_seg(const u32* idx, const u32* seg, u64 n, u32* segk) {
    SF_FOR(i, n) segk[i] = seg[idx[i]];
}

// out[i] = v[idx[i]].
extern "C" __global__ void ms_gather_keys(const u64* v, const u32* idx, u64 n, u64* out) {
    SF_FOR(i, n) out[i] = v[idx[i]];
}

// Keep flags of one side's elements (side 0: A, 1: B) under rule `op`
// (0 intersect all, 1 except all, 2 union all, 3 symmetric difference), and
// each element's cross index into the other side: lower_bound for A,
// upper_bound for B (where the output position counts the other side from).
// MS_INTERSECT_ALL, MS_EXCEPT_ALL, MS_UNION_ALL and MS_SYMMETRIC_DIFFERENCE (the `op` codes) come from the
// host: -D options from src/algo/multiset.rs.
extern "C" __global__ void ms_flags(const u64* x, const u32* xoff, const u32* xseg, u64 nx, const u64* y, const u32* yoff,
                                   const unsigned char* valid, int op, int side, u32* flag, u32* cross) {
    SF_FOR(i, nx) {
        u32 r = xseg[i];
        u32 keep = 0, cr = 0;
        if (valid[r]) {
            u64 v = x[i];
            u64 rank = i - ms_lower_bound(x, xoff[r], i, v);
            u64 ys = yoff[r], ye = yoff[r + 1];
            u64 lb = ms_lower_bound(y, ys, ye, v);
            u64 ub = ms_upper_bound(y, lb, ye, v);
            u64 other = ub - lb;
            if (side == 0) {
                keep = op == MS_INTERSECT_ALL ? rank < other : op == MS_UNION_ALL ? 1 : rank >= other;
                cr = (u32)lb;
            } else {
                keep = (op == MS_UNION_ALL || op == MS_SYMMETRIC_DIFFERENCE) ? rank >= other : 0;
                cr = (u32)ub;
            }
        }
        flag[i] = keep;
        cross[i] = cr;
    }
}

// cnt[r] = kept A elements of row r + kept B elements (eb may be null: none).
extern "C" __global__ void ms_row_counts(const u32* aoff, const u32* ea, const u32* boff, const u32* eb, u32 rows, u32* cnt) {
    SF_FOR(r, rows) {
        u32 c = ea[aoff[r + 1]] - ea[aoff[r]];
        if (eb) c += eb[boff[r + 1]] - eb[boff[r]];
        cnt[r] = c;
    }
}

// Write each kept element of side x at its output position (see the header).
extern "C" __global__ void ms_scatter(const u64* x, const u32* xoff, const u32* xseg, u64 nx, const u32* flag, const u32* ex,
                                     const u32* cross, const u32* ey, const u32* yoff, const u32* outoff, u64 flip, u64* out) {
    SF_FOR(i, nx) {
        if (flag[i]) {
            u32 r = xseg[i];
            u64 pos = (u64)outoff[r] + (ex[i] - ex[xoff[r]]);
            if (ey) pos += ey[cross[i]] - ey[yoff[r]];
            out[pos] = x[i] ^ flip;
        }
    }
}

// k-way intersection step (SvS): candidate i (sorted candidates, duplicates
// allowed) survives when its rank in its run of equal candidates is below the
// number of copies in `list` (the min(m, n) rule).
extern "C" __global__ void ms_kway_flags(const u64* cand, u64 nc, const u64* list, u64 nl, u32* flag) {
    SF_FOR(i, nc) {
        u64 v = cand[i];
        u64 rank = i - ms_lower_bound(cand, 0, i, v);
        u64 lb = ms_lower_bound(list, 0, nl, v);
        u64 ub = ms_upper_bound(list, lb, nl, v);
        flag[i] = rank < ub - lb;
    }
}

// out[excl[i]] = in[i] for flagged i.
extern "C" __global__ void ms_compact(const u64* in, u64 n, const u32* flag, const u32* excl, u64* out) {
    SF_FOR(i, n) if (flag[i]) out[excl[i]] = in[i];
}

// ---- exclusive scan of u32 over [0, n) into out[0, n], out[n] = total ----

// Block-wide exclusive scan of one value per thread; returns the block total in *total.
__device__ __forceinline__ u32 ms_block_exclusive(u32 v, u32* total) {
    __shared__ u32 warp_sums[MS_SCAN_THREADS / 32];
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 inc = v;
    for (u32 o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < MS_SCAN_THREADS / 32 ? warp_sums[lane] : 0;
        u32 winc = w;
        for (u32 o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(0xffffffffu, winc, o);
            if (lane >= o) winc += y;
        }
        if (lane < MS_SCAN_THREADS / 32) warp_sums[lane] = winc - w;
        if (lane == MS_SCAN_THREADS / 32 - 1) *total = winc;
    }
    __syncthreads();
    u32 r = warp_sums[warp] + inc - v;
    __syncthreads();
    return r;
}

// sums[t] = sum of tile t.
extern "C" __global__ void __launch_bounds__(MS_SCAN_THREADS) ms_scan_reduce(const u32* in, u64 n, u32* sums) {
    __shared__ u32 total;
    u64 base = (u64)blockIdx.x * MS_SCAN_TILE + (u64)threadIdx.x * MS_SCAN_ITEMS;
    u32 s = 0;
#pragma unroll
    for (int k = 0; k < MS_SCAN_ITEMS; ++k)
        if (base + k < n) s += in[base + k];
    ms_block_exclusive(s, &total);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

// One block: sums[0, ntiles) -> exclusive prefixes; sums[ntiles] = total.
extern "C" __global__ void __launch_bounds__(MS_SCAN_THREADS) ms_scan_sums(u32* sums, u32 ntiles) {
    __shared__ u32 total;
    u32 carry = 0;
    for (u32 b = 0; b < ntiles; b += MS_SCAN_THREADS) {
        u32 i = b + threadIdx.x;
        u32 v = i < ntiles ? sums[i] : 0;
        u32 e = ms_block_exclusive(v, &total);
        if (i < ntiles) sums[i] = carry + e;
        carry += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) sums[ntiles] = carry;
}

// out[i] = sums[tile] + exclusive prefix of in inside the tile; out[n] = total.
extern "C" __global__ void __launch_bounds__(MS_SCAN_THREADS) ms_scan_tiles(const u32* in, u64 n, const u32* sums, u32 ntiles, u32* out) {
    __shared__ u32 total;
    u64 base = (u64)blockIdx.x * MS_SCAN_TILE + (u64)threadIdx.x * MS_SCAN_ITEMS;
    u32 r[MS_SCAN_ITEMS];
    u32 s = 0;
#pragma unroll
    for (int k = 0; k < MS_SCAN_ITEMS; ++k) {
        r[k] = base + k < n ? in[base + k] : 0;
        s += r[k];
    }
    u32 e = ms_block_exclusive(s, &total) + sums[blockIdx.x];
#pragma unroll
    for (int k = 0; k < MS_SCAN_ITEMS; ++k) {
        if (base + k < n) out[base + k] = e;
        e += r[k];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) out[n] = sums[ntiles];
}
