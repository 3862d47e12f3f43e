// Set-similarity join (sf-gSSJoin / fgssjoin style), see src/algo/ssjoin/ (gpu.rs launches it).
//
// Inputs on the device (uploaded once per join):
//   r_off/r_tok   probe sets (CSR, token ids strictly increasing, sets by size)
//   s_off/s_tok   indexed sets (the same buffers for a self join)
//   idx_off/idx_sets  CSR inverted index: token -> positions of the indexed
//                 sets whose *index prefix* holds it, ascending (= by size)
//   pp/lo/hi      per probe size: probe prefix length, and the window of
//                 indexed positions [lo, hi) allowed by the length filter
// A self join only pairs probe x with indexed y < x.
//
// join_probes: one CUDA block (SF_BLOCK threads) per probe set x, fused
// count + compact + verify, so nothing but matching (x, y, overlap) triples
// leaves the kernel:
//   1. segments: for each probe-prefix token (one thread each, SF_CHUNK at a
//      time) binary-search its inverted list for the window [lo, hi); a block
//      scan of the segment lengths gives the probe's hits (index entries to
//      visit) and a flat numbering of them;
//   2. count: the flat entries are read by consecutive threads (coalesced
//      within each list) and inserted into an open-addressing table keyed by
//      y: count of prefix matches and the largest matching probe-prefix
//      position (shared-memory atomics; a table sized 1.5x the probe's
//      distinct-candidate bound, so it is never full);
//   3. compact the occupied slots into a list, then one thread per candidate:
//      since both sets share one token order, every match at probe position
//      <= last lies in the counted prefixes, so
//          overlap = count + |x[last+1..] ∩ y[j+1..]|   (j: y's position of x[last])
//      which is a positional filter (count + min(remaining) < needed drops
//      the pair) and halves the merge; the threshold is applied with the same
//      double expression as the host.
// A probe whose table does not fit the shared-memory table of this launch
// is appended to `big` (x, distinct bound) and run again by the host in a
// launch with tables in global memory (`tab` != null, one region of
// 4 * slots words per probe at `tab_off`).
#include "common.cuh"

// SF_BLOCK (threads per block) comes from the host: a -D option from src/algo/ssjoin/gpu.rs.
#define SF_CHUNK 128  // probe-prefix tokens per segment pass (== SF_BLOCK: one per thread)
#define SF_EMPTY 0xffffffffu

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

// Smallest overlap in [1, min(a, b)] that passes, or min(a, b) + 1 if none:
// a closed-form estimate corrected by the exact predicate (monotone in the
// overlap), as Threshold::min_overlap on the host.
__device__ __forceinline__ u32 sf_min_overlap(int metric, double t, int strict, u32 a, u32 b) {
    u32 m = a < b ? a : b;
    if (m == 0 || !sf_pass(metric, t, strict, m, a, b)) return m + 1;
    double af = (double)a, bf = (double)b, est;
    if (metric == 0) est = t * (af + bf) / (1.0 + t);
    else if (metric == 1) est = t * (af + bf) / 2.0;
    else if (metric == 2) est = t * sqrt(af * bf);
    else est = t;
    u32 o = m;
    if (isfinite(est)) {
        double c = ceil(est);
        o = c < 1.0 ? 1u : (c > (double)m ? m : (u32)c);
    }
    while (o > 1 && sf_pass(metric, t, strict, o - 1, a, b)) o--;
    while (!sf_pass(metric, t, strict, o, a, b)) o++;  // ends at m at the latest
    return o;
}

