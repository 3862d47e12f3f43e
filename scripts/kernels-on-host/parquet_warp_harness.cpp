// pq_snappy run by LANES host threads (one emulated warp: warp_shim.h), its
// output compared with pq_snappy_serial's on the fixture cases' pages, intact
// and with flipped bytes (both must fail, or both give the same bytes).
// usage: harness FIXTURE_DIR LANES [FIRST_CASE [STEP]]
#define PQ_RUNS 512
#define PQ_SNAPPY_WARPS 1
#include "kernels_host.h"
#include <cstring>
#include <string>
#include <vector>
#include <thread>
#include <fstream>
#include <sstream>
using std::string; using std::vector;
template <class T> static vector<T> load(const string& path) {
    std::ifstream f(path, std::ios::binary); std::stringstream ss; ss << f.rdbuf(); string s = ss.str();
    vector<T> v(s.size() / sizeof(T)); if (!v.empty()) memcpy(v.data(), s.data(), v.size() * sizeof(T)); return v;
}
int main(int argc, char** argv) {
    string dir = argv[1];
    const unsigned lanes = atoi(argv[2]);
    vector<u64> list = load<u64>(dir + "/cases.bin");
    long pages = 0;
    for (u64 c = argc > 3 ? atoi(argv[3]) : 0; c < list[0]; c += argc > 4 ? atoi(argv[4]) : 1) {
        string p = dir + "/case" + std::to_string(c);
        vector<u64> meta = load<u64>(p + "/meta.bin");
        vector<unsigned char> raw = load<unsigned char>(p + "/raw.bin");
        vector<u64> table = load<u64>(p + "/pages.bin");
        for (int corrupt = 0; corrupt < 3; ++corrupt) {
            if (corrupt) raw[(raw.size() * corrupt) / 3] ^= 0x5A;
            u64 npages = table.size() / 16;
            const PqPage* pg = (const PqPage*)table.data();
            vector<unsigned char> a(meta[1] + 1, 0xcd), b(meta[1] + 1, 0xcd);
            u32 ea = 0, eb = 0;
            blockDim.x = 1;
            pq_snappy_serial(raw.data(), b.data(), pg, npages, &eb);
            blockDim.x = lanes;
            std::barrier<> bar(lanes);
            warp_barrier = &bar;
            vector<std::thread> ts;
            for (unsigned t = 0; t < lanes; ++t) ts.emplace_back([&, t] { threadIdx.x = t; pq_snappy(raw.data(), a.data(), pg, npages, &ea); });
            for (auto& t : ts) t.join();
            if ((ea != 0) != (eb != 0)) { printf("case %llu corrupt %d: warp error %u serial error %u\n", c, corrupt, ea, eb); return 1; }
            if (!ea && a != b) { size_t i = 0; while (a[i] == b[i]) ++i; printf("case %llu: byte %zu differs (%u vs %u)\n", c, i, a[i], b[i]); return 1; }
            pages += npages;
        }
    }
    printf("ok: %llu cases, %ld page runs, %u lanes equal to pq_snappy_serial\n", list[0], pages, lanes);
}
