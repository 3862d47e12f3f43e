// Onesweep LSD radix sort (Adinets & Merrill, "Onesweep: a faster least
// significant digit radix sort for GPUs", 2022): stable, 8-bit digits, u32 or
// u64 keys, keys only or with u32 values, over the key bits [begin_bit, end_bit).
//
// Launch sequence (src/algo/radix_sort.rs):
//   0. zero `hist` (passes * RS_RADIX digit counts + passes tile counters) and
//      `status` (ntiles * RS_RADIX look-back words), once per sort;
//   1. rs_histogram_*: ONE read of the keys counts the digits of every pass;
//   2. rs_scan_digits: per pass, the exclusive scan of those counts = where
//      each digit's run starts in the pass's output;
//   3. per pass, rs_onesweep_*: one block per tile of RsCfg<K>::TILE keys.
//      The block takes the next tile index from a counter (so tiles start in
//      order and the look-back below cannot wait on a tile that never runs),
//      ranks its keys in shared memory (warp-level multisplit with ballots:
//      each warp ranks its own contiguous slice of the tile, then the warps'
//      digit counts are scanned), publishes its per-digit counts with
//      decoupled look-back (status word = flag << 32 | count, flag
//      "aggregate available" or "inclusive prefix available"), looks back to
//      the first preceding tile with a prefix, then scatters: the keys are
//      first placed in shared memory in their tile-sorted order, so that
//      consecutive threads write consecutive addresses of each digit's run.
// Each pass therefore reads the keys once and writes them once (values too),
// instead of the histogram + scan + scatter passes of a classic LSD sort.
//
// Flags carry the pass number (aggregate = 2 * pass + 1, prefix = 2 * pass + 2),
// so one status array zeroed once serves every pass: words left by earlier
// passes have smaller flags and read as "not ready".
//
// Sizes: n < 2^32 (positions and counts are u32). The sort is stable: the
// tile order, the warp order inside a tile and the lane order inside a warp
// are all the input order, and each digit's run is filled in that order.
//
// Segmented sorts (many small segments, the families' per-set sorts) reuse the
// same kernels: rs_seg_compose_u32 builds u64 keys (segment << key_bits | key),
// the u64 sort runs over bits [0, key_bits + segment bits), and rs_seg_split_u32
// takes the low words back. Segments stay in order and are sorted inside.
#include "common.cuh"

// Tuning constants. The Rust twins are in src/algo/radix_sort.rs (same names);
// #ifndef only so that the nvcc harness can try other values with -D.
// RS_BITS, RS_RADIX, RS_WARPS, RS_ITEMS_U32, RS_ITEMS_U64, RS_MIN_BLOCKS and RS_HIST_THREADS come from the host:
// -D options from src/algo/radix_sort.rs (the nvcc harness passes its own).
#define RS_THREADS (RS_WARPS * 32)
#ifndef RS_MATCH_ANY
#define RS_MATCH_ANY 0     // 1: peers by __match_any_sync instead of one ballot per digit bit
#endif
#define RS_FULL 0xffffffffu

static_assert(RS_THREADS == RS_WARPS * 32, "RS_THREADS is RS_WARPS warps");
static_assert(RS_RADIX == (1 << RS_BITS), "RS_RADIX is 2^RS_BITS");
static_assert(RS_RADIX % 32 == 0 && RS_THREADS >= RS_RADIX, "one thread per digit in the digit phases, whole warps");

template <typename K> struct RsCfg {
    static constexpr u32 ITEMS = sizeof(K) == 4 ? RS_ITEMS_U32 : RS_ITEMS_U64;
    static constexpr u32 TILE = RS_THREADS * ITEMS;
    static constexpr u32 WARP_KEYS = 32 * ITEMS;
};

template <typename K> __device__ __forceinline__ u32 rs_digit(K k, u32 shift, u32 mask) {
    return (u32)(k >> shift) & mask;
}

// Warp-inclusive scan of one u32 per lane (all 32 lanes take part).
__device__ __forceinline__ u32 rs_warp_inclusive(u32 v, u32) { return sf_warp_inclusive_scan<u32>(v); }

