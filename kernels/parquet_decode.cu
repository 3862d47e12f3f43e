// Parquet pages decoded on the device into the selection's 64-bit keys.
//
// The host (src/scan/) reads the needed column chunks, walks their page
// headers and uploads the raw bytes with one page table entry per page (the
// PqPage layout below, 16 u64 fields, written by src/scan/pages.rs). Three
// kernels, in order:
//   pq_copy_pages  one block per page: uncompressed bodies, and the never
//                  compressed level bytes of v2 pages, copied into `body`;
//   pq_snappy_serial  one thread per SNAPPY page (the default), or
//   pq_snappy      one block per SNAPPY page (SETFUSION_SNAPPY_BLOCK=1): the
//                  raw snappy stream after the v2 levels decompressed into `body`;
//   pq_decode      one block per data page: definition levels (RLE /
//                  bit-packed hybrid, bit width 1) into validity bits, then
//                  each non-NULL row's value (PLAIN, or a dictionary index
//                  looked up in its chunk's PLAIN dictionary page) as a
//                  sign-extended 64-bit key at the page's output rows; NULL
//                  rows get key 0 and no validity bit.
// Every loop over a block's work strides by blockDim, and the serial parts run
// on thread 0 between __syncthreads, so the same code runs on the host with one
// thread (scripts/kernels-on-host). Errors never fault: the first problem's
// code lands in err[0] (the host turns it into a clear error).
#include "common.cuh"

// PQ_RUNS (run descriptors per batch in shared memory) and PQ_SNAPPY_CMDS
// (snappy elements per batch) come from src/scan/decode.rs.

// How a snappy element's bytes are found (pq_snappy).
#define PQ_SNAPPY_INPUT 0   // in the compressed input (a literal, or a copy of one)
#define PQ_SNAPPY_BEFORE 1  // in the output before the batch, `offset` bytes back
#define PQ_SNAPPY_CHAIN 2   // followed back byte by byte
// Elements up to this many bytes are copied by one thread.
#define PQ_SNAPPY_SHORT 32

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
    u64 encoding;    // 0 PLAIN, 1 dictionary indices
    u64 num_values;  // values of the page, NULLs included (one per row: flat columns only)
    u64 first_row;   // output row of the page's first value
    u64 dict;        // page table index of the chunk's dictionary page (~0: none)
    u64 def_max;     // 0 required column, 1 optional
    u64 width;       // physical value bytes: 4 (INT32) or 8 (INT64)
    u64 lvl_word;    // first word of the page's validity scratch (def_max == 1)
    u64 idx_off;     // first entry of the page's dictionary index scratch
};

#define PQ_ERR_SNAPPY 1
#define PQ_ERR_SNAPPY_SIZE 2
#define PQ_ERR_LEVELS 3
#define PQ_ERR_VALUES 4
#define PQ_ERR_DICT_INDEX 5
#define PQ_ERR_BIT_WIDTH 6
#define PQ_ERR_NO_DICT 7

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

