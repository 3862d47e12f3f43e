// Hash-based multiset operators: semi/anti join and INTERSECT/EXCEPT [ALL].
// Open addressing with (bucketed) linear probing on 64-bit keys (seed 001: linear hashing
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
//
// (Running large tables in passes over hash partitions small enough for L2 was
// measured on the H100 and did not pay: 10M x 10M 0.87 ms in 1 pass, 0.82 in
// 2, 1.00 in 4; 50M x 50M 7.2 ms in 1, 8.5 in 4. One pass it is.)
#include "common.cuh"

enum Op { SEMI = 0, ANTI = 1, INTERSECT_DISTINCT = 2, INTERSECT_ALL = 3, EXCEPT_DISTINCT = 4, EXCEPT_ALL = 5 };

// Two table widths: u64 keys as they are, and u32 offsets (key - lo) when the
// key domain spans less than 2^32 - 1 values (half the table bytes, so twice
// the share of it that stays in L2; the host checks the domain).
__device__ __forceinline__ u64 sf_slot(u64 k) { return sf_mix64(k); }
__device__ __forceinline__ u64 sf_slot(u32 k) {
    // murmur3 fmix32: cheap, and spreads arithmetic key patterns
    k ^= k >> 16; k *= 0x85ebca6bu; k ^= k >> 13; k *= 0xc2b2ae35u; k ^= k >> 16;
    return k;
}

// Buckets of 16 bytes (4 u32 or 2 u64 slots), read with one vector load:
// linear probing bucket by bucket. A key goes to the next bucket only when
// every slot of this one holds another key, and slots never empty again, so
// a lookup that meets a bucket with an empty slot (and not its key) is done.
// This trades the dependent slot-by-slot loads of plain linear probing for one
// load per bucket (10M x 10M semi join on the H100: 0.91 -> 0.85 ms).
template <typename K>
struct Bucket {
    static const int N = 16 / sizeof(K);
    K k[16 / sizeof(K)];
};

// The bucket starting at slot b (b a multiple of N; the table is 256-byte aligned).
template <typename K>
__device__ __forceinline__ Bucket<K> load_bucket(const K* keys, u64 b) {
    uint4 v = *reinterpret_cast<const uint4*>(keys + b);
    Bucket<K> out;
    memcpy(&out.k[0], &v, 16);
    return out;
}

// The all-ones key is the empty marker; it lives in the extra slot mask + 1,
// whose key word is set to 0 once that key is inserted (so presence is known
// without a count). In the u32 table it cannot occur (domain < 2^32 - 1).
template <typename K>
__device__ __forceinline__ u64 find_or_insert(K* keys, u64 mask, K k) {
    const K empty = (K)~(K)0;
    const int N = Bucket<K>::N;
    if (k == empty) { keys[mask + 1] = 0; return mask + 1; }
    u64 b = sf_slot(k) & mask & ~(u64)(N - 1);
    while (true) {
        // Read before the CAS: present keys cost a load, not an atomic. The
        // load may be stale (L1 does not see other SMs' CASes): a stale empty
        // slot is only ever CASed, whose result is the truth, and a bucket is
        // never re-read, so staleness cannot loop or duplicate a key.
        Bucket<K> cur = load_bucket(keys, b);
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (cur.k[j] == k) return b + j;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if (cur.k[j] == empty) {
                K prev = atomicCAS(&keys[b + j], empty, k);
                if (prev == empty || prev == k) return b + j;
            }
        }
        b = (b + N) & mask;
    }
}

template <typename K>
__device__ __forceinline__ long long find(const K* keys, u64 mask, K k) {
    const K empty = (K)~(K)0;
    const int N = Bucket<K>::N;
    if (k == empty) return keys[mask + 1] == empty ? -1 : (long long)(mask + 1);
    u64 b = sf_slot(k) & mask & ~(u64)(N - 1);
    while (true) {
        Bucket<K> cur = load_bucket(keys, b);
        bool open = false;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if (cur.k[j] == k) return (long long)(b + j);
            open |= cur.k[j] == empty;
        }
        if (open) return -1;
        b = (b + N) & mask;
    }
}

// keys: cap+1 entries set to all ones (the extra one is the all-ones key's slot).
extern "C" __global__ void fill_empty(u64* keys, u64 n) { SF_FOR(i, n) keys[i] = ~0ULL; }
extern "C" __global__ void fill_empty_32(u32* keys, u64 n) { SF_FOR(i, n) keys[i] = ~0u; }

// Insert every build key and count its multiplicity (count_b == nullptr for
// semi/anti joins, which only need presence: one atomic per row less).
template <typename K>
__device__ void build_rows(const u64* bkeys, u64 nb, u64 lo, K* keys, u32* count_b, u64 mask) {
    SF_FOR(i, nb) {
        u64 s = find_or_insert(keys, mask, (K)(bkeys[i] - lo));
        if (count_b) atomicAdd(&count_b[s], 1u);
    }
}

// Decide each probe row; one output bit per row.
template <typename K>
__device__ void probe_rows(const u64* pkeys, u64 np, u64 lo, K* keys, const u32* count_b, u32* ctr_a,
                           u64 mask, int op, u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool keep = false;
        if (i < np) {
            K k = (K)(pkeys[i] - lo);
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

extern "C" __global__ void build(const u64* bkeys, u64 nb, u64* keys, u32* count_b, u64 mask) {
    build_rows<u64>(bkeys, nb, 0, keys, count_b, mask);
}
extern "C" __global__ void probe(const u64* pkeys, u64 np, u64* keys, const u32* count_b, u32* ctr_a,
                                 u64 mask, int op, u32* out_bits) {
    probe_rows<u64>(pkeys, np, 0, keys, count_b, ctr_a, mask, op, out_bits);
}
extern "C" __global__ void build_32(const u64* bkeys, u64 nb, u64 lo, u32* keys, u32* count_b, u64 mask) {
    build_rows<u32>(bkeys, nb, lo, keys, count_b, mask);
}
extern "C" __global__ void probe_32(const u64* pkeys, u64 np, u64 lo, u32* keys, const u32* count_b, u32* ctr_a,
                                    u64 mask, int op, u32* out_bits) {
    probe_rows<u32>(pkeys, np, lo, keys, count_b, ctr_a, mask, op, out_bits);
}
