// The sorted-list intersection family: Merge Path intersection of two sorted
// sets (below, a microbenchmark), and the segmented GTWJ intersection of the
// rows of `sorted_intersect(a, b)` (further down).
//
// Sorted-set intersection by Merge Path (seed 003 fast sorted-list intersection;
// seed 002's partitioning without duplicates). Inputs are strictly increasing
// (sets). One tile of NV = NT*VT merge steps per block: a global partition
// search finds each tile's start, the tile is staged in shared memory, and each
// thread walks VT steps of the merge. Tile shapes are template parameters; the
// launcher picks one of the instantiations below (the benchmark measures all).
#include "common.cuh"

template <typename T>
__device__ void partitions(const T* a, i64 na, const T* b, i64 nb, i64* parts, i64 nparts, i64 nv) {
    SF_FOR(i, nparts) {
        i64 diag = (i64)i * nv;
        i64 total = na + nb;
        if (diag > total) diag = total;
        parts[i] = sf_merge_path(a, na, b, nb, diag);
    }
}

// Count |A ∩ B| (into *count) and optionally set bit i of `flags` for each
// matching A[i]. A match is counted when an A element is consumed while the
// head of B equals it: with A-first tie-breaking that head is the only B
// element that can equal it.
template <int NT, int VT, typename T>
__device__ void intersect_tile(const T* a, i64 na, const T* b, i64 nb, const i64* parts,
                               unsigned long long* count, u32* flags) {
    constexpr int NV = NT * VT;
    // The tile's A run, then its B run, then (if any) the next B element: the
    // head of B when the tile ends on A.
    __shared__ T s[NV + 1];
    i64 tile = blockIdx.x;
    i64 d0 = tile * NV, d1 = d0 + NV;
    if (d1 > na + nb) d1 = na + nb;
    i64 a0 = parts[tile], a1 = parts[tile + 1];
    i64 b0 = d0 - a0, b1 = d1 - a1;
    int la = (int)(a1 - a0), lb = (int)(b1 - b0);
    bool b_more = b1 < nb;
    int n = la + lb;
    // All VT loads of a thread are issued before the first shared store, so
    // their latencies overlap (a load-store loop would wait on each in turn).
    T r[VT];
#pragma unroll
    for (int j = 0; j < VT; ++j) {
        int i = threadIdx.x + j * NT;
        if (i < n) r[j] = i < la ? a[a0 + i] : b[b0 + (i - la)];
    }
#pragma unroll
    for (int j = 0; j < VT; ++j) {
        int i = threadIdx.x + j * NT;
        if (i < n) s[i] = r[j];
    }
    if (threadIdx.x == 0 && b_more) s[n] = b[b1];
    __syncthreads();
    const T* sa = s;
    const T* sb = s + la;
    int diag = threadIdx.x * VT;
    u32 local = 0;
    if (diag < n) {
        int lo = diag > lb ? diag - lb : 0, hi = diag < la ? diag : la;
        while (lo < hi) { int mid = (lo + hi) >> 1; if (sa[mid] <= sb[diag - 1 - mid]) lo = mid + 1; else hi = mid; }
        int ia = lo, ib = diag - lo;
#pragma unroll
        for (int k = 0; k < VT; ++k) {
            if (ia + ib >= n) break;
            bool b_has = ib < lb || b_more;
            T va = sa[ia < la ? ia : 0];
            T vb = sb[ib];  // ib <= lb, and sb[lb] exists (the next B element) when b_more
            if (ia < la && (ib >= lb || va <= vb)) {
                if (b_has && va == vb) {
                    ++local;
                    if (flags) atomicOr(&flags[(a0 + ia) >> 5], 1u << ((a0 + ia) & 31));
                }
                ++ia;
            } else {
                ++ib;
            }
        }
    }
    // warp reduce, then one atomic per warp
    for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, (unsigned long long)local);
}

extern "C" __global__ void partitions_u32(const u32* a, i64 na, const u32* b, i64 nb, i64* parts, i64 nparts, i64 nv) { partitions(a, na, b, nb, parts, nparts, nv); }
extern "C" __global__ void partitions_u64(const u64* a, i64 na, const u64* b, i64 nb, i64* parts, i64 nparts, i64 nv) { partitions(a, na, b, nb, parts, nparts, nv); }

