// Set-similarity join (sf-gSSJoin / fgssjoin style), see src/algo/ssjoin.rs.
//
// Inputs on the device:
//   r_off/r_tok   probe sets (CSR, token ids strictly increasing, sets by size)
//   s_off/s_tok   indexed sets (the same buffers for a self join)
//   idx_off/idx_sets  CSR inverted index: token -> positions of the indexed
//                 sets whose *index prefix* holds it, ascending (= by size)
//   pp/lo/hi      per probe size: probe prefix length, and the window of
//                 indexed positions [lo, hi) allowed by the length filter
// A self join only pairs probe x with indexed y < x.
//
// probe_hits:   per probe, the number of index entries its prefix visits
//               inside its window (an exact bound on its candidates).
// count_block:  one CUDA block per probe of the current probe block; the
//               concatenated inverted-list segments of its prefix tokens are
//               split evenly over the threads, each entry incrementing
//               counts[row][y - wlo] with an atomic; a first touch appends
//               (row, y) to the candidate list (warp-aggregated).
// verify_block: per candidate, reset its counter (so the matrix stays zero
//               for the next block), merge both sets with early termination,
//               apply the threshold (same double expression as the host) and
//               append (x, y, overlap) for passing pairs.
#include "common.cuh"

#define MAXP 256

// Metric value from exact integers: one IEEE division (and one sqrt for
// cosine), bit-identical to Metric::value on the host.
__device__ __forceinline__ double sf_sim(int metric, u32 o, u32 a, u32 b) {
    if (metric == 0) {
        u64 den = (u64)a + (u64)b - (u64)o;
        return den == 0 ? 0.0 : __ddiv_rn((double)o, (double)den);
    } else if (metric == 1) {
        u64 den = (u64)a + (u64)b;
        return den == 0 ? 0.0 : __ddiv_rn((double)(2ULL * o), (double)den);
    } else if (metric == 2) {
        u64 p = (u64)a * (u64)b;
        return p == 0 ? 0.0 : __ddiv_rn((double)o, __dsqrt_rn((double)p));
    }
    return (double)o;
}

__device__ __forceinline__ bool sf_pass(int metric, double t, int strict, u32 o, u32 a, u32 b) {
    double v = sf_sim(metric, o, a, b);
    return strict ? (v > t) : (v >= t);
}

// Smallest overlap in [1, min(a, b)] that passes, or min(a, b) + 1 if none
// (the predicate is monotone in the overlap).
__device__ __forceinline__ u32 sf_min_overlap(int metric, double t, int strict, u32 a, u32 b) {
    u32 m = a < b ? a : b;
    if (m == 0 || !sf_pass(metric, t, strict, m, a, b)) return m + 1;
    u32 lo = 1, hi = m;  // answer in [lo, hi]
    while (lo < hi) {
        u32 mid = lo + (hi - lo) / 2;
        if (sf_pass(metric, t, strict, mid, a, b)) hi = mid; else lo = mid + 1;
    }
    return lo;
}