// ---------------------------------------------------------------- 1. histogram of every pass
// hist[p * RS_RADIX + d] += number of keys whose digit p is d (hist pre-zeroed).
// One shared histogram per pass; each block adds its counts once at the end.
template <typename K>
__device__ __forceinline__ void rs_histogram_count(u32* sh, K k, u32 begin_bit, u32 end_bit, u32 passes) {
#pragma unroll
    for (u32 p = 0; p < sizeof(K); ++p) {
        if (p < passes) {
            const u32 s = begin_bit + p * RS_BITS;
            const u32 nb = end_bit - s < RS_BITS ? end_bit - s : RS_BITS;
            atomicAdd(&sh[p * RS_RADIX + rs_digit(k, s, (1u << nb) - 1u)], 1u);
        }
    }
}

template <typename K>
__device__ __forceinline__ void rs_histogram(const K* __restrict__ keys, u64 n, u32 begin_bit, u32 end_bit, u32* hist) {
    constexpr u32 P = sizeof(K); // at most one pass per byte
    constexpr u32 V = 16 / sizeof(K); // keys per 16-byte load
    __shared__ u32 sh[P * RS_RADIX];
    for (u32 j = threadIdx.x; j < P * RS_RADIX; j += blockDim.x) sh[j] = 0;
    __syncthreads();
    const u32 passes = (end_bit - begin_bit + RS_BITS - 1) / RS_BITS;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // 16-byte loads, two in flight per thread (a pure streaming read: one
    // 4-byte load per thread left the memory system mostly idle); the keys
    // past the last whole pair of vectors, and unaligned inputs, go one by one.
    u64 done = 0;
    if (((u64)keys & 15) == 0) {
        const uint4* vk = (const uint4*)keys;
        const u64 nvec = n / V;
        const u64 pairs = nvec / 2;
        for (u64 c = tid; c < pairs; c += stride) {
            uint4 q[2];
            q[0] = vk[c];
            q[1] = vk[c + pairs];
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {
                if constexpr (sizeof(K) == 4) {
                    rs_histogram_count<K>(sh, q[h].x, begin_bit, end_bit, passes);
                    rs_histogram_count<K>(sh, q[h].y, begin_bit, end_bit, passes);
                    rs_histogram_count<K>(sh, q[h].z, begin_bit, end_bit, passes);
                    rs_histogram_count<K>(sh, q[h].w, begin_bit, end_bit, passes);
                } else {
                    rs_histogram_count<K>(sh, (K)q[h].x | ((K)q[h].y << 32), begin_bit, end_bit, passes);
                    rs_histogram_count<K>(sh, (K)q[h].z | ((K)q[h].w << 32), begin_bit, end_bit, passes);
                }
            }
        }
        done = pairs * 2 * V;
    }
    for (u64 i = done + tid; i < n; i += stride) rs_histogram_count<K>(sh, keys[i], begin_bit, end_bit, passes);
    __syncthreads();
    for (u32 j = threadIdx.x; j < passes * RS_RADIX; j += blockDim.x) {
        const u32 c = sh[j];
        if (c) atomicAdd(&hist[j], c);
    }
}

// Digit counts of every pass over u32 keys (grid-stride; RS_HIST_THREADS per block).
extern "C" __global__ void __launch_bounds__(RS_HIST_THREADS) rs_histogram_u32(const u32* keys, u64 n, u32 begin_bit, u32 end_bit, u32* hist) {
    rs_histogram<u32>(keys, n, begin_bit, end_bit, hist);
}

// Digit counts of every pass over u64 keys (grid-stride; RS_HIST_THREADS per block).
extern "C" __global__ void __launch_bounds__(RS_HIST_THREADS) rs_histogram_u64(const u64* keys, u64 n, u32 begin_bit, u32 end_bit, u32* hist) {
    rs_histogram<u64>(keys, n, begin_bit, end_bit, hist);
}

// ---------------------------------------------------------------- 2. digit starts
// One block of RS_RADIX threads per pass: hist[p] becomes its exclusive scan,
// the output position where each digit's run starts in pass p.
extern "C" __global__ void __launch_bounds__(RS_RADIX) rs_scan_digits(u32* hist) {
    __shared__ u32 warp_sum[RS_RADIX / 32];
    u32* h = hist + (u64)blockIdx.x * RS_RADIX;
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const u32 v = h[t];
    const u32 inc = rs_warp_inclusive(v, lane);
    if (lane == 31) warp_sum[warp] = inc;
    __syncthreads();
    u32 before = 0;
    for (u32 w = 0; w < warp; ++w) before += warp_sum[w];
    h[t] = before + inc - v;
}

