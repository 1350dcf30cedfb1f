// BF16 grouped GEMM, sm_90a: the pipeline of kernels/gemm/pipeline.cuh (one producer thread,
// two consumer warpgroups) over the routed-row layout, with a store or a SwiGLU epilogue.
#include <algorithm>
#include <mutex>

#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/mainloop_sm90.cuh"
#include "mok/device/cluster.cuh"
#include "mok/device/tensor_map.hpp"
#include "mok/gpu/grouped_gemm.hpp"

namespace mok::gpu {
namespace {

using kern::kBlockK;
using kern::kBlockM;
using kern::kThreads;
template <int kBlockN>
using Tile = kern::TileShape<kBlockN>;
constexpr uint64_t kWaitCycles = 4'000'000'000ull;  // ~2 s at 1.98 GHz

enum ErrorCode : int { kProducerTimeout = 1, kConsumerTimeout = 2 };

// The tile sequence both roles walk: n fastest, so CTAs running together share A (one expert).
// With clusters of kCluster CTAs a unit is kCluster consecutive m-tiles at one n-tile, CTA r of
// the cluster taking the r-th; clusters walk the units round-robin.
template <int kCluster>
struct TileScheduler {
  int64_t m_tiles, n_tiles;
  __device__ int64_t count() const { return (m_tiles + kCluster - 1) / kCluster * n_tiles; }
  __device__ int64_t m_tile(int64_t u, uint32_t rank) const {
    return u / n_tiles * kCluster + rank;
  }
  __device__ int64_t n_tile(int64_t u) const { return u % n_tiles; }
  __device__ static int64_t first() { return blockIdx.x / kCluster; }
  __device__ static int64_t stride() { return gridDim.x / kCluster; }
};

// What a CTA does with a unit; every CTA of the cluster derives the same from tile_expert.
// shared: both m-tiles are one expert's, so each CTA loads half of the B tile and multicasts it
// to both. dummy: this CTA's m-tile has no work but its partner's has: it still loads and
// multiplies in step (its A rows are zeros or unused rows, B its partner's expert) and stores
// nothing, so the two rings keep the same sequence.
struct UnitPlan {
  int64_t m;
  int b_expert;
  bool skip, shared, dummy;
};
template <int kCluster>
__device__ UnitPlan plan_unit(const TileScheduler<kCluster>& sched, const int32_t* tile_expert,
                              int64_t u, uint32_t rank) {
  auto expert_of = [&](int64_t m) { return m < sched.m_tiles ? tile_expert[m] : -1; };
  UnitPlan plan{sched.m_tile(u, rank), expert_of(sched.m_tile(u, rank)), false, false, false};
  if constexpr (kCluster == 1) {
    plan.skip = plan.b_expert < 0;
  } else {
    const int peer = expert_of(sched.m_tile(u, rank ^ 1u));
    plan.skip = plan.b_expert < 0 && peer < 0;
    plan.shared = plan.b_expert >= 0 && plan.b_expert == peer;
    plan.dummy = plan.b_expert < 0 && peer >= 0;
    if (plan.dummy) plan.b_expert = peer;
  }
  return plan;
}

// kCluster = 2: clusters of two CTAs whose B tiles, when both m-tiles are one expert's, come
// from L2 once (TMA multicast). A shared stage of one CTA is written by both producers, so a
// producer refills stage s for a shared unit only when both CTAs' consumers have released it:
// after its own empty barrier it arrives on the partner's peer_free[s] and waits for its own.
// Only shared uses of a stage take part (both CTAs know which they are), so neither producer
// can be two uses ahead on peer_free[s]: the partner's next shared use needs this CTA's half.
template <GemmEpilogue kEpilogue, int kBlockN, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map,
                        const __grid_constant__ CUtensorMap b_up_map, const GroupedGemmArgs p) {
  static_assert(kCluster == 1 || kCluster == 2, "pairs of CTAs at most");
  constexpr int kStages = Tile<kBlockN>::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages], peer_free[kStages];
  const auto ring = kern::SmemRing<kBlockN>::make(smem_raw, full, empty);
  const uint32_t rank = kCluster == 2 ? dev::cluster_ctarank() : 0;
  if constexpr (kCluster == 2) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) dev::mbar_init(&peer_free[s], 1);
      dev::mbar_fence_init();
    }
    dev::cluster_sync();  // both CTAs' barriers initialised before either addresses the other's
  } else {
    __syncthreads();
  }

  const TileScheduler<kCluster> sched{p.rows / kBlockM, (p.n + kBlockN - 1) / kBlockN};
  const int k_blocks = p.k / kBlockK;
  dev::RingCursor<kStages> cursor;

  if (threadIdx.x / 128 == kern::kConsumers) {  // producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kern::kProducerRegs));
    if (threadIdx.x % 128 >= 32 || !dev::elect_one()) return;
    dev::tma_prefetch_map(&a_map);
    dev::tma_prefetch_map(&b_map);
    if constexpr (kEpilogue == GemmEpilogue::swiglu) dev::tma_prefetch_map(&b_up_map);
    uint32_t peer_parity = 0;  // bit s: the parity of stage s's next shared use on peer_free[s]
    for (int64_t u = sched.first(); u < sched.count(); u += sched.stride()) {
      const UnitPlan plan = plan_unit(sched, p.tile_expert, u, rank);
      if (plan.skip) continue;
      for (int kb = 0; kb < k_blocks; ++kb, cursor.advance()) {
        const uint32_t s = cursor.stage;
        bool ok = dev::mbar_wait(&ring.empty[s], cursor.phase ^ 1u, kWaitCycles);
        if (kCluster == 2 && plan.shared) {
          if (ok) dev::mbar_arrive_cluster(&peer_free[s], rank ^ 1u);
          const uint32_t parity = (peer_parity >> s) & 1u;
          ok = ok &&
               dev::spin_until([&] { return dev::mbar_try_wait_cluster(&peer_free[s], parity); },
                               kWaitCycles);
          peer_parity ^= 1u << s;
        }
        if (!ok) {
          atomicExch(p.error, kProducerTimeout);
          return;
        }
        uint64_t* bar = &ring.full[s];
        dev::mbar_arrive_expect_tx(bar, Tile<kBlockN>::kStageBytes);
        dev::tma_load_2d(ring.a(s), &a_map, bar, kb * kBlockK, int32_t(plan.m * kBlockM));
        uint8_t* tile_b = ring.b(s);
        constexpr uint32_t kHalfB = Tile<kBlockN>::kBytesB / 2;
        if constexpr (kEpilogue == GemmEpilogue::swiglu) {
          // N/2 gate rows then the N/2 up rows of the same outputs: the epilogue pairs them.
          const int32_t row = int32_t(sched.n_tile(u) * (kBlockN / 2));
          if (plan.shared) {  // CTA 0 multicasts the gate half, CTA 1 the up half
            dev::tma_load_3d_multicast(tile_b + rank * kHalfB, rank == 0 ? &b_map : &b_up_map, bar,
                                       kb * kBlockK, row, plan.b_expert, 0b11);
          } else {
            dev::tma_load_3d(tile_b, &b_map, bar, kb * kBlockK, row, plan.b_expert);
            dev::tma_load_3d(tile_b + kHalfB, &b_up_map, bar, kb * kBlockK, row, plan.b_expert);
          }
        } else if constexpr (kCluster == 2) {  // boxes of kBlockN / 2 rows: one per CTA
          const int32_t row = int32_t(sched.n_tile(u) * kBlockN);
          if (plan.shared) {
            dev::tma_load_3d_multicast(tile_b + rank * kHalfB, &b_map, bar, kb * kBlockK,
                                       row + int32_t(rank) * (kBlockN / 2), plan.b_expert, 0b11);
          } else {
            for (int h = 0; h < 2; ++h)
              dev::tma_load_3d(tile_b + h * kHalfB, &b_map, bar, kb * kBlockK,
                               row + h * (kBlockN / 2), plan.b_expert);
          }
        } else {
          dev::tma_load_3d(tile_b, &b_map, bar, kb * kBlockK, int32_t(sched.n_tile(u) * kBlockN),
                           plan.b_expert);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kern::kConsumerRegs));
  const int wg = threadIdx.x / 128;
  float d[kBlockN / 2];
  for (int64_t u = sched.first(); u < sched.count(); u += sched.stride()) {
    const UnitPlan plan = plan_unit(sched, p.tile_expert, u, rank);
    if (plan.skip) continue;
    if (!kern::mma_tile<kBlockN>(d, ring, cursor, k_blocks, wg, kWaitCycles)) {
      atomicExch(p.error, kConsumerTimeout);
      return;
    }
    if (plan.dummy) continue;
    const int64_t row0 = plan.m * kBlockM + wg * 64;
    if constexpr (kEpilogue == GemmEpilogue::store) {
      __nv_bfloat16* out = p.out + sched.n_tile(u) * kBlockN;
      kern::store_tile<kBlockN>(d, 0, int(p.n - sched.n_tile(u) * kBlockN),
                                [&](int r) { return out + (row0 + r) * p.n; });
    } else {
      const int64_t width = p.n / 2;
      __nv_bfloat16* out = p.out + row0 * width + sched.n_tile(u) * (kBlockN / 2);
      const int r = kern::Fragment::mine().row_lo;
      kern::swiglu_tile<kBlockN>(d, out + r * width, out + (r + 8) * width);
    }
  }
  // Neither CTA leaves while the other may still arrive on its barriers or write its stages.
  if constexpr (kCluster == 2) dev::cluster_sync();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <GemmEpilogue kEpilogue, int kBlockN, int kCluster>
constexpr auto kKernel = grouped_gemm_kernel<kEpilogue, kBlockN, kCluster>;

template <int kCluster>
cudaLaunchAttribute cluster_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = kCluster;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// Per device, once: the SM count, the shared-memory opt-ins and how many two-CTA clusters fit at
// once (not repeated per call, so calls inside a CUDA graph capture make no device queries).
struct DeviceSetup {
  std::once_flag once;
  int sms = 0, pairs = 0;
  cudaError_t status = cudaSuccess;
  cudaError_t pair_status = cudaSuccess;  // the cluster queries': fails only cluster = 2 calls
};
cudaError_t device_setup(const DeviceSetup** out) {
  static DeviceSetup setups[64];
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess || device >= 64)
    return e != cudaSuccess ? e : cudaErrorInvalidDevice;
  DeviceSetup& setup = setups[device];
  std::call_once(setup.once, [&] {
    auto check = [&](cudaError_t e) {
      if (setup.status == cudaSuccess) setup.status = e;
    };
    check(cudaDeviceGetAttribute(&setup.sms, cudaDevAttrMultiProcessorCount, device));
    setup.pairs = setup.sms / 2;
    auto opt_in = [&](auto kernel, int bytes, int cluster) {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      if (cluster == 1 || setup.status != cudaSuccess || setup.pair_status != cudaSuccess) return;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(setup.sms / 2 * 2));
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = size_t(bytes);
      cudaLaunchAttribute attribute = cluster_attribute<2>();
      config.attrs = &attribute;
      config.numAttrs = 1;
      int pairs = 0;
      setup.pair_status = cudaOccupancyMaxActiveClusters(&pairs, kernel, &config);
      setup.pairs = std::min(setup.pairs, pairs);
    };
    opt_in(kKernel<GemmEpilogue::store, 128, 1>, Tile<128>::kSmemBytes, 1);
    opt_in(kKernel<GemmEpilogue::swiglu, 128, 1>, Tile<128>::kSmemBytes, 1);
    opt_in(kKernel<GemmEpilogue::store, 256, 1>, Tile<256>::kSmemBytes, 1);
    opt_in(kKernel<GemmEpilogue::swiglu, 256, 1>, Tile<256>::kSmemBytes, 1);
    opt_in(kKernel<GemmEpilogue::store, 128, 2>, Tile<128>::kSmemBytes, 2);
    opt_in(kKernel<GemmEpilogue::swiglu, 128, 2>, Tile<128>::kSmemBytes, 2);
    opt_in(kKernel<GemmEpilogue::store, 256, 2>, Tile<256>::kSmemBytes, 2);
    opt_in(kKernel<GemmEpilogue::swiglu, 256, 2>, Tile<256>::kSmemBytes, 2);
    if (setup.pair_status == cudaSuccess && setup.pairs < 1)
      setup.pair_status = cudaErrorInvalidConfiguration;  // no two SMs of one GPC free together
    if (setup.pair_status != cudaSuccess) cudaGetLastError();  // not sticky: the rest works
  });
  *out = &setup;
  return setup.status;
}

