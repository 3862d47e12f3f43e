// Parquet pages decoded on the device into the selection's 64-bit keys.
//
// The host (src/scan/) reads the needed column chunks, walks their page
// headers and uploads the raw bytes with one page table entry per page (the
// PqPage layout below, 16 u64 fields, written by src/scan/pages.rs). Three
// kernels, in order:
//   pq_copy_pages  one block per page: uncompressed bodies, and the never
//                  compressed level bytes of v2 pages, copied into `body`;
//   pq_snappy_pipe two warps per SNAPPY page, one parsing its windows and one
//                  writing their output (or pq_snappy, one warp doing both,
//                  under SETFUSION_SNAPPY_ONE_WARP=1; pq_snappy_serial, one
//                  thread per page, under SETFUSION_SNAPPY_SERIAL=1): the raw
//                  snappy stream after the v2 levels decompressed into `body`;
//   pq_byte_dicts  one block per BYTE_ARRAY dictionary page: its values
//                  located (thread 0 walks their lengths) and hashed;
//   pq_decode      one block per data page: definition levels (RLE /
//                  bit-packed hybrid, bit width 1) into validity bits, then
//                  each non-NULL row's value (PLAIN, a dictionary index
//                  looked up in its chunk's PLAIN dictionary page, an RLE
//                  boolean, or
//                  DELTA_BINARY_PACKED: deltas unpacked in parallel and
//                  summed by a block-wide prefix sum into scratch first) as
//                  a sign-extended 64-bit key at the page's output rows;
//                  NULL rows get key 0 and no validity bit. A BYTE_ARRAY
//                  value's key is keys::hash_bytes of its bytes, and its
//                  span (device address, length) is written beside it, so
//                  the selection can prove that equal hashes mean equal
//                  strings (kernels/row_hash.cu, verify_check_spans) while
//                  the bytes stay where the decoder left them.
// Every loop over a block's work strides by blockDim, and the serial parts run
// on thread 0 between __syncthreads, so the same code runs on the host with one
// thread (scripts/kernels-on-host). Errors never fault: the first problem's
// code lands in err[0] (the host turns it into a clear error).
#include "common.cuh"

// PQ_RUNS (run descriptors per batch in shared memory), PQ_SNAPPY_WARPS
// (pq_snappy's warps per block) and PQ_SNAPPY_PAIRS (pq_snappy_pipe's pages
// per block) come from src/scan/decode.rs.

// pq_snappy: output bytes each warp keeps in shared memory (a power of two,
// at least four fill steps: 256).
#ifndef PQ_SNAPPY_RING
#define PQ_SNAPPY_RING 8192
#endif

typedef unsigned char u8;

struct PqPage {
    u64 src;         // byte offset of the page body (after its header) in `raw`
    u64 src_len;     // bytes of the body as stored
    u64 dst;         // byte offset of the uncompressed body in `body`
    u64 dst_len;     // uncompressed body bytes (levels included)
    u64 levels_len;  // v2: repetition + definition level bytes ahead of the values (never compressed)
    u64 def_len;     // v2: definition level bytes
    u64 codec;       // 0 uncompressed, 1 snappy
    u64 kind;        // 0 dictionary page, 1 data page v1, 2 data page v2
    u64 encoding;    // 0 PLAIN, 1 dictionary indices, 2 DELTA_BINARY_PACKED, 3 RLE (BOOLEAN: a 4-byte
                     // length, then the RLE / bit-packed hybrid of bit width 1)
    u64 num_values;  // values of the page, NULLs included (one per row: flat columns only)
    u64 first_row;   // output row of the page's first value
    u64 dict;        // page table index of the chunk's dictionary page (~0: none)
    u64 def_max;     // 0 required column, 1 optional
    u64 width;       // physical value bytes: 4 (INT32) or 8 (INT64); 0: BOOLEAN, one bit a value;
                     // PQ_BYTES: BYTE_ARRAY, a 4-byte little-endian length before each value
    u64 lvl_word;    // first word of the page's validity scratch (def_max == 1)
    u64 idx_off;     // first entry of the page's index scratch: dictionary indices or RLE booleans (u32),
                     // or DELTA_BINARY_PACKED values (u64, two entries each; idx_off is even); BYTE_ARRAY:
                     // PLAIN data pages, each value's byte position in the body (u32); dictionary pages,
                     // from an even idx_off, 2 u64 a value of spans, then a u64 hash a value
};

// PqPage::width of BYTE_ARRAY columns.
#define PQ_BYTES 16

#define PQ_ERR_SNAPPY 1
#define PQ_ERR_SNAPPY_SIZE 2
#define PQ_ERR_LEVELS 3
#define PQ_ERR_VALUES 4
#define PQ_ERR_DICT_INDEX 5
#define PQ_ERR_BIT_WIDTH 6
#define PQ_ERR_NO_DICT 7
// 8 and 9: host decompression (src/scan/decode.rs).
#define PQ_ERR_DELTA 10
#define PQ_ERR_DELTA_COUNT 11

__device__ __forceinline__ void pq_fail(u32* err, u32 code) { atomicMax(err, code); }

// One block per page: bytes that need no decompression.
extern "C" __global__ void pq_copy_pages(const u8* raw, u8* body, const PqPage* pages, u64 npages) {
    for (u64 pi = blockIdx.x; pi < npages; pi += gridDim.x) {
        const PqPage p = pages[pi];
        const u64 n = p.codec == 0 ? (p.src_len < p.dst_len ? p.src_len : p.dst_len) : p.levels_len;
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) body[p.dst + i] = raw[p.src + i];
    }
}

// Snappy's varint (at most 5 bytes for 32-bit lengths).
__device__ __forceinline__ bool pq_uvarint(const u8* s, u64 end, u64* pos, u64* v) {
    u64 x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= end) return false;
        const u8 b = s[(*pos)++];
        x |= (u64)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *v = x; return true; }
    }
    return false;
}

// Lanes of the warp that decodes a snappy page: 32 on the device (so loops
// over them unroll); the host harness runs the same code with blockDim.x lanes
// (a power of two).
#ifdef __CUDA_ARCH__
#define PQ_LANES 32u
#else
#define PQ_LANES (blockDim.x < 32 ? blockDim.x : 32u)
#endif

// pq_snappy's minimum resident blocks per SM (caps its registers).
#ifndef PQ_SNAPPY_MIN_BLOCKS
#define PQ_SNAPPY_MIN_BLOCKS 1
#endif

// Pages larger than this (compressed or not) go to one lane (pq_snappy_one):
// the warp form keeps offsets in 32 bits, and sums of 64 clamped lengths must
// not wrap.
#define PQ_SNAPPY_WARP_MAX (1u << 25)

// OR of v over the warp's lanes.
__device__ __forceinline__ u32 pq_warp_or(u32 v, u32 lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    (void)lane;
    return __reduce_or_sync(0xffffffffu, v);
#else
    for (u32 d = 1; d < PQ_LANES; d <<= 1) v |= __shfl_sync(0xffffffffu, v, lane ^ d);
    return v;
#endif
}

// ... of a 64-bit v.
__device__ __forceinline__ u64 pq_warp_or64(u64 v, u32 lane) {
    return (u64)pq_warp_or((u32)v, lane) | (u64)pq_warp_or((u32)(v >> 32), lane) << 32;
}