// ---------------------------------------------------------------- 3. one digit pass
template <typename K, bool PAIRS> struct RsSmem {
    union {
        K keys[RsCfg<K>::TILE];          // keys in tile-sorted order (scatter)
        u32 vals[RsCfg<K>::TILE];        // values in tile-sorted order (scatter)
        u32 hist[RS_WARPS][RS_RADIX];    // per-warp digit counts, then warp-exclusive starts (ranking)
    } u;
    unsigned char digit[PAIRS ? RsCfg<K>::TILE : 1]; // digit of each tile-sorted slot, for the value scatter
    u32 local_start[RS_RADIX];  // where digit d starts in the tile-sorted order
    u32 delta[RS_RADIX];        // global start of the tile's digit-d run minus local_start (mod 2^32)
    u32 warp_sum[RS_RADIX / 32];
    u32 tile;
};

// One tile of one pass. kin/vin: this pass's input; kout/vout: its output.
// starts: the pass's digit starts (rs_scan_digits); counter: the pass's tile
// counter; status: ntiles * RS_RADIX look-back words (zeroed before pass 0).
template <typename K, bool PAIRS>
__device__ __forceinline__ void rs_onesweep(const K* __restrict__ kin, K* __restrict__ kout, const u32* __restrict__ vin,
                                            u32* __restrict__ vout, u64 n, u32 shift, u32 nbits, u32 pass,
                                            const u32* __restrict__ starts, u32* counter, u64* status) {
    typedef RsCfg<K> C;
    __shared__ RsSmem<K, PAIRS> sm;
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const u32 mask = (1u << nbits) - 1u; // nbits in [1, RS_BITS]
    const u32 flag_agg = 2 * pass + 1, flag_prefix = 2 * pass + 2;

    u32* flat = &sm.u.hist[0][0];
    for (u32 j = t; j < RS_WARPS * RS_RADIX; j += RS_THREADS) flat[j] = 0;
    // Tiles in the order blocks start, not blockIdx: a tile only ever waits on
    // tiles that were taken earlier, by blocks already running.
    if (t == 0) sm.tile = atomicAdd(counter, 1u);
    __syncthreads();
    const u32 tile = sm.tile;
    const u64 tile_base = (u64)tile * C::TILE;
    const u64 left = n - tile_base;
    const u32 m = left < C::TILE ? (u32)left : C::TILE; // valid keys in this tile

    // Load: warp w owns the contiguous slice [w * WARP_KEYS, (w + 1) * WARP_KEYS)
    // of the tile, item i of lane l at i * 32 + l (coalesced). Missing keys are
    // all ones: they fall in the highest digit and, being last in tile order,
    // rank after every real key, in slots [m, TILE) that are never written out.
    const u32 first = warp * C::WARP_KEYS + lane;
    K k[C::ITEMS];
#pragma unroll
    for (u32 i = 0; i < C::ITEMS; ++i) {
        const u32 j = first + i * 32;
        k[i] = j < m ? kin[tile_base + j] : (K)~(K)0;
    }

    // Warp-level multisplit: for each item, the lanes holding the same digit
    // (found with one ballot per digit bit) are ranked by lane order; the
    // lowest of them bumps the warp's count for that digit and shares the old
    // count. r[i] = rank of item i among its warp's keys of the same digit.
    u32 r[C::ITEMS];
    u32* wh = sm.u.hist[warp];
    const u32 lanes_below = (1u << lane) - 1u;
#pragma unroll
    for (u32 i = 0; i < C::ITEMS; ++i) {
        const u32 d = rs_digit(k[i], shift, mask);
#if RS_MATCH_ANY
        const u32 peers = __match_any_sync(RS_FULL, d);
#else
        u32 peers = RS_FULL;
        // All RS_BITS bits: those above nbits are 0 in every lane and keep peers as it is.
#pragma unroll
        for (u32 b = 0; b < RS_BITS; ++b) {
            const bool bit = (d >> b) & 1u;
            const u32 v = __ballot_sync(RS_FULL, bit);
            peers &= bit ? v : ~v;
        }
#endif
        const u32 below = __popc(peers & lanes_below);
        u32 pre = 0;
        if (below == 0) { // the group's lowest lane, the only one touching wh[d]
            pre = wh[d];
            wh[d] = pre + __popc(peers);
        }
        pre = __shfl_sync(RS_FULL, pre, __ffs(peers) - 1);
        r[i] = pre + below;
        __syncwarp(); // next item's leader for d may be another lane: order its read after this write
    }
    __syncthreads();

    // Thread d < RS_RADIX: the tile's count of digit d (warp counts turned into
    // warp-exclusive starts on the way), published at once as an aggregate
    // (tile 0 publishes its inclusive prefix directly), then scanned over d.
    u32 total = 0, scan_excl = 0;
    if (t < RS_RADIX) {
        u32 run = 0;
#pragma unroll
        for (u32 w = 0; w < RS_WARPS; ++w) {
            const u32 c = sm.u.hist[w][t];
            sm.u.hist[w][t] = run;
            run += c;
        }
        total = run;
        volatile u64* st = (volatile u64*)status + (u64)tile * RS_RADIX + t;
        if (tile == 0) *st = ((u64)flag_prefix << 32) | (u32)(starts[t] + total);
        else *st = ((u64)flag_agg << 32) | total;
        const u32 inc = rs_warp_inclusive(total, lane);
        if (lane == 31) sm.warp_sum[warp] = inc;
        scan_excl = inc - total;
    }
    __syncthreads();
    u32 local = 0;
    if (t < RS_RADIX) {
        for (u32 w = 0; w < warp; ++w) scan_excl += sm.warp_sum[w];
        local = scan_excl;
        sm.local_start[t] = local;
    }
    __syncthreads();

    // Decoupled look-back (threads d < RS_RADIX) while the other warps finish
    // their ranks: sum the preceding tiles' aggregates back to the first
    // inclusive prefix, then publish this tile's own prefix.
    if (t < RS_RADIX) {
        u32 excl;
        if (tile == 0) {
            excl = starts[t];
        } else {
            excl = 0;
            const volatile u64* st = (const volatile u64*)status;
            u64 j = tile - 1;
            while (true) {
                const u64 w = st[j * RS_RADIX + t];
                const u32 f = (u32)(w >> 32);
                if (f < flag_agg) continue; // not published yet in this pass: spin
                excl += (u32)w;
                if (f == flag_prefix) break;
                --j; // tile 0 always holds a prefix, so j stays >= 0
            }
            ((volatile u64*)status)[(u64)tile * RS_RADIX + t] = ((u64)flag_prefix << 32) | (u32)(excl + total);
        }
        sm.delta[t] = excl - local;
    }
#pragma unroll
    for (u32 i = 0; i < C::ITEMS; ++i) {
        const u32 d = rs_digit(k[i], shift, mask);
        r[i] += sm.local_start[d] + sm.u.hist[warp][d]; // tile-sorted slot of item i
    }
    __syncthreads(); // histograms read, deltas written: the union becomes the key staging

#pragma unroll
    for (u32 i = 0; i < C::ITEMS; ++i) sm.u.keys[r[i]] = k[i];
    __syncthreads();
    // Slot s goes to global position delta[digit] + s: consecutive threads
    // write consecutive addresses within each digit's run.
#pragma unroll
    for (u32 i = 0; i < C::ITEMS; ++i) {
        const u32 s = t + i * RS_THREADS;
        if (s < m) {
            const K key = sm.u.keys[s];
            const u32 d = rs_digit(key, shift, mask);
            kout[(u32)(sm.delta[d] + s)] = key;
            if constexpr (PAIRS) sm.digit[s] = (unsigned char)d;
        }
    }
    if constexpr (PAIRS) {
        // Values follow their keys: same ranks, staged after the keys left the union.
        u32 v[C::ITEMS];
#pragma unroll
        for (u32 i = 0; i < C::ITEMS; ++i) {
            const u32 j = first + i * 32;
            v[i] = j < m ? vin[tile_base + j] : 0u;
        }
        __syncthreads();
#pragma unroll
        for (u32 i = 0; i < C::ITEMS; ++i) sm.u.vals[r[i]] = v[i];
        __syncthreads();
#pragma unroll
        for (u32 i = 0; i < C::ITEMS; ++i) {
            const u32 s = t + i * RS_THREADS;
            if (s < m) vout[(u32)(sm.delta[sm.digit[s]] + s)] = sm.u.vals[s];
        }
    }
}

