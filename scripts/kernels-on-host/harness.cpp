// Runs the real kernels of kernels/segmented.cu, kernels/multiset.cu and
// kernels/sorted_intersect.cu serially on the host, in the launchers' order, against a counting reference
// (and the k-way step ms_kway_flags, whose searches moved to common.cuh)
// (scripts/kernels-on-host/run.sh builds it; the -D values below are defaults).
#define MS_INTERSECT_ALL 0
#define MS_EXCEPT_ALL 1
#define MS_UNION_ALL 2
#define MS_SYMMETRIC_DIFFERENCE 3
#ifndef MS_BP_VT
#define MS_BP_VT 16
#endif
#ifndef SI_GTWJ_SEQ_LOG2
#define SI_GTWJ_SEQ_LOG2 3
#endif
#ifndef MS_ROW_SORT_MAX
#define MS_ROW_SORT_MAX 2048
#endif
#include "kernels_host.h"
#include <vector>
#include <map>
#include <random>
#include <algorithm>
#include <string>
using std::vector;

static vector<u32> excl_scan(const vector<u32>& v) {
    vector<u32> o(v.size() + 1, 0);
    for (size_t i = 0; i < v.size(); ++i) o[i + 1] = o[i] + v[i];
    return o;
}
struct Side { vector<u64> keys; vector<u32> off; vector<u32> seg; };
static vector<u32> seg_ids(const vector<u32>& off, u32 rows) {
    vector<u32> seg(off[rows] + 1, 0xdeadbeef);
    ms_seg_ids(off.data(), rows, seg.data());
    seg.resize(off[rows]);
    return seg;
}
static vector<u64> reference(int op, const u64* a, u32 na, const u64* b, u32 nb) {
    std::map<u64, std::pair<size_t, size_t>> c;
    for (u32 i = 0; i < na; ++i) c[a[i]].first++;
    for (u32 i = 0; i < nb; ++i) c[b[i]].second++;
    vector<u64> out;
    for (auto& [x, mn] : c) {
        size_t m = mn.first, n = mn.second, k;
        if (op == 0) k = std::min(m, n); else if (op == 1) k = m > n ? m - n : 0; else if (op == 2) k = std::max(m, n); else k = m > n ? m - n : n - m;
        for (size_t j = 0; j < k; ++j) out.push_back(x);
    }
    return out;
}
struct Result { vector<u32> off; vector<u64> vals; };

// The launchers' count_then_fill: walk(cnt, null, null) counts each of the n
// items' outputs, a scan gives their starts, walk(null, starts, out) writes.
template <class Walk> static Result count_then_fill(u32 n, const vector<u32>& itemoff, u32 rows, Walk walk) {
    const u64 sentinel = 0xabababababababULL;
    vector<u32> cnt(n + 1);
    walk(cnt.data(), nullptr, nullptr);
    cnt.resize(n);
    vector<u32> starts = excl_scan(cnt);
    Result r;
    r.off.resize(rows + 1);
    ms_gather_u32(starts.data(), itemoff.data(), rows + 1, r.off.data());
    r.vals.assign(starts[n] + 1, sentinel);
    walk(nullptr, starts.data(), r.vals.data());
    if (r.vals.back() != sentinel) { printf("overrun\n"); exit(1); }
    r.vals.pop_back();
    return r;
}

static Result run_bp(int op, Side& A, Side& B, vector<unsigned char>& valid, u32 rows, u64 flip) {
    // Tiles per row as the host lays them out (src/algo/list_pack.rs): NULL rows keep no element.
    vector<u32> row_tiles(rows);
    for (u32 r = 0; r < rows; ++r) {
        u64 inputs = (u64)(A.off[r + 1] - A.off[r]) + (B.off[r + 1] - B.off[r]);
        row_tiles[r] = valid[r] ? (u32)((inputs + MS_BP_VT - 1) / MS_BP_VT) : 0;
    }
    vector<u32> tileoff = excl_scan(row_tiles);
    u32 nt = tileoff[rows];
    vector<u32> tilerow = seg_ids(tileoff, rows);
    vector<u64> parts(nt + 1);
    ms_bp_partition(A.keys.data(), A.off.data(), B.keys.data(), B.off.data(), tileoff.data(), tilerow.data(), nt, parts.data());
    return count_then_fill(nt, tileoff, rows, [&](u32* cnt, const u32* starts, u64* out) {
        ms_bp_walk(op, A.keys.data(), A.off.data(), B.keys.data(), B.off.data(), tileoff.data(), tilerow.data(), parts.data(), nt, cnt, starts, flip, out);
    });
}

