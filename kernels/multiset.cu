// Segmented multiset list functions and k-way sorted intersection (issue 15;
// seed 002 moderngpu "Multisets", seed 003 SvS). Launcher: src/algo/multiset.rs.
// The segmented plumbing both list families use (key images, segment ids,
// the device sort's steps, scans) is kernels/segmented.cu, whose launcher
// src/algo/segmented.rs this launcher and sorted_intersect's import.
//
// Keys are u64 in an order-preserving image (signed values have their sign bit
// flipped by the launcher); lists are segments [off[r], off[r + 1]) of one key
// array per side, with one validity byte per row (0: the row's result is NULL,
// its elements are ignored).
//
// The multiset rules run as moderngpu's Balanced Path, segmented by row: the
// merge of a row's sorted A and B lists is cut into tiles of MS_BP_VT inputs
// (+-1), one thread per tile, and no tile crosses a row (row r has
// ceil((na + nb) / MS_BP_VT) tiles, none when its result is NULL; the tiles
// are numbered row after row by a scan of those counts). Tile k of a row
// starts where the row's cross-diagonal k * MS_BP_VT meets its Balanced Path
// (sf_balanced_path, common.cuh), which pairs the r-th copy of a value in A
// with the r-th copy in B and stars a diagonal that would split such a pair
// (the left tile takes the B half). Each thread then walks its tile's
// key-rank slots serially (std::set_* / moderngpu's serial set ops): A alone,
// B alone, or a matched pair per slot, keeping
//   intersect all: pairs (A's copy)      -> min(m, n) copies
//   except all: A alone                  -> max(m - n, 0)
//   union all: every slot (A on a pair)  -> max(m, n)
//   symmetric difference: A or B alone   -> |m - n|
// Count-then-fill: one pass counts each tile's outputs, a scan gives each
// tile's (and so each row's) output start, a second pass writes them (one
// kernel, ms_bp_walk, run twice). The walk is mirrored on the host by
// `balanced_path` / `serial_set_op` in the launcher's tests, and this source
// itself runs serially on the host in scripts/kernels-on-host, both against
// the counting reference.
//
// MS_BP_VT (inputs per tile) and the rule codes MS_INTERSECT_ALL,
// MS_EXCEPT_ALL, MS_UNION_ALL and MS_SYMMETRIC_DIFFERENCE come from the host:
// -D options from src/algo/multiset.rs.
//
#include "common.cuh"

// ---- Balanced Path multiset rules, one thread per tile of a row (see the header)

// The star flag of a tile start in parts[] (the rest is the row-local A index).
#define MS_BP_STAR (1ULL << 63)

// parts[t] = where tile t starts: the row-local A index at which the row's
// cross-diagonal k * MS_BP_VT (k: the tile's number within its row) meets the
// row's Balanced Path, with MS_BP_STAR when the diagonal is starred.
extern "C" __global__ void ms_bp_partition(const u64* a, const u32* aoff, const u64* b, const u32* boff, const u32* tileoff,
                                           const u32* tilerow, u32 ntiles, u64* parts) {
    SF_FOR(t, ntiles) {
        u32 r = tilerow[t];
        i64 na = aoff[r + 1] - aoff[r], nb = boff[r + 1] - boff[r];
        i64 diag = (i64)(t - tileoff[r]) * MS_BP_VT;
        int star = 0;
        i64 ai = sf_balanced_path<i64>(a + aoff[r], na, b + boff[r], nb, diag, &star);
        parts[t] = (u64)ai | (star ? MS_BP_STAR : 0ULL);
    }
}

