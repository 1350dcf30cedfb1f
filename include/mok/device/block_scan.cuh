// A prefix sum over one thread block, one value per thread in thread order: within each warp by
// shuffles, then across the warps' sums in shared memory. Integer sums: the result does not
// depend on the order the warps run in.
#pragma once
#include <cstdint>

namespace mok::dev {

constexpr int kMaxBlockWarps = 32;  // 1024 threads

// Every thread of the block calls it (blockDim.x a multiple of 32); warp_sums: kMaxBlockWarps
// values of T in shared memory. Returns the sum of the values of the threads before this one;
// *total (optional) gets the whole block's sum.
template <class T>
__device__ __forceinline__ T block_exclusive_sum(T value, T* warp_sums, T* total = nullptr) {
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int warps = int(blockDim.x / 32);
  T inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T v = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  T before = inclusive - value;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  if (total) {
    T all = 0;
    for (int w = 0; w < warps; ++w) all += warp_sums[w];
    *total = all;
  }
  __syncthreads();  // warp_sums may be reused by the caller's next scan
  return before;
}

}  // namespace mok::dev
