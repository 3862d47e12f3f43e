// Standalone harness for kernels/radix_sort.cu (copied beside it with
// common.cuh): correctness against std::stable_sort, then timings against
// cub::DeviceRadixSort and thrust in the same process (cudaEvent, median of 5).
// Build: nvcc -O3 -arch=sm_90 -std=c++17 bench.cu -o bench && ./bench
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <random>
#include <string>
#include <cmath>
#ifndef NO_REF
#include <cub/cub.cuh>
#include <thrust/sort.h>
#include <thrust/execution_policy.h>
#include <thrust/device_ptr.h>
#endif
// The kernel takes its constants from the host (src/algo/radix_sort.rs passes
// them to NVRTC as -D options); these are the same values, and -D overrides them.
#ifndef RS_BITS
#define RS_BITS 8
#define RS_RADIX 256
#endif
#ifndef RS_WARPS
#define RS_WARPS 16
#endif
#ifndef RS_ITEMS_U32
#define RS_ITEMS_U32 16
#endif
#ifndef RS_ITEMS_U64
#define RS_ITEMS_U64 8
#endif
#ifndef RS_MIN_BLOCKS
#define RS_MIN_BLOCKS 2
#endif
#ifndef RS_HIST_THREADS
#define RS_HIST_THREADS 512
#endif
#include "radix_sort.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); exit(1); } } while (0)
#define CKL() do { CK(cudaGetLastError()); } while (0)

static int g_sms = 132;
static int g_fail = 0;

template <typename K> static u32 tile_of() { return RsCfg<K>::TILE; }

// Scratch of one sort: digit counts + tile counters (u32), look-back words (u64).
struct Scratch { u32* hist = nullptr; u64* status = nullptr; size_t status_words = 0; };
static const size_t HIST_WORDS = 8 * RS_RADIX + 8;

template <typename K> static Scratch scratch_for(u64 n) {
    Scratch s; s.status_words = ((n + tile_of<K>() - 1) / tile_of<K>()) * RS_RADIX + 1;
    CK(cudaMalloc(&s.hist, HIST_WORDS * 4)); CK(cudaMalloc(&s.status, s.status_words * 8)); return s;
}
static void free_scratch(Scratch& s) { cudaFree(s.hist); cudaFree(s.status); }

// The launcher (mirrors src/algo/radix_sort.rs). Result in *keys / *vals (swapped with alt as passes go).
template <typename K, bool PAIRS>
static void my_sort(K** keys, K** alt, u32** vals, u32** valt, u64 n, u32 begin, u32 end, Scratch& s, cudaStream_t st = 0) {
    if (n <= 1 || begin >= end) return;
    const u32 passes = (end - begin + RS_BITS - 1) / RS_BITS;
    const u64 ntiles = (n + tile_of<K>() - 1) / tile_of<K>();
    CK(cudaMemsetAsync(s.hist, 0, HIST_WORDS * 4, st));
    CK(cudaMemsetAsync(s.status, 0, ntiles * RS_RADIX * 8, st));
    u64 hb = (n + RS_HIST_THREADS - 1) / RS_HIST_THREADS; if (hb > (u64)g_sms * 8) hb = g_sms * 8;
    if (sizeof(K) == 4) rs_histogram_u32<<<(u32)hb, RS_HIST_THREADS, 0, st>>>((const u32*)*keys, n, begin, end, s.hist);
    else rs_histogram_u64<<<(u32)hb, RS_HIST_THREADS, 0, st>>>((const u64*)*keys, n, begin, end, s.hist);
    CKL();
    rs_scan_digits<<<passes, RS_RADIX, 0, st>>>(s.hist); CKL();
    for (u32 p = 0; p < passes; ++p) {
        const u32 shift = begin + p * RS_BITS;
        const u32 nbits = end - shift < RS_BITS ? end - shift : RS_BITS;
        u32* starts = s.hist + p * RS_RADIX; u32* counter = s.hist + 8 * RS_RADIX + p;
        if (sizeof(K) == 4) {
            if (PAIRS) rs_onesweep_u32_pairs<<<(u32)ntiles, RS_THREADS, 0, st>>>((const u32*)*keys, (u32*)*alt, *vals, *valt, n, shift, nbits, p, starts, counter, s.status);
            else rs_onesweep_u32_keys<<<(u32)ntiles, RS_THREADS, 0, st>>>((const u32*)*keys, (u32*)*alt, n, shift, nbits, p, starts, counter, s.status);
        } else {
            if (PAIRS) rs_onesweep_u64_pairs<<<(u32)ntiles, RS_THREADS, 0, st>>>((const u64*)*keys, (u64*)*alt, *vals, *valt, n, shift, nbits, p, starts, counter, s.status);
            else rs_onesweep_u64_keys<<<(u32)ntiles, RS_THREADS, 0, st>>>((const u64*)*keys, (u64*)*alt, n, shift, nbits, p, starts, counter, s.status);
        }
        CKL();
        std::swap(*keys, *alt);
        if (PAIRS) std::swap(*vals, *valt);
    }
}