// A snappy window holds two positions a lane (PQ_LANES * 2: 64 bytes of
// input, or of output in a fill step), lane l holding positions 2l and 2l + 1,
// so that each shuffle, scan and ballot serves two bytes. `pair` holds a
// lane's two values, the even position's in its low 16 bits; every lane gets
// the value at its own position x, or `past` when x is past the window.
__device__ __forceinline__ u32 pq_pair_at(u32 pair, u32 x, u32 past) {
    const u32 g = __shfl_sync(0xffffffffu, pair, (x >> 1) & (PQ_LANES - 1));
    return x < past ? ((x & 1) ? g >> 16 : g & 0xffff) : past;
}

__device__ bool pq_snappy_one(const u8* src, u64 n, u8* dst, u64 cap, u32* err);

// One window of a snappy stream, as pq_snappy_parse finds it: each lane's two
// elements (j = 0, 1: the ones that would start at the window's bytes 2 lane
// + j; they count if on the chain) ...
struct PqSnapLane {
    u32 start[2];   // the element's first output byte
    u32 length[2];  // its output bytes
    u32 base[2];    // a literal: output byte x's input position is base + x (mod 2^32); a copy: its offset
    u32 literal;    // bit j: element j is a literal
};
// ... and what the whole warp shares.
struct PqSnapWin {
    u64 chain;  // positions whose element is on the chain from the window's first byte
    u32 out;    // the window's first output byte
    u32 end;    // one past its last
};

// Step 1 of pq_snappy: the window of input at `pos` < n (output so far
// `out`). Each position's element is decoded speculatively (most positions
// are inside another element); the chain of elements from the window's first
// byte is found with one shuffle per four elements, their output offsets
// with one warp scan, and all of them are checked at once. Returns false
// (the same in every lane) when an element on the chain is corrupt; else
// `consumed` is the input the chain takes.
__device__ __forceinline__ bool pq_snappy_parse(const u8* src, u32 n, u32 cap, u32 pos, u32 out, u32 lane,
                                                PqSnapLane& me, PqSnapWin& w, u32& consumed) {
    const u32 full = 0xffffffffu;
    const u32 lanes = PQ_LANES, past = 2 * lanes;
    const u32 q0 = pos + 2 * lane;
    u8 b[6];
#pragma unroll
    for (u32 k = 0; k < 6; ++k) b[k] = q0 + k < n ? src[q0 + k] : 0;
    u32 used[2], length[2], base[2], n1[2];
    bool literal[2];
#pragma unroll
    for (u32 j = 0; j < 2; ++j) {
        // The element's fields without a branch (the positions' tags differ,
        // and a switch would run its cases one after another): `word` holds
        // the four bytes after the tag, a literal's long length or a copy's offset.
        const u32 tag = b[j] & 3, high = b[j] >> 2;
        const u32 word = (u32)b[j + 1] | ((u32)b[j + 2] << 8) | ((u32)b[j + 3] << 16) | ((u32)b[j + 4] << 24);
        literal[j] = tag == 0;
        // A literal of 61+ bytes gives its length - 1 in the next 1-4 bytes.
        const u32 extra = literal[j] && high >= 60 ? high - 59 : 0;
        const u32 lit = extra == 0 ? high : word & (0xffffffffu >> (32 - 8 * extra));
        const u32 offset = tag == 1 ? ((b[j] >> 5) << 8) | b[j + 1] : tag == 2 ? (word & 0xffff) : word;
        length[j] = literal[j] ? (lit < PQ_SNAPPY_WARP_MAX ? lit + 1 : PQ_SNAPPY_WARP_MAX + 1)
                               : tag == 1 ? 4 + (high & 7) : 1 + high;
        const u32 hdr = literal[j] ? 1 + extra : tag == 1 ? 2 : tag == 2 ? 3 : 5;
        used[j] = literal[j] ? hdr + length[j] : hdr;
        base[j] = literal[j] ? q0 + j + hdr : offset;  // a literal's start subtracted below
        const u32 p = 2 * lane + j;
        n1[j] = used[j] < past - p ? p + used[j] : past;
    }
    // The chain from the window's first byte, four elements a shuffle: each
    // position knows the starts of the 1st to 4th elements after its own
    // (`past`: past the window).
    const u32 pair1 = n1[0] | n1[1] << 16;
    const u32 n2a = pq_pair_at(pair1, n1[0], past), n2b = pq_pair_at(pair1, n1[1], past);
    const u32 pair2 = n2a | n2b << 16;
    const u32 hops0 = n1[0] | n2a << 8 | pq_pair_at(pair1, n2a, past) << 16 | pq_pair_at(pair2, n2a, past) << 24;
    const u32 hops1 = n1[1] | n2b << 8 | pq_pair_at(pair1, n2b, past) << 16 | pq_pair_at(pair2, n2b, past) << 24;
    u64 chain = 0;
    u32 cur = 0;
    while (cur < past && pos + cur < n) {
        chain |= 1ull << cur;
        const u32 h = __shfl_sync(full, (cur & 1) ? hops1 : hops0, (cur >> 1) & (lanes - 1));
        const u32 a1 = h & 0xff, a2 = (h >> 8) & 0xff, a3 = (h >> 16) & 0xff;
        const bool ok1 = a1 < past && pos + a1 < n;
        const bool ok2 = ok1 && a2 < past && pos + a2 < n;
        const bool ok3 = ok2 && a3 < past && pos + a3 < n;
        if (ok1) chain |= 1ull << a1;
        if (ok2) chain |= 1ull << a2;
        if (ok3) chain |= 1ull << a3;
        cur = ok3 ? h >> 24 : past;
    }
    // The input the chain consumes: to the end of its last element.
    const u32 last = 63 - __clzll((long long)chain);
    consumed = last + __shfl_sync(full, (last & 1) ? used[1] : used[0], (last >> 1) & (lanes - 1));
    const bool on0 = (chain >> (2 * lane)) & 1, on1 = (chain >> (2 * lane + 1)) & 1;
    // Output offsets: a scan of the chain elements' lengths (a lane's two summed).
    const u32 m0 = on0 ? length[0] : 0, m1 = on1 ? length[1] : 0;
    const u32 incl = sf_warp_inclusive_scan<u32>(m0 + m1, lanes, full);
    const u32 total = __shfl_sync(full, incl, lanes - 1);
    const u32 start0 = out + incl - m0 - m1, start1 = start0 + m0;
    bool bad = false;
#pragma unroll
    for (u32 j = 0; j < 2; ++j) {
        const bool on = j == 0 ? on0 : on1;
        const u32 start = j == 0 ? start0 : start1, q = q0 + j;
        bad |= on && (used[j] > n - q || start > cap || length[j] > cap - start ||
                      (!literal[j] && (base[j] == 0 || base[j] > start)));
        me.start[j] = start;
        me.length[j] = length[j];
        me.base[j] = literal[j] ? base[j] - start : base[j];
    }
    if (__ballot_sync(full, bad) != 0) return false;
    me.literal = (literal[0] ? 1u : 0u) | (literal[1] ? 2u : 0u);
    w.chain = chain;
    w.out = out;
    w.end = out + total;
    return true;
}

