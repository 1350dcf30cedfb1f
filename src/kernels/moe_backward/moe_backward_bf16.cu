// The BF16 backward megakernel, sm_90a: the engine (megakernel/engine.cuh) running the backward's
// tile program (backward_program.cuh), after a one-block kernel that lays out its tile sequence.
#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_backward/backward_program.cuh"
#include "mok/device/block_scan.cuh"

#include <type_traits>

namespace mok::kern {
namespace {

// The consumers keep 224 registers: at the forward's 200 the 256-wide epilogues (three kinds
// beside the 128 accumulators) spilled 268 bytes, at 224 they spill 64 (ptxas -v); the producer
// walks the tile table in shared memory and needs less than the forward's.
constexpr int kBackwardProducerRegs = 56, kBackwardConsumerRegs = 224;
static_assert(128 * kBackwardProducerRegs + kConsumers * 128 * kBackwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");

template <int kBlockN>
__global__ void __launch_bounds__(kThreads, 1)
    moe_backward_kernel(const __grid_constant__ BackwardLaunch launch) {
  run_megakernel<BackwardProgram<kBlockN>, kBackwardProducerRegs, kBackwardConsumerRegs, false>(
      launch);
}

// Tile width 128 or 256 (every tile of a launch).
template <class F>
cudaError_t with_block_n(int block_n, F&& f) {
  if (block_n == 128) return f(std::integral_constant<int, 128>{});
  if (block_n == 256) return f(std::integral_constant<int, 256>{});
  return cudaErrorInvalidValue;
}

// step_begin: the first tile of each step of the sequence (backward_tiles.cuh), an exclusive
// prefix over the steps' tile counts, 1024 steps per pass.
__global__ void backward_steps_kernel(const __grid_constant__ BackwardLaunch launch) {
  const BackwardParams& p = launch.local.params;
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

}  // namespace

cudaError_t prepare_backward_kernel(int block_n, int* ctas_per_sm) {
  return with_block_n(block_n, [&](auto n) {
    constexpr int kBlockN = decltype(n)::value, kSmem = TileShape<kBlockN>::kSmemBytes;
    if (cudaError_t e = cudaFuncSetAttribute(moe_backward_kernel<kBlockN>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        e != cudaSuccess)
      return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, moe_backward_kernel<kBlockN>,
                                                         kThreads, kSmem);
  });
}

cudaError_t launch_backward(const BackwardLaunch& launch, int grid, cudaStream_t stream) {
  if (launch.ranks != 1 || grid < 1) return cudaErrorInvalidValue;
  return with_block_n(launch.local.params.block_n, [&](auto n) {
    constexpr int kBlockN = decltype(n)::value;
    backward_steps_kernel<<<1, 1024, 0, stream>>>(launch);
    moe_backward_kernel<kBlockN>
        <<<grid, kThreads, TileShape<kBlockN>::kSmemBytes, stream>>>(launch);
    return cudaGetLastError();
  });
}

}  // namespace mok::kern