// One block per SNAPPY page. Thread 0 parses the next PQ_SNAPPY_CMDS elements
// (literals and copies) of the stream into shared memory, and resolves each
// copy as it goes: a copy whose source lies before the batch, or inside one
// earlier element of the batch, becomes a read of the input (that element is
// a literal) or of output before the batch (final). Then the threads fill
// the batch's bytes, with no byte waiting on another:
//   - short resolved elements one per thread (a page of integers is mostly
//     4-8 byte elements: the zero high bytes of each key are a copy of the
//     previous key's);
//   - long elements and unresolved copies (a source spanning elements, or
//     overlapping the copy itself) byte by byte over all threads, each
//     unresolved byte followed back element by element to a literal or to
//     the output before the batch.
// One thread per page, copying byte after byte, ran at 4.9 GB/s on an H100:
// every copy waited on the global memory it had just written.
extern "C" __global__ void pq_snappy(const u8* raw, u8* body, const PqPage* pages, u64 npages, u32* err) {
    __shared__ u64 c_out[PQ_SNAPPY_CMDS + 1];  // page output position where element k starts; [count]: where the batch ends
    __shared__ u64 c_src[PQ_SNAPPY_CMDS];      // PQ_SNAPPY_INPUT: input position of its first byte; else: its offset back
    __shared__ u8 c_kind[PQ_SNAPPY_CMDS];      // PQ_SNAPPY_INPUT, PQ_SNAPPY_BEFORE (source before the batch) or PQ_SNAPPY_CHAIN
    __shared__ u64 s_count, s_pos, s_out, s_status;
    for (u64 pi = blockIdx.x; pi < npages; pi += gridDim.x) {
        const PqPage p = pages[pi];
        if (p.codec != 1) continue;
        const bool sizes_ok = p.src_len >= p.levels_len && p.dst_len >= p.levels_len;
        const u8* src = raw + p.src + p.levels_len;
        u8* dst = body + p.dst + p.levels_len;
        const u64 n = sizes_ok ? p.src_len - p.levels_len : 0, cap = sizes_ok ? p.dst_len - p.levels_len : 0;
        if (threadIdx.x == 0) {
            u64 pos = 0, len = 0;
            s_status = 0;
            if (!sizes_ok || !pq_uvarint(src, n, &pos, &len)) s_status = PQ_ERR_SNAPPY;
            else if (len != cap) s_status = PQ_ERR_SNAPPY_SIZE;
            s_pos = pos;
            s_out = 0;
        }
        __syncthreads();
        while (s_status == 0) {
            if (threadIdx.x == 0) {
                u64 pos = s_pos, out = s_out, k = 0;
                while (k < PQ_SNAPPY_CMDS && pos < n) {
                    const u8 tag = src[pos++];
                    u64 length = 0, from = 0;
                    const u32 kind = tag & 3;
                    if (kind == 0) {
                        length = tag >> 2;
                        if (length >= 60) {
                            const u32 extra = (u32)length - 59;
                            if (pos + extra > n) { s_status = PQ_ERR_SNAPPY; break; }
                            length = 0;
                            for (u32 e = 0; e < extra; ++e) length |= (u64)src[pos + e] << (8 * e);
                            pos += extra;
                        }
                        length += 1;
                        if (pos + length > n || out + length > cap) { s_status = PQ_ERR_SNAPPY; break; }
                        from = pos;
                        pos += length;
                    } else {
                        const u32 extra = kind == 1 ? 1 : kind == 2 ? 2 : 4;
                        if (pos + extra > n) { s_status = PQ_ERR_SNAPPY; break; }
                        if (kind == 1) {
                            length = 4 + ((tag >> 2) & 7);
                            from = ((u64)(tag >> 5) << 8) | src[pos];
                        } else {
                            length = 1 + (tag >> 2);
                            for (u32 e = 0; e < extra; ++e) from |= (u64)src[pos + e] << (8 * e);
                        }
                        pos += extra;
                        if (from == 0 || from > out || out + length > cap) { s_status = PQ_ERR_SNAPPY; break; }
                    }
                    u8 how = kind == 0 ? PQ_SNAPPY_INPUT : PQ_SNAPPY_CHAIN;
                    if (kind != 0) {
                        // Resolve the copy from the source's side: [s, s + length).
                        const u64 s0 = out - from, lo0 = k == 0 ? out : c_out[0];
                        if (s0 + length <= lo0) {
                            how = PQ_SNAPPY_BEFORE;
                        } else if (s0 >= lo0 && s0 + length <= out) {
                            u64 j = k - 1;  // the element holding s0: usually one of the last few
                            while (c_out[j] > s0) --j;
                            const u64 end_j = j + 1 < k ? c_out[j + 1] : out;
                            if (s0 + length <= end_j && c_kind[j] != PQ_SNAPPY_CHAIN) {
                                if (c_kind[j] == PQ_SNAPPY_INPUT) {
                                    how = PQ_SNAPPY_INPUT;
                                    from = c_src[j] + (s0 - c_out[j]);
                                } else {
                                    how = PQ_SNAPPY_BEFORE;
                                    from += c_src[j];
                                }
                            }
                        }
                    }
                    c_out[k] = out;
                    c_src[k] = from;
                    c_kind[k] = how;
                    out += length;
                    ++k;
                }
                c_out[k] = out;
                s_count = k;
                s_pos = pos;
                s_out = out;
            }
            __syncthreads();
            const u64 count = s_count;
            if (s_status != 0 || count == 0) break;
            const u64 lo = c_out[0];
            // Short resolved elements: one per thread.
            for (u64 e = threadIdx.x; e < count; e += blockDim.x) {
                const u64 a = c_out[e], len = c_out[e + 1] - a;
                if (len > PQ_SNAPPY_SHORT || c_kind[e] == PQ_SNAPPY_CHAIN) continue;
                const u8* from = c_kind[e] == PQ_SNAPPY_INPUT ? src + c_src[e] : dst + a - c_src[e];
                // Eight loads before eight stores: the loads (often of bytes the
                // previous batch just wrote, served by L2) overlap instead of
                // each waiting behind the store before it.
                for (u64 t = 0; t < len; t += 8) {
                    const u64 m = len - t < 8 ? len - t : 8;
                    u64 w = 0;
                    for (u64 j = 0; j < m; ++j) w |= (u64)from[t + j] << (8 * j);
                    for (u64 j = 0; j < m; ++j) dst[a + t + j] = (u8)(w >> (8 * j));
                }
            }
            // The rest byte by byte over all threads.
            for (u64 e = 0; e < count; ++e) {
                const u64 a = c_out[e], len = c_out[e + 1] - a;
                if (len <= PQ_SNAPPY_SHORT && c_kind[e] != PQ_SNAPPY_CHAIN) continue;
                for (u64 q0 = a + threadIdx.x; q0 < a + len; q0 += blockDim.x) {
                    u64 q = q0, el = e;
                    u8 v;
                    for (;;) {
                        if (c_kind[el] == PQ_SNAPPY_INPUT) { v = src[c_src[el] + (q - c_out[el])]; break; }
                        if (c_kind[el] == PQ_SNAPPY_BEFORE) { v = dst[q - c_src[el]]; break; }
                        // A copy overlapping itself repeats the `offset` bytes before it:
                        // jump straight to the first source position below the element.
                        const u64 off = c_src[el], start = c_out[el];
                        q = q - start >= off ? start - off + (q - start) % off : q - off;  // q falls, so this ends
                        if (q < lo) { v = dst[q]; break; }
                        u64 x = 0, y = el + 1;  // c_out[x] <= q < c_out[y]
                        while (y - x > 1) {
                            const u64 m = (x + y) >> 1;
                            if (c_out[m] <= q) x = m; else y = m;
                        }
                        el = x;
                    }
                    dst[q0] = v;
                }
            }
            // This batch's bytes are final before the next batch reads them.
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            if (s_status) pq_fail(err, (u32)s_status);
            else if (s_out != cap) pq_fail(err, PQ_ERR_SNAPPY_SIZE);
        }
        __syncthreads();
    }
}

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

