// Row hashing and exact verification of hashed keys on the device. Work in progress.
#include "common.cuh"
extern "C" __global__ void row_hash_placeholder(u64* x) {}
