// The library's backward kernels (BackwardKernels: every width, with and without recompute, one
// rank and emulated groups), and the small kernels every set launches before the megakernel.
#include "kernels/moe_backward/backward_kernel.cuh"

namespace mok::kern {

__global__ void backward_share_copy_kernel(const __grid_constant__ BackwardShare share,
                                           BackwardShare* to) {
  static_assert(sizeof(BackwardShare) % 4 == 0);
  const uint32_t* from = reinterpret_cast<const uint32_t*>(&share);
  uint32_t* dst = reinterpret_cast<uint32_t*>(to);
  for (uint32_t i = threadIdx.x; i < sizeof(BackwardShare) / 4; i += blockDim.x) dst[i] = from[i];
  __syncthreads();
  if (threadIdx.x == 0) dev::fence_tensormap_release();
}

__global__ void backward_steps_kernel(const __grid_constant__ BackwardParams p) {
  __shared__ int64_t warp_sums[dev::kMaxBlockWarps];
  const int steps = backward_steps(p, p.lag);
  int64_t base = 0;
  for (int j0 = 0; j0 < steps; j0 += int(blockDim.x)) {
    const int j = j0 + int(threadIdx.x);
    const int64_t n = j < steps ? backward_step_tiles(p, j) : 0;
    int64_t total = 0;
    const int64_t before = dev::block_exclusive_sum(n, warp_sums, &total);
    if (j < steps) p.step_begin[j] = base + before;
    base += total;
  }
  if (threadIdx.x == 0) p.step_begin[steps] = base;
}

const BackwardKernels& production_backward_kernels() {
  static const BackwardKernels set{prepare_backward_set<false, true>,
                                   launch_backward_set<false, true>, RoutedWeights::bf16,
                                   /*groups=*/true};
  return set;
}

}  // namespace mok::kern
