// The forward megakernel (BF16, or the routed experts in fp8_block), sm_90a: one persistent launch
// with three roles (dispatch, GEMM, combine) that hand work to each other through counters in
// global memory. The engine (megakernel/engine.cuh) runs the roles; the forward's tile program
// (forward_program.cuh) says which tiles exist, with the tile order and its deadlock argument in
// tile_schedule.cuh and the row movers in dispatch_role.cuh and combine_role.cuh. The
// instantiations live in moe_forward_bf16.cu (production) and moe_forward_probes.cu (the
// benchmarks' stage probes).
#pragma once
#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_forward/forward_program.cuh"

#include <type_traits>

namespace mok::kern {

// The producer walks a richer tile sequence than the plain grouped GEMM's (four tile kinds, their
// counters and maps, the tile queue, peer tables): at 88 registers it spilled, at 96 it does not;
// the consumers keep 200 (128 accumulators).
constexpr int kForwardProducerRegs = 96, kForwardConsumerRegs = 200;
static_assert(128 * kForwardProducerRegs + kConsumers * 128 * kForwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");
// fp8_block's consumers also hold a partial accumulator per 64-column slice (mma_tile_fp8_block):
// registers move from the producer to them (at 40 / 232 the producer spilled, at 72 / 216 only
// per-tile lookups and the profiling timers do).
constexpr int kFp8ProducerRegs = 72, kFp8ConsumerRegs = 216;
static_assert(128 * kFp8ProducerRegs + kConsumers * 128 * kFp8ConsumerRegs <= kThreads * 168,
              "setmaxnreg budget");

// The forward megakernel: the engine running the forward's tile program. kMmaInFlight: the
// consumers keep one wgmma group in flight (mma_tile). kKeepGateUp: a training forward, which also
// keeps the SwiGLU inputs (store_gate_up). kProbe: a benchmark's stage probe (kProbe*), 0 in every
// forward that computes.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp, int kProbe, bool kGroup>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_kernel(const __grid_constant__ ForwardLaunch launch) {
  run_megakernel<ForwardProgram<kBlockN, kMmaInFlight, kKeepGateUp, kProbe>, kForwardProducerRegs,
                 kForwardConsumerRegs, kGroup>(launch);
}

// The routed experts in fp8_block (ForwardProgram's kFp8Block); kKeepGateUp: a training forward.
template <bool kGroup, bool kKeepGateUp>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_fp8_block_kernel(const __grid_constant__ ForwardLaunch launch) {
  run_megakernel<ForwardProgram<256, false, kKeepGateUp, 0, RoutedWeights::fp8_block>,
                 kFp8ProducerRegs, kFp8ConsumerRegs, kGroup>(launch);
}

// The routed experts' weights in NVFP4 (256-wide tiles) or MXFP8 (128-wide; both inference or
// training), widened by the producer warps: the consumers keep the BF16 forward's 200 registers;
// the producer warpgroup, whose warps now also widen, gets the rest (at 96 nvfp4's spilled 20
// bytes).
constexpr int kWidenProducerRegs = 104;
static_assert(128 * kWidenProducerRegs + kConsumers * 128 * kForwardConsumerRegs <= kThreads * 168,
              "setmaxnreg budget");
template <int kBlockN, RoutedWeights kRouted, bool kKeepGateUp, bool kGroup>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_widened_kernel(const __grid_constant__ ForwardLaunch launch) {
  run_megakernel<ForwardProgram<kBlockN, true, kKeepGateUp, 0, kRouted>, kWidenProducerRegs,
                 kForwardConsumerRegs, kGroup>(launch);
}

// One instantiation, prepared and launched.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp = false, int kProbe = 0,
          bool kGroup = false, RoutedWeights kRouted = RoutedWeights::bf16>
struct ForwardVariant {
  static constexpr auto kernel = [] {
    if constexpr (kRouted == RoutedWeights::fp8_block)
      return moe_forward_fp8_block_kernel<kGroup, kKeepGateUp>;
    else if constexpr (kRouted == RoutedWeights::nvfp4 || kRouted == RoutedWeights::mxfp8)
      return moe_forward_widened_kernel<kBlockN, kRouted, kKeepGateUp, kGroup>;
    else
      return moe_forward_kernel<kBlockN, kMmaInFlight, kKeepGateUp, kProbe, kGroup>;
  }();
  // nvfp4, mxfp8: the staging slots after the ring.
  static constexpr int smem =
      program_smem_bytes<ForwardProgram<kBlockN, kMmaInFlight, kKeepGateUp, kProbe, kRouted>>();
  static_assert(smem + 4096 <= 232448, "dynamic shared memory beside the static arrays");
  static cudaError_t prepare(int* ctas_per_sm) {
    if (cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess)
      return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, kThreads, smem);
  }
  static void launch(const ForwardLaunch& l, int grid, cudaStream_t stream) {
    kernel<<<grid, kThreads, smem, stream>>>(l);
  }
};

