// The BF16 backward megakernel, sm_90a: the engine (megakernel/engine.cuh) running the backward's
// tile program (backward_program.cuh), after a one-block kernel that lays out its tile sequence.
// The kernel sets that include it: the library's (moe_backward_bf16.cu) and the timeline's
// (moe_backward_trace.cu, kTrace).
#pragma once
#include <type_traits>

#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_backward/backward_program.cuh"
#include "mok/device/block_scan.cuh"

namespace mok::kern {

// The consumers keep 224 registers: at the forward's 200 the 256-wide epilogues (three kinds
// beside the 128 accumulators) spilled 268 bytes, at 224 they spill 64 (ptxas -v); the producer
// walks the tile table in shared memory and needs less than the forward's.
constexpr int kBackwardProducerRegs = 56, kBackwardConsumerRegs = 224;
static_assert(128 * kBackwardProducerRegs + kConsumers * 128 * kBackwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");

// Internal linkage, each set's instantiations its own translation unit's: with external linkage
// nvcc gave the same production kernels different SASS (cuobjdump, against 9d65bdf).
namespace {

// kGroup: an emulated group's shares in device memory (launch.group); kRecompute:
// GateUpMode::recompute (BackwardProgram); kTrace: the timeline recorded; kRouted: the routed
// dgrad tiles' weights (bf16, fp8_block, nvfp4 or mxfp8).
template <int kBlockN, bool kGroup, bool kRecompute, bool kTrace, RoutedWeights kRouted>
__global__ void __launch_bounds__(kThreads, 1)
    moe_backward_kernel(const __grid_constant__ BackwardLaunch launch) {
  run_megakernel<BackwardProgram<kBlockN, kRecompute, kTrace, kRouted>, kBackwardProducerRegs,
                 kBackwardConsumerRegs, kGroup>(launch);
}

}  // namespace

// Before a group's megakernel: one rank's share into device memory, then the release that lets
// the megakernel's TMA read the maps in it.
__global__ void backward_share_copy_kernel(const __grid_constant__ BackwardShare share,
                                           BackwardShare* to);

// step_begin: the first tile of each step of the sequence (backward_tiles.cuh), an exclusive
// prefix over the steps' tile counts, 1024 steps per pass.
__global__ void backward_steps_kernel(const __grid_constant__ BackwardParams p);

// Tile width 128 or 256 (every tile of a launch).
template <class F>
cudaError_t with_block_n(int block_n, F&& f) {
  if (block_n == 128) return f(std::integral_constant<int, 128>{});
  if (block_n == 256) return f(std::integral_constant<int, 256>{});
  return cudaErrorInvalidValue;
}

namespace {
// The widening sets (nvfp4, mxfp8) have 128-wide tiles only.
template <int kBlockN, RoutedWeights kRouted>
constexpr bool kBackwardWidth = kBlockN == 128 || (kRouted != RoutedWeights::nvfp4 &&
                                                   kRouted != RoutedWeights::mxfp8);
// One instantiation of a set: the kernel for (group, recompute). A set without recompute
// (the low precisions) has no recompute kernels, the widening ones no 256-wide ones: nullptr.
template <int kBlockN, bool kTrace, bool kGroups, RoutedWeights kRouted>
auto backward_kernel_for(bool group, bool recompute) {
  using Kernel = void (*)(BackwardLaunch);
  constexpr bool kBf16 = kRouted == RoutedWeights::bf16;
  if constexpr (!kBackwardWidth<kBlockN, kRouted>) {
    return Kernel(nullptr);
  } else {
    if (recompute && !kBf16) return Kernel(nullptr);
    constexpr bool kR = kBf16;  // the recompute instantiation, where the set has one
    if (group)
      return recompute ? Kernel(moe_backward_kernel<kBlockN, kGroups, kR, kTrace, kRouted>)
                       : Kernel(moe_backward_kernel<kBlockN, kGroups, false, kTrace, kRouted>);
    return recompute ? Kernel(moe_backward_kernel<kBlockN, false, kR, kTrace, kRouted>)
                     : Kernel(moe_backward_kernel<kBlockN, false, false, kTrace, kRouted>);
  }
}
// Its dynamic shared memory: the ring, and the widening sets' staging slots.
template <int kBlockN, RoutedWeights kRouted>
constexpr int backward_smem_bytes() {
  if constexpr (!kBackwardWidth<kBlockN, kRouted>)
    return 0;
  else
    return program_smem_bytes<BackwardProgram<kBlockN, false, false, kRouted>>();
}
// The two staging slots fit beside the ring and the tile table: besides the table ptxas counts
// 1,544 bytes of static shared memory, barriers and queues (1,600 allowed here, so that a larger
// table fails to compile instead of to launch). mxfp8's slots (8.5 KB each) fit only with the
// table's 32-bit entries.
template <RoutedWeights kRouted>
constexpr bool kFitsBesideTable = backward_smem_bytes<128, kRouted>() + int(sizeof(BackwardTable)) +
                                      1600 <=
                                  232448;
static_assert(kFitsBesideTable<RoutedWeights::nvfp4> && kFitsBesideTable<RoutedWeights::mxfp8>,
              "the widening backwards: the ring, two staging slots and the tile table in one CTA");
}  // namespace

// A kernel set's prepare and launch (BackwardKernels). kGroups: the set has the emulated groups'
// instantiations (the timeline's runs one rank). kRouted: the routed dgrad tiles' weights
// (the low precisions' sets have no recompute).
template <bool kTrace, bool kGroups, RoutedWeights kRouted = RoutedWeights::bf16>
cudaError_t prepare_backward_set(int block_n, int* ctas_per_sm) {
  return with_block_n(block_n, [&](auto n) {
    constexpr int kBlockN = decltype(n)::value, kSmem = backward_smem_bytes<kBlockN, kRouted>();
    const void* any = nullptr;
    for (bool group : {false, true})
      for (bool recompute : {false, true}) {
        if (group && !kGroups) continue;
        const void* kernel = reinterpret_cast<const void*>(
            backward_kernel_for<kBlockN, kTrace, kGroups, kRouted>(group, recompute));
        if (kernel == nullptr) continue;
        if (cudaError_t e =
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
            e != cudaSuccess)
          return e;
        if (!any) any = kernel;
      }
    if (!any) return cudaErrorInvalidValue;  // no kernel of this width in the set
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, any, kThreads, kSmem);
  });
}

template <bool kTrace, bool kGroups, RoutedWeights kRouted = RoutedWeights::bf16>
cudaError_t launch_backward_set(const BackwardShare* shares, int ranks, BackwardShare* group,
                                int grid, cudaStream_t stream) {
  if (ranks < 1 || ranks > kMaxRanks || grid < ranks || (ranks > 1 && (!group || !kGroups)))
    return cudaErrorInvalidValue;
  for (int r = 0; r < ranks; ++r) {
    if (shares[r].params.block_n != shares[0].params.block_n ||
        shares[r].params.recompute != shares[0].params.recompute ||
        shares[r].params.fp8_block != (kRouted == RoutedWeights::fp8_block ? 1 : 0) ||
        shares[r].params.nvfp4 != (kRouted == RoutedWeights::nvfp4 ? 1 : 0) ||
        shares[r].params.mxfp8 != (kRouted == RoutedWeights::mxfp8 ? 1 : 0))
      return cudaErrorInvalidValue;
    backward_steps_kernel<<<1, 1024, 0, stream>>>(shares[r].params);
    if (ranks > 1) backward_share_copy_kernel<<<1, 128, 0, stream>>>(shares[r], group + r);
  }
  return with_block_n(shares[0].params.block_n, [&](auto n) {
    constexpr int kBlockN = decltype(n)::value, kSmem = backward_smem_bytes<kBlockN, kRouted>();
    BackwardLaunch launch{};
    launch.ranks = ranks;
    const bool recompute = shares[0].params.recompute != 0;
    if (ranks == 1)
      launch.local = shares[0];
    else
      launch.group = group;
    const auto kernel =
        backward_kernel_for<kBlockN, kTrace, kGroups, kRouted>(ranks > 1, recompute);
    if (kernel == nullptr) return cudaErrorInvalidValue;
    kernel<<<grid, kThreads, kSmem, stream>>>(launch);
    return cudaGetLastError();
  });
}

}  // namespace mok::kern