// The serial multiset op of one tile: walks the key-rank slots of a[0, na)
// and b[0, nb) (one row) from (i, j) until i + j reaches `end` (the next
// tile's start, which the walk meets exactly: Balanced Path never cuts a
// pair). Returns the number of outputs; writes them (^ flip) to out unless
// out is null. Mirrored by `serial_set_op` in src/algo/multiset.rs's tests.
__device__ u32 ms_serial_set_op(int op, const u64* a, u32 na, const u64* b, u32 nb, u32 i, u32 j, u32 end, u64 flip, u64* out) {
    u32 n = 0;
    while (i + j < end) {
        bool a_in = i < na, b_in = j < nb;
        u64 x = a_in ? a[i] : 0, y = b_in ? b[j] : 0;
        // The slot holds A alone (a_first), B alone (b_first) or a pair (neither).
        bool a_first = a_in && (!b_in || x < y);
        bool b_first = b_in && (!a_in || y < x);
        bool keep;
        u64 v = x;
        if (op == MS_INTERSECT_ALL) {
            keep = !a_first && !b_first;
        } else if (op == MS_EXCEPT_ALL) {
            keep = a_first;
        } else if (op == MS_UNION_ALL) {
            keep = true;
            v = b_first ? y : x;
        } else { // MS_SYMMETRIC_DIFFERENCE
            keep = a_first || b_first;
            v = a_first ? x : y;
        }
        if (keep) {
            if (out) out[n] = v ^ flip;
            ++n;
        }
        if (!b_first) ++i;
        if (!a_first) ++j;
    }
    return n;
}

// Tile t's row-local slice of its row's merge: [(a0, b0), (a1, b1)), the end
// being the next tile's start or, for the row's last tile, the row's end.
struct MsTile {
    u32 row, a0, b0, a1, b1;
};

__device__ __forceinline__ MsTile ms_tile(const u32* aoff, const u32* boff, const u32* tileoff, const u32* tilerow, const u64* parts, u32 t) {
    MsTile s;
    s.row = tilerow[t];
    u32 na = aoff[s.row + 1] - aoff[s.row], nb = boff[s.row + 1] - boff[s.row];
    u32 k = t - tileoff[s.row];
    u64 p0 = parts[t];
    s.a0 = (u32)(p0 & ~MS_BP_STAR);
    s.b0 = k * MS_BP_VT - s.a0 + (p0 & MS_BP_STAR ? 1 : 0);
    if (t + 1 < tileoff[s.row + 1]) {
        u64 p1 = parts[t + 1];
        s.a1 = (u32)(p1 & ~MS_BP_STAR);
        s.b1 = (k + 1) * MS_BP_VT - s.a1 + (p1 & MS_BP_STAR ? 1 : 0);
    } else {
        s.a1 = na;
        s.b1 = nb;
    }
    return s;
}

// One count-then-fill pass over the tiles under rule `op` (the MS_* codes):
// with out null, cnt[t] = tile t's number of outputs; else tile t writes its
// outputs (^ flip) at out[excl[t]...], excl being the exclusive scan of the
// counting pass's cnt (then cnt is null).
extern "C" __global__ void ms_bp_walk(int op, const u64* a, const u32* aoff, const u64* b, const u32* boff, const u32* tileoff,
                                      const u32* tilerow, const u64* parts, u32 ntiles, u32* cnt, const u32* excl, u64 flip, u64* out) {
    SF_FOR(t, ntiles) {
        MsTile s = ms_tile(aoff, boff, tileoff, tilerow, parts, (u32)t);
        u32 na = aoff[s.row + 1] - aoff[s.row], nb = boff[s.row + 1] - boff[s.row];
        u64* tile_out = out ? out + excl[t] : nullptr;
        u32 n = ms_serial_set_op(op, a + aoff[s.row], na, b + boff[s.row], nb, s.a0, s.b0, s.a1 + s.b1, flip, tile_out);
        if (!out) cnt[t] = n;
    }
}

// k-way intersection step (SvS): candidate i (sorted candidates, duplicates
// allowed) survives when its rank in its run of equal candidates is below the
// number of copies in `list` (the min(m, n) rule).
extern "C" __global__ void ms_kway_flags(const u64* cand, u64 nc, const u64* list, u64 nl, u32* flag) {
    SF_FOR(i, nc) {
        u64 v = cand[i];
        u64 rank = i - sf_lower_bound_u64<u64>(cand, i, v);
        u64 lb = sf_lower_bound_u64<u64>(list, nl, v);
        u64 ub = lb + sf_upper_bound_u64<u64>(list + lb, nl - lb, v);
        flag[i] = rank < ub - lb;
    }
}

// out[excl[i]] = in[i] for flagged i.
extern "C" __global__ void ms_compact(const u64* in, u64 n, const u32* flag, const u32* excl, u64* out) {
    SF_FOR(i, n) if (flag[i]) out[excl[i]] = in[i];
}