// The production set's instantiations of one kind (lone or group), for ForwardKernel k: calls f
// with its ForwardVariant; false when there is none.
template <bool kGroup, class F>
bool with_production_variant(const ForwardKernel& k, F&& f) {
  if (k.probe != 0) return false;
  if (k.routed == RoutedWeights::fp8_block) {  // 256 wide, no group in flight; inference, training
    if (k.block_n != 256 || k.mma_in_flight) return false;
    k.keep_gate_up ? f(ForwardVariant<256, false, true, 0, kGroup, RoutedWeights::fp8_block>{})
                   : f(ForwardVariant<256, false, false, 0, kGroup, RoutedWeights::fp8_block>{});
    return true;
  }
  if (k.routed == RoutedWeights::nvfp4) {  // 256-wide tiles, a group in flight
    if (k.block_n != 256 || !k.mma_in_flight) return false;
    k.keep_gate_up ? f(ForwardVariant<256, true, true, 0, kGroup, RoutedWeights::nvfp4>{})
                   : f(ForwardVariant<256, true, false, 0, kGroup, RoutedWeights::nvfp4>{});
    return true;
  }
  if (k.routed == RoutedWeights::mxfp8) {  // 128-wide tiles, a group in flight
    if (k.block_n != 128 || !k.mma_in_flight) return false;
    k.keep_gate_up ? f(ForwardVariant<128, true, true, 0, kGroup, RoutedWeights::mxfp8>{})
                   : f(ForwardVariant<128, true, false, 0, kGroup, RoutedWeights::mxfp8>{});
    return true;
  }
  auto pick = [&](auto block_n) {
    constexpr int kBlockN = decltype(block_n)::value;
    if (k.keep_gate_up)
      k.mma_in_flight ? f(ForwardVariant<kBlockN, true, true, 0, kGroup>{})
                      : f(ForwardVariant<kBlockN, false, true, 0, kGroup>{});
    else
      k.mma_in_flight ? f(ForwardVariant<kBlockN, true, false, 0, kGroup>{})
                      : f(ForwardVariant<kBlockN, false, false, 0, kGroup>{});
  };
  if (k.block_n == 256)
    pick(std::integral_constant<int, 256>{});
  else if (k.block_n == 128)
    pick(std::integral_constant<int, 128>{});
  else
    return false;
  return true;
}

// The group set (moe_forward_group_bf16.cu), which production_forward_kernels() dispatches to.
const ForwardKernels& group_forward_kernels();

// A ForwardKernels over `with_variant(kernel, f)`, which calls f with the ForwardVariant of
// `kernel` and returns false when the set has no such instantiation.
template <class Set>
struct ForwardKernelSet {
  static cudaError_t prepare(const ForwardKernel& k, int* ctas_per_sm) {
    cudaError_t e = cudaErrorInvalidValue;
    Set::with_variant(k, [&](auto v) { e = decltype(v)::prepare(ctas_per_sm); });
    return e;
  }
  static cudaError_t launch(const ForwardLaunch& l, const ForwardKernel& k, int grid,
                            cudaStream_t stream) {
    if (l.ranks < 1 || l.ranks > kMaxRanks || grid < l.ranks) return cudaErrorInvalidValue;
    if (!Set::with_variant(k, [&](auto v) { decltype(v)::launch(l, grid, stream); }))
      return cudaErrorInvalidValue;
    return cudaGetLastError();
  }
  static constexpr ForwardKernels kernels{&prepare, &launch};
};

// A ForwardKernels over two: ForwardKernelSet<Lone> for one rank, and kGroup's (the emulated
// groups' instantiations, another translation unit's) where ForwardKernel::group.
template <class Lone, const ForwardKernels& (*kGroup)()>
struct LoneOrGroupKernels {
  static cudaError_t prepare(const ForwardKernel& k, int* ctas_per_sm) {
    return (k.group ? kGroup() : ForwardKernelSet<Lone>::kernels).prepare(k, ctas_per_sm);
  }
  static cudaError_t launch(const ForwardLaunch& l, const ForwardKernel& k, int grid,
                            cudaStream_t stream) {
    return (k.group ? kGroup() : ForwardKernelSet<Lone>::kernels).launch(l, k, grid, stream);
  }
  static constexpr ForwardKernels kernels{&prepare, &launch};
};

}  // namespace mok::kern
