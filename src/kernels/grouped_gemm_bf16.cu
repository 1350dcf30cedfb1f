// BF16 grouped GEMM, sm_90a: one CTA per SM, 384 threads = 2 consumer warpgroups (64 rows of the
// 128x128 tile each, wgmma into FP32 registers, then the epilogue) + 1 producer warpgroup (one
// thread issues every TMA load). Both roles walk the same (tile, k-block) sequence, so the
// ring's stage and phase stay in step with no other synchronisation (hopper-gemm.md, 1 and 5).
#include <algorithm>
#include <mutex>

#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/tensor_map.hpp"
#include "mok/device/tma.cuh"
#include "mok/device/wgmma.cuh"
#include "mok/gpu/grouped_gemm.hpp"

namespace mok::gpu {
namespace {

constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 64;  // K: one 128-byte swizzle span
constexpr int kStages = 6;
constexpr int kConsumers = 2, kThreads = (kConsumers + 1) * 128;
constexpr uint32_t kTileBytesA = kBlockM * kBlockK * 2, kTileBytesB = kBlockN * kBlockK * 2;
constexpr int kSmemBytes = kStages * int(kTileBytesA + kTileBytesB) + 1024;  // + alignment slack
constexpr uint64_t kWaitCycles = 4'000'000'000ull;                           // ~2 s at 1.98 GHz
static_assert(kSmemBytes <= 232448, "dynamic shared memory of one CTA");
static_assert(kTileBytesA % 1024 == 0 && kTileBytesB % 1024 == 0, "tiles stay 1024-byte aligned");
static_assert(128 * 40 + kConsumers * 128 * 232 <= kThreads * 168, "setmaxnreg budget");

enum ErrorCode : int { kProducerTimeout = 1, kConsumerTimeout = 2 };

// The tile sequence both roles walk: n fastest, so CTAs running together share A (one expert).
struct TileScheduler {
  int64_t m_tiles, n_tiles;
  __device__ int64_t count() const { return m_tiles * n_tiles; }
  __device__ int64_t m_tile(int64_t t) const { return t / n_tiles; }
  __device__ int64_t n_tile(int64_t t) const { return t % n_tiles; }
};

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

// Accumulator (row, col) of thread (warp w, lane l) for register 4j + q (hopper-gemm.md, 6).
template <GemmEpilogue kEpilogue>
__device__ __forceinline__ void epilogue(const float (&d)[64], const GroupedGemmArgs& p,
                                         int64_t row0, int64_t col_tile) {
  const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32;
  const int64_t r_lo = row0 + 16 * w + l / 4, r_hi = r_lo + 8;
  if constexpr (kEpilogue == GemmEpilogue::store) {
    __nv_bfloat16* out = p.out + col_tile * kBlockN;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int c = 8 * j + 2 * (l % 4);
      *reinterpret_cast<__nv_bfloat162*>(out + r_lo * p.n + c) =
          __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<__nv_bfloat162*>(out + r_hi * p.n + c) =
          __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
    }
  } else {
    // Columns 0-63 of the tile come from gate rows, 64-127 from the up rows of the same 64
    // outputs: the same thread holds both halves (registers 4j+q and 4(j+8)+q).
    const int64_t width = p.n / 2;
    __nv_bfloat16* out = p.out + col_tile * (kBlockN / 2);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 8 * j + 2 * (l % 4);
      const float* g = &d[4 * j];
      const float* u = &d[4 * (j + 8)];
      *reinterpret_cast<__nv_bfloat162*>(out + r_lo * width + c) =
          __floats2bfloat162_rn(silu(g[0]) * u[0], silu(g[1]) * u[1]);
      *reinterpret_cast<__nv_bfloat162*>(out + r_hi * width + c) =
          __floats2bfloat162_rn(silu(g[2]) * u[2], silu(g[3]) * u[3]);
    }
  }
}