static Result run_gtwj(Side& A, Side& B, vector<unsigned char>& valid, u32 rows, u64 flip) {
    vector<u32> plan(rows + 1);
    si_gtwj_plan(A.keys.data(), A.off.data(), B.keys.data(), B.off.data(), valid.data(), rows, plan.data());
    vector<u32> head[2], hs[2];
    Side* sides[2] = {&A, &B};
    for (int s = 0; s < 2; ++s) {
        Side& x = *sides[s];
        head[s].assign(x.keys.size() + 1, 7);
        si_gtwj_heads(x.keys.data(), x.off.data(), x.seg.data(), x.keys.size(), plan.data(), s, head[s].data());
        head[s].resize(x.keys.size());
        hs[s] = excl_scan(head[s]);
    }
    vector<u32> seqcnt(rows);
    ms_row_counts(A.off.data(), hs[0].data(), B.off.data(), hs[1].data(), rows, seqcnt.data());
    vector<u32> seqoff = excl_scan(seqcnt);
    u32 nseq = seqoff[rows];
    vector<u32> seqstart(nseq + 1, 0xffffffff);
    for (int s = 0; s < 2; ++s) {
        Side& x = *sides[s];
        si_gtwj_seq_starts(x.off.data(), x.seg.data(), x.keys.size(), head[s].data(), hs[s].data(), seqoff.data(), seqstart.data());
    }
    for (u32 k = 0; k < nseq; ++k) if (seqstart[k] == 0xffffffff) { printf("seq %u has no start\n", k); exit(1); }
    vector<u32> seqrow = seg_ids(seqoff, rows);
    return count_then_fill(nseq, seqoff, rows, [&](u32* cnt, const u32* starts, u64* out) {
        si_gtwj_walk(A.keys.data(), A.off.data(), B.keys.data(), B.off.data(), plan.data(), seqoff.data(), seqrow.data(), seqstart.data(), nseq, cnt, starts, flip, out);
    });
}

// ms_row_sort (one block per row) against std::sort, rows up to MS_ROW_SORT_MAX, ~0 keys among them.
static void check_row_sort(std::mt19937_64& rng) {
    for (int round = 0; round < 120; ++round) {
        u32 rows = 1 + rng() % 12;
        vector<u32> off{0};
        vector<u64> keys;
        for (u32 r = 0; r < rows; ++r) {
            u32 n = rng() % (round % 2 ? 40 : MS_ROW_SORT_MAX + 1);
            for (u32 j = 0; j < n; ++j) keys.push_back(round % 3 == 0 ? ~0ULL - rng() % 3 : rng() % 50);
            off.push_back(keys.size());
        }
        vector<u64> want = keys;
        for (u32 r = 0; r < rows; ++r) std::sort(want.begin() + off[r], want.begin() + off[r + 1]);
        ms_row_sort(keys.data(), off.data(), rows);
        if (keys != want) { printf("ms_row_sort: round %d differs\n", round); exit(1); }
    }
}

// ms_images / ms_inline_keys / ms_view_keys (a raw batch's values made into
// key images) against the rules written out here: integers sign- or
// zero-extended, strings of at most 7 bytes as their bytes from the top byte
// down with the length in the low byte, from offsets and data or from views.
static void check_raw_images(std::mt19937_64& rng) {
    const long long ints[] = {0, 1, -1, 127, -128, 255, 32767, -32768, 65535, 2147483647LL, -2147483648LL, 4294967295LL, 123456789012LL, -5};
    for (u32 width : {1u, 2u, 4u, 8u}) {
        for (u32 is_signed : {0u, 1u}) {
            vector<unsigned char> in;
            vector<u64> want;
            for (long long v : ints) {
                for (u32 b = 0; b < width; ++b) in.push_back((unsigned char)((unsigned long long)v >> (8 * b)));
                u64 bits = width == 8 ? (u64)v : ((u64)v & ((1ULL << (8 * width)) - 1));
                bool neg = is_signed && width < 8 && (bits >> (8 * width - 1)) & 1;
                if (neg) bits |= ~0ULL << (8 * width);
                want.push_back(bits ^ (1ULL << 63));
            }
            vector<u64> got(want.size());
            ms_images(in.data(), want.size(), width, is_signed, 1ULL << 63, got.data());
            if (got != want) { printf("ms_images: width %u signed %u differs\n", width, is_signed); exit(1); }
        }
    }
    for (int round = 0; round < 50; ++round) {
        u32 n = rng() % 40;
        vector<u32> off{0};
        vector<unsigned char> data;
        vector<u64> views, want;
        for (u32 i = 0; i < n; ++i) {
            u32 len = rng() % 8;
            u64 key = len, view_bytes = 0;
            for (u32 b = 0; b < len; ++b) {
                unsigned char c = round % 2 ? (unsigned char)(rng() % 256) : (unsigned char)('a' + rng() % 3);
                data.push_back(c);
                key |= (u64)c << (56 - 8 * b);
                view_bytes |= (u64)c << (8 * b);
            }
            off.push_back(data.size());
            want.push_back(key);
            views.push_back((u64)len | (view_bytes << 32));  // bytes 0-3 the length, 4-7 the first four
            views.push_back(view_bytes >> 32);                // bytes 8-15: the rest (zero padded)
        }
        vector<u64> got(n), got_views(n);
        ms_inline_keys(off.data(), data.data(), n, 0, got.data());
        ms_view_keys(views.data(), n, 0, got_views.data());
        if (got != want || got_views != want) { printf("inline keys: round %d differs\n", round); exit(1); }
        for (u32 i = 1; i < n; ++i) {
            // The keys order as the strings' bytes do.
            std::string x((const char*)data.data() + off[i - 1], off[i] - off[i - 1]), y((const char*)data.data() + off[i], off[i + 1] - off[i]);
            if ((x < y) != (want[i - 1] < want[i]) && x != y) { printf("inline keys: order differs\n"); exit(1); }
        }
    }
}