template <int kBlockN, int kCluster>
cudaError_t launch(const GroupedGemmArgs& args, const DeviceSetup& setup, cudaStream_t stream) {
  const bool swiglu = args.epilogue == GemmEpilogue::swiglu;
  const CUtensorMap a_map = dev::make_map_2d(dev::Dtype::bf16, args.a, uint64_t(args.rows),
                                             uint64_t(args.k), uint64_t(args.k), kBlockM);
  // Swiglu: gate and up are [experts, n/2, k] each, read in boxes of N/2 rows; a pair of CTAs
  // loads the store epilogue's B tile in two boxes of half the rows too, one per CTA.
  const uint64_t b_rows = swiglu ? uint64_t(args.n / 2) : uint64_t(args.n);
  const uint32_t b_box = swiglu || kCluster == 2 ? kBlockN / 2 : kBlockN;
  const CUtensorMap b_map = dev::make_map_3d(dev::Dtype::bf16, args.b, uint64_t(args.experts),
                                             b_rows, uint64_t(args.k), b_box);
  const CUtensorMap b_up_map =
      swiglu ? dev::make_map_3d(dev::Dtype::bf16, args.b_up, uint64_t(args.experts), b_rows,
                                uint64_t(args.k), b_box)
             : b_map;
  const int64_t m_units = (args.rows / kBlockM + kCluster - 1) / kCluster;
  const int64_t units = m_units * ((args.n + kBlockN - 1) / kBlockN);
  const int64_t slots = kCluster == 1 ? setup.sms : int64_t(setup.pairs);  // CTAs or pairs
  const int64_t wanted = args.max_ctas > 0 ? std::max(1, args.max_ctas / kCluster) : slots;
  const int grid = int(std::min({units, slots, wanted}) * kCluster);
  auto kernel = swiglu ? kKernel<GemmEpilogue::swiglu, kBlockN, kCluster>
                       : kKernel<GemmEpilogue::store, kBlockN, kCluster>;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Tile<kBlockN>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = cluster_attribute<kCluster>();
  config.attrs = &attribute;
  config.numAttrs = kCluster == 2 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, a_map, b_map, b_up_map, args);
}

}  // namespace