template <GemmEpilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map,
                        const __grid_constant__ CUtensorMap b_up_map, const GroupedGemmArgs p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles_a = smem;
  uint8_t* tiles_b = smem + kStages * kTileBytesA;
  __shared__ uint64_t full[kStages], empty[kStages];

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      dev::mbar_init(&full[s], 1);                // the producer's arrive_expect_tx
      dev::mbar_init(&empty[s], kConsumers * 4);  // one arrival per consumer warp
    }
    dev::mbar_fence_init();
  }
  __syncthreads();

  const TileScheduler sched{p.rows / kBlockM, p.n / kBlockN};
  const int k_blocks = p.k / kBlockK;
  dev::RingCursor<kStages> ring;

  if (threadIdx.x / 128 == kConsumers) {  // producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x % 128 >= 32 || !dev::elect_one()) return;
    dev::tma_prefetch_map(&a_map);
    dev::tma_prefetch_map(&b_map);
    if constexpr (kEpilogue == GemmEpilogue::swiglu) dev::tma_prefetch_map(&b_up_map);
    for (int64_t t = blockIdx.x; t < sched.count(); t += gridDim.x) {
      const int expert = p.tile_expert[sched.m_tile(t)];
      if (expert < 0) continue;
      for (int kb = 0; kb < k_blocks; ++kb, ring.advance()) {
        if (!dev::mbar_wait(&empty[ring.stage], ring.phase ^ 1u, kWaitCycles)) {
          atomicExch(p.error, kProducerTimeout);
          return;
        }
        dev::mbar_arrive_expect_tx(&full[ring.stage], kTileBytesA + kTileBytesB);
        dev::tma_load_2d(tiles_a + ring.stage * kTileBytesA, &a_map, &full[ring.stage],
                         kb * kBlockK, int32_t(sched.m_tile(t) * kBlockM));
        uint8_t* tile_b = tiles_b + ring.stage * kTileBytesB;
        if constexpr (kEpilogue == GemmEpilogue::swiglu) {
          // 64 gate rows then the 64 up rows of the same outputs: the epilogue pairs them.
          const int32_t row = int32_t(sched.n_tile(t) * (kBlockN / 2));
          dev::tma_load_3d(tile_b, &b_map, &full[ring.stage], kb * kBlockK, row, expert);
          dev::tma_load_3d(tile_b + kTileBytesB / 2, &b_up_map, &full[ring.stage], kb * kBlockK,
                           row, expert);
        } else {
          dev::tma_load_3d(tile_b, &b_map, &full[ring.stage], kb * kBlockK,
                           int32_t(sched.n_tile(t) * kBlockN), expert);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int wg = threadIdx.x / 128;
  const bool arrives = threadIdx.x % 32 == 0;
  float d[64];
  for (int64_t t = blockIdx.x; t < sched.count(); t += gridDim.x) {
    if (p.tile_expert[sched.m_tile(t)] < 0) continue;
    for (int kb = 0; kb < k_blocks; ++kb, ring.advance()) {
      if (!dev::mbar_wait(&full[ring.stage], ring.phase, kWaitCycles)) {
        atomicExch(p.error, kConsumerTimeout);
        return;
      }
      // This warpgroup's 64 rows start 64 * 128 bytes into the A tile.
      const uint64_t da = dev::smem_desc_kmajor_sw128(
          dev::smem_addr(tiles_a + ring.stage * kTileBytesA + wg * 64 * 128));
      const uint64_t db =
          dev::smem_desc_kmajor_sw128(dev::smem_addr(tiles_b + ring.stage * kTileBytesB));
      dev::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBlockK / 16; ++k)
        dev::wgmma_m64n128k16_bf16(d, dev::smem_desc_advance(da, 32 * k),
                                   dev::smem_desc_advance(db, 32 * k), kb > 0 || k > 0);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::fence_accumulators(d);
      if (arrives) dev::mbar_arrive(&empty[ring.stage]);
    }
    epilogue<kEpilogue>(d, p, sched.m_tile(t) * kBlockM + wg * 64, sched.n_tile(t));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t grouped_gemm_bf16(const GroupedGemmArgs& args, cudaStream_t stream) {
  if (args.rows < 0 || args.rows % kBlockM != 0 || args.n <= 0 || args.n % kBlockN != 0 ||
      args.k <= 0 || args.k % kBlockK != 0 || args.experts <= 0 || !args.error ||
      !args.tile_expert || !aligned16(args.a) || !aligned16(args.b) || !aligned16(args.out) ||
      (args.epilogue == GemmEpilogue::swiglu && (!args.b_up || !aligned16(args.b_up))))
    return cudaErrorInvalidValue;
  if (args.rows == 0) return cudaSuccess;
  const CUtensorMap a_map = dev::make_bf16_map_2d(args.a, uint64_t(args.rows), uint64_t(args.k),
                                                  uint64_t(args.k), kBlockM);
  const bool swiglu = args.epilogue == GemmEpilogue::swiglu;
  // Swiglu: gate and up are [experts, n/2, k] each, read in boxes of 64 rows.
  const uint64_t b_rows = swiglu ? uint64_t(args.n / 2) : uint64_t(args.n);
  const uint32_t b_box = swiglu ? kBlockN / 2 : kBlockN;
  const CUtensorMap b_map =
      dev::make_bf16_map_3d(args.b, uint64_t(args.experts), b_rows, uint64_t(args.k), b_box);
  const CUtensorMap b_up_map = swiglu ? dev::make_bf16_map_3d(args.b_up, uint64_t(args.experts),
                                                              b_rows, uint64_t(args.k), b_box)
                                      : b_map;
  // Per device, once: the SM count and the shared-memory opt-in (not repeated per call, so
  // calls inside a CUDA graph capture make no device queries).
  struct DeviceSetup {
    std::once_flag once;
    int sms = 0;
    cudaError_t status = cudaSuccess;
  };
  static DeviceSetup setups[64];
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess || device >= 64)
    return e != cudaSuccess ? e : cudaErrorInvalidDevice;
  DeviceSetup& setup = setups[device];
  std::call_once(setup.once, [&] {
    setup.status = cudaDeviceGetAttribute(&setup.sms, cudaDevAttrMultiProcessorCount, device);
    for (auto k :
         {grouped_gemm_kernel<GemmEpilogue::store>, grouped_gemm_kernel<GemmEpilogue::swiglu>})
      if (setup.status == cudaSuccess)
        setup.status =
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  });
  if (setup.status != cudaSuccess) return setup.status;
  const int sms = setup.sms;
  const int64_t tiles = (args.rows / kBlockM) * (args.n / kBlockN);
  const int grid =
      int(std::min<int64_t>(tiles, args.max_ctas > 0 ? std::min(args.max_ctas, sms) : sms));
  auto kernel = args.epilogue == GemmEpilogue::store ? grouped_gemm_kernel<GemmEpilogue::store>
                                                     : grouped_gemm_kernel<GemmEpilogue::swiglu>;
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(a_map, b_map, b_up_map, args);
  return cudaGetLastError();
}

}  // namespace mok::gpu