static u64 host_mix(u64 x) { x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL; x ^= x >> 27; x *= 0x94d049bb133111ebULL; x ^= x >> 31; return x; }

// dist: 0 random, 1 seven distinct values, 2 all equal, 3 ascending, 4 descending, 5 random in 20 bits
template <typename K> static std::vector<K> host_keys(u64 n, int dist, u64 seed) {
    std::vector<K> v(n);
    for (u64 i = 0; i < n; ++i) {
        u64 r = host_mix(i * 0x9E3779B97F4A7C15ULL + seed);
        switch (dist) {
        case 0: v[i] = (K)r; break;
        case 1: v[i] = (K)(host_mix(r % 7) ); break;
        case 2: v[i] = (K)0x1234567890abcdefULL; break;
        case 3: v[i] = (K)(i * 3); break;
        case 4: v[i] = (K)(~(u64)0 - i * 5); break;
        default: v[i] = (K)(r & 0xfffff); break;
        }
    }
    return v;
}

template <typename K, bool PAIRS> static bool check_case(u64 n, int dist, u32 begin, u32 end, u64 seed) {
    std::vector<K> hk = host_keys<K>(n, dist, seed);
    std::vector<u32> hv(n);
    for (u64 i = 0; i < n; ++i) hv[i] = (u32)i;
    // Reference: stable sort of (key, index) by the key's bits [begin, end).
    const u64 fmask = end - begin >= 64 ? ~0ULL : ((1ULL << (end - begin)) - 1);
    auto field = [&](K k) { return ((u64)k >> begin) & fmask; };
    std::vector<u32> idx(n);
    for (u64 i = 0; i < n; ++i) idx[i] = (u32)i;
    std::stable_sort(idx.begin(), idx.end(), [&](u32 a, u32 b) { return field(hk[a]) < field(hk[b]); });
    K *dk = nullptr, *da = nullptr; u32 *dv = nullptr, *dva = nullptr;
    const u64 cap = n ? n : 1;
    CK(cudaMalloc(&dk, cap * sizeof(K))); CK(cudaMalloc(&da, cap * sizeof(K)));
    CK(cudaMalloc(&dv, cap * 4)); CK(cudaMalloc(&dva, cap * 4));
    CK(cudaMemset(da, 0xA5, cap * sizeof(K))); CK(cudaMemset(dva, 0xA5, cap * 4)); // poison
    if (n) { CK(cudaMemcpy(dk, hk.data(), n * sizeof(K), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dv, hv.data(), n * 4, cudaMemcpyHostToDevice)); }
    Scratch s = scratch_for<K>(n);
    my_sort<K, PAIRS>(&dk, &da, &dv, &dva, n, begin, end, s);
    CK(cudaDeviceSynchronize());
    std::vector<K> ok(n); std::vector<u32> ov(n);
    if (n) { CK(cudaMemcpy(ok.data(), dk, n * sizeof(K), cudaMemcpyDeviceToHost)); CK(cudaMemcpy(ov.data(), dv, n * 4, cudaMemcpyDeviceToHost)); }
    bool good = true; u64 bad = 0;
    for (u64 i = 0; i < n; ++i) {
        if (ok[i] != hk[idx[i]] || (PAIRS && ov[i] != idx[i])) { if (good) bad = i; good = false; }
    }
    if (!good) {
        printf("FAIL %s %s n=%llu dist=%d bits=[%u,%u) first bad %llu: got key %llx val %u, want key %llx val %u\n",
               sizeof(K) == 4 ? "u32" : "u64", PAIRS ? "pairs" : "keys", (unsigned long long)n, dist, begin, end,
               (unsigned long long)bad, (unsigned long long)ok[bad], ov[bad], (unsigned long long)hk[idx[bad]], idx[bad]);
        ++g_fail;
    }
    free_scratch(s); cudaFree(dk); cudaFree(da); cudaFree(dv); cudaFree(dva);
    return good;
}