cudaError_t grouped_gemm_bf16(const GroupedGemmArgs& args, cudaStream_t stream) {
  const bool swiglu_args = args.epilogue == GemmEpilogue::swiglu;
  if (args.rows < 0 || args.rows % kBlockM != 0 || args.n <= 0 ||
      args.n % (swiglu_args ? 128 : 64) != 0 || args.k <= 0 || args.k % kBlockK != 0 ||
      args.experts <= 0 || !args.error || !args.tile_expert || !aligned16(args.a) ||
      !aligned16(args.b) || !aligned16(args.out) ||
      (args.epilogue == GemmEpilogue::swiglu && (!args.b_up || !aligned16(args.b_up))) ||
      (args.block_n != 0 && args.block_n != 128 && args.block_n != 256) ||
      (args.block_n == 256 && args.n % 256 != 0) || (args.cluster != 1 && args.cluster != 2))
    return cudaErrorInvalidValue;
  if (args.rows == 0) return cudaSuccess;
  const DeviceSetup* setup = nullptr;
  if (cudaError_t e = device_setup(&setup); e != cudaSuccess) return e;
  // Wider tiles when N allows them and they still give every SM work (wave quantisation).
  const bool wide =
      args.block_n == 256 || (args.block_n == 0 && args.n % 256 == 0 &&
                              (args.rows / kBlockM) * (args.n / 256) >= 2 * setup->sms);
  if (args.cluster == 2) {
    if (setup->pair_status != cudaSuccess) return setup->pair_status;
    return wide ? launch<256, 2>(args, *setup, stream) : launch<128, 2>(args, *setup, stream);
  }
  return wide ? launch<256, 1>(args, *setup, stream) : launch<128, 1>(args, *setup, stream);
}

}  // namespace mok::gpu