// Step 2 of pq_snappy: window `w`'s output, 64 bytes a step, two bytes per
// lane (lane l: the step's bytes 2l and 2l + 1). Each byte finds its element
// (the last element start at or before it: an OR of the starts' bits, and
// their bases in `bases`, 64 words in shared memory), then reads its literal
// byte from the input or, for a copy, its source: output before the step is
// final (`ring`: the page's last PQ_SNAPPY_RING bytes in shared memory, or
// `dst` further back, written by the flushes), and a source inside the step
// is another byte of it, found by pointer jumping over shuffles until every
// byte has its value (a lane's two bytes' states packed in one word; a chain
// of at most 63 hops takes at most 7 rounds). Every half ring, the output is
// flushed to `dst` in coalesced stores (`flushed`: how far). PQ_SNAPPY_RING
// must be at least 4 steps, so that a copy reaching past the ring reads
// flushed bytes.
__device__ __forceinline__ void pq_snappy_fill(const u8* src, u8* dst, u8* ring, u32* bases, const PqSnapLane& me,
                                               const PqSnapWin& w, u32 lane, u32& flushed) {
    const u32 full = 0xffffffffu;
    const u32 lanes = PQ_LANES, step = 2 * lanes;
    const u32 mask = PQ_SNAPPY_RING - 1;
    // A copy reads the ring when its source cannot be a slot this step overwrites.
    const u32 ring_reach = PQ_SNAPPY_RING - step;
    const bool on0 = (w.chain >> (2 * lane)) & 1, on1 = (w.chain >> (2 * lane + 1)) & 1;
    // A byte's state: 1 << 15 | its value once known, else the step position holding it.
    const u32 known = 1u << 15;
    for (u32 s0 = w.out; s0 < w.end; s0 += step) {
        // Each element overlapping the step marks its first byte in it;
        // byte x belongs to the last mark at or before it.
        u64 marks = 0, lits = 0;
#pragma unroll
        for (u32 j = 0; j < 2; ++j) {
            const bool on = j == 0 ? on0 : on1;
            if (on && me.start[j] < s0 + step && me.start[j] + me.length[j] > s0) {
                const u32 m = me.start[j] > s0 ? me.start[j] - s0 : 0;
                bases[m] = me.base[j];
                marks |= 1ull << m;
                if ((me.literal >> j) & 1) lits |= 1ull << m;
            }
        }
        const u64 starts = pq_warp_or64(marks, lane), literal = pq_warp_or64(lits, lane);
        __syncwarp();
        u32 got[2];
#pragma unroll
        for (u32 j = 0; j < 2; ++j) {
            const u32 x = 2 * lane + j, at = s0 + x;
            const u32 o = 63 - __clzll((long long)(starts & (~0ull >> (63 - x))));
            const u32 e_base = bases[o];
            got[j] = known;
            if (at < w.end) {
                if ((literal >> o) & 1) {
                    got[j] |= src[e_base + at];
                } else {
                    const u32 from = at - e_base;
                    if (from < s0) got[j] |= e_base <= ring_reach ? ring[from & mask] : dst[from];
                    else got[j] = from - s0;
                }
            }
        }
        while (__ballot_sync(full, !(got[0] & known) || !(got[1] & known)) != 0) {
            const u32 pair = got[0] | got[1] << 16;
            const u32 there0 = pq_pair_at(pair, got[0] & (step - 1), step);
            const u32 there1 = pq_pair_at(pair, got[1] & (step - 1), step);
            if (!(got[0] & known)) got[0] = there0;
            if (!(got[1] & known)) got[1] = there1;
        }
        if (s0 + 2 * lane < w.end) ring[(s0 + 2 * lane) & mask] = (u8)got[0];
        if (s0 + 2 * lane + 1 < w.end) ring[(s0 + 2 * lane + 1) & mask] = (u8)got[1];
        __syncwarp();
        // Flush half a ring.
        const u32 done = s0 + step < w.end ? s0 + step : w.end;
        if (done - flushed >= PQ_SNAPPY_RING / 2) {
            for (u32 i = flushed + lane; i < done; i += lanes) dst[i] = ring[i & mask];
            flushed = done;
            __syncwarp();
        }
    }
}

// A SNAPPY page's stream after its v2 levels: where it lies, and its first
// element's input byte.
struct PqSnapStream {
    const u8* src;
    u8* dst;
    u32 n;    // input bytes
    u32 cap;  // output bytes
    u32 pos;
};

// Page pi's stream for a warp (every lane calls it), or false when the warp
// has nothing to do: not a SNAPPY page; a page table entry or length prefix
// that is wrong (the error reported by the `report` lane); or a stream too
// long for the warp form's 32-bit offsets (n or cap over
// PQ_SNAPPY_WARP_MAX), which the `report` lane decompresses alone
// (pq_snappy_one).
__device__ __forceinline__ bool pq_snappy_stream(const u8* raw, u8* body, const PqPage* pages, u64 pi, bool report,
                                                 u32* err, PqSnapStream& s) {
    const PqPage p = pages[pi];
    if (p.codec != 1) return false;
    if (p.src_len < p.levels_len || p.dst_len < p.levels_len) {
        if (report) pq_fail(err, PQ_ERR_SNAPPY);
        return false;
    }
    const u8* src = raw + p.src + p.levels_len;
    u8* dst = body + p.dst + p.levels_len;
    const u64 n = p.src_len - p.levels_len, cap = p.dst_len - p.levels_len;
    if (n > PQ_SNAPPY_WARP_MAX || cap > PQ_SNAPPY_WARP_MAX) {
        if (report) pq_snappy_one(src, n, dst, cap, err);
        __syncwarp();
        return false;
    }
    u64 pos = 0, len = 0;
    if (!pq_uvarint(src, n, &pos, &len)) {
        if (report) pq_fail(err, PQ_ERR_SNAPPY);
        return false;
    }
    if (len != cap) {
        if (report) pq_fail(err, PQ_ERR_SNAPPY_SIZE);
        return false;
    }
    s = {src, dst, (u32)n, (u32)cap, (u32)pos};
    return true;
}

// A page's end, after its last window: the ring's bytes not yet flushed
// stored to `dst`, then lane 0 reports `code` (a corrupt element) or an
// output that is not exactly `cap` bytes.
__device__ __forceinline__ void pq_snappy_finish(u8* dst, const u8* ring, u32 flushed, u32 out, u32 cap, u32 code,
                                                 u32 lane, u32* err) {
    for (u32 i = flushed + lane; i < out; i += PQ_LANES) dst[i] = ring[i & (PQ_SNAPPY_RING - 1)];
    __syncwarp();
    if (lane == 0) {
        if (code != 0) pq_fail(err, code);
        else if (out != cap) pq_fail(err, PQ_ERR_SNAPPY_SIZE);
    }
}

