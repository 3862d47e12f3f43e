// The seeds' GPU library baselines for `setfusion bench seeds`: CUB's radix
// sort, and thrust's sort and set operations, on the keys the bench writes to
// files. The bench builds this with nvcc where the machine has one
// (tools/src/bench/seeds/cuda_baselines.rs), starts it once, and sends it one
// job a line on stdin; each job answers one line of key=value pairs on stdout.
//
//   sort PAIRS FILE
//       u32 keys; PAIRS 1 sorts (key, index) pairs. CUB DeviceRadixSort and
//       thrust::sort / sort_by_key; the result is checked here (ordered, the
//       same multiset of keys, each value pointing at its key).
//   set OP SORTED WIDTH FILE_A FILE_B
//       thrust::set_<OP> (intersection, difference, union,
//       symmetric_difference) of u32 (WIDTH 4) or u64 (WIDTH 8) keys with
//       std::set_* semantics (duplicates kept as multisets); SORTED 0 sorts
//       both sides with thrust::sort first. Answers the result's length.
//
// Times are medians of RUNS (argv[1]) after one untimed run:
//   device_ms  the inputs already on the device (cudaEvent around the work);
//   total_ms   from pageable host memory until the result is in host memory:
//              allocations, uploads, the work and the download (wall clock),
//              as setfusion's GPU times in `bench seeds` are taken.
//
// Build: nvcc -O3 -std=c++17 -arch=native seed_baselines.cu -o seed_baselines
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <cub/cub.cuh>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/host_vector.h>
#include <thrust/sequence.h>
#include <thrust/set_operations.h>
#include <thrust/sort.h>

typedef uint32_t u32;
typedef uint64_t u64;

// A failed CUDA call ends the process with a line the bench shows.
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("error %s at line %d: %s\n", cudaGetErrorString(e_), __LINE__, #x);             \
            fflush(stdout);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int g_runs = 3;

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <class T> static std::vector<T> read_keys(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        printf("error cannot open %s\n", path.c_str());
        fflush(stdout);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    std::vector<T> v(bytes / sizeof(T));
    if (!v.empty() && fread(v.data(), sizeof(T), v.size(), f) != v.size()) {
        printf("error short read of %s\n", path.c_str());
        fflush(stdout);
        exit(1);
    }
    fclose(f);
    return v;
}

// The median of RUNS timings of `work` on the device (cudaEvent), each after
// an untimed `reset`, following one untimed run.
template <class R, class W> static double device_ms(R reset, W work) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int r = 0; r <= g_runs; ++r) {
        reset();
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        work();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r) t.push_back(ms);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(t);
}

// The median of RUNS wall-clock timings of `work` (which ends with its result
// in host memory), following one untimed run.
template <class W> static double total_ms(W work) {
    std::vector<double> t;
    for (int r = 0; r <= g_runs; ++r) {
        CK(cudaDeviceSynchronize());
        const auto t0 = std::chrono::steady_clock::now();
        work();
        CK(cudaDeviceSynchronize());
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r) t.push_back(ms);
    }
    return median(t);
}

// Whether `k` (with values `v` when pairs) is `keys` sorted: ordered, the same
// keys (sum and xor of their mixes), each value the index of its key.
static bool sorted_right(const std::vector<u32>& keys, const std::vector<u32>& k, const std::vector<u32>* v) {
    if (k.size() != keys.size()) return false;
    u64 sum_in = 0, sum_out = 0, xor_in = 0, xor_out = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
        const u64 a = (u64)keys[i] * 0x9e3779b97f4a7c15ULL, b = (u64)k[i] * 0x9e3779b97f4a7c15ULL;
        sum_in += a; xor_in ^= a; sum_out += b; xor_out ^= b;
        if (i + 1 < k.size() && k[i] > k[i + 1]) return false;
        if (v && ((*v)[i] >= keys.size() || keys[(*v)[i]] != k[i])) return false;
    }
    return sum_in == sum_out && xor_in == xor_out;
}

// CUB's radix sort, one reusable set of buffers: the keys (and values) in,
// their double buffers, CUB's temporary storage.
struct CubSort {
    size_t n;
    bool pairs;
    u32 *k[2], *v[2];
    void* tmp = nullptr;
    size_t tmp_bytes = 0;
    int out = 0;