// One digit pass over u32 keys (one block of RS_THREADS per tile of RsCfg<u32>::TILE).
extern "C" __global__ void __launch_bounds__(RS_THREADS, RS_MIN_BLOCKS)
    rs_onesweep_u32_keys(const u32* kin, u32* kout, u64 n, u32 shift, u32 nbits, u32 pass, const u32* starts, u32* counter, u64* status) {
    rs_onesweep<u32, false>(kin, kout, nullptr, nullptr, n, shift, nbits, pass, starts, counter, status);
}

// One digit pass over u32 keys with u32 values.
extern "C" __global__ void __launch_bounds__(RS_THREADS, RS_MIN_BLOCKS)
    rs_onesweep_u32_pairs(const u32* kin, u32* kout, const u32* vin, u32* vout, u64 n, u32 shift, u32 nbits, u32 pass,
                          const u32* starts, u32* counter, u64* status) {
    rs_onesweep<u32, true>(kin, kout, vin, vout, n, shift, nbits, pass, starts, counter, status);
}

// One digit pass over u64 keys (tile RsCfg<u64>::TILE).
extern "C" __global__ void __launch_bounds__(RS_THREADS, RS_MIN_BLOCKS)
    rs_onesweep_u64_keys(const u64* kin, u64* kout, u64 n, u32 shift, u32 nbits, u32 pass, const u32* starts, u32* counter, u64* status) {
    rs_onesweep<u64, false>(kin, kout, nullptr, nullptr, n, shift, nbits, pass, starts, counter, status);
}