// One warp per SNAPPY page (SETFUSION_SNAPPY_ONE_WARP=1; the host harness's
// form): the raw snappy stream after the v2 levels decompressed into `body`,
// a window parsed (pq_snappy_parse), then its output written
// (pq_snappy_fill), and so on.
//
// A page of integers is mostly 4-8 byte elements (a key's zero high bytes are
// a copy of the previous key's), so the warp must not spend its steps one
// element at a time: one thread per page (pq_snappy_serial) and a warp running
// one element after another both took 120-130 ms for 100M keys on an H200,
// the first waiting on L2 for every copied byte, the second on ~150
// instructions per element. Offsets within the page are 32-bit (fewer
// registers and instructions). All control flow is uniform in the warp.
// With one thread (the host harness) the same steps run a byte at a time;
// scripts/kernels-on-host/parquet-warp.sh runs them as an emulated warp of
// several threads.
extern "C" __global__ void __launch_bounds__(32 * PQ_SNAPPY_WARPS, PQ_SNAPPY_MIN_BLOCKS) pq_snappy(const u8* raw, u8* body, const PqPage* pages, u64 npages, u32* err) {
    __shared__ u8 rings[PQ_SNAPPY_WARPS][PQ_SNAPPY_RING];
    __shared__ u32 bases[PQ_SNAPPY_WARPS][64];
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    for (u64 pi = (u64)blockIdx.x * warps + warp; pi < npages; pi += (u64)gridDim.x * warps) {
        PqSnapStream st;
        if (!pq_snappy_stream(raw, body, pages, pi, lane == 0, err, st)) continue;
        const u8* src = st.src;
        u8* dst = st.dst;
        const u32 n = st.n, cap = st.cap;
        u32 pos = st.pos;
        u32 out = 0, flushed = 0, code = 0;
        while (pos < n) {
            PqSnapLane me;
            PqSnapWin w;
            u32 consumed;
            if (!pq_snappy_parse(src, n, cap, pos, out, lane, me, w, consumed)) {
                code = PQ_ERR_SNAPPY;
                break;
            }
            pq_snappy_fill(src, dst, rings[warp], bases[warp], me, w, lane, flushed);
            out = w.end;
            pos += consumed;
        }
        pq_snappy_finish(dst, rings[warp], flushed, out, cap, code, lane, err);
    }
}

#ifdef __CUDACC__
// pq_snappy_pipe: windows a page's parsing warp may run ahead of its filling warp.
#ifndef PQ_SNAPPY_QUEUE
#define PQ_SNAPPY_QUEUE 4
#endif

// A window passed from a page's parsing warp to its filling warp.
struct PqSnapSlot {
    PqSnapLane lanes[32];  // 7 words each: lane-indexed stores do not conflict
    PqSnapWin w;
    u32 stop;  // 0: a window; 1: the stream's end; 2: a corrupt element
};

// Two warps per SNAPPY page (the launcher's default): one parses windows
// (pq_snappy_parse) into a queue of PQ_SNAPPY_QUEUE slots in shared memory,
// the other writes their output (pq_snappy_fill). A warp alone on a page
// waits on its own instructions' latencies (a page set has few pages an SM):
// on an H200 a 160 KB page of integer keys took 4.7 ms, 2.7 of them parsing,
// so the two halves overlap instead of adding up. The counters pass windows
// through shared memory: a slot is written, fenced, then counted; read,
// fenced, then released.
extern "C" __global__ void __launch_bounds__(64 * PQ_SNAPPY_PAIRS, PQ_SNAPPY_MIN_BLOCKS) pq_snappy_pipe(const u8* raw, u8* body, const PqPage* pages, u64 npages, u32* err) {
    __shared__ u8 rings[PQ_SNAPPY_PAIRS][PQ_SNAPPY_RING];
    __shared__ PqSnapSlot slots[PQ_SNAPPY_PAIRS][PQ_SNAPPY_QUEUE];
    __shared__ u32 bases[PQ_SNAPPY_PAIRS][64];
    __shared__ u32 counts[PQ_SNAPPY_PAIRS][2];
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, pair = warp / 2, pairs = blockDim.x / 64;
    const bool parser = (warp & 1) == 0;
    volatile u32* written = &counts[pair][0];
    volatile u32* released = &counts[pair][1];
    if (threadIdx.x < 2 * pairs) counts[threadIdx.x / 2][threadIdx.x % 2] = 0;
    __syncthreads();
    if (pair >= pairs) return;
    // Windows this warp has written (parser) or read (filler): equal at each page's start.
    u32 seq = 0;
    for (u64 pi = (u64)blockIdx.x * pairs + pair; pi < npages; pi += (u64)gridDim.x * pairs) {
        PqSnapStream st;
        if (!pq_snappy_stream(raw, body, pages, pi, parser && lane == 0, err, st)) continue;
        const u8* src = st.src;
        u8* dst = st.dst;
        const u32 n = st.n, cap = st.cap;
        u32 pos = st.pos;
        if (parser) {
            u32 out = 0, stop = 0;
            while (stop == 0) {
                PqSnapLane me = {};
                PqSnapWin w = {0, out, out};
                u32 consumed = 0;
                if (pos >= n) stop = 1;
                else if (!pq_snappy_parse(src, n, cap, pos, out, lane, me, w, consumed)) stop = 2;
                while (seq - *released >= PQ_SNAPPY_QUEUE) __nanosleep(32);
                __threadfence_block();
                PqSnapSlot& s = slots[pair][seq % PQ_SNAPPY_QUEUE];
                if (stop == 0) {
                    s.lanes[lane] = me;
                    if (lane == 0) s.w = w;
                }
                if (lane == 0) s.stop = stop;
                __threadfence_block();
                __syncwarp();
                if (lane == 0) *written = seq + 1;
                ++seq;
                out = w.end;
                pos += consumed;
            }
        } else {
            u32 out = 0, flushed = 0, stop = 0;
            for (;;) {
                while (*written == seq) __nanosleep(32);
                __threadfence_block();
                const PqSnapSlot& s = slots[pair][seq % PQ_SNAPPY_QUEUE];
                stop = s.stop;
                const PqSnapLane me = s.lanes[lane];
                const PqSnapWin w = s.w;
                __threadfence_block();
                __syncwarp();
                if (lane == 0) *released = seq + 1;
                ++seq;
                if (stop != 0) break;
                pq_snappy_fill(src, dst, rings[pair], bases[pair], me, w, lane, flushed);
                out = w.end;
            }
            pq_snappy_finish(dst, rings[pair], flushed, out, cap, stop == 2 ? PQ_ERR_SNAPPY : 0, lane, err);
        }
    }
}
#endif