#define SF_INTERSECT_U32(NT_, VT_)                                                                                  \
    extern "C" __global__ void __launch_bounds__(NT_) intersect_u32_##NT_##x##VT_(                                  \
        const u32* a, i64 na, const u32* b, i64 nb, const i64* parts, unsigned long long* count, u32* flags) {      \
        intersect_tile<NT_, VT_>(a, na, b, nb, parts, count, flags);                                               \
    }
#define SF_INTERSECT(NT_, VT_)                                                                                      \
    SF_INTERSECT_U32(NT_, VT_)                                                                                      \
    extern "C" __global__ void __launch_bounds__(NT_) intersect_u64_##NT_##x##VT_(                                  \
        const u64* a, i64 na, const u64* b, i64 nb, const i64* parts, unsigned long long* count, u32* flags) {      \
        intersect_tile<NT_, VT_>(a, na, b, nb, parts, count, flags);                                               \
    }

// Keep in step with TILE_SHAPES / TILE_SHAPES_U32 in src/algo/sorted_intersect.rs.
SF_INTERSECT(128, 11)
SF_INTERSECT(128, 15)
SF_INTERSECT(256, 7)
SF_INTERSECT(256, 11)
SF_INTERSECT(256, 15)
SF_INTERSECT(256, 19)
SF_INTERSECT(512, 9)
SF_INTERSECT_U32(256, 23)
SF_INTERSECT_U32(256, 27)

// ---------------------------------------------------------------------------
// Segmented GTWJ intersection of ascending lists with duplicates (seed 003,
// "GPU Test With Jumps", Algorithm 4; issue 15 deliverable 3): the device
// path of `sorted_intersect(a, b)` on a batch of rows. Launcher:
// `gtwj_segmented` in src/algo/sorted_intersect.rs, on the multiset family's
// device lists (u64 order-preserving keys, u32 row offsets, a segment id per
// element, a validity byte per row) and its scans.
//
// Per row, values are grouped into sequences of width Val = 2^s (SeqID =
// x >> s: a power of two, so no division). All copies of a value share a
// sequence, so the min(m, n) rule per pair of equal-SeqID sequences is the
// rule for the lists. One thread per sequence of the row's driving list (the
// shorter, SvS's order) finds the other list's sequence with the same SeqID
// by two binary searches over the other list's elements (its sequence index,
// never built: the bounds SeqID << s and SeqID << s | (Val - 1) locate it)
// and merges the two; a sequence without partner stops at once (the skip),
// and the other list's sequences without partner are never read. These are
// the implementer's choices the paper's incomplete pseudo-code leaves open:
// (i) an array of sequence starts, (ii) binary search, not a linear walk over
// the other list's headers, (iii) count, scan, then write, (iv) one partner
// sequence per thread.
//
// Val per row: SI_GTWJ_SEQ_LOG2 (from the launcher) sets the mean sequence of
// the row's longer list to 2^SI_GTWJ_SEQ_LOG2 elements (within a factor 2
// each way): s = bitlen(span) - bitlen(n) + SI_GTWJ_SEQ_LOG2, clamped to
// [0, 63], with span = last - first of that list. See the launcher for why.
// Mirrored on the host by `gtwj_row` in the launcher's tests; this source
// itself runs serially on the host in scripts/kernels-on-host.

// plan[r] when row r has no result to compute (NULL, or an empty list).
#define SI_GTWJ_NO_PLAN 0xffffffffu
// plan[r] bit set when B drives row r (else A); the low byte is s.
#define SI_GTWJ_DRIVE_B 0x100u

// Bits needed to write x (0 for 0).
__device__ __forceinline__ u32 si_bit_length(u64 x) { return 64 - __clzll((long long)x); }

// plan[r] = which list drives row r and its sequence shift s (see above).
extern "C" __global__ void si_gtwj_plan(const u64* a, const u32* aoff, const u64* b, const u32* boff, const unsigned char* valid,
                                        u32 rows, u32* plan) {
    SF_FOR(r, rows) {
        u32 na = aoff[r + 1] - aoff[r], nb = boff[r + 1] - boff[r];
        if (!valid[r] || na == 0 || nb == 0) {
            plan[r] = SI_GTWJ_NO_PLAN;
            continue;
        }
        bool drive_b = nb < na;
        // The longer list sets the density: its sequences hold about 2^SI_GTWJ_SEQ_LOG2 elements.
        const u64* longer = drive_b ? a + aoff[r] : b + boff[r];
        u32 n = drive_b ? na : nb;
        int s = (int)si_bit_length(longer[n - 1] - longer[0]) - (int)si_bit_length(n) + SI_GTWJ_SEQ_LOG2;
        s = s < 0 ? 0 : s > 63 ? 63 : s;
        plan[r] = (drive_b ? SI_GTWJ_DRIVE_B : 0u) | (u32)s;
    }
}

