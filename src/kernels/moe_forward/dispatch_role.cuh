// Dispatch role (CTAs [0, dispatch_ctas)): copies each token row into its expert's segment of the
// routed buffer, row block by row block, and publishes a ready counter per block. The GEMM CTAs'
// producers TMA-load a block as soon as its counter is set, so the first experts' GEMMs run while
// later blocks are still being gathered. Padding rows are written as zeros. With expert
// parallelism only the source of these rows changes (a peer's buffer instead of x).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/moe_forward/tile_schedule.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

// Test hook: a pseudo-random delay in [0, max_ns) that depends on the block and the seed only.
__device__ __forceinline__ void injected_delay(uint32_t max_ns, uint32_t seed, int64_t block) {
  if (max_ns == 0) return;
  uint32_t h = seed ^ uint32_t(block) * 0x9E3779B9u;
  h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13;
  for (uint32_t left = h % max_ns; left > 0;) {  // __nanosleep takes at most ~1 ms at a time
    const uint32_t step = left < 500000u ? left : 500000u;
    __nanosleep(step);
    left -= step;
  }
}

__device__ __forceinline__ void dispatch_role(const ForwardParams& p, int cta, int ctas) {
  const int64_t blocks = routed_blocks(p);
  const int64_t row_vecs = p.hidden / 8;  // 16-byte vectors per row
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  uint4* routed = reinterpret_cast<uint4*>(p.routed_x);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int64_t b = cta; b < blocks; b += ctas) {
    const int expert = p.tile_expert[b];
    for (int r = warp; r < kBlockM; r += warps) {
      const int64_t row = b * kBlockM + r;
      const int64_t slot =
          sched::routed_row_slot(row, expert, p.seg_begin, p.counts, p.offsets, p.sorted);
      uint4* dst = routed + row * row_vecs;
      if (slot >= 0) {
        const uint4* src = x + sched::slot_token(slot, p.top_k) * row_vecs;
#pragma unroll 4
        for (int64_t v = lane; v < row_vecs; v += 32) dst[v] = __ldg(src + v);
      } else {
        for (int64_t v = lane; v < row_vecs; v += 32) dst[v] = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();  // every thread's stores precede the release below (it is cumulative)
    if (threadIdx.x == 0) {
      injected_delay(p.delay_ns, p.delay_seed, b);
      if (b != p.never_publish_block) {
        dev::fence_proxy_async_global();  // the readers are TMA loads (hopper-gemm.md, 13)
        dev::add_release_gpu(p.x_ready + b, 1);
      }
    }
  }
}

}  // namespace mok::kern
