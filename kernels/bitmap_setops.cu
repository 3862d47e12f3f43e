// Direct-address operators for dense integer domains (seed 001 ILBS, seed 004
// BI): keys are first offset by the domain minimum. Semi/anti joins use one bit
// per domain value; the multiset set operations use a count per value, which
// gives the same rank rules as hash_setops.cu without any probing.
#include "common.cuh"

enum Op { SEMI = 0, ANTI = 1, INTERSECT_DISTINCT = 2, INTERSECT_ALL = 3, EXCEPT_DISTINCT = 4, EXCEPT_ALL = 5 };

extern "C" __global__ void build_bits(const u64* bkeys, u64 nb, u64 lo, u32* bits) {
    SF_FOR(i, nb) {
        u64 v = bkeys[i] - lo;
        atomicOr(&bits[v >> 5], 1u << (v & 31));
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
