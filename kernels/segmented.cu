// Segmented list plumbing shared by the list families (issue 15): the
// multiset rules' Balanced Path (kernels/multiset.cu) and sorted_intersect's
// GTWJ (kernels/sorted_intersect.cu) both run on rows cut from one key array
// per side by row offsets. Launcher: src/algo/segmented.rs. Split from
// kernels/multiset.cu so that both families' launchers import one neutral
// launcher instead of each other (issue 29); the kernels keep their ms_ names.
//
// Keys are u64 in an order-preserving image (signed values have their sign bit
// flipped by the launcher); lists are segments [off[r], off[r + 1]) of one key
// array per side, with one validity byte per row (0: the row's result is NULL,
// its elements are ignored).
//
// Scans are three kernels (tile sums, one-block scan of the sums, tile scan
// with the tile's base); n < 2^32 and totals < 2^32 (the launcher checks).
#include "common.cuh"

#define MS_SCAN_THREADS 256
#define MS_SCAN_ITEMS 8
#define MS_SCAN_TILE (MS_SCAN_THREADS * MS_SCAN_ITEMS)

// out[i] = in[i] ^ flip (the order-preserving key image, and back).
extern "C" __global__ void ms_xor(const u64* in, u64 n, u64 flip, u64* out) {
    SF_FOR(i, n) out[i] = in[i] ^ flip;
}

// keys[i] = base + in[i]: a batch's key images sent in 32 bits as their
// offsets from the batch's smallest image (src/algo/multiset.rs PreparedLists).
extern "C" __global__ void ms_widen(const u32* in, u64 n, u64 base, u64* keys) {
    SF_FOR(i, n) keys[i] = base + (u64)in[i];
}

// A raw batch's values (their own Arrow bytes, src/algo/list_pack.rs) made
// into key images: keys[i] = image(value i) ^ flip, the values `width` bytes
// each (1, 2, 4 or 8), sign-extended when is_signed.
extern "C" __global__ void ms_images(const unsigned char* in, u64 n, u32 width, u32 is_signed, u64 flip, u64* keys) {
    SF_FOR(i, n) {
        u64 v;
        if (width == 1) v = is_signed ? (u64)(i64)((const signed char*)in)[i] : (u64)in[i];
        else if (width == 2) v = is_signed ? (u64)(i64)((const short*)in)[i] : (u64)((const unsigned short*)in)[i];
        else if (width == 4) v = is_signed ? (u64)(i64)((const int*)in)[i] : (u64)((const u32*)in)[i];
        else v = ((const u64*)in)[i];
        keys[i] = v ^ flip;
    }
}

// The inline key of a string of at most 7 bytes (src/keys/lists.rs
// inline_key: its bytes from the top byte down, its length in the low byte,
// which orders as the bytes do): n strings data[off[i], off[i + 1]).
extern "C" __global__ void ms_inline_keys(const u32* off, const unsigned char* data, u64 n, u64 flip, u64* keys) {
    SF_FOR(i, n) {
        u32 s = off[i], len = off[i + 1] - s;
        if (len > 7) len = 7;  // the host refuses longer strings; never read past them
        u64 k = len;
        for (u32 b = 0; b < len; ++b) k |= (u64)data[s + b] << (56 - 8 * b);
        keys[i] = k ^ flip;
    }
}

// The same keys from Utf8View views (16 bytes: the length in bytes 0-3, a
// short string's bytes from byte 4), two u64 words a view, little-endian.
extern "C" __global__ void ms_view_keys(const u64* views, u64 n, u64 flip, u64* keys) {
    SF_FOR(i, n) {
        u64 lo = views[2 * i], hi = views[2 * i + 1];
        u32 len = (u32)lo;
        if (len > 7) len = 7;
        u64 bytes = (lo >> 32) | (hi << 32);  // view bytes 4..11: the string's first 8
        u64 k = len;
        for (u32 b = 0; b < len; ++b) k |= ((bytes >> (8 * b)) & 0xff) << (56 - 8 * b);
        keys[i] = k ^ flip;
    }
}

// Every row of at most MS_ROW_SORT_MAX keys sorted ascending in place, one
// block per row: the row in shared memory, padded with ~0 to a power of two,
// a bitonic sort, the first n keys written back (a real ~0 key ties with the
// padding, so the first n are still the row's keys). The launcher takes this
// path only when no row is longer (else the radix sort of composite keys,
// whose passes grow with the keys' bits: 8-byte string keys need ~8).
extern "C" __global__ void __launch_bounds__(256) ms_row_sort(u64* keys, const u32* off, u32 rows) {
    __shared__ u64 row[MS_ROW_SORT_MAX];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        u32 base = off[r], n = off[r + 1] - base;
        if (n < 2) continue;  // n is the block's own, so every thread skips together
        u32 p = 1;
        while (p < n) p <<= 1;
        for (u32 i = threadIdx.x; i < p; i += blockDim.x) row[i] = i < n ? keys[base + i] : ~0ULL;
        block_bitonic_sort(row, p);
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) keys[base + i] = row[i];
        __syncthreads();
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

// cnt[r] = the row's marked A elements + its marked B elements, from the
// exclusive scans ea and eb of per-element marks.
extern "C" __global__ void ms_row_counts(const u32* aoff, const u32* ea, const u32* boff, const u32* eb, u32 rows, u32* cnt) {
    SF_FOR(r, rows) cnt[r] = (ea[aoff[r + 1]] - ea[aoff[r]]) + (eb[boff[r + 1]] - eb[boff[r]]);
}

// out[r] = at[idx[r]] for r in [0, n): a row's output start is the scanned
// count at its first work item (tile or sequence); idx[rows] gives the total.
extern "C" __global__ void ms_gather_u32(const u32* at, const u32* idx, u32 n, u32* out) {
    SF_FOR(r, n) out[r] = at[idx[r]];
}

// ---- exclusive scan of u32 over [0, n) into out[0, n], out[n] = total ----

// Block-wide exclusive scan of one value per thread; returns the block total in *total.
__device__ __forceinline__ u32 ms_block_exclusive(u32 v, u32* total) {
    __shared__ u32 warp_sums[MS_SCAN_THREADS / 32];
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 inc = sf_warp_inclusive_scan<u32>(v);
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < MS_SCAN_THREADS / 32 ? warp_sums[lane] : 0;
        u32 winc = sf_warp_inclusive_scan<u32>(w);
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
