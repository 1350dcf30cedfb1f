// The BF16 forward megakernel, sm_90a: one persistent launch with three roles (dispatch, GEMM,
// combine) that hand work to each other through counters in global memory. Read the roles in
// dispatch_role.cuh, gemm_roles.cuh and combine_role.cuh, and the tile order (with the argument
// that it cannot deadlock) in tile_schedule.cuh.
#include "kernels/moe_forward/combine_role.cuh"
#include "kernels/moe_forward/dispatch_role.cuh"
#include "kernels/moe_forward/gemm_roles.cuh"
#include "kernels/moe_forward/pingpong_consumers.cuh"

namespace mok::kern {
namespace {

// The producer walks a richer tile sequence than the plain grouped GEMM's (four tile kinds, their
// counters and maps, the tile queue, peer tables): at 88 registers it spilled, at 96 it does not;
// the consumers keep 200 (128 accumulators).
constexpr int kForwardProducerRegs = 96, kForwardConsumerRegs = 200;
static_assert(128 * kForwardProducerRegs + kConsumers * 128 * kForwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");

// The grid is split into launch.ranks contiguous shares, one per logical rank (one share for a
// real EP rank); inside a share the first dispatch_ctas CTAs dispatch, then join the others in the
// GEMMs. kMmaInFlight: the cooperative consumers keep one wgmma group in flight (mma_tile).
// kProbe: a benchmark's stage probe (kProbe*), 0 in every forward that computes.
template <int kBlockN, bool kPingPong, bool kMmaInFlight, int kProbe>
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
    // this CTA. With combine_on_dispatch_ctas (or a failed wait) it combines instead.
    const bool dispatched = !batch_ok(p) || dispatch_role<kBlockN>(p, cta, p.dispatch_ctas);
    if (!dispatched || p.combine_on_dispatch_ctas) {
      combine_role<kBlockN, false>(p);
      return;
    }
    if (p.timings && threadIdx.x == 0) atomicAdd(p.timings + kDispatchCtasJoined, 1ull);
  }
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[TileShape<kBlockN>::kStages], empty[TileShape<kBlockN>::kStages];
  __shared__ int64_t queue_index[kTileQueueDepth];
  __shared__ uint64_t queue_full[kTileQueueDepth], queue_empty[kTileQueueDepth];
  __shared__ uint64_t mainloop_done[kConsumers];  // ping-pong only
  // Producer: one warp (its lane 0 arrives), or with gather_rows the whole warpgroup (every thread
  // arrives on every stage; warps 1-3 read the tile queue too).
  const bool gather = p.gather_rows != 0;
  const auto ring = SmemRing<kBlockN>::make(smem_raw, full, empty, gather ? kGatherFullArrivals : 1,
                                            kPingPong ? 4 : kConsumers * 4);
  const TileQueue queue{queue_index, queue_full, queue_empty};
  if (threadIdx.x == 0) {
    queue.init(gather ? kGatherWarps - 1 : 0);
    for (uint64_t& bar : mainloop_done) dev::mbar_init(&bar, kMainloopDoneArrivals);
    dev::mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x / 128 == kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kForwardProducerRegs));
    if (gather || threadIdx.x % 128 < 32) producer_role<kBlockN, kProbe>(maps, p, ring, queue);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kForwardConsumerRegs));
  bool finished;
  if constexpr (kPingPong)
    finished = pingpong_consumer_role<kBlockN>(p, ring, queue, mainloop_done);
  else
    finished = consumer_role<kBlockN, kMmaInFlight, kProbe>(p, ring, queue);
  if (finished && !p.combine_on_dispatch_ctas) combine_role<kBlockN, true>(p);
}

// Before the megakernel: each routed row's destination (source rank, slot) from the owner and
// source schedules, so that the down epilogue looks it up with one load instead of a chain of
// dependent ones while the tensor cores wait (under EP some of them cross NVLink).
__global__ void row_destination_kernel(const __grid_constant__ ForwardLaunch launch) {
  const ForwardParams& p = launch.params[blockIdx.y];
  const int64_t rows = routed_blocks(p) * kBlockM;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    p.row_destination[row] = routed_row_destination(p, row, p.tile_expert[row / kBlockM]);
  }
}

// The instantiations: ping-pong (block_n 128 only), and cooperative with either mainloop; the
// stage probes for cooperative block_n 256 only (the shapes the benchmarks measure).
template <int kBlockN, bool kPingPong, bool kMmaInFlight, int kProbe = 0>
struct Variant {
  static constexpr auto kernel = moe_forward_kernel<kBlockN, kPingPong, kMmaInFlight, kProbe>;
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

// A stage probe's instantiation, with either mainloop.
template <int kProbe, class F>
void with_probe(bool mma_in_flight, F&& f) {
  mma_in_flight ? f(Variant<256, false, true, kProbe>{}) : f(Variant<256, false, false, kProbe>{});
}

// Calls f with the Variant of k (false: no such instantiation).
template <class F>
bool with_variant(const ForwardKernel& k, F&& f) {
  if (k.probe != 0) {
    if (k.pingpong || k.block_n != 256) return false;
    switch (k.probe) {
      case kProbeNoGemmLoads:
        with_probe<kProbeNoGemmLoads>(k.mma_in_flight, f);
        break;
      case kProbeNoMma:
        with_probe<kProbeNoMma>(k.mma_in_flight, f);
        break;
      case kProbeNoGemmLoads | kProbeNoMma:
        with_probe<kProbeNoGemmLoads | kProbeNoMma>(k.mma_in_flight, f);
        break;
      default:
        return false;
    }
  } else if (k.pingpong) {
    if (k.block_n != 128 || k.mma_in_flight) return false;
    f(Variant<128, true, false>{});
  } else if (k.block_n == 256) {
    k.mma_in_flight ? f(Variant<256, false, true>{}) : f(Variant<256, false, false>{});
  } else if (k.block_n == 128) {
    k.mma_in_flight ? f(Variant<128, false, true>{}) : f(Variant<128, false, false>{});
  } else {
    return false;
  }
  return true;
}

}  // namespace

cudaError_t prepare_moe_forward(const ForwardKernel& k, int* ctas_per_sm) {
  cudaError_t e = cudaErrorInvalidValue;
  with_variant(k, [&](auto v) { e = decltype(v)::prepare(ctas_per_sm); });
  return e;
}

cudaError_t launch_moe_forward(const ForwardLaunch& launch, const ForwardKernel& k, int grid,
                               cudaStream_t stream) {
  if (launch.ranks < 1 || launch.ranks > kMaxRanks || grid < launch.ranks)
    return cudaErrorInvalidValue;
  if (!with_variant(k, [](auto) {})) return cudaErrorInvalidValue;  // before any launch
  // Four blocks per SM: each row is a chain of dependent loads, so rows run side by side.
  row_destination_kernel<<<dim3(unsigned(4 * grid / launch.ranks), unsigned(launch.ranks)), 256, 0,
                           stream>>>(launch);
  with_variant(k, [&](auto v) { decltype(v)::launch(launch, grid, stream); });
  return cudaGetLastError();
}

}  // namespace mok::kern
