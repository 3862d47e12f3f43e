// Runs kernels/parquet_decode.cu's real kernels serially on the host (one
// block of one thread: shim.h) over page tables written by the Rust tests
// (files written by arrow-rs, decoded by arrow-rs's reader for the expected
// keys; see parquet.sh), in the launcher's order: pq_copy_pages, pq_snappy, zs_pages (zstd.cu),
// pq_byte_dicts, pq_decode (BYTE_ARRAY spans checked against each row's
// hash: the span's bytes hash to the key), (pq_snappy with one lane and a 128-byte ring, so pages wrap it
// and reach past it; pq_snappy_serial's output is compared too). Then flips bytes of every case's pages and checks that the
// kernels end with an error code or the same keys as the CPU twin's rules
// allow, without reading or writing out of bounds (run under ASan + UBSan);
// DELTA_BINARY_PACKED pages also get their header bytes flipped and their
// bodies cut short.
#define PQ_RUNS 512
#define PQ_SNAPPY_WARPS 1
#define PQ_SNAPPY_RING 128
#include "kernels_host.h"
#include <cstring>
#include <string>
#include <vector>
#include <fstream>
#include <sstream>
using std::string;
using std::vector;

template <class T> static vector<T> load(const string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) { printf("cannot read %s\n", path.c_str()); exit(2); }
    std::stringstream ss;
    ss << f.rdbuf();
    string s = ss.str();
    vector<T> v(s.size() / sizeof(T));
    if (!v.empty()) memcpy(v.data(), s.data(), v.size() * sizeof(T));
    return v;
}

struct Out { vector<u64> keys; vector<u32> valid; u32 err; };

static Out run(const vector<unsigned char>& raw, const vector<u64>& table, u64 rows, u64 body_len, u64 lvl_words, u64 idx_len, u64 def_max) {
    u64 npages = table.size() / 16;
    // (+16: a string's hash reads whole words, up to the one after its last byte, as on the device.)
    vector<u64> body_words((body_len + 16) / 8 + 1, 0xcdcdcdcdcdcdcdcdULL);
    unsigned char* body_bytes = (unsigned char*)body_words.data();
    vector<unsigned char> body(body_bytes, body_bytes + body_len + 16);
    vector<u32> levels(lvl_words + 1, 0), idx(idx_len + 1, 0xdeadbeef), valid(rows / 32 + 2, 0);
    vector<u64> spans(2 * rows + 2, 0);
    Out o;
    o.keys.assign(rows + 1, 0x5a5a5a5a5a5a5a5aULL);
    o.err = 0;
    const PqPage* pages = (const PqPage*)table.data();
    pq_copy_pages(raw.data(), body.data(), pages, npages);
    vector<unsigned char> serial_body = body;
    u32 serial_err = 0;
    pq_snappy(raw.data(), body.data(), pages, npages, &o.err);
    pq_snappy_serial(raw.data(), serial_body.data(), pages, npages, &serial_err);
    if ((o.err != 0) != (serial_err != 0)) { printf("pq_snappy error %u, pq_snappy_serial error %u\n", o.err, serial_err); exit(1); }
    if (!o.err && body != serial_body) { printf("pq_snappy and pq_snappy_serial decompress differently\n"); exit(1); }
    // kernels/zstd.cu's ZSTD pages, as the launcher runs it after pq_snappy.
    zs_pages(raw.data(), body.data(), table.data(), npages, 16, 2, &o.err);
    // The body as 8-aligned words (the hash reads aligned words).
    memcpy(body_words.data(), body.data(), body.size());
    pq_byte_dicts(body_bytes, pages, npages, idx.data(), &o.err);
    pq_decode(body_bytes, pages, npages, levels.data(), idx.data(), o.keys.data(), valid.data(), spans.data(), &o.err);
    if (o.keys[rows] != 0x5a5a5a5a5a5a5a5aULL) { printf("keys overrun\n"); exit(1); }
    if (!o.err) {
        // Every BYTE_ARRAY row's span lies in the body and hashes to its key; NULL rows are (0, 0).
        for (u64 r = 0; r < rows; ++r) {
            const u64 a = spans[2 * r], l = spans[2 * r + 1];
            if (a == 0 && l == 0) continue;
            if (a < (u64)body_bytes || a + l > (u64)body_bytes + body_len) { printf("row %llu: span outside the body\n", r); exit(1); }
            if (sf_hash_bytes((const u64*)(a & ~7ULL), a & 7, l) != o.keys[r]) { printf("row %llu: span's bytes do not hash to the key\n", r); exit(1); }
        }
    }
    o.keys.resize(rows);
    valid.resize(def_max ? (rows + 31) / 32 : 0);
    o.valid = valid;
    return o;
}

