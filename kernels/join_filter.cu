// Semi / anti / mark joins with a residual filter: per probe row, the build
// rows with an equal key (the row's *group*), and a filter over each (probe
// row, build row) pair, reduced to "some pair passes" (issue 14, item 3).
//
// The build side's keys arrive sorted (radix sort of `key - min`, with their
// row ids), so a probe row's group is one run, found by binary search. The
// filter is a small postfix program (compiled on the host from DataFusion's
// PhysicalExpr by src/exec/pair_filter.rs, interpreted by
// src/algo/join_filter.rs's CPU twin with identical results) over fixed-width
// columns of both sides, with SQL's three-valued logic. Arithmetic that leaves
// its result type's range sets an error flag: the host then evaluates the whole
// operator with DataFusion's own expression (which raises or wraps as it does),
// so the device never decides a row differently from DataFusion.
//
// Per probe row the kernel writes one byte of facts: bit 0 some pair passes
// the filter (the group is not empty), bit 1 some passing pair also has equal
// IN keys (program 2), bit 2 some passing pair has a NULL build IN key
// (program 3). A row stops at its first pass (EXISTS) or first match (IN).
//
// Groups are short in most joins (TPC-H Q21: ~4 lineitems an order), so a
// thread takes a probe row; when the average group is long (skewed keys, an
// uncorrelated subquery whose group is the whole build side) a warp takes a
// probe row, its lanes striding over the run, so one long run does not leave
// a single thread working through it.
#include "common.cuh"

// Program ops (src/algo/join_filter.rs `op`, checked equal by a unit test).
// The program op codes (JF_COL .. JF_CHECK_I), value kinds (JF_K_*), JF_RANGE_DEC and JF_STACK
// come from the host: -D options from src/algo/join_filter.rs.

// Column value kinds.

// Ranges of checked integer results: 0 all of i64; 1-3 i8 / i16 / i32; 4-6
// u8 / u16 / u32; 7 + p: a decimal of precision p (|v| < 10^p).


struct JfInstr {
    u32 op;
    u32 arg;
    u64 imm;
};

// A column of one side: its values at byte `values` of the values buffer, its
// validity (LSB-first bits by row) at byte `validity` of the validity buffer,
// or JF_NO_NULLS. All columns travel in those two buffers.
struct JfColumn {
    u64 values;
    u64 validity;
    u32 kind;
    u32 from_probe;
};
#define JF_NO_NULLS 0xffffffffffffffffULL

// The columns and the two buffers they live in.
struct JfData {
    const JfColumn* cols;
    const unsigned char* values;
    const unsigned char* validity;
};

// Checked i64 arithmetic (the device's NVRTC 13.0 lacks the overflow builtins):
// the wrapped result, and whether it overflowed.
__device__ __forceinline__ bool jf_add(i64 a, i64 b, i64* r) {
    *r = (i64)((u64)a + (u64)b);
    return ((a ^ *r) & (b ^ *r)) < 0;
}
__device__ __forceinline__ bool jf_sub(i64 a, i64 b, i64* r) {
    *r = (i64)((u64)a - (u64)b);
    return ((a ^ b) & (a ^ *r)) < 0;
}
__device__ __forceinline__ bool jf_mul(i64 a, i64 b, i64* r) {
    *r = (i64)((u64)a * (u64)b);
    return __mul64hi(a, b) != (*r >> 63);
}

__device__ __forceinline__ bool jf_in_range(i64 v, u32 range) {
    switch (range) {
        case 0: return true;
        case 1: return v >= -128 && v <= 127;
        case 2: return v >= -32768 && v <= 32767;
        case 3: return v >= -2147483648LL && v <= 2147483647LL;
        case 4: return v >= 0 && v <= 255;
        case 5: return v >= 0 && v <= 65535;
        case 6: return v >= 0 && v <= 4294967295LL;
        default: {
            u32 p = range - JF_RANGE_DEC;
            if (p >= 19) return true;
            i64 lim = 1;
            for (u32 i = 0; i < p; ++i) lim *= 10;
            return v > -lim && v < lim;
        }
    }
}

// IEEE total order as a signed integer (Rust's f64::total_cmp).
// A double's place in DataFusion's order: IEEE's total order once -0.0 is 0.0
// (DataFusion makes it so before comparing floats). The host's `util::double_order_key` is the twin.
__device__ __forceinline__ i64 jf_total(u64 bits) {
    if (bits == 0x8000000000000000ull) bits = 0;
    i64 x = (i64)bits;
    return x ^ (i64)(((u64)(x >> 63)) >> 1);
}

