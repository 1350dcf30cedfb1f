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

// kGroup: an emulated group's shares in device memory (launch.group); kRecompute:
// GateUpMode::recompute (BackwardProgram).
template <int kBlockN, bool kGroup, bool kRecompute>
__global__ void __launch_bounds__(kThreads, 1)
    moe_backward_kernel(const __grid_constant__ BackwardLaunch launch) {
  run_megakernel<BackwardProgram<kBlockN, kRecompute>, kBackwardProducerRegs, kBackwardConsumerRegs,
                 kGroup>(launch);
}

// Before a group's megakernel: one rank's share into device memory, then the release that lets
// the megakernel's TMA read the maps in it.
__global__ void backward_share_copy_kernel(const __grid_constant__ BackwardShare share,
                                           BackwardShare* to) {
  static_assert(sizeof(BackwardShare) % 4 == 0);
  const uint32_t* from = reinterpret_cast<const uint32_t*>(&share);
  uint32_t* dst = reinterpret_cast<uint32_t*>(to);
  for (uint32_t i = threadIdx.x; i < sizeof(BackwardShare) / 4; i += blockDim.x) dst[i] = from[i];
  __syncthreads();
  if (threadIdx.x == 0) dev::fence_tensormap_release();
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

}  // namespace

cudaError_t prepare_backward_kernel(int block_n, int* ctas_per_sm) {
  return with_block_n(block_n, [&](auto n) {
    constexpr int kBlockN = decltype(n)::value, kSmem = TileShape<kBlockN>::kSmemBytes;
    for (auto* kernel :
         {moe_backward_kernel<kBlockN, false, false>, moe_backward_kernel<kBlockN, true, false>,
          moe_backward_kernel<kBlockN, false, true>, moe_backward_kernel<kBlockN, true, true>})
      if (cudaError_t e =
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
          e != cudaSuccess)
        return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        ctas_per_sm, moe_backward_kernel<kBlockN, false, false>, kThreads, kSmem);
  });
}

cudaError_t launch_backward(const BackwardShare* shares, int ranks, BackwardShare* group, int grid,
                            cudaStream_t stream) {
  if (ranks < 1 || ranks > kMaxRanks || grid < ranks || (ranks > 1 && !group))
    return cudaErrorInvalidValue;
  for (int r = 0; r < ranks; ++r) {
    if (shares[r].params.block_n != shares[0].params.block_n ||
        shares[r].params.recompute != shares[0].params.recompute)
      return cudaErrorInvalidValue;
    backward_steps_kernel<<<1, 1024, 0, stream>>>(shares[r].params);
    if (ranks > 1) backward_share_copy_kernel<<<1, 128, 0, stream>>>(shares[r], group + r);
  }
  return with_block_n(shares[0].params.block_n, [&](auto n) {
    constexpr int kBlockN = decltype(n)::value, kSmem = TileShape<kBlockN>::kSmemBytes;
    BackwardLaunch launch{};
    launch.ranks = ranks;
    const bool recompute = shares[0].params.recompute != 0;
    if (ranks == 1) {
      launch.local = shares[0];
      (recompute
           ? moe_backward_kernel<kBlockN, false, true>
           : moe_backward_kernel<kBlockN, false, false>)<<<grid, kThreads, kSmem, stream>>>(launch);
    } else {
      launch.group = group;
      (recompute
           ? moe_backward_kernel<kBlockN, true, true>
           : moe_backward_kernel<kBlockN, true, false>)<<<grid, kThreads, kSmem, stream>>>(launch);
    }
    return cudaGetLastError();
  });
}

}  // namespace mok::kern