    CubSort(size_t n_, bool pairs_) : n(n_), pairs(pairs_) {
        k[0] = k[1] = v[0] = v[1] = nullptr;
        CK(cudaMalloc(&k[0], n * 4 + 4));
        CK(cudaMalloc(&k[1], n * 4 + 4));
        if (pairs) {
            CK(cudaMalloc(&v[0], n * 4 + 4));
            CK(cudaMalloc(&v[1], n * 4 + 4));
        }
        cub::DoubleBuffer<u32> dk(k[0], k[1]), dv(v[0], v[1]);
        if (pairs) CK(cub::DeviceRadixSort::SortPairs(nullptr, tmp_bytes, dk, dv, (int)n));
        else CK(cub::DeviceRadixSort::SortKeys(nullptr, tmp_bytes, dk, (int)n));
        CK(cudaMalloc(&tmp, tmp_bytes + 4));
    }
    ~CubSort() {
        cudaFree(k[0]); cudaFree(k[1]); cudaFree(v[0]); cudaFree(v[1]); cudaFree(tmp);
    }
    void sort() {
        cub::DoubleBuffer<u32> dk(k[0], k[1]), dv(v[0], v[1]);
        if (pairs) CK(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, dk, dv, (int)n));
        else CK(cub::DeviceRadixSort::SortKeys(tmp, tmp_bytes, dk, (int)n));
        out = dk.selector;
    }
};

static void sort_job(bool pairs, const std::string& path) {
    const std::vector<u32> keys = read_keys<u32>(path);
    const size_t n = keys.size();
    std::vector<u32> index(n);
    for (size_t i = 0; i < n; ++i) index[i] = (u32)i;
    std::vector<u32> got_k(n), got_v(pairs ? n : 0);
    bool ok = true;

    // CUB: on the device, then from the host (allocations, uploads, sort, downloads).
    double cub_device = 0, cub_total = 0;
    {
        CubSort s(n, pairs);
        u32 *keys_in, *values_in = nullptr;
        CK(cudaMalloc(&keys_in, n * 4 + 4));
        CK(cudaMemcpy(keys_in, keys.data(), n * 4, cudaMemcpyHostToDevice));
        if (pairs) {
            CK(cudaMalloc(&values_in, n * 4 + 4));
            CK(cudaMemcpy(values_in, index.data(), n * 4, cudaMemcpyHostToDevice));
        }
        cub_device = device_ms(
            [&] {
                CK(cudaMemcpy(s.k[0], keys_in, n * 4, cudaMemcpyDeviceToDevice));
                if (pairs) CK(cudaMemcpy(s.v[0], values_in, n * 4, cudaMemcpyDeviceToDevice));
            },
            [&] { s.sort(); });
        cudaFree(keys_in);
        cudaFree(values_in);
    }
    cub_total = total_ms([&] {
        CubSort s(n, pairs);
        CK(cudaMemcpy(s.k[0], keys.data(), n * 4, cudaMemcpyHostToDevice));
        if (pairs) CK(cudaMemcpy(s.v[0], index.data(), n * 4, cudaMemcpyHostToDevice));
        s.sort();
        CK(cudaMemcpy(got_k.data(), s.k[s.out], n * 4, cudaMemcpyDeviceToHost));
        if (pairs) CK(cudaMemcpy(got_v.data(), s.v[s.out], n * 4, cudaMemcpyDeviceToHost));
    });
    ok = ok && sorted_right(keys, got_k, pairs ? &got_v : nullptr);

    // thrust (its temporary storage allocated inside each call).
    double thrust_device = 0, thrust_total = 0;
    {
        thrust::device_vector<u32> in_k(keys.begin(), keys.end()), k(n), in_v(n), v(n);
        if (pairs) thrust::sequence(in_v.begin(), in_v.end());
        thrust_device = device_ms(
            [&] {
                thrust::copy(in_k.begin(), in_k.end(), k.begin());
                if (pairs) thrust::copy(in_v.begin(), in_v.end(), v.begin());
            },
            [&] {
                if (pairs) thrust::sort_by_key(thrust::device, k.begin(), k.end(), v.begin());
                else thrust::sort(thrust::device, k.begin(), k.end());
            });
    }
    thrust_total = total_ms([&] {
        thrust::device_vector<u32> k(keys.begin(), keys.end());
        if (pairs) {
            thrust::device_vector<u32> v(index.begin(), index.end());
            thrust::sort_by_key(thrust::device, k.begin(), k.end(), v.begin());
            thrust::copy(v.begin(), v.end(), got_v.begin());
        } else {
            thrust::sort(thrust::device, k.begin(), k.end());
        }
        thrust::copy(k.begin(), k.end(), got_k.begin());
    });
    ok = ok && sorted_right(keys, got_k, pairs ? &got_v : nullptr);
    printf("sort n=%zu pairs=%d cub_device_ms=%.4f cub_total_ms=%.4f thrust_device_ms=%.4f thrust_total_ms=%.4f ok=%d\n", n,
           (int)pairs, cub_device, cub_total, thrust_device, thrust_total, (int)ok);
}

