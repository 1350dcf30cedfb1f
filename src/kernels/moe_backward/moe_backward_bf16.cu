// The BF16 backward megakernel, sm_90a: the engine (megakernel/engine.cuh) running the backward's
// tile program (backward_program.cuh), after a one-block kernel that lays out its tile sequence.
#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_backward/backward_program.cuh"
#include "mok/device/block_scan.cuh"

namespace mok::kern {
namespace {

// The same register split as the forward's (its producer walks as rich a tile sequence).
constexpr int kBackwardProducerRegs = 96, kBackwardConsumerRegs = 200;
static_assert(128 * kBackwardProducerRegs + kConsumers * 128 * kBackwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");
constexpr int kSmem = TileShape<kBackwardBlockN>::kSmemBytes;

__global__ void __launch_bounds__(kThreads, 1)
    moe_backward_kernel(const __grid_constant__ BackwardLaunch launch) {
  run_megakernel<BackwardProgram, kBackwardProducerRegs, kBackwardConsumerRegs, false>(launch);
}

// step_begin: the first tile of each step of the sequence (backward_tiles.cuh), an exclusive
// prefix over the steps' tile counts, 1024 steps per pass.
__global__ void backward_steps_kernel(const __grid_constant__ BackwardLaunch launch) {
  const BackwardParams& p = launch.local.params;
  __shared__ int64_t warp_sums[dev::kMaxBlockWarps];
  const int steps = backward_units(p) + 2;
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

}  // namespace

cudaError_t prepare_backward_kernel(int* ctas_per_sm) {
  if (cudaError_t e = cudaFuncSetAttribute(moe_backward_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      e != cudaSuccess)
    return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, moe_backward_kernel, kThreads,
                                                       kSmem);
}

cudaError_t launch_backward(const BackwardLaunch& launch, int grid, cudaStream_t stream) {
  if (launch.ranks != 1 || grid < 1) return cudaErrorInvalidValue;
  backward_steps_kernel<<<1, 1024, 0, stream>>>(launch);
  moe_backward_kernel<<<grid, kThreads, kSmem, stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace mok::kern