// One snappy stream: src[0, n) into dst[0, cap). Returns false when corrupt
// or when it does not decompress to exactly `cap` bytes.
__device__ bool pq_snappy_one(const u8* src, u64 n, u8* dst, u64 cap, u32* err) {
    u64 pos = 0, len = 0, out = 0;
    if (!pq_uvarint(src, n, &pos, &len)) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
    if (len != cap) { pq_fail(err, PQ_ERR_SNAPPY_SIZE); return false; }
    while (pos < n) {
        const u8 tag = src[pos++];
        u64 length, offset;
        switch (tag & 3) {
        case 0: {
            length = tag >> 2;
            if (length >= 60) {
                const u32 extra = (u32)length - 59;
                if (pos + extra > n) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
                length = 0;
                for (u32 k = 0; k < extra; ++k) length |= (u64)src[pos + k] << (8 * k);
                pos += extra;
            }
            length += 1;
            if (pos + length > n || out + length > cap) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
            for (u64 k = 0; k < length; ++k) dst[out + k] = src[pos + k];
            pos += length;
            out += length;
            continue;
        }
        case 1:
            if (pos + 1 > n) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
            length = 4 + ((tag >> 2) & 7);
            offset = ((u64)(tag >> 5) << 8) | src[pos];
            pos += 1;
            break;
        case 2:
            if (pos + 2 > n) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
            length = 1 + (tag >> 2);
            offset = (u64)src[pos] | ((u64)src[pos + 1] << 8);
            pos += 2;
            break;
        default:
            if (pos + 4 > n) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
            length = 1 + (tag >> 2);
            offset = (u64)src[pos] | ((u64)src[pos + 1] << 8) | ((u64)src[pos + 2] << 16) | ((u64)src[pos + 3] << 24);
            pos += 4;
            break;
        }
        if (offset == 0 || offset > out || out + length > cap) { pq_fail(err, PQ_ERR_SNAPPY); return false; }
        // Byte by byte: a copy may overlap its own output (offset < length repeats a pattern).
        for (u64 k = 0; k < length; ++k) dst[out + k] = dst[out + k - offset];
        out += length;
    }
    if (out != cap) { pq_fail(err, PQ_ERR_SNAPPY_SIZE); return false; }
    return true;
}

// One thread per page, each copy byte after byte (SETFUSION_SNAPPY_SERIAL=1;
// on an H200 it decoded 100M keys in 130 ms: BENCHMARKS section 12). Kept to
// measure pq_snappy against. Only snappy pages do work.
extern "C" __global__ void pq_snappy_serial(const u8* raw, u8* body, const PqPage* pages, u64 npages, u32* err) {
    SF_FOR(pi, npages) {
        const PqPage p = pages[pi];
        if (p.codec != 1) continue;
        if (p.src_len < p.levels_len || p.dst_len < p.levels_len) { pq_fail(err, PQ_ERR_SNAPPY); continue; }
        pq_snappy_one(raw + p.src + p.levels_len, p.src_len - p.levels_len, body + p.dst + p.levels_len, p.dst_len - p.levels_len, err);
    }
}

// One run of an RLE / bit-packed hybrid stream.
struct PqRun {
    u64 first;   // index of its first value in the stream
    u64 count;   // values (bit-packed runs: clipped to the values wanted)
    u64 at;      // RLE: the repeated value; bit-packed: bit offset of its first value in the stream
    u32 packed;  // 1: bit-packed
};

// Parse the next run header of the hybrid stream s[pos, end); bw <= 32.
__device__ bool pq_next_run(const u8* s, u64 end, u64* pos, u32 bw, u64 first, u64 wanted, PqRun* r) {
    u64 h;
    if (!pq_uvarint(s, end, pos, &h)) return false;
    r->first = first;
    if (h & 1) {
        const u64 groups = h >> 1;
        const u64 bytes = groups * bw;
        const u64 n = groups * 8;
        r->count = n < wanted - first ? n : wanted - first;
        // A writer may end the last group early: only the values wanted must be there.
        if (*pos + (r->count * bw + 7) / 8 > end) return false;
        r->packed = 1;
        r->at = *pos * 8;
        *pos += bytes;
        if (*pos > end) *pos = end;
    } else {
        const u32 vb = (bw + 7) / 8;
        if (*pos + vb > end) return false;
        u64 v = 0;
        for (u32 k = 0; k < vb; ++k) v |= (u64)s[*pos + k] << (8 * k);
        *pos += vb;
        r->packed = 0;
        r->at = v;
        const u64 n = h >> 1;
        r->count = n < wanted - first ? n : wanted - first;
    }
    return true;
}

// Value j of a bit-packed run: bw bits at bit `at + j * bw` of s (bytes past `end` read as 0).
__device__ __forceinline__ u32 pq_unpack(const u8* s, u64 end, u64 bit, u32 bw) {
    u64 byte = bit >> 3;
    u64 word = 0;
    for (u32 k = 0; k < 5; ++k) word |= (byte + k < end ? (u64)s[byte + k] : 0) << (8 * k);
    return (u32)((word >> (bit & 7)) & ((bw == 32) ? 0xffffffffULL : ((1ULL << bw) - 1)));
}

// A little-endian value of `width` bytes at s, sign-extended to 64 bits.
__device__ __forceinline__ u64 pq_value(const u8* s, u64 width) {
    if (width == 4) {
        const u32 v = (u32)s[0] | ((u32)s[1] << 8) | ((u32)s[2] << 16) | ((u32)s[3] << 24);
        return (u64)(i64)(int)v;
    }
    u64 v = 0;
    for (u32 k = 0; k < 8; ++k) v |= (u64)s[k] << (8 * k);
    return v;
}

// PLAIN value i of a page whose values start at s: `width` bytes each, or
// one bit each, LSB first (BOOLEAN, width 0).
__device__ __forceinline__ u64 pq_plain(const u8* s, u64 i, u64 width) {
    if (width == 0) return (s[i >> 3] >> (i & 7)) & 1;
    return pq_value(s + i * width, width);
}

// DELTA_BINARY_PACKED (parquet-format Encodings.md): a header (block size, a
// multiple of 128; miniblocks per block, each a multiple of 32 values; the
// value count; the first value, zigzag), then blocks of a min delta (zigzag),
// one bit width byte per miniblock and the miniblocks' (delta - min delta)
// bit-packed LSB first. Miniblocks past the last value may be absent (their
// bit widths are arbitrary). Sums wrap: computed in 64 bits, INT32 values
// are the low 32 bits sign-extended.

// Block sizes above this are refused (writers use 128 to 2048), so a
// miniblock's value count fits 32 bits.
#define PQ_DELTA_MAX_BLOCK (1ULL << 30)
// DELTA miniblocks per batch thread 0 parses into shared memory.
#define PQ_MINIS (PQ_RUNS / 2)

// One miniblock of a DELTA_BINARY_PACKED page.
struct PqMini {
    u64 first;      // index of its first delta in the page (value first + 1)
    u64 at;         // bit offset of its first packed delta in the page body
    u64 min_delta;  // its block's min delta (two's complement)
    u32 count;      // deltas (the page's last miniblock: only those wanted)
    u32 bw;         // bit width, 0 to 64
};

// pq_decode's shared memory for a DELTA page: one batch of miniblocks, and
// the warps' sums of a tile (two, alternating, so a tile's warp sums are not
// overwritten while slow threads still read the previous one's).
struct PqDelta {
    PqMini minis[PQ_MINIS];
    u64 warp_sums[2][32];
    u64 deltas;  // the page's deltas (its values - 1)
    u64 mini_values;
    u64 got;     // deltas parsed by the end of this batch
    u32 status;
};

// pq_decode's batches in shared memory: hybrid runs of dictionary indices or DELTA miniblocks.
union PqBatch {
    PqRun runs[PQ_RUNS];
    PqDelta delta;
};

// A zigzag varint as its signed value's 64-bit two's complement.
__device__ __forceinline__ bool pq_zigzag(const u8* s, u64 end, u64* pos, u64* v) {
    u64 z;
    if (!pq_uvarint(s, end, pos, &z)) return false;
    *v = (z >> 1) ^ (0 - (z & 1));
    return true;
}