__device__ __forceinline__ u64 jf_load(const JfData& d, u32 col, u64 row, bool& null) {
    const JfColumn c = d.cols[col];
    const unsigned char* bits = d.validity + c.validity;
    null = c.validity != JF_NO_NULLS && !((bits[row >> 3] >> (row & 7)) & 1);
    const unsigned char* v = d.values + c.values;
    switch (c.kind) {
        case JF_K_I8: return (u64)(i64)((const signed char*)v)[row];
        case JF_K_I16: return (u64)(i64)((const short*)v)[row];
        case JF_K_I32: return (u64)(i64)((const int*)v)[row];
        case JF_K_I64: return ((const u64*)v)[row];
        case JF_K_U8: return (u64)v[row];
        case JF_K_U16: return (u64)((const unsigned short*)v)[row];
        case JF_K_U32: return (u64)((const u32*)v)[row];
        case JF_K_F32: return (u64)__double_as_longlong((double)((const float*)v)[row]);
        case JF_K_F64: return ((const u64*)v)[row];
        case JF_K_BOOL: return (u64)((v[row >> 3] >> (row & 7)) & 1);
        default: return ((const u64*)v)[2 * row];  // decimal128 of <= 18 digits: its low word
    }
}

// One table's columns as the device Parquet scan decodes them (its filter):
// every value a sign-extended 64-bit lane, validity in LSB-first 32-bit words
// (a null pointer: no NULLs), each column in its own buffer.
struct JfRowData {
    const u64* const* values;
    const u32* const* validity;
};

// A column's address with its lowest bit set holds bits (LSB-first 32-bit
// words), read as 0 or 1: a mark the host computed, never widened to lanes.
__device__ __forceinline__ u64 jf_load(const JfRowData& d, u32 col, u64 row, bool& null) {
    const u32* bits = d.validity[col];
    null = bits != nullptr && !((bits[row >> 5] >> (row & 31)) & 1);
    const u64* v = d.values[col];
    if ((unsigned long long)v & 1ULL) {
        const u32* w = (const u32*)((unsigned long long)v & ~1ULL);
        return (w[row >> 5] >> (row & 31)) & 1u;
    }
    return v[row];
}

// Which row of column `col` an instruction reads: the probe or the build row of the pair.
__device__ __forceinline__ u64 jf_row_of(const JfData& d, u32 col, u64 p, u64 b) { return d.cols[col].from_probe ? p : b; }
// A table's row filter reads one row: p == b.
__device__ __forceinline__ u64 jf_row_of(const JfRowData&, u32, u64 p, u64) { return p; }

__device__ __forceinline__ double jf_f(u64 b) { return __longlong_as_double((long long)b); }
__device__ __forceinline__ u64 jf_b(double d) { return (u64)__double_as_longlong(d); }
__device__ __forceinline__ double jf_round(double d, u32 to_f32) { return to_f32 ? (double)(float)d : d; }

