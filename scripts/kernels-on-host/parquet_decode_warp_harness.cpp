// pq_decode run by LANES host threads (one block of one emulated warp:
// warp_shim.h) over the fixture cases' pages (see parquet.sh), its keys and
// validity compared with arrow-rs's: the strided loops, the per-thread word
// ranges of pages with NULLs, and DELTA_BINARY_PACKED's shuffle scan and
// batches with more than one thread. The pages are decompressed first by
// pq_copy_pages and pq_snappy_serial on one thread.
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
    long pages = 0, rows_checked = 0;
    for (u64 c = argc > 3 ? atoi(argv[3]) : 0; c < list[0]; c += argc > 4 ? atoi(argv[4]) : 1) {
        string p = dir + "/case" + std::to_string(c);
        vector<u64> meta = load<u64>(p + "/meta.bin");  // rows, body_len, lvl_words, idx_len, def_max
        vector<unsigned char> raw = load<unsigned char>(p + "/raw.bin");
        vector<u64> table = load<u64>(p + "/pages.bin");
        vector<u64> want = load<u64>(p + "/keys.bin");
        vector<u32> want_valid = load<u32>(p + "/valid.bin");
        const u64 rows = meta[0], npages = table.size() / 16;
        const PqPage* pg = (const PqPage*)table.data();
        vector<u64> body_words((meta[1] + 16) / 8 + 1, 0xcdcdcdcdcdcdcdcdULL);
        unsigned char* body = (unsigned char*)body_words.data();
        vector<u64> spans(2 * rows + 2, 0);
        vector<u32> levels(meta[2] + 1, 0), idx(meta[3] + 1, 0xdeadbeef), valid(rows / 32 + 2, 0);
        vector<u64> keys(rows + 1, 0x5a5a5a5a5a5a5a5aULL);
        u32 err = 0;
        blockDim.x = 1;
        pq_copy_pages(raw.data(), body, pg, npages);
        pq_snappy_serial(raw.data(), body, pg, npages, &err);
        zs_pages(raw.data(), body, table.data(), npages, 16, 2, &err);
        blockDim.x = lanes;
        std::barrier<> bar(lanes);
        warp_barrier = &bar;
        vector<std::thread> ts;
        for (unsigned t = 0; t < lanes; ++t)
            ts.emplace_back([&, t] { threadIdx.x = t; pq_byte_dicts(body, pg, npages, idx.data(), &err); });
        for (auto& t : ts) t.join();
        ts.clear();
        for (unsigned t = 0; t < lanes; ++t)
            ts.emplace_back([&, t] { threadIdx.x = t; pq_decode(body, pg, npages, levels.data(), idx.data(), keys.data(), valid.data(), spans.data(), &err); });
        for (auto& t : ts) t.join();
        if (err) { printf("case %llu: error code %u\n", c, err); return 1; }
        if (keys[rows] != 0x5a5a5a5a5a5a5a5aULL) { printf("case %llu: keys overrun\n", c); return 1; }
        keys.resize(rows);
        valid.resize(meta[4] ? (rows + 31) / 32 : 0);
        if (keys != want) {
            for (size_t i = 0; i < want.size(); ++i) if (keys[i] != want[i]) { printf("case %llu: key %zu: got %llu want %llu\n", c, i, keys[i], want[i]); break; }
            return 1;
        }
        if (valid != want_valid) { printf("case %llu: validity differs\n", c); return 1; }
        pages += npages;
        rows_checked += rows;
    }
    printf("ok: %ld pages, %ld rows decoded by %u threads equal to arrow-rs's reader\n", pages, rows_checked, lanes);
}