// thrust::set_<op> of [a, a + na) and [b, b + nb) into out; the result's length.
template <class P> static size_t set_op(const std::string& op, P a, size_t na, P b, size_t nb, P out) {
    P end = out;
    if (op == "intersection") end = thrust::set_intersection(thrust::device, a, a + na, b, b + nb, out);
    else if (op == "difference") end = thrust::set_difference(thrust::device, a, a + na, b, b + nb, out);
    else if (op == "union") end = thrust::set_union(thrust::device, a, a + na, b, b + nb, out);
    else end = thrust::set_symmetric_difference(thrust::device, a, a + na, b, b + nb, out);
    return (size_t)(end - out);
}

template <class T> static void set_job(const std::string& op, bool sorted, const std::string& pa, const std::string& pb) {
    const std::vector<T> a = read_keys<T>(pa), b = read_keys<T>(pb);
    const size_t na = a.size(), nb = b.size(), cap = na + nb + 1;
    size_t count = 0;
    double device = 0, total = 0;
    {
        thrust::device_vector<T> in_a(a.begin(), a.end()), in_b(b.begin(), b.end()), x(na + 1), y(nb + 1), out(cap);
        device = device_ms(
            [&] {
                thrust::copy(in_a.begin(), in_a.end(), x.begin());
                thrust::copy(in_b.begin(), in_b.end(), y.begin());
            },
            [&] {
                if (!sorted) {
                    thrust::sort(thrust::device, x.begin(), x.begin() + na);
                    thrust::sort(thrust::device, y.begin(), y.begin() + nb);
                }
                count = set_op(op, x.data(), na, y.data(), nb, out.data());
            });
    }
    std::vector<T> result(cap);
    size_t got = 0;
    total = total_ms([&] {
        thrust::device_vector<T> x(a.begin(), a.end()), y(b.begin(), b.end()), out(cap);
        if (!sorted) {
            thrust::sort(thrust::device, x.begin(), x.end());
            thrust::sort(thrust::device, y.begin(), y.end());
        }
        got = set_op(op, x.data(), na, y.data(), nb, out.data());
        thrust::copy(out.begin(), out.begin() + got, result.begin());
    });
    printf("set op=%s sorted=%d width=%zu count=%zu device_ms=%.4f total_ms=%.4f ok=%d\n", op.c_str(), (int)sorted, sizeof(T),
           count, device, total, (int)(got == count));
}

int main(int argc, char** argv) {
    if (argc > 1) g_runs = std::max(1, atoi(argv[1]));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("ready device=%s\n", p.name);
    fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string job;
        in >> job;
        try {
            if (job == "sort") {
                int pairs = 0;
                std::string path;
                in >> pairs >> path;
                sort_job(pairs != 0, path);
            } else if (job == "set") {
                std::string op, pa, pb;
                int sorted = 1, width = 4;
                in >> op >> sorted >> width >> pa >> pb;
                if (op != "intersection" && op != "difference" && op != "union" && op != "symmetric_difference")
                    printf("error no set operation %s\n", op.c_str());
                else if (width == 8) set_job<u64>(op, sorted != 0, pa, pb);
                else set_job<u32>(op, sorted != 0, pa, pb);
            } else {
                printf("error no job %s\n", job.c_str());
            }
        } catch (const std::exception& e) {
            // thrust reports a failed allocation by throwing.
            printf("error %s\n", e.what());
            cudaGetLastError();
        }
        fflush(stdout);
    }
    return 0;
}