// Evaluate prog[0, len) over (probe row p, build row b). True only for TRUE
// (NULL and FALSE fail). Sets *error on a checked overflow.
template <class D> __device__ bool jf_eval(const JfInstr* prog, u32 len, const D& d, u64 p, u64 b, u32* error) {
    u64 v[JF_STACK];
    bool nl[JF_STACK];
    int sp = 0;
    for (u32 pc = 0; pc < len; ++pc) {
        JfInstr in = prog[pc];
        u32 o = in.op;
        if (o == JF_COL) {
            v[sp] = jf_load(d, in.arg, jf_row_of(d, in.arg, p, b), nl[sp]);
            ++sp;
        } else if (o == JF_LIT) {
            v[sp] = in.imm; nl[sp] = false; ++sp;
        } else if (o == JF_NULL) {
            v[sp] = 0; nl[sp] = true; ++sp;
        } else if (o == JF_NOT || o == JF_NEG_I || o == JF_NEG_F || o == JF_IS_NULL || o == JF_IS_NOT_NULL || o == JF_I2F
                   || o == JF_SCALE_I || o == JF_DEC2F || o == JF_F2F32 || o == JF_CHECK_I) {
            u64 a = v[sp - 1];
            bool an = nl[sp - 1];
            u64 r = a;
            bool rn = an;
            switch (o) {
                case JF_NOT: r = a ^ 1; break;
                case JF_NEG_I: {
                    i64 out;
                    if (!an && (jf_sub(0, (i64)a, &out) || !jf_in_range(out, in.arg))) atomicOr(error, 1u);
                    r = (u64)out;
                    break;
                }
                case JF_NEG_F: r = jf_b(jf_round(-jf_f(a), in.arg)); break;
                case JF_IS_NULL: r = an; rn = false; break;
                case JF_IS_NOT_NULL: r = !an; rn = false; break;
                case JF_I2F: r = in.arg ? jf_b((double)__ll2float_rn((long long)a)) : jf_b(__ll2double_rn((long long)a)); break;
                case JF_SCALE_I: {
                    i64 out;
                    if (!an && (jf_mul((i64)a, (i64)in.imm, &out) || !jf_in_range(out, in.arg))) atomicOr(error, 1u);
                    r = (u64)out;
                    break;
                }
                case JF_DEC2F: r = jf_b(jf_round(__ddiv_rn((double)(i64)a, (double)(i64)in.imm), in.arg)); break;
                case JF_F2F32: r = jf_b((double)(float)jf_f(a)); break;
                default: /* JF_CHECK_I */
                    if (!an && !jf_in_range((i64)a, in.arg)) atomicOr(error, 1u);
                    break;
            }
            v[sp - 1] = r;
            nl[sp - 1] = rn;
        } else {
            // Binary ops.
            u64 a = v[sp - 2], c = v[sp - 1];
            bool an = nl[sp - 2], cn = nl[sp - 1];
            --sp;
            u64 r = 0;
            bool rn = an || cn;
            if (o == JF_AND) {
                // Kleene: FALSE wins over NULL.
                bool af = !an && a == 0, cf = !cn && c == 0;
                if (af || cf) { r = 0; rn = false; } else { r = 1; }
            } else if (o == JF_OR) {
                bool at = !an && a != 0, ct = !cn && c != 0;
                if (at || ct) { r = 1; rn = false; } else { r = 0; }
            } else if (o >= JF_ADD_I && o <= JF_MUL_I) {
                i64 out = 0;
                bool over = o == JF_ADD_I ? jf_add((i64)a, (i64)c, &out)
                          : o == JF_SUB_I ? jf_sub((i64)a, (i64)c, &out)
                                          : jf_mul((i64)a, (i64)c, &out);
                if (!rn && (over || !jf_in_range(out, in.arg))) atomicOr(error, 1u);
                r = (u64)out;
            } else if (o >= JF_ADD_F && o <= JF_DIV_F) {
                double x = jf_f(a), y = jf_f(c);
                // Explicitly rounded ops: never contracted into an FMA (the CPU twin rounds each).
                double out = o == JF_ADD_F ? __dadd_rn(x, y) : o == JF_SUB_F ? __dsub_rn(x, y) : o == JF_MUL_F ? __dmul_rn(x, y) : __ddiv_rn(x, y);
                r = jf_b(jf_round(out, in.arg));
            } else {
                i64 x, y;
                u32 cmp;
                if (o >= JF_EQ_F) { x = jf_total(a); y = jf_total(c); cmp = o - JF_EQ_F; }
                else { x = (i64)a; y = (i64)c; cmp = o - JF_EQ_I; }
                bool t = cmp == 0 ? x == y : cmp == 1 ? x != y : cmp == 2 ? x < y : cmp == 3 ? x <= y : cmp == 4 ? x > y : x >= y;
                r = t;
            }
            v[sp - 1] = r;
            nl[sp - 1] = rn;
        }
    }
    return sp > 0 && !nl[sp - 1] && v[sp - 1] != 0;
}

// The run [lo, hi) of sorted (key - key_min) equal to probe key k; empty when
// k lies outside [key_min, key_min + key_span].
__device__ __forceinline__ void jf_run(const u64* sorted, u64 nb, u64 key_min, u64 key_span, u64 k, u64& lo, u64& hi) {
    lo = hi = 0;
    if (k < key_min || k - key_min > key_span) return;
    u64 t = k - key_min;
    u64 a = 0, z = nb;
    while (a < z) { u64 m = (a + z) >> 1; if (sorted[m] < t) a = m + 1; else z = m; }
    lo = a;
    z = nb;
    while (a < z) { u64 m = (a + z) >> 1; if (sorted[m] <= t) a = m + 1; else z = m; }
    hi = a;
}

// A probe row's group: all build rows (no keys: `sorted` null) or its run.
__device__ __forceinline__ bool jf_group(const u64* probe_keys, const unsigned char* probe_valid, u64 p, const u64* sorted, u64 nb,
                                         u64 key_min, u64 key_span, u64& lo, u64& hi) {
    lo = hi = 0;
    if (probe_valid != nullptr && !((probe_valid[p >> 3] >> (p & 7)) & 1)) return false;
    if (sorted == nullptr) { hi = nb; return true; }
    jf_run(sorted, nb, key_min, key_span, probe_keys[p], lo, hi);
    return true;
}