template <typename K, bool PAIRS> static void check_all() {
    const u32 KB = sizeof(K) * 8; const u32 T = tile_of<K>();
    int cases = 0, before = g_fail;
    std::vector<u64> sizes = {0, 1, 2, 31, 32, 33, 1000, T - 1, T, T + 1, 2 * T + 17, 100003, (1u << 20) + 12345};
    for (u64 n : sizes) for (int dist = 0; dist < 6; ++dist) { check_case<K, PAIRS>(n, dist, 0, KB, n * 7 + dist); ++cases; }
    const u32 ranges[][2] = {{0, 1}, {0, 13}, {4, 20}, {8, 9}, {3, KB}, {KB - 4, KB}, {0, 20}};
    for (auto& r : ranges) for (u64 n : {(u64)T + 1, (u64)100003, (u64)(1u << 20) + 1}) for (int dist : {0, 1, 5}) { check_case<K, PAIRS>(n, dist, r[0], r[1], n + r[0]); ++cases; }
    check_case<K, PAIRS>(3000017, 0, 0, KB, 99); ++cases;
    printf("check %s %s: %d cases, %d failed\n", sizeof(K) == 4 ? "u32" : "u64", PAIRS ? "pairs" : "keys", cases, g_fail - before);
}

// Segmented: compose, sort u64 keys-only, split; compare with per-segment std::sort.
static void check_segmented() {
    std::mt19937_64 rng(5);
    std::vector<u32> offs = {0}; u64 n = 0;
    for (int s = 0; s < 20000; ++s) { n += (s % 97 == 0) ? 0 : rng() % 300; offs.push_back((u32)n); }
    const u32 nseg = (u32)offs.size() - 1, key_bits = 24;
    std::vector<u32> hk(n); for (auto& k : hk) k = (u32)(rng() & 0xffffff);
    u32 *dk, *doff, *dout; u64 *dc, *da;
    CK(cudaMalloc(&dk, n * 4)); CK(cudaMalloc(&doff, offs.size() * 4)); CK(cudaMalloc(&dc, n * 8)); CK(cudaMalloc(&da, n * 8)); CK(cudaMalloc(&dout, n * 4));
    CK(cudaMemcpy(dk, hk.data(), n * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(doff, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
    rs_seg_compose_u32<<<264, 256>>>(dk, n, doff, nseg, key_bits, dc); CKL();
    u32 seg_bits = 0; while ((1ull << seg_bits) < nseg) ++seg_bits;
    Scratch s = scratch_for<u64>(n);
    my_sort<u64, false>(&dc, &da, nullptr, nullptr, n, 0, key_bits + seg_bits, s);
    rs_seg_split_u32<<<264, 256>>>(dc, n, key_bits, dout); CKL();
    std::vector<u32> got(n); CK(cudaMemcpy(got.data(), dout, n * 4, cudaMemcpyDeviceToHost));
    for (u32 sgi = 0; sgi < nseg; ++sgi) std::sort(hk.begin() + offs[sgi], hk.begin() + offs[sgi + 1]);
    bool good = got == hk; if (!good) ++g_fail;
    printf("check segmented: %u segments, %llu keys: %s\n", nseg, (unsigned long long)n, good ? "ok" : "FAIL");
    free_scratch(s); cudaFree(dk); cudaFree(doff); cudaFree(dc); cudaFree(da); cudaFree(dout);
}

// ------------------------------------------------------------------ timing
template <typename K> __global__ void gen_keys(K* k, u32* v, u64 n, u64 seed) {
    SF_FOR(i, n) { k[i] = (K)sf_mix64(i * 0x9E3779B97F4A7C15ULL + seed); if (v) v[i] = (u32)i; }
}
// Sortedness, stability (values are original indices) and permutation (key == pristine[value]).
template <typename K> __global__ void verify(const K* k, const u32* v, const K* pk, u64 n, unsigned long long* err, unsigned long long* hash) {
    SF_FOR(i, n) {
        const K a = k[i];
        if (i + 1 < n) { const K b = k[i + 1]; if (a > b || (v && a == b && v[i] >= v[i + 1])) atomicAdd(err, 1ULL); }
        if (v && (v[i] >= n || pk[v[i]] != a)) atomicAdd(err, 1ULL);
        atomicAdd(hash, sf_mix64((u64)a));
    }
}
template <typename K> __global__ void hash_keys(const K* k, u64 n, unsigned long long* hash) { SF_FOR(i, n) atomicAdd(hash, sf_mix64((u64)k[i])); }

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

template <typename K, bool PAIRS> static void bench(u64 n, const char* tag) {
    K *pk, *a, *b; u32 *pv = nullptr, *av = nullptr, *bv = nullptr;
    size_t fr, tot; cudaMemGetInfo(&fr, &tot);
    const double need = (double)n * (sizeof(K) + (PAIRS ? 4 : 0)) * 5.2;
    if (need > (double)fr) { printf("%-10s 2^%-2d  skipped (needs ~%.1f GB, %.1f free)\n", tag, (int)log2((double)n), need / 1e9, fr / 1e9); return; }
    CK(cudaMalloc(&pk, n * sizeof(K))); CK(cudaMalloc(&a, n * sizeof(K))); CK(cudaMalloc(&b, n * sizeof(K)));
    if (PAIRS) { CK(cudaMalloc(&pv, n * 4)); CK(cudaMalloc(&av, n * 4)); CK(cudaMalloc(&bv, n * 4)); }
    gen_keys<K><<<g_sms * 8, 256>>>(pk, pv, n, n); CKL();
    unsigned long long* dd; CK(cudaMalloc(&dd, 32)); CK(cudaMemset(dd, 0, 32));
    hash_keys<K><<<g_sms * 8, 256>>>(pk, n, dd + 2); CKL();
    Scratch s = scratch_for<K>(n);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto reset = [&]() { CK(cudaMemcpy(a, pk, n * sizeof(K), cudaMemcpyDeviceToDevice)); if (PAIRS) CK(cudaMemcpy(av, pv, n * 4, cudaMemcpyDeviceToDevice)); CK(cudaDeviceSynchronize()); };
    const u32 KB = sizeof(K) * 8;
    // mine
    std::vector<float> tm, tc, tt;
    K* res = nullptr; u32* resv = nullptr;
    for (int r = 0; r < 6; ++r) {
        reset();
        K *x = a, *y = b; u32 *xv = av, *yv = bv;
        cudaEventRecord(e0); my_sort<K, PAIRS>(&x, &y, &xv, &yv, n, 0, KB, s); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1); if (r) tm.push_back(ms);
        res = x; resv = xv;
    }
    verify<K><<<g_sms * 8, 256>>>(res, PAIRS ? resv : nullptr, pk, n, dd, dd + 1); CKL();
    unsigned long long h[3]; CK(cudaMemcpy(h, dd, 24, cudaMemcpyDeviceToHost));
    const bool ok = h[0] == 0 && h[1] == h[2];
    if (!ok) { ++g_fail; printf("VERIFY FAIL %s n=%llu errors=%llu hash %llx vs %llx\n", tag, (unsigned long long)n, h[0], h[1], h[2]); }
    // histogram + digit scan alone (the part before the passes)
    std::vector<float> th;
    for (int r = 0; r < 4; ++r) {
        cudaEventRecord(e0);
        CK(cudaMemsetAsync(s.hist, 0, HIST_WORDS * 4));
        u64 hb = (n + RS_HIST_THREADS - 1) / RS_HIST_THREADS; if (hb > (u64)g_sms * 8) hb = g_sms * 8;
        if (sizeof(K) == 4) rs_histogram_u32<<<(u32)hb, RS_HIST_THREADS>>>((const u32*)pk, n, 0, KB, s.hist);
        else rs_histogram_u64<<<(u32)hb, RS_HIST_THREADS>>>((const u64*)pk, n, 0, KB, s.hist);
        rs_scan_digits<<<KB / 8, RS_RADIX>>>(s.hist);
        cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); CKL();
        float ms; cudaEventElapsedTime(&ms, e0, e1); if (r) th.push_back(ms);
    }
    tc.assign(1, 0.0f); tt.assign(1, 0.0f);
#ifndef NO_REF
    // cub, DoubleBuffer (no extra n-sized temp), same bits
    {
        void* tmp = nullptr; size_t tb = 0;
        cub::DoubleBuffer<K> dk(a, b); cub::DoubleBuffer<u32> dv(av, bv);
        if (PAIRS) cub::DeviceRadixSort::SortPairs(tmp, tb, dk, dv, (int)n, 0, KB); else cub::DeviceRadixSort::SortKeys(tmp, tb, dk, (int)n, 0, KB);
        CK(cudaMalloc(&tmp, tb));
        for (int r = 0; r < 6; ++r) {
            reset();
            cub::DoubleBuffer<K> k2(a, b); cub::DoubleBuffer<u32> v2(av, bv);
            cudaEventRecord(e0);
            if (PAIRS) cub::DeviceRadixSort::SortPairs(tmp, tb, k2, v2, (int)n, 0, KB); else cub::DeviceRadixSort::SortKeys(tmp, tb, k2, (int)n, 0, KB);
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); CKL();
            float ms; cudaEventElapsedTime(&ms, e0, e1); if (r) tc.push_back(ms);
        }
        cudaFree(tmp);
    }
    // thrust (allocates its own temporary storage inside the timed call)
    {
        bool thrust_ok = true;
        for (int r = 0; r < 6 && thrust_ok; ++r) {
            reset();
            cudaEventRecord(e0);
            try {
                if (PAIRS) thrust::sort_by_key(thrust::device, a, a + n, av); else thrust::sort(thrust::device, a, a + n);
            } catch (...) { thrust_ok = false; }
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1); if (r) tt.push_back(ms);
        }
        cudaGetLastError();
        if (!thrust_ok) tt.assign(1, -1.0f);
    }
