// BF16 grouped GEMM, sm_90a: the pipeline of kernels/gemm/pipeline.cuh (one producer thread,
// two consumer warpgroups) over the routed-row layout, with a store or a SwiGLU epilogue.
#include <algorithm>
#include <mutex>
#include <type_traits>

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

using Pairs = GemmPairs;

// The unit sequence both roles walk: n fastest, so CTAs running together share A (one expert).
// A unit is one tile, or a pair's two; clusters walk the units round-robin.
template <Pairs kPairs>
struct TileScheduler {
  static constexpr int kCtas = kPairs == Pairs::none ? 1 : 2;
  int64_t m_tiles, n_tiles;
  __device__ int64_t m_units() const {
    return kPairs == Pairs::share_b ? (m_tiles + 1) / 2 : m_tiles;
  }
  __device__ int64_t n_units() const {
    return kPairs == Pairs::share_a ? (n_tiles + 1) / 2 : n_tiles;
  }
  __device__ int64_t count() const { return m_units() * n_units(); }
  __device__ int64_t m_tile(int64_t u, uint32_t rank) const {
    return kPairs == Pairs::share_b ? u / n_units() * 2 + rank : u / n_units();
  }
  __device__ int64_t n_tile(int64_t u, uint32_t rank) const {
    return kPairs == Pairs::share_a ? u % n_units() * 2 + rank : u % n_units();
  }
  __device__ static int64_t first() { return blockIdx.x / kCtas; }
  __device__ static int64_t stride() { return gridDim.x / kCtas; }
};

// What a CTA does with a unit; both CTAs of a pair derive the same from tile_expert. shared: the
// pair multicasts its shared tile this unit (share_b: both m-tiles one expert's; share_a:
// always). dummy: this CTA's tile has no work (no rows, or past N) but its partner's has: it
// still loads its half and multiplies in step, and stores nothing, so the rings stay in step.
struct UnitPlan {
  int64_t m, n;
  int b_expert;
  bool skip, shared, dummy;
};
template <Pairs kPairs>
__device__ UnitPlan plan_unit(const TileScheduler<kPairs>& sched, const int32_t* tile_expert,
                              int64_t u, uint32_t rank) {
  auto expert_of = [&](int64_t m) { return m < sched.m_tiles ? tile_expert[m] : -1; };
  UnitPlan plan{sched.m_tile(u, rank),
                sched.n_tile(u, rank),
                expert_of(sched.m_tile(u, rank)),
                false,
                false,
                false};
  if constexpr (kPairs == Pairs::none) {
    plan.skip = plan.b_expert < 0;
  } else if constexpr (kPairs == Pairs::share_b) {
    const int peer = expert_of(sched.m_tile(u, rank ^ 1u));
    plan.skip = plan.b_expert < 0 && peer < 0;
    plan.shared = plan.b_expert >= 0 && plan.b_expert == peer;
    plan.dummy = plan.b_expert < 0 && peer >= 0;
    if (plan.dummy) plan.b_expert = peer;
  } else {  // one m-tile: both CTAs skip it or neither does
    plan.skip = plan.b_expert < 0;
    plan.shared = true;
    plan.dummy = plan.n >= sched.n_tiles;  // an odd n-tile count's last pair (B past N: zeros)
  }
  return plan;
}

