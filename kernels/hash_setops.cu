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
// Build in passes: when the table is a little larger than L2 (10M keys: 64 MB
// against the H100's 50 MB), inserting the keys whose home bucket lies in the
// lower half of the table first, then the others, keeps each pass's dirty
// working set in L2 (10M x 10M semi join on the H100: build 540 -> 450 us;
// 3 passes 495 us, 4 passes 567 us, each pass re-reads the build keys). The
// probe does not gain from passes (259 us in 1, 290 us in 2): it only reads.
// Measured and dropped (November 2026, same benchmark): 32-byte buckets (a
// whole DRAM sector per lookup; 0.817 against 0.816 ms); a CAS without the
// read before it (build 608 us); a table at half the load (1.04 ms); and a
// radix-partitioned join with tables in shared memory, which moves the random
// accesses on chip but pays for them in the partitioning: histogram ~100 us,
// scatter 500 us even with the tiles sorted in shared memory before writing
// (runs of ~4 rows over 2^11 partitions are partial DRAM sectors), join 250 us
// (its output is a random atomicOr per kept row); 0.95 ms at best, 2.1 ms at
// worst over the variants tried.)
#include "common.cuh"

// SEMI .. EXCEPT_ALL (the SetOp codes) come from the host: -D options from src/algo/select/mod.rs.

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

// Set the table's n16 16-byte words to all ones (every slot empty, the extra
// slot included: the host rounds the table up to whole words).
extern "C" __global__ void fill_empty(uint4* words, u64 n16) { SF_FOR(i, n16) words[i] = make_uint4(~0u, ~0u, ~0u, ~0u); }

// Insert the build keys of pass `pass` of `passes` (those whose home bucket
// lies in that share of the table; see the note on passes above) and count
// their multiplicity (count_b == nullptr for semi/anti joins, which only need
// presence: one atomic per row less).
template <typename K>
__device__ void build_rows(const u64* bkeys, u64 nb, u64 lo, K* keys, u32* count_b, u64 mask, u32 pass, u32 passes) {
    SF_FOR(i, nb) {
        K k = (K)(bkeys[i] - lo);
        if (passes > 1 && (u32)(((sf_slot(k) & mask) * passes) / (mask + 1)) != pass) continue;
        u64 s = find_or_insert(keys, mask, k);
        if (count_b) atomicAdd(&count_b[s], 1u);
    }
}

// Decide each probe row; one output bit per row. A key outside the table's
// domain [lo, lo + span] has no match (a u32 table built from the build side
// alone may be probed by wider keys; EXCEPT DISTINCT's callers pass a domain
// holding every probe key, since its probe inserts them).
template <typename K>
__device__ void probe_rows(const u64* pkeys, u64 np, u64 lo, u64 span, K* keys, const u32* count_b, u32* ctr_a,
                           u64 mask, int op, u32* out_bits) {
    SF_FOR_WARPS(i, np) {
        bool keep = false;
        if (i < np && pkeys[i] - lo > span) {
            keep = op == ANTI || op == EXCEPT_ALL;
        } else if (i < np) {
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

extern "C" __global__ void build(const u64* bkeys, u64 nb, u64* keys, u32* count_b, u64 mask, u32 pass, u32 passes) {
    build_rows<u64>(bkeys, nb, 0, keys, count_b, mask, pass, passes);
}
extern "C" __global__ void probe(const u64* pkeys, u64 np, u64* keys, const u32* count_b, u32* ctr_a,
                                 u64 mask, int op, u32* out_bits) {
    probe_rows<u64>(pkeys, np, 0, ~0ULL, keys, count_b, ctr_a, mask, op, out_bits);
}
extern "C" __global__ void build_32(const u64* bkeys, u64 nb, u64 lo, u32* keys, u32* count_b, u64 mask, u32 pass, u32 passes) {
    build_rows<u32>(bkeys, nb, lo, keys, count_b, mask, pass, passes);
}
extern "C" __global__ void probe_32(const u64* pkeys, u64 np, u64 lo, u64 span, u32* keys, const u32* count_b, u32* ctr_a,
                                    u64 mask, int op, u32* out_bits) {
    probe_rows<u32>(pkeys, np, lo, span, keys, count_b, ctr_a, mask, op, out_bits);
}