// First index in [lo, hi) with a[idx] >= key.
__device__ __forceinline__ u32 sf_lower_bound(const u32* a, u32 lo, u32 hi, u32 key) {
    while (lo < hi) {
        u32 mid = lo + (hi - lo) / 2;
        if (a[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Output slot for the lanes with `flag` from a 64-bit counter (all 32 lanes
// of the warp must call).
__device__ __forceinline__ u64 sf_warp_slot64(u64* counter, bool flag) {
    unsigned mask = __ballot_sync(0xffffffffu, flag);
    if (mask == 0) return ~0ULL;
    int lane = threadIdx.x & 31;
    u64 base = 0;
    if (lane == __ffs(mask) - 1) base = atomicAdd(counter, (u64)__popc(mask));
    base = __shfl_sync(0xffffffffu, base, __ffs(mask) - 1);
    if (!flag) return ~0ULL;
    return base + (u64)__popc(mask & ((1u << lane) - 1u));
}

// Table slots for a probe with at most `m` distinct candidates: a power of
// two >= 1.5 m + 1 (load <= 2/3, never full), at least 32. Same formula as
// `table_slots` on the host.
__device__ __forceinline__ u32 sf_table_slots(u32 m) {
    u64 want = (u64)m + (u64)(m >> 1) + 1;
    u64 s = 32;
    while (s < want) s <<= 1;
    return s > 0x80000000ULL ? 0x80000000u : (u32)s;
}

// Insert (or find) key y; returns its slot. The table has a free slot.
__device__ __forceinline__ u32 sf_insert(u32* keys, u32 mask, u32 h, u32 y) {
    while (true) {
        u32 k = ((volatile u32*)keys)[h];
        if (k == y) return h;
        if (k == SF_EMPTY) {
            u32 prev = atomicCAS(&keys[h], SF_EMPTY, y);
            if (prev == SF_EMPTY || prev == y) return h;
        }
        h = (h + 1) & mask;
    }
}

// Inclusive block scan of v over SF_BLOCK threads; `wsum` holds SF_BLOCK/32
// words of shared scratch. Ends with a barrier.
__device__ __forceinline__ u32 sf_block_scan(u32 v, u32* wsum) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = sf_warp_inclusive_scan<u32>(v);
    if (lane == 31) wsum[warp] = v;
    __syncthreads();
    for (int w = 0; w < warp; w++) v += wsum[w];
    __syncthreads();
    return v;
}

// Segment table of one chunk of probe-prefix tokens r_tok[from .. from + cn - 1]
// (cn <= SF_CHUNK, one token per thread): seg_start[k] = first entry of token
// k's inverted list inside the window [lo, hi), seg_cum[0..cn] = exclusive
// prefix sums of the segment lengths (seg_cum[cn]: the chunk's hits). Returns
// this thread's inclusive sum. All SF_BLOCK threads must call; it ends after
// the scan's last barrier but before seg_start/seg_cum are visible to the
// block (the caller's next __syncthreads publishes them). Step 1 builds the
// first chunk's table (kept when it is the only chunk), step 2 each later one.
__device__ __forceinline__ u32 sf_segments(
    const u32* __restrict__ r_tok, u32 from, u32 cn,
    const u32* __restrict__ idx_off, const u32* __restrict__ idx_sets, u32 lo, u32 hi,
    u32* seg_start, u32* seg_cum, u32* wsum)
{
    const u32 tid = threadIdx.x;
    u32 len = 0;
    if (tid < cn) {
        u32 w = r_tok[from + tid];
        u32 s = idx_off[w], e = idx_off[w + 1];
        u32 l = sf_lower_bound(idx_sets, s, e, lo);
        u32 u = sf_lower_bound(idx_sets, l, e, hi);
        seg_start[tid] = l;
        len = u - l;
    }
    u32 incl = sf_block_scan(len, wsum);
    if (tid < cn) seg_cum[tid + 1] = incl;
    if (tid == 0) seg_cum[0] = 0;
    return incl;
}

// counters: [0] result triples, [1] deferred (big) probes, [2] candidates
// (distinct pairs counted), [3] index entries visited.
// list == null: probes are first .. first + n - 1; else list[first + i].
// tab == null: shared-memory tables of sh_slots slots (dynamic shared memory
// of 16 * sh_slots bytes); probes needing more go to `big`.
// tab != null: global tables, region of probe i at tab + tab_off[first + i].
extern "C" __global__ void join_probes(
    const u32* __restrict__ r_off, const u32* __restrict__ r_tok,
    const u32* __restrict__ s_off, const u32* __restrict__ s_tok,
    const u32* __restrict__ pp, const u32* __restrict__ lo_tab, const u32* __restrict__ hi_tab,
    const u32* __restrict__ idx_off, const u32* __restrict__ idx_sets,
    int self_join, int metric, double t, int strict,
    const u32* __restrict__ list, u32 first, u32 n,
    u32* tab, const u64* __restrict__ tab_off, u32 sh_slots,
    u32* __restrict__ big, u64* counters,
    u32* __restrict__ out, u64 out_cap)
{
    extern __shared__ u32 sh_tab[];
    __shared__ u32 seg_start[SF_CHUNK];
    __shared__ u32 seg_cum[SF_CHUNK + 1];
    __shared__ u32 wsum[SF_BLOCK / 32];
    __shared__ u32 s_total;
    __shared__ u32 s_nc;

    const u32 tid = threadIdx.x;
    for (u32 i = blockIdx.x; i < n; i += gridDim.x) {
        __syncthreads();  // the previous probe is done with the shared arrays
        u32 x = list ? list[first + i] : first + i;
        u32 beg = r_off[x];
        u32 a = r_off[x + 1] - beg;
        u32 p = pp[a];
        u32 lo = lo_tab[a], hi = hi_tab[a];
        if (self_join && hi > x) hi = x;
        if (lo >= hi || p == 0) continue;  // uniform over the block

        // 1. Hits: segments of the first chunk (kept when it is the only one).
        if (tid == 0) s_total = 0;
        {
            u32 cn = p < SF_CHUNK ? p : SF_CHUNK;
            u32 incl = sf_segments(r_tok, beg, cn, idx_off, idx_sets, lo, hi, seg_start, seg_cum, wsum);
            if (p > SF_CHUNK) {
                // More chunks: only their totals now; segments are rebuilt per chunk below.
                u32 more = 0;
                for (u32 k = SF_CHUNK + tid; k < p; k += SF_BLOCK) {
                    u32 w = r_tok[beg + k];
                    u32 s = idx_off[w], e = idx_off[w + 1];
                    u32 l = sf_lower_bound(idx_sets, s, e, lo);
                    more += sf_lower_bound(idx_sets, l, e, hi) - l;
                }
                if (more) atomicAdd(&s_total, more);
            }
            __syncthreads();
            if (tid == cn - 1) atomicAdd(&s_total, incl);
            __syncthreads();
        }
        u32 total = s_total;
        if (total == 0) continue;
        u32 width = hi - lo;
        u32 m = total < width ? total : width;  // distinct candidates <= both
        u32 slots = sf_table_slots(m);
        u32* keys;
        if (tab == nullptr) {
            if (slots > sh_slots) {
                if (tid == 0) {
                    u64 k = atomicAdd(&counters[1], 1ULL);
                    big[2 * k] = x;  // k < n: each probe is deferred at most once per launch
                    big[2 * k + 1] = m;
                }
                continue;
            }
            keys = sh_tab;
        } else {
            keys = tab + tab_off[first + i];
        }
        u32* cnt = keys + slots;
        u32* last = cnt + slots;
        u32* cand = last + slots;
        const u32 mask = slots - 1;
        const int shift = 32 - (__ffs(slots) - 1);
        const bool direct = width <= slots;  // y - lo is a perfect hash
        for (u32 k = tid; k < slots; k += SF_BLOCK) {
            keys[k] = SF_EMPTY;
            cnt[k] = 0;
            last[k] = 0;
        }
        if (tid == 0) s_nc = 0;
        __syncthreads();

        // 2. Count prefix matches per candidate.
        for (u32 c0 = 0; c0 < p; c0 += SF_CHUNK) {
            u32 cn = p - c0 < SF_CHUNK ? p - c0 : SF_CHUNK;
            if (c0 > 0) {
                sf_segments(r_tok, beg + c0, cn, idx_off, idx_sets, lo, hi, seg_start, seg_cum, wsum);
                __syncthreads();
            }
            u32 ctotal = seg_cum[cn];
            for (u32 k = tid; k < ctotal; k += SF_BLOCK) {
                u32 li = 0, hi_i = cn;  // seg_cum[li] <= k < seg_cum[hi_i]
                while (hi_i - li > 1) {
                    u32 mid = (li + hi_i) >> 1;
                    if (seg_cum[mid] <= k) li = mid; else hi_i = mid;
                }
                u32 y = idx_sets[seg_start[li] + (k - seg_cum[li])];
                u32 h = direct ? (y - lo) : ((y * 2654435761u) >> shift) & mask;
                u32 slot = sf_insert(keys, mask, h, y);
                atomicAdd(&cnt[slot], 1u);
                atomicMax(&last[slot], c0 + li);
            }
            __syncthreads();  // segments are rebuilt by the next chunk; counts complete
        }

        // 3. Compact the occupied slots.
        for (u32 k = tid; k < slots; k += SF_BLOCK) {
            if (keys[k] != SF_EMPTY) cand[atomicAdd(&s_nc, 1u)] = k;
        }
        __syncthreads();
        u32 nc = s_nc;
        if (tid == 0) {
            atomicAdd(&counters[2], (u64)nc);
            atomicAdd(&counters[3], (u64)total);
        }

        // 4. Verify, one candidate per thread (warp-uniform loop for the output slot).
        const u32* xs = r_tok + beg;
        for (u32 q0 = 0; q0 < nc; q0 += SF_BLOCK) {
            u32 q = q0 + tid;
            bool ok = false;
            u32 y = 0, o = 0;
            if (q < nc) {
                u32 k = cand[q];
                y = keys[k];
                o = cnt[k];
                u32 il = last[k];
                u32 yb = s_off[y], b = s_off[y + 1] - yb;
                u32 need = sf_min_overlap(metric, t, strict, a, b);
                const u32* ys = s_tok + yb;
                // x[il] is in y (it was counted), at position jl.
                u32 jl = sf_lower_bound(ys, 0, b, xs[il]);
                u32 ii = il + 1, jj = jl + 1;
                if (need <= (a < b ? a : b) && jl < b) {
                    bool dead = false;
                    while (true) {
                        u32 ra = a - ii, rb = b - jj;
                        if (o + (ra < rb ? ra : rb) < need) { dead = true; break; }
                        if (ra == 0 || rb == 0) break;
                        u32 u = xs[ii], v = ys[jj];
                        if (u < v) ii++;
                        else if (u > v) jj++;
                        else { o++; ii++; jj++; }
                    }
                    ok = !dead && o >= need && sf_pass(metric, t, strict, o, a, b);
                }
            }
            u64 slot = sf_warp_slot64(&counters[0], ok);
            if (ok && slot < out_cap) {
                out[3 * slot] = x;
                out[3 * slot + 1] = y;
                out[3 * slot + 2] = o;
            }
        }
    }
}