// Pairs: a shared stage of one CTA is written by both producers, so a producer refills stage s
// for a shared unit only when both CTAs' consumers have released it: after its own empty
// barrier it arrives on the partner's peer_free[s] and waits for its own. Only shared uses of a
// stage take part (both CTAs know which they are), so neither producer can be two uses ahead on
// peer_free[s]: the partner's next shared use needs this CTA's half.
template <GemmEpilogue kEpilogue, int kBlockN, Pairs kPairs>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map,
                        const __grid_constant__ CUtensorMap b_up_map, const GroupedGemmArgs p) {
  constexpr bool kPaired = kPairs != Pairs::none;
  constexpr int kStages = Tile<kBlockN>::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages], peer_free[kStages];
  const auto ring = kern::SmemRing<kBlockN>::make(smem_raw, full, empty);
  const uint32_t rank = kPaired ? dev::cluster_ctarank() : 0;
  if constexpr (kPaired) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) dev::mbar_init(&peer_free[s], 1);
      dev::mbar_fence_init();
    }
    dev::cluster_sync();  // both CTAs' barriers initialised before either addresses the other's
  } else {
    __syncthreads();
  }

  const TileScheduler<kPairs> sched{p.rows / kBlockM, (p.n + kBlockN - 1) / kBlockN};
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
        if (kPaired && plan.shared) {
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
        if constexpr (kPairs == Pairs::share_a) {  // boxes of 64 rows: one per CTA
          constexpr uint32_t kHalfA = Tile<kBlockN>::kBytesA / 2;
          dev::tma_load_2d_multicast(ring.a(s) + rank * kHalfA, &a_map, bar, kb * kBlockK,
                                     int32_t(plan.m * kBlockM + rank * (kBlockM / 2)), 0b11);
        } else {
          dev::tma_load_2d(ring.a(s), &a_map, bar, kb * kBlockK, int32_t(plan.m * kBlockM));
        }
        uint8_t* tile_b = ring.b(s);
        constexpr uint32_t kHalfB = Tile<kBlockN>::kBytesB / 2;
        const bool share_b = kPairs == Pairs::share_b && plan.shared;
        if constexpr (kEpilogue == GemmEpilogue::swiglu) {
          // N/2 gate rows then the N/2 up rows of the same outputs: the epilogue pairs them.
          const int32_t row = int32_t(plan.n * (kBlockN / 2));
          if (share_b) {  // CTA 0 multicasts the gate half, CTA 1 the up half
            dev::tma_load_3d_multicast(tile_b + rank * kHalfB, rank == 0 ? &b_map : &b_up_map, bar,
                                       kb * kBlockK, row, plan.b_expert, 0b11);
          } else {
            dev::tma_load_3d(tile_b, &b_map, bar, kb * kBlockK, row, plan.b_expert);
            dev::tma_load_3d(tile_b + kHalfB, &b_up_map, bar, kb * kBlockK, row, plan.b_expert);
          }
        } else if constexpr (kPaired) {  // boxes of kBlockN / 2 rows
          const int32_t row = int32_t(plan.n * kBlockN);
          if (share_b) {
            dev::tma_load_3d_multicast(tile_b + rank * kHalfB, &b_map, bar, kb * kBlockK,
                                       row + int32_t(rank) * (kBlockN / 2), plan.b_expert, 0b11);
          } else {
            for (int h = 0; h < 2; ++h)
              dev::tma_load_3d(tile_b + h * kHalfB, &b_map, bar, kb * kBlockK,
                               row + h * (kBlockN / 2), plan.b_expert);
          }
        } else {
          dev::tma_load_3d(tile_b, &b_map, bar, kb * kBlockK, int32_t(plan.n * kBlockN),
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
      __nv_bfloat16* out = p.out + plan.n * kBlockN;
      kern::store_tile<kBlockN>(d, 0, int(p.n - plan.n * kBlockN),
                                [&](int r) { return out + (row0 + r) * p.n; });
    } else {
      const int64_t width = p.n / 2;
      __nv_bfloat16* out = p.out + row0 * width + plan.n * (kBlockN / 2);
      const int r = kern::Fragment::mine().row_lo;
      kern::swiglu_tile<kBlockN>(d, out + r * width, out + (r + 8) * width);
    }
  }
  // Neither CTA leaves while the other may still arrive on its barriers or write its stages.
  if constexpr (kPaired) dev::cluster_sync();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <GemmEpilogue kEpilogue, int kBlockN, Pairs kPairs>
constexpr auto kKernel = grouped_gemm_kernel<kEpilogue, kBlockN, kPairs>;

// f(std::integral_constant<Pairs, pairs>{}).
template <class F>
cudaError_t with_pairs(Pairs pairs, F&& f) {
  switch (pairs) {
    case Pairs::none:
      return f(std::integral_constant<Pairs, Pairs::none>{});
    case Pairs::share_b:
      return f(std::integral_constant<Pairs, Pairs::share_b>{});
    case Pairs::share_a:
      return f(std::integral_constant<Pairs, Pairs::share_a>{});
  }
  return cudaErrorInvalidValue;
}

template <int kCtas>
cudaLaunchAttribute cluster_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = kCtas;
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
  cudaError_t pair_status = cudaSuccess;  // the cluster queries': fails only paired calls
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
    auto opt_in = [&](auto kernel, int bytes, bool paired) {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      if (!paired || setup.status != cudaSuccess || setup.pair_status != cudaSuccess) return;
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
    for (Pairs pairs : {Pairs::none, Pairs::share_b, Pairs::share_a})
      with_pairs(pairs, [&](auto k) {
        constexpr Pairs kP = decltype(k)::value;
        const bool paired = kP != Pairs::none;
        opt_in(kKernel<GemmEpilogue::store, 128, kP>, Tile<128>::kSmemBytes, paired);
        opt_in(kKernel<GemmEpilogue::swiglu, 128, kP>, Tile<128>::kSmemBytes, paired);
        opt_in(kKernel<GemmEpilogue::store, 256, kP>, Tile<256>::kSmemBytes, paired);
        opt_in(kKernel<GemmEpilogue::swiglu, 256, kP>, Tile<256>::kSmemBytes, paired);
        return cudaSuccess;
      });
    if (setup.pair_status == cudaSuccess && setup.pairs < 1)
      setup.pair_status = cudaErrorInvalidConfiguration;  // no two SMs of one GPC free together
    if (setup.pair_status != cudaSuccess) cudaGetLastError();  // not sticky: the rest works
  });
  *out = &setup;
  return setup.status;
}