int main() {
    std::mt19937_64 rng(15);
    check_row_sort(rng);
    check_raw_images(rng);
    const u32 lens[] = {0, 1, 2, 3, MS_BP_VT - 1, MS_BP_VT, MS_BP_VT + 1, 2 * MS_BP_VT + 1, 40, 100, 1000, 3000};
    const u64 lo_hi[][2] = {{0, 0}, {0, 2}, {0, 7}, {100, 160}, {0, 5000}, {1ULL << 40, (1ULL << 40) + 1000000}, {0, ~0ULL}, {~0ULL - 40, ~0ULL}};
    long checked = 0, nonempty = 0;
    for (int round = 0; round < 400; ++round) {
        u32 rows = 1 + rng() % 60;
        auto [lo, hi] = std::pair<u64, u64>(lo_hi[round % 8][0], lo_hi[round % 8][1]);
        auto key = [&]() { u64 span = hi - lo; return span == ~0ULL ? rng() : lo + rng() % (span + 1); };
        Side A, B;
        A.off.push_back(0); B.off.push_back(0);
        vector<unsigned char> valid(rows + 1);
        for (u32 r = 0; r < rows; ++r) {
            valid[r] = rng() % 9 != 0;
            for (Side* s : {&A, &B}) {
                u32 n = lens[rng() % 12];
                if (round % 3 == 1 && s == &B) n = n / 10;  // uneven sides: the other list drives
                vector<u64> v(n);
                for (auto& x : v) x = key();
                std::sort(v.begin(), v.end());
                s->keys.insert(s->keys.end(), v.begin(), v.end());
                s->off.push_back(s->keys.size());
            }
        }
        A.seg = seg_ids(A.off, rows);
        B.seg = seg_ids(B.off, rows);
        u64 flip = round % 2 ? (1ULL << 63) : 0;
        for (int op = -1; op < 4; ++op) {
            Result r = op < 0 ? run_gtwj(A, B, valid, rows, flip) : run_bp(op, A, B, valid, rows, flip);
            for (u32 row = 0; row < rows; ++row) {
                vector<u64> want;
                if (valid[row]) want = reference(op < 0 ? 0 : op, A.keys.data() + A.off[row], A.off[row + 1] - A.off[row], B.keys.data() + B.off[row], B.off[row + 1] - B.off[row]);
                vector<u64> got(r.vals.begin() + r.off[row], r.vals.begin() + r.off[row + 1]);
                for (auto& x : got) x ^= flip;
                if (got != want) {
                    printf("MISMATCH round %d op %d row %u: got %zu want %zu\n", round, op, row, got.size(), want.size());
                    return 1;
                }
                ++checked;
                nonempty += !want.empty();
            }
            if (r.off[rows] != r.vals.size()) { printf("total mismatch\n"); return 1; }
        }
    }
    // ms_kway_flags (SvS step, min(m, n) rule): candidate i survives while its rank among equal candidates < copies in list.
    for (int round = 0; round < 2000; ++round) {
        u64 domain = 1 + rng() % (round % 2 ? 8 : 100000);
        vector<u64> cand(rng() % 200), list(rng() % 300);
        for (auto& x : cand) x = rng() % domain;
        for (auto& x : list) x = rng() % domain;
        std::sort(cand.begin(), cand.end());
        std::sort(list.begin(), list.end());
        vector<u32> flag(cand.size() + 1, 9);
        ms_kway_flags(cand.data(), cand.size(), list.data(), list.size(), flag.data());
        for (size_t i = 0; i < cand.size(); ++i) {
            size_t rank = i - (std::lower_bound(cand.begin(), cand.end(), cand[i]) - cand.begin());
            size_t copies = std::upper_bound(list.begin(), list.end(), cand[i]) - std::lower_bound(list.begin(), list.end(), cand[i]);
            if (flag[i] != (rank < copies)) { printf("ms_kway_flags MISMATCH round %d at %zu\n", round, i); return 1; }
        }
    }
    printf("ok: %ld rows checked (%ld non-empty results), MS_BP_VT %d\n", checked, nonempty, MS_BP_VT);
    return 0;
}