// head[i] = 1 when element i of side x (0: A, 1: B) starts a sequence of a
// row that x drives: the row's first element, or one whose SeqID differs
// from its predecessor's.
extern "C" __global__ void si_gtwj_heads(const u64* x, const u32* xoff, const u32* xseg, u64 nx, const u32* plan, u32 side,
                                         u32* head) {
    SF_FOR(i, nx) {
        u32 r = xseg[i];
        u32 p = plan[r];
        u32 h = 0;
        if (p != SI_GTWJ_NO_PLAN && ((p & SI_GTWJ_DRIVE_B) ? 1u : 0u) == side) {
            u32 s = p & 0xff;
            h = i == xoff[r] || (x[i] >> s) != (x[i - 1] >> s);
        }
        head[i] = h;
    }
}

// seqstart[k] = element index (in x) of sequence k: row r's sequences are
// numbered from seqoff[r], in order; hscan is the exclusive scan of head.
extern "C" __global__ void si_gtwj_seq_starts(const u32* xoff, const u32* xseg, u64 nx, const u32* head, const u32* hscan,
                                              const u32* seqoff, u32* seqstart) {
    SF_FOR(i, nx) {
        if (head[i]) {
            u32 r = xseg[i];
            seqstart[seqoff[r] + (hscan[i] - hscan[xoff[r]])] = (u32)i;
        }
    }
}

// Sequence k: merge it with the other list's sequence of the same SeqID
// (min(m, n) rule). Returns the number of common elements; writes them
// (^ flip) to out unless out is null. Mirrored by `gtwj_sequence` in
// src/algo/sorted_intersect.rs's tests.
__device__ u32 si_gtwj_sequence(const u64* a, const u32* aoff, const u64* b, const u32* boff, const u32* plan, const u32* seqoff,
                                const u32* seqrow, const u32* seqstart, u32 k, u64 flip, u64* out) {
    u32 r = seqrow[k];
    u32 p = plan[r], s = p & 0xff;
    bool drive_b = (p & SI_GTWJ_DRIVE_B) != 0;
    const u64* x = drive_b ? b : a;
    const u32* xoff = drive_b ? boff : aoff;
    const u64* y = drive_b ? a + aoff[r] : b + boff[r];
    u32 ny = drive_b ? aoff[r + 1] - aoff[r] : boff[r + 1] - boff[r];
    u32 i = seqstart[k];
    u32 i_end = k + 1 < seqoff[r + 1] ? seqstart[k + 1] : xoff[r + 1];
    // The partner sequence: y's elements in [SeqID << s, SeqID << s | (2^s - 1)].
    u64 lo = (x[i] >> s) << s, hi = lo | ((1ULL << s) - 1);
    u32 j = sf_lower_bound_u64<u32>(y, ny, lo);
    u32 j_end = j + sf_upper_bound_u64<u32>(y + j, ny - j, hi);
    u32 n = 0;
    while (i < i_end && j < j_end) {
        u64 u = x[i], v = y[j];
        if (u < v) {
            ++i;
        } else if (v < u) {
            ++j;
        } else {
            if (out) out[n] = u ^ flip;
            ++n;
            ++i;
            ++j;
        }
    }
    return n;
}

// One count-then-fill pass over the sequences: with out null, cnt[k] = the
// number of common elements of sequence k and its partner; else sequence k
// writes them (^ flip) at out[excl[k]...], excl being the exclusive scan of
// the counting pass's cnt (then cnt is null).
extern "C" __global__ void si_gtwj_walk(const u64* a, const u32* aoff, const u64* b, const u32* boff, const u32* plan,
                                        const u32* seqoff, const u32* seqrow, const u32* seqstart, u32 nseq, u32* cnt,
                                        const u32* excl, u64 flip, u64* out) {
    SF_FOR(k, nseq) {
        u64* seq_out = out ? out + excl[k] : nullptr;
        u32 n = si_gtwj_sequence(a, aoff, b, boff, plan, seqoff, seqrow, seqstart, (u32)k, flip, seq_out);
        if (!out) cnt[k] = n;
    }
}