// First index in [lo, hi) with a[idx] >= key.
__device__ __forceinline__ u32 sf_lower_bound(const u32* a, u32 lo, u32 hi, u32 key) {
    while (lo < hi) {
        u32 mid = lo + (hi - lo) / 2;
        if (a[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Append `value` for the lanes with `flag` (all 32 lanes must call).
__device__ __forceinline__ int sf_warp_slot(u32* counter, bool flag) {
    unsigned mask = __ballot_sync(0xffffffffu, flag);
    if (mask == 0) return -1;
    int lane = threadIdx.x & 31;
    u32 base = 0;
    if (lane == 0) base = atomicAdd(counter, (u32)__popc(mask));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (!flag) return -1;
    return (int)(base + __popc(mask & ((1u << lane) - 1u)));
}

extern "C" __global__ void probe_hits(
    const u32* __restrict__ r_off, const u32* __restrict__ r_tok, u64 n_r,
    const u32* __restrict__ pp, const u32* __restrict__ lo_tab, const u32* __restrict__ hi_tab,
    const u32* __restrict__ idx_off, const u32* __restrict__ idx_sets,
    int self_join, u32* __restrict__ hits)
{
    SF_FOR(x, n_r) {
        u32 beg = r_off[x];
        u32 a = r_off[x + 1] - beg;
        u32 p = pp[a];
        u32 lo = lo_tab[a], hi = hi_tab[a];
        if (self_join && hi > (u32)x) hi = (u32)x;
        u64 h = 0;
        if (lo < hi) {
            for (u32 i = 0; i < p; i++) {
                u32 w = r_tok[beg + i];
                u32 s = idx_off[w], e = idx_off[w + 1];
                u32 l = sf_lower_bound(idx_sets, s, e, lo);
                u32 u = sf_lower_bound(idx_sets, l, e, hi);
                h += u - l;
            }
        }
        hits[x] = h > 0xffffffffULL ? 0xffffffffu : (u32)h;
    }
}

// blockDim.x must be a multiple of 32.
extern "C" __global__ void count_block(
    const u32* __restrict__ r_off, const u32* __restrict__ r_tok, u32 p0, u32 nprobe,
    const u32* __restrict__ pp, const u32* __restrict__ lo_tab, const u32* __restrict__ hi_tab,
    const u32* __restrict__ idx_off, const u32* __restrict__ idx_sets, int self_join,
    u32 wlo, u64 width, u32* __restrict__ counts,
    u64* __restrict__ cand, u32* __restrict__ cand_count, u64 cand_cap)
{
    __shared__ u32 seg_start[MAXP];
    __shared__ u32 seg_cum[MAXP + 1];
    for (u32 row = blockIdx.x; row < nprobe; row += gridDim.x) {
        u32 x = p0 + row;
        u32 beg = r_off[x];
        u32 a = r_off[x + 1] - beg;
        u32 p = pp[a];
        u32 lo = lo_tab[a], hi = hi_tab[a];
        if (self_join && hi > x) hi = x;
        if (lo >= hi) continue;  // uniform over the block
        for (u32 c0 = 0; c0 < p; c0 += MAXP) {
            u32 cn = p - c0 < MAXP ? p - c0 : MAXP;
            for (u32 i = threadIdx.x; i < cn; i += blockDim.x) {
                u32 w = r_tok[beg + c0 + i];
                u32 s = idx_off[w], e = idx_off[w + 1];
                u32 l = sf_lower_bound(idx_sets, s, e, lo);
                u32 u = sf_lower_bound(idx_sets, l, e, hi);
                seg_start[i] = l;
                seg_cum[i + 1] = u - l;
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                seg_cum[0] = 0;
                for (u32 i = 1; i <= cn; i++) seg_cum[i] += seg_cum[i - 1];
            }
            __syncthreads();
            u32 total = seg_cum[cn];
            for (u32 k0 = 0; k0 < total; k0 += blockDim.x) {
                u32 k = k0 + threadIdx.x;
                bool first = false;
                u64 key = 0;
                if (k < total) {
                    u32 li = 0, hi_i = cn;
                    while (hi_i - li > 1) {
                        u32 mid = (li + hi_i) >> 1;
                        if (seg_cum[mid] <= k) li = mid; else hi_i = mid;
                    }
                    u32 y = idx_sets[seg_start[li] + (k - seg_cum[li])];
                    u32 old = atomicAdd(&counts[(u64)row * width + (u64)(y - wlo)], 1u);
                    first = (old == 0);
                    key = ((u64)row << 32) | (u64)y;
                }
                int slot = sf_warp_slot(cand_count, first);
                if (slot >= 0 && (u64)slot < cand_cap) cand[slot] = key;
            }
            __syncthreads();  // shared arrays are rewritten next
        }
    }
}

extern "C" __global__ void verify_block(
    const u64* __restrict__ cand, u32 ncand, u32 p0, u32 wlo, u64 width, u32* __restrict__ counts,
    const u32* __restrict__ r_off, const u32* __restrict__ r_tok,
    const u32* __restrict__ s_off, const u32* __restrict__ s_tok,
    int metric, double t, int strict,
    u32* __restrict__ out, u32* __restrict__ out_count, u64 out_cap)
{
    SF_FOR_WARPS(i, ncand) {
        bool ok = false;
        u32 x = 0, y = 0, o = 0;
        if (i < ncand) {
            u64 key = cand[i];
            u32 row = (u32)(key >> 32);
            y = (u32)key;
            x = p0 + row;
            counts[(u64)row * width + (u64)(y - wlo)] = 0;
            u32 xb = r_off[x], a = r_off[x + 1] - xb;
            u32 yb = s_off[y], b = s_off[y + 1] - yb;
            u32 need = sf_min_overlap(metric, t, strict, a, b);
            if (need <= (a < b ? a : b)) {
                const u32* xs = r_tok + xb;
                const u32* ys = s_tok + yb;
                u32 ii = 0, jj = 0;
                bool dead = false;
                while (ii < a && jj < b) {
                    u32 ra = a - ii, rb = b - jj;
                    if (o + (ra < rb ? ra : rb) < need) { dead = true; break; }
                    u32 u = xs[ii], v = ys[jj];
                    if (u < v) ii++;
                    else if (u > v) jj++;
                    else { o++; ii++; jj++; }
                }
                ok = !dead && o >= need && sf_pass(metric, t, strict, o, a, b);
            }
        }
        int slot = sf_warp_slot(out_count, ok);
        if (slot >= 0 && (u64)slot < out_cap) {
            out[3 * (u64)slot] = x;
            out[3 * (u64)slot + 1] = y;
            out[3 * (u64)slot + 2] = o;
        }
    }
}
