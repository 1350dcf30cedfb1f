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
// counters and maps, the tile queue, peer tables, CTA pairs): at 96 registers it spilled, at 104
// it does not;
// the consumers keep 200 (128 accumulators).
constexpr int kForwardProducerRegs = 104, kForwardConsumerRegs = 200;
static_assert(128 * kForwardProducerRegs + kConsumers * 128 * kForwardConsumerRegs <=
                  kThreads * 168,
              "setmaxnreg budget");

// The grid is split into launch.ranks contiguous shares, one per logical rank (one share for a
// real EP rank); inside a share the first dispatch_ctas CTAs dispatch, then join the others in the
// GEMMs.
template <int kBlockN, bool kPingPong>
__global__ void __launch_bounds__(kThreads, 1)
    moe_forward_kernel(const __grid_constant__ ForwardLaunch launch) {
  const int per_rank = int(gridDim.x) / launch.ranks;
  const int rank = min(int(blockIdx.x) / per_rank, launch.ranks - 1);
  const int cta = int(blockIdx.x) - rank * per_rank;  // the last rank also takes the remainder
  const ForwardParams& p = launch.params[rank];
  const ForwardMaps& maps = launch.maps[rank];
  // CTA pairs (clusters of two; shares and dispatch CTAs come in even numbers, so a cluster never
  // spans two roles or ranks): a CTA's shared memory must outlive the other CTA's arrivals on it
  // and multicasts into it. Both CTAs' threads meet at a cluster barrier once their barriers are
  // initialized; the consumers meet again before exiting (a cluster barrier waits for the threads
  // that have not exited: the producers' last access to the other CTA is the end entry, which
  // the other CTA's readers wait for, and the consumers' ring releases precede their arrival).
  const bool paired = p.cta_pairs != 0;
  if (cta < p.dispatch_ctas) {
    // Once its blocks are copied a dispatch CTA joins the GEMMs: its SM would otherwise only wait
    // for the combine (dispatch spans a third of the forward or less). It claims tiles from the
    // same counter, so the tile order's deadlock argument holds; dispatch itself never waits on
    // this CTA. With combine_on_dispatch_ctas (or a failed wait, unpaired) it combines instead;
    // a paired CTA whose dispatch failed still joins its pair (the GEMM waits then end at once).
    const bool dispatched = !batch_ok(p) || dispatch_role<kBlockN>(p, cta, p.dispatch_ctas);
    if ((!dispatched && !paired) || p.combine_on_dispatch_ctas) {  // never touches the other CTA
      combine_role<kBlockN>(p);
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
  // Reader warps of the tile queue: the 8 consumer warps, producer warps 1-3 when they gather,
  // and on rank 1 of a pair producer warp 0 too (rank 0's claims for it).
  const uint32_t claimer_readers = kConsumers * 4 + (gather ? kGatherWarps - 1 : 0);
  static_assert(!kPingPong || kConsumers * 4 == 8, "ping-pong: 8 consumer warps read the queue");
  const auto ring = SmemRing<kBlockN>::make(smem_raw, full, empty, gather ? kGatherFullArrivals : 1,
                                            (kPingPong ? 4 : kConsumers * 4) * (paired ? 2 : 1));
  const TileQueue queue{queue_index, queue_full, queue_empty};
  if (threadIdx.x == 0) {
    queue.init(TileQueue::pair_rank() == 1 ? claimer_readers + 1 : claimer_readers,
               claimer_readers + 1);
    for (uint64_t& bar : mainloop_done) dev::mbar_init(&bar, kMainloopDoneArrivals);
    dev::mbar_fence_init();
  }
  // Paired: the other CTA's barriers are initialized before anything arrives on them.
  if (paired)
    dev::cluster_sync();
  else
    __syncthreads();
  if (threadIdx.x / 128 == kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kForwardProducerRegs));
    if (gather || threadIdx.x % 128 < 32) producer_role<kBlockN>(maps, p, ring, queue);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kForwardConsumerRegs));
  bool finished;
  if constexpr (kPingPong)
    finished = pingpong_consumer_role<kBlockN>(p, ring, queue, mainloop_done);
  else
    finished = consumer_role<kBlockN>(p, ring, queue);
  if (finished && !p.combine_on_dispatch_ctas) combine_role<kBlockN>(p);
  if (paired) dev::cluster_sync();
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

template <int kBlockN, bool kPingPong>
cudaError_t launch_kernel(const ForwardLaunch& l, int grid, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = TileShape<kBlockN>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = l.params[0].cta_pairs ? 2 : 1;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, moe_forward_kernel<kBlockN, kPingPong>, l);
}

template <int kBlockN, bool kPingPong>
cudaError_t prepare(int grid, int* ctas_per_sm, int* pair_clusters) {
  constexpr int smem = TileShape<kBlockN>::kSmemBytes;
  if (cudaError_t e = cudaFuncSetAttribute(moe_forward_kernel<kBlockN, kPingPong>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          ctas_per_sm, moe_forward_kernel<kBlockN, kPingPong>, kThreads, smem);
      e != cudaSuccess)
    return e;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(grid + grid % 2));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(pair_clusters, moe_forward_kernel<kBlockN, kPingPong>,
                                        &config);
}

}  // namespace

cudaError_t prepare_moe_forward(int block_n, bool pingpong, int grid, int* ctas_per_sm,
                                int* pair_clusters) {
  if (pingpong)
    return block_n == 128 ? prepare<128, true>(grid, ctas_per_sm, pair_clusters)
                          : cudaErrorInvalidValue;
  if (block_n == 256) return prepare<256, false>(grid, ctas_per_sm, pair_clusters);
  if (block_n == 128) return prepare<128, false>(grid, ctas_per_sm, pair_clusters);
  return cudaErrorInvalidValue;
}

cudaError_t launch_moe_forward(const ForwardLaunch& launch, int block_n, bool pingpong, int grid,
                               cudaStream_t stream) {
  if (launch.ranks < 1 || launch.ranks > kMaxRanks || grid < launch.ranks)
    return cudaErrorInvalidValue;
  if (launch.params[0].cta_pairs && (pingpong || grid % 2 != 0)) return cudaErrorInvalidValue;
  row_destination_kernel<<<dim3(unsigned(grid / launch.ranks), unsigned(launch.ranks)), 256, 0,
                           stream>>>(launch);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (pingpong && block_n == 128) return launch_kernel<128, true>(launch, grid, stream);
  if (!pingpong && block_n == 256) return launch_kernel<256, false>(launch, grid, stream);
  if (!pingpong && block_n == 128) return launch_kernel<128, false>(launch, grid, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mok::kern
