// Hash-based multiset operators: semi/anti join and INTERSECT/EXCEPT [ALL].
// Open addressing with linear probing on 64-bit keys (seed 001: linear hashing
// was its fastest method on unsorted inputs). The table stores per distinct key
// the build-side multiplicity and a probe-side occurrence counter, which gives
// the exact SQL multiset result per probe row:
//   semi: n_b > 0                    anti: n_b == 0
//   intersect all: rank < n_b        except all: rank >= n_b
//   intersect: rank == 0 && n_b > 0  except: rank == 0 && n_b == 0
// where rank is the row's occurrence number among equal probe keys (assigned
// by atomicAdd: equal rows are identical, so which copy is kept is immaterial).
// The all-ones key is the table's empty marker; rows with that key use a
// dedicated extra slot at index `cap`.
#include "common.cuh"

#define EMPTY 0xffffffffffffffffULL

enum Op { SEMI = 0, ANTI = 1, INTERSECT_DISTINCT = 2, INTERSECT_ALL = 3, EXCEPT_DISTINCT = 4, EXCEPT_ALL = 5 };

// The all-ones key lives in the extra slot mask + 1, whose key word is set to 0
// once that key is inserted (so presence is known without a count).
__device__ __forceinline__ u64 find_or_insert(u64* keys, u64 mask, u64 k) {
    if (k == EMPTY) { keys[mask + 1] = 0; return mask + 1; }
    u64 s = sf_mix64(k) & mask;
    while (true) {
        u64 cur = keys[s];
        if (cur == k) return s;
        if (cur == EMPTY) {
            u64 prev = atomicCAS(&keys[s], EMPTY, k);
            if (prev == EMPTY || prev == k) return s;
        }
        s = (s + 1) & mask;
    }
}

__device__ __forceinline__ long long find(const u64* keys, u64 mask, u64 k) {
    if (k == EMPTY) return keys[mask + 1] == EMPTY ? -1 : (long long)(mask + 1);
    u64 s = sf_mix64(k) & mask;
    while (true) {
        u64 cur = keys[s];
        if (cur == k) return (long long)s;
        if (cur == EMPTY) return -1;
        s = (s + 1) & mask;
    }
}

// keys: cap+1 entries initialised to EMPTY (the extra one is the EMPTY key's slot).
extern "C" __global__ void fill_empty(u64* keys, u64 n) { SF_FOR(i, n) keys[i] = EMPTY; }

// Insert every build key and count its multiplicity (count_b == nullptr for
// semi/anti joins, which only need presence: one atomic per row less).
extern "C" __global__ void build(const u64* bkeys, u64 nb, u64* keys, u32* count_b, u64 mask) {
    SF_FOR(i, nb) {
        u64 s = find_or_insert(keys, mask, bkeys[i]);
        if (count_b) atomicAdd(&count_b[s], 1u);
    }
}

// Decide each probe row; one output bit per row.
extern "C" __global__ void probe(const u64* pkeys, u64 np, u64* keys, const u32* count_b, u32* ctr_a,
                                 u64 mask, int op, u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool keep = false;
        if (i < np) {
            u64 k = pkeys[i];
            if (op == SEMI || op == ANTI || op == INTERSECT_DISTINCT || op == INTERSECT_ALL) {
                long long s = find(keys, mask, k);
                if (op == SEMI) keep = s >= 0;
                else if (op == ANTI) keep = s < 0;
                else if (s >= 0 && count_b[s] > 0) {
                    u32 nb = count_b[s];
                    u32 r = atomicAdd(&ctr_a[s], 1u);
                    keep = op == INTERSECT_ALL ? r < nb : r == 0;
                }
            } else if (op == EXCEPT_ALL) {
                long long s = find(keys, mask, k);
                if (s < 0) keep = true;
                else keep = atomicAdd(&ctr_a[s], 1u) >= count_b[s];
            } else { // EXCEPT_DISTINCT: probe keys are inserted to elect one copy
                u64 s = find_or_insert(keys, mask, k);
                keep = count_b[s] == 0 && atomicAdd(&ctr_a[s], 1u) == 0;
            }
        }
        sf_store_bit(out_bits, i, np, keep);
    }
}
