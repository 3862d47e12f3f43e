// ZSTD frames (RFC 8878) decompressed on the device, one warp per frame run.
//
// The Parquet device scan (src/scan/decode.rs) launches zs_pages over its
// page table: each ZSTD page's stream (after the never compressed v2 levels)
// is one or more frames, decompressed into the page's place in `body`.
//
// A warp's work on one run of frames:
//   - lane 0 parses: frame and block headers, the literals section (its
//     Huffman table built from the weights, themselves FSE-coded), the
//     sequences section's three FSE tables, then the sequences themselves,
//     32 at a time, with the repeat offsets resolved. The sequences' bit
//     stream is one chain of states: it cannot be split.
//   - Huffman-coded literals: one lane per stream (four streams: four lanes),
//     written at the END of the run's output space ([dlen - literals, dlen)):
//     output never overtakes the literals it has still to read (the bytes
//     still to come, this block's remaining literals among them, fill the
//     space after it), so no scratch is needed. A run whose output does not
//     end exactly at dlen fails, and only such a run could break that order.
//   - each batch of sequences (lane 0 decodes them with one bit-reader
//     check per field group and its checks gathered into flags tested once
//     a batch): its output a byte a lane a step, in order; a literal byte
//     reads its literal, a match byte its source, which is either final
//     (before the step) or another lane's byte of the step, found by
//     pointer jumping (zs_batch). A batch of literals alone is copied
//     ZS_LIT_STEP bytes a lane a step.
//   - output goes to a ring in shared memory (ZS_RING bytes a warp), flushed
//     to `body` in coalesced stores when a batch would not fit beside what it
//     holds: matches read their sources from it (integer columns' are mostly
//     a few bytes back: their high zero bytes) or, before the flushed point,
//     from `body`. A batch longer than the ring is written to `body`
//     directly. One 160 KB page of integer keys (~19K sequences) takes ~7.9
//     ms alone on an H200 (lane 0's sequences ~3.7 of it, the batches ~3.4,
//     Huffman ~0.8); 5000 pages in one launch 33.5 ms, 23.9 GB/s of output
//     (benches/cuda/page_decompress_bench.cu). The device scan uses it by
//     default (SETFUSION_DEVICE_ZSTD=0: host threads inflate instead).
//   - raw and RLE blocks, and each block's last literals, are batches of one
//     sequence with no match.
// Offsets are 32-bit (a Parquet page is at most 2 GiB). Errors never fault:
// every read is bounded by its run, every write by its output, and the first
// problem's code lands in err[0] (src/scan/decode.rs turns it into a clear
// error). Checksums (XXH64) are skipped; dictionaries are refused.
//
// All control flow is uniform in the warp (lane 0's results reach the other
// lanes through shared memory between __syncwarp calls), so the same code
// runs on the host with one thread or an emulated warp
// (scripts/kernels-on-host/zstd.sh).
#include "common.cuh"

typedef unsigned char u8;
typedef unsigned short u16;

// ZS_WARPS (warps per block, each with its own tables and ring) comes from
// src/scan/decode.rs.
// Output bytes each warp keeps in shared memory (a power of two).
#ifndef ZS_RING
#define ZS_RING 4096
#endif
#define ZS_BATCH 32
// Literal bytes each lane copies a step.
#define ZS_LIT_STEP 4

#ifdef __CUDA_ARCH__
#define ZS_LANES 32u
#define ZS_CONST __constant__
#else
#define ZS_LANES (blockDim.x < 32 ? blockDim.x : 32u)
#define ZS_CONST static const
#endif

// Error codes (after parquet_decode.cu's).
#define ZS_ERR_CORRUPT 12
#define ZS_ERR_SIZE 13
#define ZS_ERR_DICTIONARY 14

#define ZS_HUF_MAX 11
#define ZS_LL_MAX_LOG 9
#define ZS_OF_MAX_LOG 8
#define ZS_ML_MAX_LOG 9