#endif
    const double gk = n / 1e6;
    printf("%-10s 2^%-2d  mine %8.3f ms (%5.2f Gkeys/s, histogram %.3f)  cub %8.3f ms  thrust %8.3f ms  %s\n", tag, (int)log2((double)n), median(tm),
           gk / median(tm), median(th), median(tc), median(tt), ok ? "verified" : "WRONG");
    free_scratch(s); cudaFree(pk); cudaFree(a); cudaFree(b); cudaFree(dd);
    if (PAIRS) { cudaFree(pv); cudaFree(av); cudaFree(bv); }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
}

int main(int argc, char** argv) {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0)); g_sms = p.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MB\n", p.name, g_sms, p.l2CacheSize >> 20);
    int lo = 26, hi = 30;
    if (argc > 1) lo = atoi(argv[1]);
    if (argc > 2) hi = atoi(argv[2]);
    const bool quick = argc > 3 && !strcmp(argv[3], "quick");
    if (!quick) {
        check_all<u32, false>(); check_all<u32, true>(); check_all<u64, false>(); check_all<u64, true>();
        check_segmented();
    }
    printf("config RS_WARPS=%d RS_ITEMS_U32=%d RS_ITEMS_U64=%d RS_MIN_BLOCKS=%d RS_MATCH_ANY=%d\n", RS_WARPS, RS_ITEMS_U32, RS_ITEMS_U64, RS_MIN_BLOCKS, RS_MATCH_ANY);
    if (g_fail) printf("CORRECTNESS FAILURES: %d (timings follow anyway)\n", g_fail);
    for (int lg = lo; lg <= hi; ++lg) {
        const u64 n = 1ULL << lg;
        bench<u32, false>(n, "u32 keys");
        bench<u32, true>(n, "u32 pairs");
        bench<u64, false>(n, "u64 keys");
        bench<u64, true>(n, "u64 pairs");
    }
    printf("%s\n", g_fail ? "FAILURES" : "ALL OK");
    return g_fail ? 1 : 0;
}
