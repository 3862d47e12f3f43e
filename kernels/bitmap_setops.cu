// Direct-address operators for dense integer domains (seed 001 ILBS, seed 004
// BI): keys are first offset by the domain minimum. Semi/anti joins use one bit
// per domain value; the multiset set operations use a count per value, which
// gives the same rank rules as hash_setops.cu without any probing.
// When every build key occurs at most once (always true for the DISTINCT
// forms, which only ask n_b > 0), counts are not needed: the build bitmap
// gives n_b and a second "seen" bitmap gives each probe row's rank 0 or >= 1
// (atomicOr returns the old bit) - two bits per domain value instead of two
// 32-bit counters, 1/32 of the memory traffic.
#include "common.cuh"

// SEMI .. EXCEPT_ALL (the SetOp codes) come from the host: -D options from src/algo/select/mod.rs.

// Build keys outside [lo, lo + range) are skipped: a table over one slice of
// the domain (the streamed path's passes under a small device budget) takes
// the keys of that slice only.
extern "C" __global__ void build_bits(const u64* bkeys, u64 nb, u64 lo, u64 range, u32* bits) {
    SF_FOR(i, nb) {
        u64 v = bkeys[i] - lo;
        if (v < range) atomicOr(&bits[v >> 5], 1u << (v & 31));
    }
}

extern "C" __global__ void probe_bits(const u64* pkeys, u64 np, u64 lo, u64 range, const u32* bits, int anti, u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool hit = false;
        if (i < np) {
            u64 k = pkeys[i];
            if (k >= lo && k - lo < range) { u64 v = k - lo; hit = (bits[v >> 5] >> (v & 31)) & 1u; }
        }
        sf_store_bit(out_bits, i, np, i < np && (anti ? !hit : hit));
    }
}

extern "C" __global__ void build_counts(const u64* bkeys, u64 nb, u64 lo, u32* count_b) {
    SF_FOR(i, nb) atomicAdd(&count_b[bkeys[i] - lo], 1u);
}

extern "C" __global__ void probe_counts(const u64* pkeys, u64 np, u64 lo, u64 range, const u32* count_b, u32* ctr_a, int op, u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool keep = false;
        if (i < np) {
            u64 k = pkeys[i];
            bool in = k >= lo && k - lo < range;
            u64 v = k - lo;
            u32 nb = in ? count_b[v] : 0;
            if (op == INTERSECT_ALL) keep = nb > 0 && atomicAdd(&ctr_a[v], 1u) < nb;
            else if (op == INTERSECT_DISTINCT) keep = nb > 0 && atomicAdd(&ctr_a[v], 1u) == 0;
            else if (op == EXCEPT_ALL) keep = !in || nb == 0 || atomicAdd(&ctr_a[v], 1u) >= nb;
            else keep = in && nb == 0 && atomicAdd(&ctr_a[v], 1u) == 0; // EXCEPT_DISTINCT (probe keys lie in the domain)
        }
        sf_store_bit(out_bits, i, np, keep);
    }
}

// Build bits and report whether some key occurred twice (`*dup` = 1): then the
// ALL forms need real counts (build_counts / probe_counts).
extern "C" __global__ void build_bits_dup(const u64* bkeys, u64 nb, u64 lo, u64 range, u32* bits, u32* dup) {
    SF_FOR(i, nb) {
        u64 v = bkeys[i] - lo;
        u32 bit = 1u << (v & 31);
        if (v < range && (atomicOr(&bits[v >> 5], bit) & bit)) *dup = 1u;
    }
}

// Multiset operators with build multiplicities 0 or 1: rank 0 is the probe
// row that first sets the key's `seen` bit (equal rows are identical, so which
// copy is kept is immaterial).
extern "C" __global__ void probe_ranks(const u64* pkeys, u64 np, u64 lo, u64 range, const u32* bits, u32* seen, int op,
                                       u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool keep = false;
        if (i < np) {
            u64 k = pkeys[i];
            bool in_range = k >= lo && k - lo < range;
            u64 v = k - lo;
            u32 bit = 1u << (v & 31);
            bool in = in_range && (bits[v >> 5] & bit);
            // Only rows whose rank decides the result touch `seen`.
            bool ranked = op == EXCEPT_DISTINCT ? (in_range && !in) : in;
            bool first = ranked && !(atomicOr(&seen[v >> 5], bit) & bit);
            if (op == INTERSECT_ALL || op == INTERSECT_DISTINCT) keep = first;      // min(m, 1) copies
            else if (op == EXCEPT_ALL) keep = !in || !first;                        // max(m - n_b, 0)
            else keep = first;                                                     // EXCEPT_DISTINCT
        }
        sf_store_bit(out_bits, i, np, keep);
    }
}