ZS_CONST u32 ZS_LL_BASE[36] = {0,  1,  2,  3,  4,  5,   6,   7,   8,   9,    10,   11,   12,   13,     14,     15,     16,    18,
                               20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
ZS_CONST u8 ZS_LL_BITS[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  0,  1,  1,
                              1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
ZS_CONST u32 ZS_ML_BASE[53] = {3,  4,  5,  6,  7,  8,  9,  10, 11, 12,  13,  14,  15,  16,   17,   18,   19,   20,
                               21, 22, 23, 24, 25, 26, 27, 28, 29, 30,  31,  32,  33,  34,   35,   37,   39,   41,
                               43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
ZS_CONST u8 ZS_ML_BITS[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  0,  0,  0,  0,
                              0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// The predefined distributions (RFC 8878 3.1.1.3.2.2).
ZS_CONST short ZS_LL_NORM[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2,  2,
                                 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
ZS_CONST short ZS_ML_NORM[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,  1,  1,  1,  1,  1,  1,  1, 1,
                                 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
ZS_CONST short ZS_OF_NORM[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

// One FSE decoding table cell: the symbol, the bits to read for the next
// state, and the next state's base.
struct ZsFse {
    u16 base;
    u8 sym;
    u8 bits;
};

// What lane 0 hands the warp: Huffman streams to decode, or a batch.
#define ZS_TASK_DONE 0
#define ZS_TASK_HUF 1
#define ZS_TASK_BATCH 2
// Where a batch's literal bytes come from.
#define ZS_LIT_SRC 0   // the input (raw literals, raw blocks)
#define ZS_LIT_RLE 1   // one byte repeated
#define ZS_LIT_DST 2   // the Huffman-decoded literals at the end of the output space

struct ZsWarp {
    u16 huf[1 << ZS_HUF_MAX];  // (symbol << 4) | bits, indexed by the next ZS_HUF_MAX... bits (huf_log)
    ZsFse ll[1 << ZS_LL_MAX_LOG], of[1 << ZS_OF_MAX_LOG], ml[1 << ZS_ML_MAX_LOG];
    ZsFse hw[1 << 6];           // the Huffman weights' table
    u32 seq_ml[ZS_BATCH + 1], seq_off[ZS_BATCH + 1];
    u32 lit_at[ZS_BATCH + 2], out_at[ZS_BATCH + 2];  // batch-relative starts; [k]: the totals
    u8 ring[ZS_RING];
    // Output before `flushed` is in dst; [flushed, written) only in the ring.
    u32 flushed, written;
    // The task.
    u32 task, fail;
    u32 nseq;                           // sequences in the batch (the last-literals one included)
    u32 out0;                           // the batch's first output position
    u32 lit_kind, lit0;                 // literal source and the batch's first literal's offset in it
    u32 lit_byte;
    u32 huf_log, nstreams;
    u32 hs_at[4], hs_len[4], hs_out[4], hs_n[4];
};

__device__ __forceinline__ u32 zs_highbit(u32 x) { return 31 - __clz((int)x); }

// The little-endian value of the n <= 8 bytes at s[at..].
__device__ __forceinline__ u64 zs_le(const u8* s, u32 at, u32 n) {
    u64 v = 0;
    for (u32 k = 0; k < n; ++k) v |= (u64)s[at + k] << (8 * k);
    return v;
}

// Bits [bit, bit + n) (n <= 32) of s[0..len) read forward, zeros past the end.
__device__ __forceinline__ u32 zs_fwd(const u8* s, u32 len, u32 bit, u32 n) {
    u64 v = 0;
    const u32 byte = bit >> 3;
    for (u32 k = 0; k < 5; ++k)
        if (byte + k < len) v |= (u64)s[byte + k] << (8 * k);
    return (u32)((v >> (bit & 7)) & ((1ull << n) - 1));
}

// A backward bit stream (Huffman streams, FSE streams): bits are read from
// the end down, zeros below the start. Positions are 32-bit (a stream lies
// in one block: at most 128 KiB). `c` holds bits [lo, lo + 64); a refill
// leaves at least 57 of them at or below `pos`, so a caller may take up to
// n <= 57 bits after `zs_need(b, n)` without another check.
struct ZsBits {
    const u8* s;
    int len, pos, lo;
    u64 c;
};

// Starts `b` at the stream's last set bit (its end marker); false if the last byte is 0.
__device__ __forceinline__ bool zs_bits_init(ZsBits& b, const u8* s, u32 len) {
    b.s = s;
    b.len = (int)len;
    b.c = 0;
    if (len == 0 || s[len - 1] == 0) return false;
    b.pos = (int)len * 8 - 8 + (int)zs_highbit(s[len - 1]);
    b.lo = b.pos + 1;  // the first peek refills
    return true;
}

// The little-endian u64 of s[at..at + 8), bytes outside [0, len) zero. Inside
// the stream it takes the two aligned words around it where both lie in the
// stream (one where it is aligned), else byte by byte: nothing outside the
// stream is read.
__device__ __forceinline__ u64 zs_le64(const u8* s, int len, int at) {
    if (at >= 0 && at + 8 <= len) {
        const u8* p = s + at;
        const unsigned long long addr = (unsigned long long)p;
        const u32 sh = (u32)(addr & 7) * 8;
        const u64* a = (const u64*)(addr & ~7ull);
        if (sh == 0) return *a;
        if ((const u8*)a >= s && (const u8*)(a + 2) <= s + len) return (a[0] >> sh) | (a[1] << (64 - sh));
        // The aligned words reach outside the stream: byte by byte, below.
    }
    u64 v = 0;
    for (int k = 7; k >= 0; --k) {
        const int j = at + k;
        v = (v << 8) | (u64)((j >= 0 && j < len) ? s[j] : 0);
    }
    return v;
}

__device__ __forceinline__ void zs_refill(ZsBits& b) {
    const int hi = (b.pos + 7) >> 3;  // (arithmetic: below the start too)
    b.lo = hi * 8 - 64;
    b.c = zs_le64(b.s, b.len, hi - 8);
}

// At least n <= 57 bits at or below pos in `c`.
__device__ __forceinline__ void zs_need(ZsBits& b, u32 n) {
    if (b.pos - b.lo < (int)n) zs_refill(b);
}

// The n <= 32 bits below pos, without consuming them or checking `c` holds them.
__device__ __forceinline__ u32 zs_look(const ZsBits& b, u32 n) {
    return n ? (u32)((b.c >> (u32)(b.pos - (int)n - b.lo)) & ((1ull << n) - 1)) : 0;
}

// The n <= 32 bits below pos, without consuming them.
__device__ __forceinline__ u32 zs_peek(ZsBits& b, u32 n) {
    if (b.pos - (int)n < b.lo) zs_refill(b);
    return zs_look(b, n);
}

__device__ __forceinline__ u32 zs_read(ZsBits& b, u32 n) {
    const u32 v = zs_peek(b, n);
    b.pos -= (int)n;
    return v;
}

// zs_read of bits `c` already holds (zs_need made sure of them).
__device__ __forceinline__ u32 zs_take(ZsBits& b, u32 n) {
    const u32 v = zs_look(b, n);
    b.pos -= (int)n;
    return v;
}

// An FSE table description (forward bits at s[0..len)) into norm[0..*nsym)
// and *log; returns the bytes it took, 0 if corrupt.
__device__ u32 zs_read_ncount(const u8* s, u32 len, u32 max_log, u32 max_sym, short* norm, u32* nsym, u32* log) {
    if (len == 0) return 0;
    for (u32 i = 0; i < max_sym; ++i) norm[i] = 0;
    u32 bit = 4;
    const u32 al = zs_fwd(s, len, 0, 4) + 5;
    if (al > max_log) return 0;
    int remaining = (1 << al) + 1;
    int threshold = 1 << al;
    u32 nb = al + 1;
    u32 sym = 0;
    bool prev0 = false;
    for (;;) {
        if (prev0) {
            u32 rep;
            do {
                rep = zs_fwd(s, len, bit, 2);
                bit += 2;
                sym += rep;
                if (bit > len * 8 || sym >= max_sym) return 0;
            } while (rep == 3);
        }
        const int max = (2 * threshold - 1) - remaining;
        const u32 v = zs_fwd(s, len, bit, nb);
        int count;
        if ((int)(v & (threshold - 1)) < max) {
            count = v & (threshold - 1);
            bit += nb - 1;
        } else {
            count = v & (2 * threshold - 1);
            if (count >= threshold) count -= max;
            bit += nb;
        }
        count--;
        remaining -= count < 0 ? -count : count;
        norm[sym++] = (short)count;
        prev0 = count == 0;
        if (remaining < threshold) {
            if (remaining <= 1) break;
            nb = zs_highbit(remaining) + 1;
            threshold = 1 << (nb - 1);
        }
        if (sym >= max_sym) break;
    }
    if (remaining != 1 || bit > len * 8) return 0;
    *nsym = sym;
    *log = al;
    return (bit + 7) >> 3;
}

// An FSE decoding table from normalized counts (their sum of magnitudes is 1 << log).
__device__ bool zs_build_fse(ZsFse* t, const short* norm, u32 nsym, u32 log) {
    const int size = 1 << log;
    u16 next[64];
    int high = size - 1;
    for (u32 s = 0; s < nsym; ++s) {
        if (norm[s] == -1) {
            t[high--].sym = (u8)s;
            next[s] = 1;
        } else {
            next[s] = (u16)norm[s];
        }
    }
    const int step = (size >> 1) + (size >> 3) + 3, mask = size - 1;
    int pos = 0;
    for (u32 s = 0; s < nsym; ++s) {
        for (int i = 0; i < norm[s]; ++i) {
            t[pos].sym = (u8)s;
            do pos = (pos + step) & mask;
            while (pos > high);
        }
    }
    if (pos != 0) return false;
    for (int u = 0; u < size; ++u) {
        const u32 ns = next[t[u].sym]++;
        const u32 nb = log - zs_highbit(ns);
        t[u].bits = (u8)nb;
        t[u].base = (u16)((ns << nb) - size);
    }
    return true;
}

// A table of one symbol (RLE mode).
__device__ __forceinline__ void zs_build_rle(ZsFse* t, u8 sym) {
    t[0].sym = sym;
    t[0].bits = 0;
    t[0].base = 0;
}

// The Huffman table from n explicit weights (the last symbol's is implied);
// returns its log (the longest code), 0 if corrupt.
__device__ u32 zs_build_huf(u16* huf, const u8* w, u32 n) {
    if (n == 0 || n > 255) return 0;
    u32 sum = 0;
    for (u32 i = 0; i < n; ++i) {
        if (w[i] > ZS_HUF_MAX) return 0;
        sum += w[i] ? 1u << (w[i] - 1) : 0;
    }
    if (sum == 0) return 0;
    const u32 maxb = zs_highbit(sum) + 1;
    const u32 left = (1u << maxb) - sum;
    if (left & (left - 1)) return 0;
    const u32 last_w = zs_highbit(left) + 1;
    u32 rank_count[ZS_HUF_MAX + 2];
    for (u32 i = 0; i <= ZS_HUF_MAX + 1; ++i) rank_count[i] = 0;
    u32 log = 0;
    for (u32 i = 0; i <= n; ++i) {
        const u32 wi = i < n ? w[i] : last_w;
        const u32 bits = wi ? maxb + 1 - wi : 0;
        if (bits > ZS_HUF_MAX) return 0;
        if (bits > log) log = bits;
        rank_count[bits]++;
    }
    u32 rank_at[ZS_HUF_MAX + 2];
    rank_at[log] = 0;
    for (u32 i = log; i >= 1; --i) rank_at[i - 1] = rank_at[i] + (rank_count[i] << (log - i));
    if (rank_at[0] != (1u << log)) return 0;
    for (u32 i = 0; i <= n; ++i) {
        const u32 wi = i < n ? w[i] : last_w;
        if (!wi) continue;
        const u32 bits = maxb + 1 - wi;
        const u32 code = rank_at[bits], len = 1u << (log - bits);
        for (u32 j = 0; j < len; ++j) huf[code + j] = (u16)((i << 4) | bits);
        rank_at[bits] += len;
    }
    return log;
}

// The Huffman tree description at s[0..len): returns the bytes it took
// (0 if corrupt) and the table's log in *log.
__device__ u32 zs_read_huf(ZsWarp& sh, const u8* s, u32 len, u32* log) {
    if (len == 0) return 0;
    const u32 hb = s[0];
    u8 w[256];
    u32 n = 0;
    u32 took;
    if (hb >= 128) {
        n = hb - 127;
        took = 1 + (n + 1) / 2;
        if (took > len) return 0;
        for (u32 i = 0; i < n; ++i) w[i] = (i & 1) ? (s[1 + i / 2] & 15) : (s[1 + i / 2] >> 4);
    } else {
        took = 1 + hb;
        if (took > len || hb == 0) return 0;
        short norm[16];
        u32 nsym, al;
        const u32 desc = zs_read_ncount(s + 1, hb, 6, 16, norm, &nsym, &al);
        if (!desc || !zs_build_fse(sh.hw, norm, nsym, al)) return 0;
        ZsBits b;
        if (!zs_bits_init(b, s + 1 + desc, hb - desc)) return 0;
        u32 s1 = zs_read(b, al), s2 = zs_read(b, al);
        for (;;) {
            if (n > 253) return 0;
            w[n++] = sh.hw[s1].sym;
            s1 = sh.hw[s1].base + zs_read(b, sh.hw[s1].bits);
            if (b.pos < 0) {
                w[n++] = sh.hw[s2].sym;
                break;
            }
            w[n++] = sh.hw[s2].sym;
            s2 = sh.hw[s2].base + zs_read(b, sh.hw[s2].bits);
            if (b.pos < 0) {
                w[n++] = sh.hw[s1].sym;
                break;
            }
        }
    }
    *log = zs_build_huf(sh.huf, w, n);
    return *log ? took : 0;
}

// One Huffman stream of n symbols into out; false unless it is consumed exactly.
// One check serves five symbols (codes of at most ZS_HUF_MAX = 11 bits: the
// fifth looks at ZS_HUF_MAX bits after four codes).
__device__ bool zs_huf_stream(const u16* huf, u32 log, const u8* s, u32 len, u8* out, u32 n) {
    ZsBits b;
    if (!zs_bits_init(b, s, len)) return false;
    u32 i = 0;
    for (; i + 5 <= n; i += 5) {
        zs_need(b, 5 * ZS_HUF_MAX);
#pragma unroll
        for (u32 k = 0; k < 5; ++k) {
            const u32 e = huf[zs_look(b, log)];
            out[i + k] = (u8)(e >> 4);
            b.pos -= (int)(e & 15);
        }
    }
    for (; i < n; ++i) {
        const u32 e = huf[zs_peek(b, log)];
        out[i] = (u8)(e >> 4);
        b.pos -= (int)(e & 15);
    }
    return b.pos == 0;
}

// Lane 0's state over a run of frames.
struct ZsState {
    u32 ip, o, phase;
    u32 frame_start, frame_size;  // frame_size: ~0 when the header has none
    u32 checksum, last_block, block_end;
    u32 rep[3];
    bool huf_ok, ll_ok, of_ok, ml_ok;
    u32 huf_log, ll_log, of_log, ml_log;
    // The block's literals and sequences.
    u32 lit_kind, lit_at, lit_n, lit_pos, lit_byte;
    u32 nseq, done, tail_done;
    u32 sll, sof, sml;
    ZsBits bits;
};

#define ZS_PHASE_FRAME 0
#define ZS_PHASE_BLOCK 1
#define ZS_PHASE_SEQ 2
#define ZS_PHASE_END 3

// One FSE table of the sequences section: mode 0 predefined, 1 RLE, 2 described, 3 repeat.
__device__ bool zs_seq_table(ZsFse* t, u32 mode, const u8* s, u32* p, u32 end, const short* def, u32 def_n, u32 def_log,
                             u32 max_log, u32 max_sym, bool* ok, u32* log) {
    if (mode == 0) {
        short norm[64];
        for (u32 i = 0; i < def_n; ++i) norm[i] = def[i];
        *ok = zs_build_fse(t, norm, def_n, def_log);
        *log = def_log;
    } else if (mode == 1) {
        if (*p >= end || s[*p] >= max_sym) return false;
        zs_build_rle(t, s[(*p)++]);
        *ok = true;
        *log = 0;
    } else if (mode == 2) {
        short norm[64];
        u32 nsym, al;
        const u32 took = zs_read_ncount(s + *p, end - *p, max_log, max_sym, norm, &nsym, &al);
        if (!took) return false;
        *p += took;
        *ok = zs_build_fse(t, norm, nsym, al);
        *log = al;
    }
    return *ok;
}

// A batch of one sequence without a match: n literal bytes from `kind` at `at`.
__device__ __forceinline__ void zs_literal_batch(ZsWarp& sh, ZsState& st, u32 kind, u32 at, u32 byte, u32 n) {
    sh.lit_kind = kind;
    sh.lit0 = at;
    sh.lit_byte = byte;
    sh.nseq = 1;
    sh.out0 = st.o;
    sh.lit_at[0] = 0;
    sh.out_at[0] = 0;
    sh.seq_ml[0] = 0;
    sh.seq_off[0] = 0;
    sh.lit_at[1] = n;
    sh.out_at[1] = n;
    st.o += n;
    sh.task = ZS_TASK_BATCH;
}

// Lane 0: the next task of the run src[0..slen) -> dst[0..dlen); ZS_TASK_DONE
// with sh.fail set on an error.
__device__ void zs_step(ZsWarp& sh, ZsState& st, const u8* src, u32 slen, u32 dlen) {
#define ZS_FAIL(code)      \
    do {                   \
        sh.fail = (code);  \
        sh.task = ZS_TASK_DONE; \
        return;            \
    } while (0)
    for (;;) {
        if (st.phase == ZS_PHASE_FRAME) {
            if (st.ip == slen) {
                if (st.o != dlen) ZS_FAIL(ZS_ERR_SIZE);
                sh.task = ZS_TASK_DONE;
                return;
            }
            if (slen - st.ip < 5) ZS_FAIL(ZS_ERR_CORRUPT);
            const u32 magic = (u32)zs_le(src, st.ip, 4);
            if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) {
                if (slen - st.ip < 8) ZS_FAIL(ZS_ERR_CORRUPT);
                const u32 skip = (u32)zs_le(src, st.ip + 4, 4);
                if (skip > slen - st.ip - 8) ZS_FAIL(ZS_ERR_CORRUPT);
                st.ip += 8 + skip;
                continue;
            }
            if (magic != 0xFD2FB528u) ZS_FAIL(ZS_ERR_CORRUPT);
            const u32 fhd = src[st.ip + 4];
            st.ip += 5;
            if (fhd & 8) ZS_FAIL(ZS_ERR_CORRUPT);
            const u32 single = (fhd >> 5) & 1, fcs_flag = fhd >> 6, did_flag = fhd & 3;
            const u32 did_size = did_flag == 3 ? 4 : did_flag;
            const u32 fcs_size = fcs_flag == 0 ? single : (1u << fcs_flag);
            const u32 need = (single ? 0 : 1) + did_size + fcs_size;
            if (slen - st.ip < need) ZS_FAIL(ZS_ERR_CORRUPT);
            st.ip += single ? 0 : 1;
            if (did_size && zs_le(src, st.ip, did_size) != 0) ZS_FAIL(ZS_ERR_DICTIONARY);
            st.ip += did_size;
            st.frame_size = ~0u;
            if (fcs_size) {
                u64 fcs = zs_le(src, st.ip, fcs_size) + (fcs_size == 2 ? 256 : 0);
                if (fcs > dlen - st.o) ZS_FAIL(ZS_ERR_SIZE);
                st.frame_size = (u32)fcs;
            }
            st.ip += fcs_size;
            st.checksum = (fhd >> 2) & 1;
            st.frame_start = st.o;
            st.rep[0] = 1;
            st.rep[1] = 4;
            st.rep[2] = 8;
            st.huf_ok = st.ll_ok = st.of_ok = st.ml_ok = false;
            st.phase = ZS_PHASE_BLOCK;
            continue;
        }
        if (st.phase == ZS_PHASE_END) {
            if (st.checksum) {
                if (slen - st.ip < 4) ZS_FAIL(ZS_ERR_CORRUPT);
                st.ip += 4;
            }
            if (st.frame_size != ~0u && st.o - st.frame_start != st.frame_size) ZS_FAIL(ZS_ERR_SIZE);
            st.phase = ZS_PHASE_FRAME;
            continue;
        }
        if (st.phase == ZS_PHASE_BLOCK) {
            if (slen - st.ip < 3) ZS_FAIL(ZS_ERR_CORRUPT);
            const u32 h = (u32)zs_le(src, st.ip, 3);
            st.ip += 3;
            st.last_block = h & 1;
            const u32 type = (h >> 1) & 3, size = h >> 3;
            if (type == 3 || size > (128u << 10)) ZS_FAIL(ZS_ERR_CORRUPT);
            if (type == 0 || type == 1) {
                const u32 in = type == 0 ? size : 1;
                if (slen - st.ip < in) ZS_FAIL(ZS_ERR_CORRUPT);
                if (size > dlen - st.o) ZS_FAIL(ZS_ERR_SIZE);
                zs_literal_batch(sh, st, type == 0 ? ZS_LIT_SRC : ZS_LIT_RLE, st.ip, type == 1 ? src[st.ip] : 0, size);
                st.ip += in;
                st.phase = st.last_block ? ZS_PHASE_END : ZS_PHASE_BLOCK;
                return;
            }
            // A compressed block: its literals section.
            if (slen - st.ip < size || size < 2) ZS_FAIL(ZS_ERR_CORRUPT);
            const u32 end = st.ip + size;
            st.block_end = end;
            u32 p = st.ip;
            const u32 b0 = src[p];
            const u32 ltype = b0 & 3, sf = (b0 >> 2) & 3;
            bool huf_task = false;
            if (ltype <= 1) {
                u32 n, hdr;
                if (sf == 0 || sf == 2) {
                    n = b0 >> 3;
                    hdr = 1;
                } else if (sf == 1) {
                    if (end - p < 2) ZS_FAIL(ZS_ERR_CORRUPT);
                    n = (b0 >> 4) + ((u32)src[p + 1] << 4);
                    hdr = 2;
                } else {
                    if (end - p < 3) ZS_FAIL(ZS_ERR_CORRUPT);
                    n = (b0 >> 4) + ((u32)src[p + 1] << 4) + ((u32)src[p + 2] << 12);
                    hdr = 3;
                }
                p += hdr;
                const u32 in = ltype == 0 ? n : 1;
                if (end - p < in) ZS_FAIL(ZS_ERR_CORRUPT);
                st.lit_kind = ltype == 0 ? ZS_LIT_SRC : ZS_LIT_RLE;
                st.lit_at = p;
                st.lit_byte = ltype == 1 ? src[p] : 0;
                st.lit_n = n;
                p += in;
            } else {
                // Sizes of 10 bits (one stream, or four), 14 or 18 bits (four streams).
                const u32 hdr = sf <= 1 ? 3 : sf + 2, nbits = sf <= 1 ? 10 : (sf == 2 ? 14 : 18);
                if (end - p < hdr) ZS_FAIL(ZS_ERR_CORRUPT);
                const u64 hv = zs_le(src, p, hdr);
                const u32 n = (u32)((hv >> 4) & ((1u << nbits) - 1));
                const u32 csize = (u32)((hv >> (4 + nbits)) & ((1u << nbits) - 1));
                p += hdr;
                if (end - p < csize || n > (128u << 10)) ZS_FAIL(ZS_ERR_CORRUPT);
                u32 q = p;
                if (ltype == 2) {
                    u32 log;
                    const u32 took = zs_read_huf(sh, src + q, csize, &log);
                    if (!took) ZS_FAIL(ZS_ERR_CORRUPT);
                    q += took;
                    st.huf_ok = true;
                    st.huf_log = log;
                } else if (!st.huf_ok) {
                    ZS_FAIL(ZS_ERR_CORRUPT);
                }
                const u32 total = p + csize - q;
                // The literals at the end of the output space.
                if (n > dlen - st.o) ZS_FAIL(ZS_ERR_SIZE);
                const u32 at = dlen - n;
                sh.huf_log = st.huf_log;
                if (sf == 0) {
                    sh.nstreams = 1;
                    sh.hs_at[0] = q;
                    sh.hs_len[0] = total;
                    sh.hs_out[0] = at;
                    sh.hs_n[0] = n;
                } else {
                    if (total < 6 || n < 6) ZS_FAIL(ZS_ERR_CORRUPT);
                    const u32 l1 = (u32)zs_le(src, q, 2), l2 = (u32)zs_le(src, q + 2, 2), l3 = (u32)zs_le(src, q + 4, 2);
                    if ((u64)l1 + l2 + l3 >= total - 6) ZS_FAIL(ZS_ERR_CORRUPT);
                    const u32 seg = (n + 3) / 4;
                    if (3 * seg > n) ZS_FAIL(ZS_ERR_CORRUPT);
                    sh.nstreams = 4;
                    const u32 lens[4] = {l1, l2, l3, total - 6 - l1 - l2 - l3};
                    u32 a = q + 6;
                    for (u32 k = 0; k < 4; ++k) {
                        sh.hs_at[k] = a;
                        sh.hs_len[k] = lens[k];
                        sh.hs_out[k] = at + k * seg;
                        sh.hs_n[k] = k < 3 ? seg : n - 3 * seg;
                        a += lens[k];
                    }
                }
                st.lit_kind = ZS_LIT_DST;
                st.lit_at = at;
                st.lit_n = n;
                st.lit_byte = 0;
                p += csize;
                huf_task = true;
            }
            st.lit_pos = 0;
            // The sequences section.
            if (p >= end) ZS_FAIL(ZS_ERR_CORRUPT);
            const u32 s0 = src[p];
            u32 nseq;
            if (s0 < 128) {
                nseq = s0;
                p += 1;
            } else if (s0 < 255) {
                if (end - p < 2) ZS_FAIL(ZS_ERR_CORRUPT);
                nseq = ((s0 - 128) << 8) + src[p + 1];
                p += 2;
            } else {
                if (end - p < 3) ZS_FAIL(ZS_ERR_CORRUPT);
                nseq = src[p + 1] + ((u32)src[p + 2] << 8) + 0x7F00;
                p += 3;
            }
            st.nseq = nseq;
            st.done = 0;
            st.tail_done = 0;
            if (nseq == 0) {
                if (p != end) ZS_FAIL(ZS_ERR_CORRUPT);
            } else {
                if (p >= end) ZS_FAIL(ZS_ERR_CORRUPT);
                const u32 modes = src[p++];
                if (modes & 3) ZS_FAIL(ZS_ERR_CORRUPT);
                if (!zs_seq_table(sh.ll, modes >> 6, src, &p, end, ZS_LL_NORM, 36, 6, ZS_LL_MAX_LOG, 36, &st.ll_ok, &st.ll_log))
                    ZS_FAIL(ZS_ERR_CORRUPT);
                if (!zs_seq_table(sh.of, (modes >> 4) & 3, src, &p, end, ZS_OF_NORM, 29, 5, ZS_OF_MAX_LOG, 32, &st.of_ok,
                                  &st.of_log))
                    ZS_FAIL(ZS_ERR_CORRUPT);
                if (!zs_seq_table(sh.ml, (modes >> 2) & 3, src, &p, end, ZS_ML_NORM, 53, 6, ZS_ML_MAX_LOG, 53, &st.ml_ok,
                                  &st.ml_log))
                    ZS_FAIL(ZS_ERR_CORRUPT);
                if (!zs_bits_init(st.bits, src + p, end - p)) ZS_FAIL(ZS_ERR_CORRUPT);
                st.sll = zs_read(st.bits, st.ll_log);
                st.sof = zs_read(st.bits, st.of_log);
                st.sml = zs_read(st.bits, st.ml_log);
            }
            st.ip = end;
            st.phase = ZS_PHASE_SEQ;
            if (huf_task) {
                sh.task = ZS_TASK_HUF;
                return;
            }
            continue;
        }
        // ZS_PHASE_SEQ: the next batch of the block's sequences.
        u32 k = 0, lit = 0, out = 0;
        sh.lit_kind = st.lit_kind;
        sh.lit0 = st.lit_at + (st.lit_kind == ZS_LIT_RLE ? 0 : st.lit_pos);
        sh.lit_byte = st.lit_byte;
        sh.out0 = st.o;
        {
            // The loop's state in registers (st, passed by reference, may live in local memory).
            ZsBits b = st.bits;
            u32 sll = st.sll, sof = st.sof, sml = st.sml, r0 = st.rep[0], r1 = st.rep[1], r2 = st.rep[2];
            u32 done = st.done, o = st.o, lit_pos = st.lit_pos;
            const u32 nseq = st.nseq, lit_n = st.lit_n, frame_start = st.frame_start;
            // Checks are gathered into `bad` and tested once after the loop (a bad
            // sequence only makes bad values here; the batch never runs then).
            u32 bad_corrupt = 0, bad_size = 0;
            while (k < ZS_BATCH && done < nseq) {
                const ZsFse el = sh.ll[sll], eo = sh.of[sof], em = sh.ml[sml];
                // The symbols are within their tables' (zs_build_fse takes at most max_sym).
                const u32 ls = sf_min<u32>(el.sym, 35), ms = sf_min<u32>(em.sym, 52), os = sf_min<u32>(eo.sym, 31);
                const u32 mlb = ZS_ML_BITS[ms], llb = ZS_LL_BITS[ls];
                // One check for the offset's and match length's extra bits (at most 31 + 16), one for
                // the literal length's, one for the three states' (at most 9 + 9 + 8).
                zs_need(b, os + mlb);
                const u32 ofv = (1u << os) + zs_take(b, os);
                const u32 mlv = ZS_ML_BASE[ms] + zs_take(b, mlb);
                zs_need(b, llb);
                const u32 llv = ZS_LL_BASE[ls] + zs_take(b, llb);
                done++;
                // The next states; the last sequence's are not in the stream, so its bits are given back.
                const u32 sb = (u32)el.bits + em.bits + eo.bits;
                zs_need(b, sb);
                const u32 nll = el.base + zs_take(b, el.bits);
                const u32 nml = em.base + zs_take(b, em.bits);
                const u32 nof = eo.base + zs_take(b, eo.bits);
                const bool more = done < nseq;
                sll = more ? nll : sll;
                sml = more ? nml : sml;
                sof = more ? nof : sof;
                b.pos += more ? 0 : (int)sb;
                // Repeat offsets (RFC 8878 3.1.1.5): idx 0-2 a repeat, 3 the first less one, 4 a new offset.
                const u32 idx = ofv > 3 ? 4 : ofv - 1 + (llv == 0);
                const u32 off = idx == 4 ? ofv - 3 : idx == 0 ? r0 : idx == 1 ? r1 : idx == 2 ? r2 : r0 - 1;
                const u32 n2 = idx >= 2 ? r1 : r2, n1 = idx >= 1 ? r0 : r1;
                r0 = off;
                r1 = n1;
                r2 = n2;
                bad_corrupt |= (u32)(llv > lit_n - lit_pos) | (u32)(off == 0) | (u32)(off > o + llv - frame_start);
                bad_size |= (u32)(llv + mlv > dlen - o);
                sh.lit_at[k] = lit;
                sh.out_at[k] = out;
                sh.seq_ml[k] = mlv;
                sh.seq_off[k] = off;
                lit += llv;
                out += llv + mlv;
                lit_pos += llv;
                o += llv + mlv;
                k++;
            }
            if (bad_corrupt) ZS_FAIL(ZS_ERR_CORRUPT);
            if (bad_size) ZS_FAIL(ZS_ERR_SIZE);
            st.bits = b;
            st.sll = sll;
            st.sof = sof;
            st.sml = sml;
            st.rep[0] = r0;
            st.rep[1] = r1;
            st.rep[2] = r2;
            st.done = done;
            st.o = o;
            st.lit_pos = lit_pos;
        }
        if (st.done == st.nseq) {
            if (st.nseq > 0 && st.bits.pos != 0) ZS_FAIL(ZS_ERR_CORRUPT);
            if (k < ZS_BATCH) {
                // The block's last literals: a sequence without a match.
                const u32 n = st.lit_n - st.lit_pos;
                if (n > dlen - st.o) ZS_FAIL(ZS_ERR_SIZE);
                sh.lit_at[k] = lit;
                sh.out_at[k] = out;
                sh.seq_ml[k] = 0;
                sh.seq_off[k] = 0;
                lit += n;
                out += n;
                st.lit_pos += n;
                st.o += n;
                k++;
                st.tail_done = 1;
            }
        }
        sh.lit_at[k] = lit;
        sh.out_at[k] = out;
        sh.nseq = k;
        if (st.tail_done) st.phase = st.last_block ? ZS_PHASE_END : ZS_PHASE_BLOCK;
        sh.task = ZS_TASK_BATCH;
        return;
    }
#undef ZS_FAIL
}

// Ring positions [sh.flushed, to) written to dst, by the whole warp.
__device__ __forceinline__ void zs_flush(ZsWarp& sh, u8* dst, u32 to, u32 lane, u32 lanes) {
    for (u32 p = sh.flushed + lane; p < to; p += lanes) dst[p] = sh.ring[p & (ZS_RING - 1)];
    __syncwarp();
    if (lane == 0) sh.flushed = to;
    __syncwarp();
}

// The warp runs a batch. Output goes to the ring, where positions
// [flushed, o0 + total) each keep a slot of their own (the ring is flushed to
// dst first when they would not fit); sources before `flushed` are read from
// dst. A batch longer than the ring is written to dst directly (after the
// ring is flushed).
//
// A batch of literals alone (raw and RLE blocks, a block's last literals)
// is copied ZS_LIT_STEP bytes a lane a step. Any other batch is written a
// byte a lane a step, in order (integer columns' sequences are a few literal
// bytes and a short match each: one step covers several sequences, where a
// step a match took ~270 ns a sequence on an H200): each byte finds its
// sequence by a search over the batch's output starts; a literal byte reads
// its literal, a match byte u of a match at m with offset d reads position
// m - d + (u mod d) (u itself when d >= the match's length), which is before
// m: final output when it is before the step (ring or dst), else another
// lane's byte of this step, found by pointer jumping over shuffles (a chain
// of at most lanes - 1 hops, strictly backwards).
__device__ void zs_batch(ZsWarp& sh, const u8* src, u8* dst, u32 lane, u32 lanes) {
    const u32 k = sh.nseq, o0 = sh.out0, kind = sh.lit_kind, lit0 = sh.lit0;
    const u8 rle = (u8)sh.lit_byte;
    const u32 total = sh.out_at[k];
    if ((u64)o0 + total - sh.flushed > ZS_RING) zs_flush(sh, dst, o0, lane, lanes);
    const bool direct = total > ZS_RING;
    const u32 flushed = sh.flushed;
    if (k == 1 && sh.seq_ml[0] == 0) {
        // Literals alone: all of a step's bytes loaded before any is stored
        // (a store lands at most on its own byte's place: on bytes already read).
        for (u32 base = 0; base < total; base += ZS_LIT_STEP * lanes) {
            u8 v[ZS_LIT_STEP];
            for (u32 r = 0; r < ZS_LIT_STEP; ++r) {
                const u32 t = base + r * lanes + lane;
                if (t < total) v[r] = kind == ZS_LIT_RLE ? rle : kind == ZS_LIT_SRC ? src[lit0 + t] : dst[lit0 + t];
            }
            __syncwarp();
            for (u32 r = 0; r < ZS_LIT_STEP; ++r) {
                const u32 t = base + r * lanes + lane;
                if (t < total) {
                    if (direct) dst[o0 + t] = v[r];
                    else sh.ring[(o0 + t) & (ZS_RING - 1)] = v[r];
                }
            }
            __syncwarp();
        }
    } else {
        const u32 full = 0xffffffffu;
        for (u32 s0 = 0; s0 < total; s0 += lanes) {
            const u32 r = s0 + lane, x = o0 + r;
            const bool active = r < total;
            // v | 1 << 31 once this lane has its byte, else the lane that has it.
            u32 got = 1u << 31;
            if (active) {
                // The last sequence whose output starts at or before r (sequences of no
                // output, a block's empty last literals, start where the next one does).
                u32 lo = 0, hi = k;  // out_at[lo] <= r < out_at[hi]
                while (hi - lo > 1) {
                    const u32 mid = (lo + hi) >> 1;
                    if (sh.out_at[mid] <= r) lo = mid;
                    else hi = mid;
                }
                const u32 ml = sh.seq_ml[lo], end = sh.out_at[lo + 1];
                if (r + ml < end) {
                    const u32 t = sh.lit_at[lo] + (r - sh.out_at[lo]);
                    got |= kind == ZS_LIT_RLE ? rle : kind == ZS_LIT_SRC ? src[lit0 + t] : dst[lit0 + t];
                } else {
                    const u32 d = sh.seq_off[lo], m = o0 + end - ml, u = x - m;
                    const u32 from = m - d + (d < ml ? u % d : u);
                    if (from < o0 + s0) got |= (direct || from < flushed) ? dst[from] : sh.ring[from & (ZS_RING - 1)];
                    else got = from - (o0 + s0);
                }
            }
            while (__ballot_sync(full, !(got >> 31)) != 0) {
                const u32 there = __shfl_sync(full, got, got & 31);
                if (!(got >> 31)) got = there;
            }
            if (active) {
                if (direct) dst[x] = (u8)got;
                else sh.ring[x & (ZS_RING - 1)] = (u8)got;
            }
            __syncwarp();
        }
    }
    if (lane == 0) {
        if (direct) sh.flushed = o0 + total;
        sh.written = o0 + total;
    }
}

// The frames at src[0..slen) into dst[0..dlen), by one warp.
__device__ void zs_run(ZsWarp& sh, const u8* src, u32 slen, u8* dst, u32 dlen, u32 lane, u32 lanes, u32* err) {
    ZsState st;
    st.ip = 0;
    st.o = 0;
    st.phase = ZS_PHASE_FRAME;
    if (lane == 0) {
        sh.fail = 0;
        sh.flushed = 0;
        sh.written = 0;
    }
    __syncwarp();
    for (;;) {
        if (lane == 0) zs_step(sh, st, src, slen, dlen);
        __syncwarp();
        const u32 task = sh.task;
        if (task == ZS_TASK_DONE) break;
        if (task == ZS_TASK_HUF) {
            for (u32 s = lane; s < sh.nstreams; s += lanes) {
                if (!zs_huf_stream(sh.huf, sh.huf_log, src + sh.hs_at[s], sh.hs_len[s], dst + sh.hs_out[s], sh.hs_n[s]))
                    sh.fail = ZS_ERR_CORRUPT;
            }
        } else {
            zs_batch(sh, src, dst, lane, lanes);
        }
        __syncwarp();
        const u32 failed = sh.fail;
        __syncwarp();
        if (failed) break;
    }
    if (!sh.fail) zs_flush(sh, dst, sh.written, lane, lanes);
    if (lane == 0 && sh.fail) atomicMax(err, sh.fail);
    __syncwarp();
}

// One warp per entry of `table` (`stride` u64 an entry) whose codec word
// (entry[6]) is `codec`: entry[0] the byte offset of its stored bytes in
// `raw`, [1] their length, [2] the offset of its output in `body`, [3] the
// output's length, [4] bytes at the head of both that are not compressed
// (copied by the caller). This is the prefix of src/scan/pages.rs's PqPage.
extern "C" __global__ void __launch_bounds__(32 * ZS_WARPS) zs_pages(const u8* raw, u8* body, const u64* table, u64 n,
                                                                     u64 stride, u64 codec, u32* err) {
    __shared__ ZsWarp warps[ZS_WARPS];
    const u32 lanes = ZS_LANES;
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    ZsWarp& sh = warps[w];
    for (u64 pi = (u64)blockIdx.x * ZS_WARPS + w; pi < n; pi += (u64)gridDim.x * ZS_WARPS) {
        const u64* e = table + pi * stride;
        if (e[6] != codec) continue;
        const u64 head = e[4];
        if (e[1] < head || e[3] < head || e[1] - head >= (1ull << 31) || e[3] - head >= (1ull << 31)) {
            if (lane == 0) atomicMax(err, (u32)ZS_ERR_CORRUPT);
            continue;
        }
        zs_run(sh, raw + e[0] + head, (u32)(e[1] - head), body + e[2] + head, (u32)(e[3] - head), lane, lanes, err);
    }
}