// bw (1 to 64) bits at bit `bit` of s, LSB first (bytes past `end` read as 0).
__device__ __forceinline__ u64 pq_unpack64(const u8* s, u64 end, u64 bit, u32 bw) {
    const u64 byte = bit >> 3;
    const u32 shift = (u32)(bit & 7);
    u64 word = 0;
    for (u32 k = 0; k < 8; ++k) word |= (byte + k < end ? (u64)s[byte + k] : 0) << (8 * k);
    u64 v = word >> shift;
    if (shift + bw > 64) v |= (u64)(byte + 8 < end ? s[byte + 8] : 0) << (64 - shift);
    return bw == 64 ? v : v & ((1ULL << bw) - 1);
}

// A 64-bit sum as the key of a `width`-byte column (INT32: its low 32 bits, sign-extended).
__device__ __forceinline__ u64 pq_narrow(u64 v, u64 width) {
    return width == 4 ? (u64)(i64)(int)(u32)v : v;
}

// The DELTA_BINARY_PACKED values of a page, s[vals, len), as `nonnull` keys
// at dv. Every thread of the block calls it; it returns 0 or a PQ_ERR code,
// the same on every thread. Thread 0 parses the miniblock headers a batch at
// a time; the block unpacks a tile of blockDim deltas at once, one per
// thread, and scans them (warp shuffles, then the warps' sums on thread 0,
// which carries the running value from tile to tile).
__device__ u32 pq_delta_values(const u8* s, u64 vals, u64 len, u64 nonnull, u64 width, u64* dv, PqDelta* sh) {
    // Thread 0's parse state and running value, kept across batches.
    u64 pos = vals, mb = 0, vpm = 0, deltas = 0, got = 0, mini = 0, widths_at = 0, min_delta = 0, carry = 0;
    if (threadIdx.x == 0) {
        u32 status = 0;
        // A page of NULLs only may hold no values at all.
        if (nonnull > 0 || vals < len) {
            u64 block = 0, total = 0, first = 0;
            if (!pq_uvarint(s, len, &pos, &block) || !pq_uvarint(s, len, &pos, &mb) || !pq_uvarint(s, len, &pos, &total) || !pq_zigzag(s, len, &pos, &first)) {
                status = PQ_ERR_DELTA;
            } else if (block == 0 || block % 128 != 0 || block > PQ_DELTA_MAX_BLOCK || mb == 0 || block % mb != 0 || (block / mb) % 32 != 0) {
                status = PQ_ERR_DELTA;
            } else if (total != nonnull) {
                status = PQ_ERR_DELTA_COUNT;
            } else if (nonnull > 0) {
                vpm = block / mb;
                mini = mb;  // the first block's header is next
                deltas = nonnull - 1;
                carry = first;
                dv[0] = pq_narrow(first, width);
            }
        }
        sh->status = status;
        sh->deltas = deltas;
        sh->mini_values = vpm;
    }
    __syncthreads();
    if (sh->status) return sh->status;
    const u64 all = sh->deltas, mini_values = sh->mini_values;
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    u64 done = 0;
    u32 tile = 0;
    while (done < all) {
        if (threadIdx.x == 0) {
            u32 status = 0;
            u64 k = 0;
            while (k < PQ_MINIS && got < deltas) {
                if (mini == mb) {
                    // The next block: its min delta, then one bit width per miniblock.
                    if (!pq_zigzag(s, len, &pos, &min_delta) || mb > len - pos) { status = PQ_ERR_DELTA; break; }
                    widths_at = pos;
                    pos += mb;
                    mini = 0;
                }
                const u32 bw = s[widths_at + mini];
                ++mini;
                // Only the deltas wanted must be there: a writer may end the last miniblock early.
                const u64 count = vpm < deltas - got ? vpm : deltas - got;
                if (bw > 8 * width || (count * bw + 7) / 8 > len - pos) { status = PQ_ERR_DELTA; break; }
                PqMini* m = &sh->minis[k];
                m->first = got;
                m->at = pos * 8;
                m->min_delta = min_delta;
                m->count = (u32)count;
                m->bw = bw;
                const u64 bytes = vpm / 8 * bw;
                pos = bytes < len - pos ? pos + bytes : len;
                got += count;
                ++k;
            }
            sh->status = status;
            sh->got = got;
        }
        __syncthreads();
        if (sh->status) return sh->status;
        // The batch's miniblocks hold deltas [done, end), mini_values each (the page's last: fewer).
        const u64 end = sh->got;
        for (u64 base = done; base < end; base += blockDim.x, ++tile) {
            const u64 i = base + threadIdx.x;
            u64 incl = 0;
            if (i < end) {
                const PqMini m = sh->minis[(i - done) / mini_values];
                incl = m.min_delta + (m.bw ? pq_unpack64(s, len, m.at + (i - m.first) * m.bw, m.bw) : 0);
            }
            incl = sf_warp_inclusive_scan<u64>(incl);
            u64* sums = sh->warp_sums[tile & 1];
            if (lane == 31 || threadIdx.x == blockDim.x - 1) sums[warp] = incl;
            __syncthreads();
            if (threadIdx.x == 0) {
                for (u32 w = 0; w < warps; ++w) { const u64 x = sums[w]; sums[w] = carry; carry += x; }
            }
            __syncthreads();
            if (i < end) dv[1 + i] = pq_narrow(sums[warp] + incl, width);
        }
        done = end;
    }
    // Every thread's values written before the block reads them.
    __syncthreads();
    return 0;
}

// A 4-byte little-endian length at s.
__device__ __forceinline__ u64 pq_le32(const u8* s) {
    return (u64)s[0] | ((u64)s[1] << 8) | ((u64)s[2] << 16) | ((u64)s[3] << 24);
}

// keys::hash_bytes of the bytes at device address a (len of them).
__device__ __forceinline__ u64 pq_hash_at(u64 a, u64 len) { return sf_hash_bytes((const u64*)(a & ~7ULL), a & 7, len); }

// Bytes of a page body pq_walk_bytes stages in shared memory at a time.
#ifndef PQ_WALK_WINDOW
#define PQ_WALK_WINDOW 4096
#endif

// The values of a PLAIN BYTE_ARRAY stream b[from, len), each a 4-byte
// little-endian length and its bytes, located by the block: each value's
// start depends on every length before it, so thread 0 walks them, but over
// the body staged in shared memory (`win`, PQ_WALK_WINDOW bytes), loaded by
// the whole block a window at a time from the next value's length on, not
// one dependent global load a value (a ~1 MB page of ~12,500 strings took
// ~12 ms so on an H200: TPC-H q16's supplier scan). put(k, start, length)
// receives value k (on thread 0). `st`: three shared words. Returns on every
// thread the number of values walked; fewer than n: a value runs past the stream.
template <class Put>
__device__ u64 pq_walk_bytes(const u8* b, u64 from, u64 len, u64 n, u8* win, u64* st, Put put) {
    if (threadIdx.x == 0) { st[0] = from; st[1] = 0; st[2] = 0; }
    __syncthreads();
    while (true) {
        const u64 base = st[0], walked = st[1];
        if (st[2] || walked >= n) break;
        const u64 end = len - base > PQ_WALK_WINDOW ? base + PQ_WALK_WINDOW : len;
        // Every thread read st above; it is written again only after this barrier.
        __syncthreads();
        for (u64 i = base + threadIdx.x; i < end; i += blockDim.x) win[i - base] = b[i];
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 pos = base, k = walked, stop = 0;
            while (k < n) {
                if (len - pos < 4) { stop = 1; break; }
                if (pos + 4 > end) break;  // the length lies past the window: the next one starts there
                const u8* at = win + (pos - base);
                const u64 l = (u64)at[0] | ((u64)at[1] << 8) | ((u64)at[2] << 16) | ((u64)at[3] << 24);
                if (l > len - pos - 4) { stop = 1; break; }
                put(k, pos + 4, l);
                pos += 4 + l;
                ++k;
            }
            st[0] = pos; st[1] = k; st[2] = stop;
        }
        __syncthreads();
    }
    const u64 walked = st[1];
    __syncthreads();
    return walked;
}