int main(int argc, char** argv) {
    if (argc < 2) { printf("usage: harness FIXTURE_DIR\n"); return 2; }
    string dir = argv[1];
    vector<u64> list = load<u64>(dir + "/cases.bin");
    long pages_checked = 0, rows_checked = 0, corrupt_errors = 0, delta_flips = 0;
    for (u64 c = 0; c < list[0]; ++c) {
        string p = dir + "/case" + std::to_string(c);
        vector<u64> meta = load<u64>(p + "/meta.bin");  // rows, body_len, lvl_words, idx_len, def_max
        vector<unsigned char> raw = load<unsigned char>(p + "/raw.bin");
        vector<u64> table = load<u64>(p + "/pages.bin");
        vector<u64> want = load<u64>(p + "/keys.bin");
        vector<u32> want_valid = load<u32>(p + "/valid.bin");
        Out o = run(raw, table, meta[0], meta[1], meta[2], meta[3], meta[4]);
        if (o.err) { printf("case %llu: error code %u\n", c, o.err); return 1; }
        if (o.keys != want) {
            for (size_t i = 0; i < want.size(); ++i) if (o.keys[i] != want[i]) { printf("case %llu: key %zu: got %llu want %llu\n", c, i, o.keys[i], want[i]); break; }
            return 1;
        }
        if (o.valid != want_valid) { printf("case %llu: validity differs\n", c); return 1; }
        pages_checked += table.size() / 16;
        rows_checked += meta[0];
        // Corrupt pages: never out of bounds (ASan), an error code or keys.
        for (size_t flip : {size_t(0), size_t(1), size_t(5), raw.size() / 3, raw.size() / 2, raw.size() - 1}) {
            if (flip >= raw.size()) continue;
            vector<unsigned char> bad = raw;
            bad[flip] ^= 0xA5;
            Out b = run(bad, table, meta[0], meta[1], meta[2], meta[3], meta[4]);
            corrupt_errors += b.err != 0;
        }
        // DELTA_BINARY_PACKED pages (encoding 2): bytes of their first 48,
        // where the header, the first block's min delta and bit widths lie
        // (in uncompressed pages), flipped and truncated.
        int delta_pages = 0;
        for (size_t pi = 0; pi < table.size() / 16 && delta_pages < 3; ++pi) {
            const PqPage& pg = ((const PqPage*)table.data())[pi];
            if (pg.kind == 0 || pg.encoding != 2) continue;
            ++delta_pages;
            for (u64 k = 0; k < 48 && k < pg.src_len; ++k) {
                vector<unsigned char> bad = raw;
                bad[pg.src + k] ^= (unsigned char)(0x5A + k);
                Out b = run(bad, table, meta[0], meta[1], meta[2], meta[3], meta[4]);
                corrupt_errors += b.err != 0;
                delta_flips += 1;
            }
            for (u64 cut : {u64(1), u64(3), pg.dst_len / 2}) {
                if (pg.codec != 0 || cut >= pg.dst_len) continue;
                vector<u64> short_table = table;
                PqPage* sp = (PqPage*)short_table.data() + pi;
                sp->src_len -= cut;
                sp->dst_len -= cut;
                Out b = run(raw, short_table, meta[0], meta[1], meta[2], meta[3], meta[4]);
                corrupt_errors += b.err != 0;
                delta_flips += 1;
            }
        }
    }
    printf("ok: %llu cases, %ld pages, %ld rows equal to arrow-rs's reader; %ld of the corrupted runs ended with an error code (%ld runs flipped DELTA pages' first bytes or cut them short)\n", list[0], pages_checked, rows_checked, corrupt_errors, delta_flips);
    return 0;
}
