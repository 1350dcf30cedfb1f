// The BF16 forward megakernel, sm_90a: one persistent launch with three roles (dispatch, GEMM,
// combine) that hand work to each other through counters in global memory. Read the roles in
// dispatch_role.cuh, gemm_roles.cuh and combine_role.cuh, and the tile order (with the argument
// that it cannot deadlock) in tile_schedule.cuh. The instantiations live in moe_forward_bf16.cu
// (production) and moe_forward_probes.cu (the benchmarks' stage probes).
#pragma once
#include "kernels/moe_forward/combine_role.cuh"
#include "kernels/moe_forward/dispatch_role.cuh"
#include "kernels/moe_forward/gemm_roles.cuh"

namespace mok::kern {

// The producer walks a richer tile sequence than the plain grouped GEMM's (four tile kinds, their
// counters and maps, the tile queue, peer tables): at 88 registers it spilled, at 96 it does not;
// the consumers keep 200 (128 accumulators).
constexpr int kForwardProducerRegs = 96, kForwardConsumerRegs = 200;
static_assert(128 * kForwardProducerRegs + kConsumers * 128 * kForwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");

// The grid is split into launch.ranks contiguous shares, one per logical rank (one share for a
// real EP rank); inside a share the first dispatch_ctas CTAs dispatch, then join the others in the
// GEMMs. kMmaInFlight: the consumers keep one wgmma group in flight (mma_tile). kKeepGateUp: a
// training forward, which also keeps the SwiGLU inputs (store_gate_up). kProbe: a benchmark's
// stage probe (kProbe*), 0 in every forward that computes.
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp, int kProbe>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_kernel(const __grid_constant__ ForwardLaunch launch) {
  const int per_rank = int(gridDim.x) / launch.ranks;
  const int rank = min(int(blockIdx.x) / per_rank, launch.ranks - 1);
  const int cta = int(blockIdx.x) - rank * per_rank;  // the last rank also takes the remainder
  const ForwardParams& p = launch.params[rank];
  const ForwardMaps& maps = launch.maps[rank];
  if (cta < p.dispatch_ctas) {
    // Once its blocks are copied a dispatch CTA joins the GEMMs: its SM would otherwise only wait
    // for the combine (dispatch spans a third of the forward or less). It claims tiles from the
    // same counter, so the tile order's deadlock argument holds; dispatch itself never waits on
    // this CTA. A dispatch whose wait expired has recorded the fault: the CTA stops.
    if (batch_ok(p) && !dispatch_role<kBlockN>(p, cta, p.dispatch_ctas)) return;
    if (p.timings && threadIdx.x == 0) atomicAdd(p.timings + kDispatchCtasJoined, 1ull);
  }
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[TileShape<kBlockN>::kStages], empty[TileShape<kBlockN>::kStages];
  __shared__ int64_t queue_index[kTileQueueDepth];
  __shared__ uint64_t queue_full[kTileQueueDepth], queue_empty[kTileQueueDepth];
  // Producer: one warp (its lane 0 arrives), or with gather_rows the whole warpgroup (every thread
  // arrives on every stage; warps 1-3 read the tile queue too).
  const bool gather = p.gather_rows != 0;
  const auto ring =
      SmemRing<kBlockN>::make(smem_raw, full, empty, gather ? kGatherFullArrivals : 1);
  const TileQueue queue{queue_index, queue_full, queue_empty};
  if (threadIdx.x == 0) {
    queue.init(gather ? kGatherWarps - 1 : 0);
    dev::mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x / 128 == kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kForwardProducerRegs));
    if (gather || threadIdx.x % 128 < 32) producer_role<kBlockN, kProbe>(maps, p, ring, queue);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kForwardConsumerRegs));
  if (consumer_role<kBlockN, kMmaInFlight, kKeepGateUp, kProbe>(p, ring, queue))
    combine_role<kBlockN>(p);
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