// One thread per page, each copy byte after byte: the launcher's default (on
// an H200 it decoded 100M keys in 130 ms, pq_snappy above in 190-230 ms; see
// src/scan/decode.rs). Only snappy pages do work.
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

// One block per page. levels: validity scratch (zeroed), one bit per value of
// pages with def_max; idx: dictionary index scratch; out: keys of every row;
// valid: validity words of every row (zeroed; written only for optional columns).
extern "C" __global__ void pq_decode(const u8* body, const PqPage* pages, u64 npages, u32* levels, u32* idx, u64* out, u32* valid, u32* err) {
    __shared__ PqRun runs[PQ_RUNS];
    __shared__ u64 nruns_s, nonnull_s, got_s, status_s;
    __shared__ u32 counts[1024];
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
        u64 dict_n = 0;
        if (p.encoding == 1) {
            if (p.dict == ~0ULL || p.dict >= npages) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_NO_DICT); __syncthreads(); continue; }
            const PqPage d = pages[p.dict];
            dict = body + d.dst;
            dict_n = d.num_values;
            if (d.dst_len < dict_n * p.width) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES); __syncthreads(); continue; }
            u32* ix = idx + p.idx_off;
            u32 bw = vals < len ? b[vals] : 0;
            if (nonnull > 0 && (vals >= len || bw > 32)) { if (threadIdx.x == 0) pq_fail(err, PQ_ERR_BIT_WIDTH); __syncthreads(); continue; }
            u64 pos = vals + 1, got = 0;
            while (got < nonnull) {
                if (threadIdx.x == 0) {
                    u64 k = 0;
                    while (k < PQ_RUNS && got < nonnull) {
                        if (!pq_next_run(b, len, &pos, bw, got, nonnull, &runs[k]) || runs[k].count == 0) { status_s = PQ_ERR_VALUES; break; }
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
                        ix[r.first + j] = r.packed ? (bw == 0 ? 0 : pq_unpack(b, len, r.at + j * bw, bw)) : (u32)r.at;
                }
                __syncthreads();
            }
            if (status_s) { if (threadIdx.x == 0) pq_fail(err, (u32)status_s); __syncthreads(); continue; }
        } else if (len < vals || (len - vals) / p.width < nonnull) {
            if (threadIdx.x == 0) pq_fail(err, PQ_ERR_VALUES);
            __syncthreads();
            continue;
        }
        const u32* ix = idx + p.idx_off;
        if (nonnull == n) {
            // No NULL in the page: value i is row i's, written coalesced.
            for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
                u64 key = 0;
                if (p.encoding == 1) {
                    const u32 di = ix[i];
                    if (di >= dict_n) pq_fail(err, PQ_ERR_DICT_INDEX); else key = pq_value(dict + (u64)di * p.width, p.width);
                } else {
                    key = pq_value(b + vals + i * p.width, p.width);
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
                    if (p.encoding == 1) {
                        const u32 di = ix[rank];
                        if (di >= dict_n) { pq_fail(err, PQ_ERR_DICT_INDEX); } else { key = pq_value(dict + (u64)di * p.width, p.width); }
                    } else {
                        key = pq_value(b + vals + rank * p.width, p.width);
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
