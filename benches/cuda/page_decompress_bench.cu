// Standalone harness for the device scan's page decompressors on the GPU
// machine (nvcc, no Rust): kernels/zstd.cu's zs_pages (ZSTD) and
// kernels/parquet_decode.cu's pq_snappy (SNAPPY), over pages made by
// benches/cuda/page_pages.py (the bench's integer columns, 20,000 values a
// page as arrow-rs writes them). The pages are laid out as one column's
// worth of pages at distinct addresses, decompressed one launch a column
// (as the scan's parts are), timed with CUDA events (median of 5 after one
// warm-up) and every page's output compared with its original.
//
// Build (from the repository root; -DKERNEL_DIR for a variant's folder):
//   nvcc -O3 -arch=sm_90 -std=c++17 -Ikernels -DZS_WARPS=3 benches/cuda/page_decompress_bench.cu -o zb
//   nvcc -O3 -arch=sm_90 -std=c++17 -Ikernels -DSNAPPY -DPQ_SNAPPY_WARPS=4 -DPQ_RUNS=512 benches/cuda/page_decompress_bench.cu -o sb
//   (add -DSNAPPY_PIPE -DPQ_SNAPPY_PAIRS=2 for pq_snappy_pipe: two warps a page, PQ_SNAPPY_PAIRS pages a block;
//   PIPE_PAIRS=N in the environment launches N <= PQ_SNAPPY_PAIRS pages a block)
// Run: ./zb LIST PAGES...   (LIST: lines "compressed original"; PAGES: column sizes in pages)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#include <fstream>
#include <sstream>
#include <algorithm>

#ifdef SNAPPY
#include "parquet_decode.cu"
#else
#include "zstd.cu"
#endif

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); exit(1); } } while (0)

static std::vector<unsigned char> load(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return std::vector<unsigned char>(s.begin(), s.end());
}

int main(int argc, char** argv) {
    if (argc < 3) { printf("usage: %s LIST PAGES...\n", argv[0]); return 2; }
    std::vector<std::vector<unsigned char>> comp, orig;
    {
        std::ifstream list(argv[1]);
        std::string zf, of;
        while (list >> zf >> of) { comp.push_back(load(zf)); orig.push_back(load(of)); }
    }
    if (comp.empty()) { printf("empty list\n"); return 2; }
#if defined(SNAPPY) && defined(SNAPPY_PIPE)
    const char* name = "pq_snappy_pipe";
    const u64 codec = 1;
    // PIPE_PAIRS: pages a block at launch (at most PQ_SNAPPY_PAIRS, which sizes the shared arrays).
    const unsigned per_block = getenv("PIPE_PAIRS") ? (unsigned)atoi(getenv("PIPE_PAIRS")) : PQ_SNAPPY_PAIRS;
    const unsigned warps = 2 * per_block;
    const void* kernel = (const void*)pq_snappy_pipe;
#elif defined(SNAPPY)
    const char* name = "pq_snappy";
    const u64 codec = 1;
    const unsigned warps = PQ_SNAPPY_WARPS;
    const void* kernel = (const void*)pq_snappy;
    const unsigned per_block = warps;
#else
    const char* name = "zs_pages";
    const u64 codec = 2;
    const unsigned warps = ZS_WARPS;
    const void* kernel = (const void*)zs_pages;
    const unsigned per_block = warps;
#endif
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kernel));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 32 * warps, 0));
    printf("%s: %d registers, %zu B local, %zu B shared a block, %d blocks (%d warps) an SM\n", name, fa.numRegs,
           fa.localSizeBytes, fa.sharedSizeBytes, occ, occ * warps);
    for (int a = 2; a < argc; ++a) {
        const u64 n = strtoull(argv[a], nullptr, 10);
        // Page i is comp[i % k] at its own place in raw and body.
        std::vector<u64> table(n * 16, 0);
        u64 rlen = 0, blen = 0;
        for (u64 i = 0; i < n; ++i) {
            const auto& c = comp[i % comp.size()];
            const auto& o = orig[i % comp.size()];
            u64* e = table.data() + i * 16;
            e[0] = rlen; e[1] = c.size(); e[2] = blen; e[3] = o.size(); e[4] = 0; e[6] = codec;
            rlen += (c.size() + 15) & ~15ull;
            blen += (o.size() + 15) & ~15ull;
        }
        std::vector<unsigned char> raw(rlen);
        for (u64 i = 0; i < n; ++i) memcpy(raw.data() + table[i * 16], comp[i % comp.size()].data(), comp[i % comp.size()].size());
        unsigned char *draw, *dbody; u64* dtab; u32* derr;
        CK(cudaMalloc(&draw, rlen)); CK(cudaMalloc(&dbody, blen)); CK(cudaMalloc(&dtab, table.size() * 8)); CK(cudaMalloc(&derr, 4));
        CK(cudaMemcpy(draw, raw.data(), rlen, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dtab, table.data(), table.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMemset(derr, 0, 4));
        CK(cudaMemset(dbody, 0xcd, blen));
        const unsigned blocks = (unsigned)((n + per_block - 1) / per_block);
        cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int r = 0; r < 6; ++r) {
            CK(cudaEventRecord(e0));
#if defined(SNAPPY) && defined(SNAPPY_PIPE)
            pq_snappy_pipe<<<blocks, 32 * warps>>>(draw, dbody, (const PqPage*)dtab, n, derr);
#elif defined(SNAPPY)
            pq_snappy<<<blocks, 32 * warps>>>(draw, dbody, (const PqPage*)dtab, n, derr);
#else
            zs_pages<<<blocks, 32 * warps>>>(draw, dbody, dtab, n, 16, codec, derr);
#endif
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float t; CK(cudaEventElapsedTime(&t, e0, e1));
            if (r) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        u32 err = 0; CK(cudaMemcpy(&err, derr, 4, cudaMemcpyDeviceToHost));
        std::vector<unsigned char> body(blen);
        CK(cudaMemcpy(body.data(), dbody, blen, cudaMemcpyDeviceToHost));
        u64 bad = 0, out = 0, in = 0;
        for (u64 i = 0; i < n; ++i) {
            const auto& o = orig[i % comp.size()];
            out += o.size(); in += comp[i % comp.size()].size();
            if (memcmp(body.data() + table[i * 16 + 2], o.data(), o.size()) != 0) bad++;
        }
        printf("%s %6llu pages: %7.1f MB in, %7.1f MB out, median %8.3f ms (min %8.3f), %6.2f GB/s out, err %u, %llu pages wrong\n",
               name, (unsigned long long)n, in / 1e6, out / 1e6, ms[ms.size() / 2], ms[0], out / 1e6 / ms[ms.size() / 2],
               err, (unsigned long long)bad);
        CK(cudaFree(draw)); CK(cudaFree(dbody)); CK(cudaFree(dtab)); CK(cudaFree(derr));
    }
    return 0;
}