// One block per BYTE_ARRAY dictionary page: its values located (thread 0
// walks their lengths: each value's start depends on every length before it)
// and hashed by the block, into the page's index scratch read as u64 from
// its even idx_off: 2 n words of spans (the value's device address, its
// length), then n hashes. A value running past the page sets the error code;
// it and the entries after it are (0, 0) with hash 0.
extern "C" __global__ void pq_byte_dicts(const u8* body, const PqPage* pages, u64 npages, u32* idx, u32* err) {
    __shared__ u8 win[PQ_WALK_WINDOW];
    __shared__ u64 walk_s[3];
    for (u64 pi = blockIdx.x; pi < npages; pi += gridDim.x) {
        const PqPage p = pages[pi];
        if (p.kind != 0 || p.width != PQ_BYTES) continue;
        const u8* b = body + p.dst;
        const u64 n = p.num_values, len = p.dst_len;
        u64* spans = (u64*)(idx + p.idx_off);
        u64* hashes = spans + 2 * n;
        const u64 walked = pq_walk_bytes(b, 0, len, n, win, walk_s, [&](u64 k, u64 at, u64 l) {
            spans[2 * k] = (u64)(b + at);
            spans[2 * k + 1] = l;
        });
        if (walked < n && threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES);
        for (u64 k = threadIdx.x; k < n; k += blockDim.x) {
            if (k < walked) {
                hashes[k] = pq_hash_at(spans[2 * k], spans[2 * k + 1]);
            } else {
                spans[2 * k] = 0;
                spans[2 * k + 1] = 0;
                hashes[k] = 0;
            }
        }
        __syncthreads();
    }
}

// Value v of a BYTE_ARRAY data page as row `row`'s key (its hash), its span
// written at spans[2 row]: PLAIN, the value at byte ix[v] of the page body b
// (its length in the 4 bytes before); dictionary-encoded, entry ix[v] of the
// dictionary page's spans and hashes (dspans, dict_n entries).
__device__ __forceinline__ u64 pq_byte_key(u64 encoding, const u8* b, const u32* ix, u64 v, const u64* dspans,
                                           u64 dict_n, u64* spans, u64 row, u32* err) {
    u64 a, l, h;
    if (encoding == 1) {
        const u32 di = ix[v];
        if (di >= dict_n) { pq_fail(err, PQ_ERR_DICT_INDEX); return 0; }
        a = dspans[2 * di];
        l = dspans[2 * di + 1];
        h = dspans[2 * dict_n + di];
    } else {
        const u8* s = b + ix[v];
        l = pq_le32(s - 4);
        a = (u64)s;
        h = pq_hash_at(a, l);
    }
    spans[2 * row] = a;
    spans[2 * row + 1] = l;
    return h;
}

