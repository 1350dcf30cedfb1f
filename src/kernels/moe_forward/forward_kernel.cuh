// The BF16 forward megakernel, sm_90a: one persistent launch with three roles (dispatch, GEMM,
// combine) that hand work to each other through counters in global memory. The engine
// (megakernel/engine.cuh) runs the roles; the forward's tile program (forward_program.cuh) says
// which tiles exist, with the tile order and its deadlock argument in tile_schedule.cuh and the
// row movers in dispatch_role.cuh and combine_role.cuh. The instantiations live in
// moe_forward_bf16.cu (production) and moe_forward_probes.cu (the benchmarks' stage probes).
#pragma once
#include "kernels/megakernel/engine.cuh"
#include "kernels/moe_forward/forward_program.cuh"

namespace mok::kern {

// The producer walks a richer tile sequence than the plain grouped GEMM's (four tile kinds, their
// counters and maps, the tile queue, peer tables): at 88 registers it spilled, at 96 it does not;
// the consumers keep 200 (128 accumulators).
constexpr int kForwardProducerRegs = 96, kForwardConsumerRegs = 200;
static_assert(128 * kForwardProducerRegs + kConsumers * 128 * kForwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");

// The forward megakernel: the engine running the forward's tile program. kMmaInFlight: the
// consumers keep one wgmma group in flight (mma_tile). kKeepGateUp: a training forward, which also
// keeps the SwiGLU inputs (store_gate_up). kProbe: a benchmark's stage probe (kProbe*), 0 in every
// forward that computes.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp, int kProbe>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_kernel(const __grid_constant__ ForwardLaunch launch) {
  run_megakernel<ForwardProgram<kBlockN, kMmaInFlight, kKeepGateUp, kProbe>, kForwardProducerRegs,
                 kForwardConsumerRegs>(launch);
}

// One instantiation, prepared and launched.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp = false, int kProbe = 0>
struct ForwardVariant {
  static constexpr auto kernel = moe_forward_kernel<kBlockN, kMmaInFlight, kKeepGateUp, kProbe>;
  static constexpr int smem = TileShape<kBlockN>::kSmemBytes;
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
