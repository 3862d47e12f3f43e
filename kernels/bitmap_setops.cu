// Direct-address operators for dense integer domains (seed 001 ILBS, seed 004
// BI): keys are first offset by the domain minimum. Semi/anti joins use one bit
// per domain value; the multiset set operations use a count per value, which
// gives the same rank rules as hash_setops.cu without any probing.
// When every build key occurs at most once (always true for the DISTINCT
// forms, which only ask n_b > 0), counts are not needed: each probe row claims
// its key's build bit (atomicAnd clears it and returns the old word), so the
// one row that finds the bit set has rank 0 and later equal rows see it
// clear - one bit per domain value instead of two 32-bit counters, and one
// bitmap rather than presence and "seen" bitmaps, so a small device budget
// holds twice the domain in one pass.
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

// Multiset operators with build multiplicities 0 or 1: a probe row claims its
// key's bit. INTERSECT [ALL] keeps the claiming row (min(m, 1) copies), EXCEPT
// ALL every other row (max(m - n_b, 0)); EXCEPT DISTINCT claims from the
// inverted build bits (`invert_bits`: the domain values the build side lacks),
// keeping the first row of each such key. Equal rows are identical, so which
// copy is kept is immaterial.
extern "C" __global__ void probe_claims(const u64* pkeys, u64 np, u64 lo, u64 range, u32* bits, int op,
                                        u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool claimed = false;
        if (i < np) {
            u64 k = pkeys[i];
            if (k >= lo && k - lo < range) {
                u64 v = k - lo;
                u32 bit = 1u << (v & 31);
                // Bits only go from set to clear here, so a stale plain read can only
                // send a row to the atomic, which decides; rows of absent keys skip it.
                if (bits[v >> 5] & bit) claimed = (atomicAnd(&bits[v >> 5], ~bit) & bit) != 0;
            }
        }
        bool keep = op == EXCEPT_ALL ? !claimed : claimed;
        sf_store_bit(out_bits, i, np, i < np && keep);
    }
}

// EXCEPT DISTINCT's claims: every word of the build bits inverted (bits past
// the domain's end are never read: probe keys are range-checked).
extern "C" __global__ void invert_bits(u32* bits, u64 words) {
    SF_FOR(i, words) bits[i] = ~bits[i];
}
