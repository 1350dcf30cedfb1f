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
// fp8_block's consumers hold a partial accumulator beside the tile's (mma_tile_fp8_block), more
// than the 168 registers ptxas allots each of 384 threads, whatever setmaxnreg raises at run time
// (it spilled ~700 bytes at 200 and at 232). Its producer never gathers, so its CTA is the two
// consumer warpgroups and one producer warp: 288 threads of up to kFp8Regs registers, no
// setmaxnreg.
constexpr int kFp8Threads = kConsumers * 128 + 32, kFp8Regs = 224;
static_assert(kFp8Threads * kFp8Regs <= 65536, "the register file of one SM");
template <bool kFp8Block>
constexpr int forward_threads() {
  return kFp8Block ? kFp8Threads : kThreads;
}

// The forward megakernel: the engine running the forward's tile program. kMmaInFlight: the
// consumers keep one wgmma group in flight (mma_tile). kKeepGateUp: a training forward, which also
// keeps the SwiGLU inputs (store_gate_up). kProbe: a benchmark's stage probe (kProbe*), 0 in every
// forward that computes. kFp8Block: the routed experts in fp8_block.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp, int kProbe, bool kGroup>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_kernel(const __grid_constant__ ForwardLaunch launch) {
  run_megakernel<ForwardProgram<kBlockN, kMmaInFlight, kKeepGateUp, kProbe>, kForwardProducerRegs,
                 kForwardConsumerRegs, kGroup>(launch);
}

// The routed experts in fp8_block, kFp8Threads per CTA (with __launch_bounds__(288, 1) ptxas
// still kept to 168 registers; it takes __maxnreg__ or __launch_bounds__, not both).
template <bool kGroup>
__global__ void __maxnreg__(kFp8Regs)
    moe_forward_fp8_block_kernel(const __grid_constant__ ForwardLaunch launch) {
  run_megakernel<ForwardProgram<256, false, false, 0, true>, 0, 0, kGroup>(launch);
}

// One instantiation, prepared and launched.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp = false, int kProbe = 0,
          bool kGroup = false, bool kFp8Block = false>
struct ForwardVariant {
  static constexpr auto kernel = [] {
    if constexpr (kFp8Block)
      return moe_forward_fp8_block_kernel<kGroup>;
    else
      return moe_forward_kernel<kBlockN, kMmaInFlight, kKeepGateUp, kProbe, kGroup>;
  }();
  static constexpr int smem = TileShape<kBlockN>::kSmemBytes;
  static constexpr int threads = forward_threads<kFp8Block>();
  static cudaError_t prepare(int* ctas_per_sm) {
    if (cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess)
      return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, threads, smem);
  }
  static void launch(const ForwardLaunch& l, int grid, cudaStream_t stream) {
    kernel<<<grid, threads, smem, stream>>>(l);
  }
};

// The production set's instantiations of one kind (lone or group), for ForwardKernel k: calls f
// with its ForwardVariant; false when there is none.
template <bool kGroup, class F>
bool with_production_variant(const ForwardKernel& k, F&& f) {
  if (k.probe != 0) return false;
  if (k.fp8_block) {  // one instantiation: 256-wide tiles, no group in flight, inference
    if (k.block_n != 256 || k.mma_in_flight || k.keep_gate_up) return false;
    f(ForwardVariant<256, false, false, 0, kGroup, true>{});
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

}  // namespace mok::kern