template <int kBlockN, Pairs kPairs>
cudaError_t launch(const GroupedGemmArgs& args, const DeviceSetup& setup, cudaStream_t stream) {
  constexpr int kCtas = TileScheduler<kPairs>::kCtas;
  const bool swiglu = args.epilogue == GemmEpilogue::swiglu;
  // share_a: boxes of 64 rows, one per CTA of a pair.
  const CUtensorMap a_map =
      dev::make_map_2d(dev::Dtype::bf16, args.a, uint64_t(args.rows), uint64_t(args.k),
                       uint64_t(args.k), kPairs == Pairs::share_a ? kBlockM / 2 : kBlockM);
  // Swiglu: gate and up are [experts, n/2, k] each, read in boxes of N/2 rows; pairs load the
  // store epilogue's B tile in two boxes of half the rows too.
  const uint64_t b_rows = swiglu ? uint64_t(args.n / 2) : uint64_t(args.n);
  const uint32_t b_box = swiglu || kPairs != Pairs::none ? kBlockN / 2 : kBlockN;
  const CUtensorMap b_map = dev::make_map_3d(dev::Dtype::bf16, args.b, uint64_t(args.experts),
                                             b_rows, uint64_t(args.k), b_box);
  const CUtensorMap b_up_map =
      swiglu ? dev::make_map_3d(dev::Dtype::bf16, args.b_up, uint64_t(args.experts), b_rows,
                                uint64_t(args.k), b_box)
             : b_map;
  const int64_t m_tiles = args.rows / kBlockM, n_tiles = (args.n + kBlockN - 1) / kBlockN;
  const int64_t units = (kPairs == Pairs::share_b ? (m_tiles + 1) / 2 : m_tiles) *
                        (kPairs == Pairs::share_a ? (n_tiles + 1) / 2 : n_tiles);
  const int64_t slots = kCtas == 1 ? setup.sms : int64_t(setup.pairs);  // CTAs or pairs
  const int64_t wanted = args.max_ctas > 0 ? std::max(1, args.max_ctas / kCtas) : slots;
  const int grid = int(std::min({units, slots, wanted}) * kCtas);
  auto kernel = swiglu ? kKernel<GemmEpilogue::swiglu, kBlockN, kPairs>
                       : kKernel<GemmEpilogue::store, kBlockN, kPairs>;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Tile<kBlockN>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = cluster_attribute<kCtas>();
  config.attrs = &attribute;
  config.numAttrs = kCtas == 2 ? 1 : 0;
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
      (args.block_n == 256 && args.n % 256 != 0) ||
      (args.pairs != Pairs::none && args.pairs != Pairs::share_b && args.pairs != Pairs::share_a))
    return cudaErrorInvalidValue;
  if (args.rows == 0) return cudaSuccess;
  const DeviceSetup* setup = nullptr;
  if (cudaError_t e = device_setup(&setup); e != cudaSuccess) return e;
  // Wider tiles when N allows them and they still give every SM work (wave quantisation).
  const bool wide =
      args.block_n == 256 || (args.block_n == 0 && args.n % 256 == 0 &&
                              (args.rows / kBlockM) * (args.n / 256) >= 2 * setup->sms);
  if (args.pairs != Pairs::none && setup->pair_status != cudaSuccess) return setup->pair_status;
  return with_pairs(args.pairs, [&](auto k) {
    constexpr Pairs kP = decltype(k)::value;
    return wide ? launch<256, kP>(args, *setup, stream) : launch<128, kP>(args, *setup, stream);
  });
}

}  // namespace mok::gpu