// One digit pass over u64 keys with u32 values.
extern "C" __global__ void __launch_bounds__(RS_THREADS, RS_MIN_BLOCKS)
    rs_onesweep_u64_pairs(const u64* kin, u64* kout, const u32* vin, u32* vout, u64 n, u32 shift, u32 nbits, u32 pass,
                          const u32* starts, u32* counter, u64* status) {
    rs_onesweep<u64, true>(kin, kout, vin, vout, n, shift, nbits, pass, starts, counter, status);
}

// ---------------------------------------------------------------- helpers around the sort
// out_keys[i] = keys[i] - sub; out_rows[i] = i when out_rows is not null: the
// probe side of sort_setops sorts key - lo (fewer passes) carrying its rows.
extern "C" __global__ void rs_offset_keys_u64(const u64* keys, u64 n, u64 sub, u64* out_keys, u32* out_rows) {
    SF_FOR(i, n) {
        out_keys[i] = keys[i] - sub;
        if (out_rows) out_rows[i] = (u32)i;
    }
}

// Segmented sort, step 1: out[i] = segment(i) << key_bits | keys[i], where
// segment(i) is the s with offsets[s] <= i < offsets[s + 1] (offsets[0] = 0,
// offsets[nseg] = n, non-decreasing). key_bits >= the keys' significant bits.
extern "C" __global__ void rs_seg_compose_u32(const u32* keys, u64 n, const u32* offsets, u32 nseg, u32 key_bits, u64* out) {
    SF_FOR(i, n) {
        // Last s in [0, nseg) with offsets[s] <= i (empty segments are skipped over).
        u32 lo = 0, hi = nseg;
        while (hi - lo > 1) {
            const u32 mid = lo + ((hi - lo) >> 1);
            if ((u64)offsets[mid] <= i) lo = mid; else hi = mid;
        }
        out[i] = ((u64)lo << key_bits) | keys[i];
    }
}

// Segmented sort, step 3: the sorted composite keys' low key_bits back into keys.
extern "C" __global__ void rs_seg_split_u32(const u64* composite, u64 n, u32 key_bits, u32* keys) {
    const u64 mask = key_bits >= 32 ? 0xffffffffULL : ((1ULL << key_bits) - 1);
    SF_FOR(i, n) keys[i] = (u32)(composite[i] & mask);
}