struct JfPrograms {
    u32 filter_len, eq_start, eq_len, null_start, null_len;  // eq_len == 0: EXISTS (no IN keys)
};

// One pair's facts (bits as in the header comment); 0 when the filter fails.
__device__ __forceinline__ unsigned jf_pair(const JfInstr* prog, const JfPrograms& pr, const JfData& d, u64 p, u64 b, u32* error) {
    if (!jf_eval(prog, pr.filter_len, d, p, b, error)) return 0;
    if (pr.eq_len == 0) return 3;
    unsigned f = 1;
    if (jf_eval(prog + pr.eq_start, pr.eq_len, d, p, b, error)) f |= 2;
    else if (jf_eval(prog + pr.null_start, pr.null_len, d, p, b, error)) f |= 4;
    return f;
}

// The kernels' shared arguments after the keys: the columns, the program
// (filter at 0; IN key equality and NULL build key after it, or none).
#define JF_FACTS_ARGS const JfColumn* cols, const unsigned char* values, const unsigned char* validity, const JfInstr* prog, \
    u32 filter_len, u32 eq_start, u32 eq_len, u32 null_start, u32 null_len, unsigned char* facts, u32* error
#define JF_FACTS_SETUP JfData d = {cols, values, validity}; JfPrograms pr = {filter_len, eq_start, eq_len, null_start, null_len};

// A thread per probe row: its run [lo[p], hi[p]) of the sorted build rows
// (`rows`; a null pointer: no keys, row j is j).
extern "C" __global__ void jf_facts_thread(const u32* lo, const u32* hi, u64 n, const u32* rows, JF_FACTS_ARGS) {
    JF_FACTS_SETUP
    SF_FOR(p, n) {
        unsigned f = 0;
        for (u64 j = lo[p]; j < hi[p]; ++j) {
            f |= jf_pair(prog, pr, d, p, rows ? rows[j] : j, error);
            if (f & 2) break;  // matched (EXISTS: any pass sets bit 1 too)
        }
        facts[p] = (unsigned char)((f & 2) ? (f & 3) : f);  // as jf_facts_warp: a match carries bits 0-1 only
    }
}

// A warp per probe row, its lanes striding over the run.
extern "C" __global__ void jf_facts_warp(const u32* lo, const u32* hi, u64 n, const u32* rows, JF_FACTS_ARGS) {
    JF_FACTS_SETUP
    const u32 lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; p < n; p += warps) {
        unsigned f = 0;
        const u64 end = hi[p];
        for (u64 base = lo[p]; base < end; base += 32) {
            u64 j = base + lane;
            unsigned mine = j < end ? jf_pair(prog, pr, d, p, rows ? rows[j] : j, error) : 0;
            for (int s = 16; s > 0; s >>= 1) mine |= __shfl_xor_sync(0xffffffffu, mine, s);
            f |= mine;
            if (f & 2) break;
        }
        // A matched row's other bits are those of the pairs before its match in
        // the thread kernel and the twin: lanes past it may have set bit 2.
        if (lane == 0) facts[p] = (unsigned char)((f & 2) ? (f & 3) : f);
    }
}

// Each probe row's run [lo, hi) in the sorted build keys (`sorted` null: no
// keys, every run is [0, nb)); (0, 0) for a NULL key. Adds the runs' lengths
// to *total (which kernel the facts take depends on it).
extern "C" __global__ void jf_ranges(const u64* probe_keys, const unsigned char* probe_valid, u64 n, const u64* sorted, u64 nb,
                                     u64 key_min, u64 key_span, u32* lo_out, u32* hi_out, u64* total) {
    u64 sum = 0;
    SF_FOR(p, n) {
        u64 lo, hi;
        jf_group(probe_keys, probe_valid, p, sorted, nb, key_min, key_span, lo, hi);
        lo_out[p] = (u32)lo;
        hi_out[p] = (u32)hi;
        sum += hi - lo;
    }
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if ((threadIdx.x & 31) == 0 && sum) atomicAdd(total, sum);
}

// The device Parquet scan's filter: bit r of `pass` (LSB-first words) is set
// when the program is TRUE on row r of the table's n rows (NULL and FALSE
// fail). Sets *error on a checked overflow (the caller then leaves the input
// to DataFusion's FilterExec).
extern "C" __global__ void jf_pass_rows(u64 n, const u64* const* values, const u32* const* validity, const JfInstr* prog,
                                        u32 len, u32* pass, u32* error) {
    JfRowData d = {values, validity};
    SF_FOR_WARPS(r, n) {
        bool t = r < n && jf_eval(prog, len, d, r, r, error);
        sf_store_bit(pass, r, n, t);
    }
}