// One block per page. levels: validity scratch (zeroed), one bit per value of
// pages with def_max; idx: dictionary index scratch; out: keys of every row;
// valid: validity words of every row (zeroed; written only for optional columns);
// spans: BYTE_ARRAY columns, two words a row (zeroed; NULL rows stay (0, 0)).
extern "C" __global__ void pq_decode(const u8* body, const PqPage* pages, u64 npages, u32* levels, u32* idx, u64* out, u32* valid, u64* spans, u32* err) {
    __shared__ PqBatch batch;
    PqRun* const runs = batch.runs;
    __shared__ u64 nruns_s, nonnull_s, got_s, status_s;
    __shared__ u32 counts[1024];
    __shared__ u8 win[PQ_WALK_WINDOW];
    __shared__ u64 walk_s[3];
    for (u64 pi = blockIdx.x; pi < npages; pi += gridDim.x) {
        const PqPage p = pages[pi];
        if (p.kind == 0) continue;
        const u8* b = body + p.dst;
        const u64 len = p.dst_len, n = p.num_values;
        // Where the levels and the values start.
        u64 def_at = 0, def_end = 0, vals = 0;
        if (p.kind == 2) {
            def_at = p.levels_len - p.def_len;
            def_end = p.levels_len;
            vals = p.levels_len;
        } else if (p.def_max) {
            if (len < 4) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_LEVELS); continue; }
            const u64 l = (u64)b[0] | ((u64)b[1] << 8) | ((u64)b[2] << 16) | ((u64)b[3] << 24);
            def_at = 4;
            def_end = 4 + l;
            vals = def_end;
        }
        if (def_end > len) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_LEVELS); continue; }
        u32* lv = levels + p.lvl_word;
        // Definition levels into one bit per value (thread 0: the runs are sequential).
        if (threadIdx.x == 0) {
            status_s = 0;
            u64 nonnull = n;
            if (p.def_max) {
                u64 pos = def_at, got = 0;
                nonnull = 0;
                while (got < n) {
                    PqRun r;
                    if (!pq_next_run(b, def_end, &pos, 1, got, n, &r) || r.count == 0) { status_s = PQ_ERR_LEVELS; break; }
                    if (!r.packed) {
                        if (r.at > 1) { status_s = PQ_ERR_LEVELS; break; }
                        if (r.at) {
                            nonnull += r.count;
                            u64 i = r.first, e = r.first + r.count;
                            for (; i < e && (i & 31); ++i) lv[i >> 5] |= 1u << (i & 31);
                            for (; i + 32 <= e; i += 32) lv[i >> 5] = 0xffffffffu;
                            for (; i < e; ++i) lv[i >> 5] |= 1u << (i & 31);
                        }
                    } else {
                        for (u64 j = 0; j < r.count; ++j) {
                            const u64 bit = r.at + j;
                            if ((b[bit >> 3] >> (bit & 7)) & 1) {
                                const u64 i = r.first + j;
                                lv[i >> 5] |= 1u << (i & 31);
                                ++nonnull;
                            }
                        }
                    }
                    got += r.count;
                }
            }
            nonnull_s = nonnull;
        }
        __syncthreads();
        if (status_s) { if (threadIdx.x == 0) pq_fail(err, (u32)status_s); __syncthreads(); continue; }
        const u64 nonnull = nonnull_s;
        // Dictionary indices of the non-NULL values, expanded into idx scratch.
        const u8* dict = 0;
        const u64* dspans = 0;
        u64 dict_n = 0;
        // DELTA_BINARY_PACKED values, decoded into the index scratch (only for such pages: idx_off is even there).
        u64* const dv = p.encoding == 2 ? (u64*)(idx + p.idx_off) : 0;
        if (p.encoding == 2) {
            const u32 code = pq_delta_values(b, vals, len, nonnull, p.width, dv, &batch.delta);
            if (code) { if (threadIdx.x == 0) pq_fail(err, code); __syncthreads(); continue; }
        } else if (p.encoding == 1 || p.encoding == 3) {
            // Dictionary indices, or RLE booleans, expanded into the index scratch.
            u32 bw = 1;
            u64 pos = vals, end = len;
            if (p.encoding == 1) {
                if (p.dict == ~0ULL || p.dict >= npages) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_NO_DICT); __syncthreads(); continue; }
                const PqPage d = pages[p.dict];
                dict = body + d.dst;
                dict_n = d.num_values;
                dspans = (const u64*)(idx + d.idx_off);
                if (p.width != PQ_BYTES && d.dst_len < dict_n * p.width) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES); __syncthreads(); continue; }
                bw = vals < len ? b[vals] : 0;
                if (nonnull > 0 && (vals >= len || bw > 32)) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_BIT_WIDTH); __syncthreads(); continue; }
                pos = vals + 1;
            } else {
                // (A page of NULLs only reads no value: its length is not looked at, as in the CPU twin.)
                const u64 l = vals + 4 <= len ? (u64)b[vals] | ((u64)b[vals + 1] << 8) | ((u64)b[vals + 2] << 16) | ((u64)b[vals + 3] << 24) : ~0ULL;
                if (nonnull > 0 && (vals + 4 > len || l > len - vals - 4)) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES); __syncthreads(); continue; }
                pos = vals + 4;
                end = nonnull > 0 ? pos + l : len;
            }
            u32* ix = idx + p.idx_off;
            u64 got = 0;
            while (got < nonnull) {
                if (threadIdx.x == 0) {
                    u64 k = 0;
                    while (k < PQ_RUNS && got < nonnull) {
                        if (!pq_next_run(b, end, &pos, bw, got, nonnull, &runs[k]) || runs[k].count == 0) { status_s = PQ_ERR_VALUES; break; }
                        got += runs[k].count;
                        ++k;
                    }
                    nruns_s = k;
                    got_s = got;
                }
                __syncthreads();
                if (status_s) break;
                got = got_s;
                const u64 nr = nruns_s;
                for (u64 k = 0; k < nr; ++k) {
                    const PqRun r = runs[k];
                    for (u64 j = threadIdx.x; j < r.count; j += blockDim.x)
                        ix[r.first + j] = r.packed ? (bw == 0 ? 0 : pq_unpack(b, end, r.at + j * bw, bw)) : (u32)r.at;
                }
                __syncthreads();
            }
            if (status_s) { if (threadIdx.x == 0) pq_fail(err, (u32)status_s); __syncthreads(); continue; }
        } else if (p.width == PQ_BYTES) {
            // PLAIN byte arrays: each value's start (pq_walk_bytes).
            u32* ix = idx + p.idx_off;
            const u64 walked = pq_walk_bytes(b, vals, len, nonnull, win, walk_s, [&](u64 k, u64 at, u64) { ix[k] = (u32)at; });
            if (walked < nonnull) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES); __syncthreads(); continue; }
        } else if (len < vals || (p.width == 0 ? (len - vals) * 8 : (len - vals) / p.width) < nonnull) {
            if (threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES);
            __syncthreads();
            continue;
        }
        const u32* ix = idx + p.idx_off;
        if (nonnull == n) {
            // No NULL in the page: value i is row i's, written coalesced.
            for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
                u64 key = 0;
                if (p.width == PQ_BYTES) {
                    key = pq_byte_key(p.encoding, b, ix, i, dspans, dict_n, spans, p.first_row + i, err);
                } else if (p.encoding == 1) {
                    const u32 di = ix[i];
                    if (di >= dict_n) pq_fail(err, PQ_ERR_DICT_INDEX); else key = pq_value(dict + (u64)di * p.width, p.width);
                } else if (p.encoding == 2) {
                    key = dv[i];
                } else if (p.encoding == 3) {
                    key = ix[i] & 1;
                } else {
                    key = pq_plain(b + vals, i, p.width);
                }
                out[p.first_row + i] = key;
            }
            if (p.def_max && n > 0) {
                const u64 lo = p.first_row, hi = p.first_row + n;  // rows [lo, hi) are valid
                for (u64 w = (lo >> 5) + threadIdx.x; w <= ((hi - 1) >> 5); w += blockDim.x) {
                    const u64 a = w * 32 < lo ? lo - w * 32 : 0, e = (w + 1) * 32 > hi ? hi - w * 32 : 32;
                    const u32 mask = (e == 32 ? 0xffffffffu : ((1u << e) - 1)) & ~((1u << a) - 1);
                    atomicOr(&valid[w], mask);
                }
            }
            __syncthreads();
            continue;
        }
        // Each thread owns a run of whole validity words (32 values each): count
        // its non-NULL values, scan the counts, then write its rows.
        const u64 words = (n + 31) / 32;
        const u64 per = (words + blockDim.x - 1) / blockDim.x;
        const u64 w0 = threadIdx.x * per < words ? threadIdx.x * per : words;
        const u64 w1 = w0 + per < words ? w0 + per : words;
        u32 c = 0;
        for (u64 w = w0; w < w1; ++w) {
            const u64 live = n - w * 32 >= 32 ? 32 : n - w * 32;
            const u32 mask = live == 32 ? 0xffffffffu : ((1u << live) - 1);
            c += p.def_max ? __popc(lv[w] & mask) : (u32)live;
        }
        counts[threadIdx.x] = c;
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 run = 0;
            for (u32 t = 0; t < blockDim.x; ++t) { const u32 x = counts[t]; counts[t] = run; run += x; }
        }
        __syncthreads();
        u64 rank = counts[threadIdx.x];
        u64 vword = ~0ULL;
        u32 vbits = 0;
        for (u64 w = w0; w < w1; ++w) {
            const u64 live = n - w * 32 >= 32 ? 32 : n - w * 32;
            const u32 bits = p.def_max ? lv[w] : 0xffffffffu;
            for (u64 j = 0; j < live; ++j) {
                const u64 row = p.first_row + w * 32 + j;
                u64 key = 0;
                const bool ok = (bits >> j) & 1;
                if (ok) {
                    if (p.width == PQ_BYTES) {
                        key = pq_byte_key(p.encoding, b, ix, rank, dspans, dict_n, spans, row, err);
                    } else if (p.encoding == 1) {
                        const u32 di = ix[rank];
                        if (di >= dict_n) { pq_fail(err, PQ_ERR_DICT_INDEX); } else { key = pq_value(dict + (u64)di * p.width, p.width); }
                    } else if (p.encoding == 2) {
                        key = dv[rank];
                    } else if (p.encoding == 3) {
                        key = ix[rank] & 1;
                    } else {
                        key = pq_plain(b + vals, rank, p.width);
                    }
                    ++rank;
                }
                out[row] = key;
                if (p.def_max) {
                    // One atomic per output word this thread touches (pages need not start on a word).
                    if ((row >> 5) != vword) {
                        if (vbits) atomicOr(&valid[vword], vbits);
                        vword = row >> 5;
                        vbits = 0;
                    }
                    if (ok) vbits |= 1u << (row & 31);
                }
            }
        }
        if (vbits) atomicOr(&valid[vword], vbits);
        __syncthreads();
    }
}
