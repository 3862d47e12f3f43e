// Warp emulation for the host (scripts/kernels-on-host/parquet-warp.sh): blockDim.x host
// threads run one block, each with its own threadIdx; __syncwarp and __syncthreads
// are a barrier and __shfl_sync exchanges values through slots between two
// barriers. One warp of at most 32 threads, except for code whose only shuffle
// is __shfl_up_sync read by lanes at or above the distance (pq_decode): that
// stays within each thread's warp of 32, so its blocks may have up to 1024.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <barrier>
struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx{0, 0, 0};
static Dim3 blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
static std::barrier<>* warp_barrier = nullptr;
static inline void __syncthreads() { if (blockDim.x > 1) warp_barrier->arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { if (blockDim.x > 1) warp_barrier->arrive_and_wait(); }
static unsigned long long shfl_slots[1024];
template <class T> T __shfl_sync(unsigned, T v, int src) {
    if (blockDim.x == 1) return v;
    shfl_slots[threadIdx.x] = (unsigned long long)v;
    warp_barrier->arrive_and_wait();
    T r = (T)shfl_slots[src];
    warp_barrier->arrive_and_wait();
    return r;
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned d) {
    if (blockDim.x == 1) return v;
    shfl_slots[threadIdx.x] = (unsigned long long)v;
    warp_barrier->arrive_and_wait();
    T r = threadIdx.x >= d ? (T)shfl_slots[threadIdx.x - d] : v;
    warp_barrier->arrive_and_wait();
    return r;
}
template <class T> T __shfl_down_sync(unsigned, T v, int) { return v; }
static inline unsigned __ballot_sync(unsigned, int p) {
    if (blockDim.x == 1) return p ? 1u : 0u;
    shfl_slots[threadIdx.x] = p ? 1 : 0;
    warp_barrier->arrive_and_wait();
    unsigned r = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) r |= (unsigned)shfl_slots[i] << i;
    warp_barrier->arrive_and_wait();
    return r;
}
static inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) { auto o = *p; if (v < o) *p = v; return o; }
static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) { auto o = *p; if (v > o) *p = v; return o; }
#include <mutex>
static std::mutex fail_mu;
// Locked: pq_decode's threads OR validity bits into shared words.
static inline unsigned atomicOr(unsigned* p, unsigned v) { std::lock_guard<std::mutex> g(fail_mu); auto o = *p; *p |= v; return o; }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p += v; return o; }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline unsigned atomicMax(unsigned* p, unsigned v) { std::lock_guard<std::mutex> g(fail_mu); auto o = *p; if (v > o) *p = v; return o; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
