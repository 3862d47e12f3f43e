// kernels/zstd.cu's zs_pages run on the host as one emulated warp of LANES
// threads (warp_shim.h), over frames written by the zstd command line tool,
// each compared byte for byte with its original; then every frame with
// bytes flipped, truncated and with a wrong output size, each of which must
// fail or give some output without touching memory outside its run (the
// script runs this under AddressSanitizer too).
// usage: zstd_harness LIST LANES [undamaged]  (LIST: lines "compressed original")
#include "kernels_host.h"
#include <cstring>
#include <string>
#include <vector>
#include <thread>
#include <fstream>
#include <sstream>
using std::string; using std::vector;
static vector<unsigned char> load(const string& path) {
    std::ifstream f(path, std::ios::binary); std::stringstream ss; ss << f.rdbuf(); string s = ss.str();
    return vector<unsigned char>(s.begin(), s.end());
}
// Runs zs_pages over one entry (and a skipped entry of another codec before it).
static u32 run(const vector<unsigned char>& in, vector<unsigned char>& out, unsigned lanes, u64 head) {
    vector<u64> table(32, 0);
    table[6] = 1;  // another codec: skipped
    u64* e = table.data() + 16;
    e[0] = 0; e[1] = in.size(); e[2] = 0; e[3] = out.size(); e[4] = head; e[6] = 2;
    u32 err = 0;
    blockDim.x = lanes;
    std::barrier<> bar(lanes);
    warp_barrier = &bar;
    vector<std::thread> ts;
    for (unsigned t = 0; t < lanes; ++t) ts.emplace_back([&, t] { threadIdx.x = t; zs_pages(in.data(), out.data(), table.data(), 2, 16, 2, &err); });
    for (auto& t : ts) t.join();
    return err;
}
int main(int argc, char** argv) {
    std::ifstream list(argv[1]);
    const unsigned lanes = atoi(argv[2]);
    const int damages = argc > 3 ? 0 : 8;
    string zf, of;
    long frames = 0, bytes = 0, bad_ok = 0, bad_err = 0;
    while (list >> zf >> of) {
        vector<unsigned char> z = load(zf), want = load(of);
        // A head of 3 bytes copied as is (a v2 page's levels), then the frames.
        vector<unsigned char> in = {7, 8, 9};
        in.insert(in.end(), z.begin(), z.end());
        vector<unsigned char> got(want.size() + 3, 0xcd);
        u32 err = run(in, got, lanes, 3);
        if (err) { printf("%s: error %u\n", zf.c_str(), err); return 1; }
        if (!want.empty() && memcmp(got.data() + 3, want.data(), want.size()) != 0) {
            size_t i = 0; while (got[3 + i] == want[i]) ++i;
            printf("%s: byte %zu of %zu differs (%u vs %u)\n", zf.c_str(), i, want.size(), got[3 + i], want[i]);
            return 1;
        }
        if (got[0] != 0xcd) { printf("%s: the head was written\n", zf.c_str()); return 1; }
        frames++; bytes += want.size();
        // Damaged: flipped bytes at several places, truncated, a wrong output size.
        for (int c = 0; c < damages; ++c) {
            vector<unsigned char> bad = z;
            vector<unsigned char> o(want.size(), 0);
            if (c < 5) { if (bad.empty()) continue; bad[(bad.size() * (2 * c + 1)) / 10] ^= (unsigned char)(0x5A + c); }
            else if (c == 5) bad.resize(bad.size() / 2);
            else if (c == 6) o.resize(want.size() + 1);
            else { if (want.empty()) continue; o.resize(want.size() - 1); }
            // Exact-size buffers, so AddressSanitizer sees any write outside the output.
            vector<unsigned char> exact_in(bad.begin(), bad.end());
            u32 e = run(exact_in, o, lanes, 0);
            if (c >= 5 && !e) { printf("%s: damage %d was not reported\n", zf.c_str(), c); return 1; }
            (e ? bad_err : bad_ok)++;
        }
    }
    printf("ok: %ld frame files (%ld bytes) equal to zstd's, %u lanes; damaged: %ld failed, %ld decoded (flips zstd's format cannot see without a checksum)\n", frames, bytes, lanes, bad_err, bad_ok);
}
