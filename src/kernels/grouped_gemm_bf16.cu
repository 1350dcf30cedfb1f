// BF16 grouped GEMM, sm_90a: one CTA per SM, 384 threads = 2 consumer warpgroups (64 rows of the
// 128xN tile each, N = 128 or 256, wgmma into FP32 registers, then the epilogue) + 1 producer
// warpgroup (one
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

constexpr int kBlockM = 128, kBlockK = 64;  // K: one 128-byte swizzle span
constexpr int kConsumers = 2, kThreads = (kConsumers + 1) * 128;
constexpr uint32_t kTileBytesA = kBlockM * kBlockK * 2;
constexpr uint64_t kWaitCycles = 4'000'000'000ull;  // ~2 s at 1.98 GHz
static_assert(128 * 40 + kConsumers * 128 * 232 <= kThreads * 168, "setmaxnreg budget");

// Per tile width: as many ring stages as the shared memory holds.
template <int kBlockN>
struct Tile {
  static_assert(kBlockN == 128 || kBlockN == 256, "wgmma m64n128 or m64n256");
  static constexpr uint32_t kBytesB = kBlockN * kBlockK * 2;
  static constexpr int kStages = kBlockN == 128 ? 6 : 4;
  static constexpr int kSmemBytes = kStages * int(kTileBytesA + kBytesB) + 1024;  // + alignment
  static_assert(kSmemBytes <= 232448, "dynamic shared memory of one CTA");
  static_assert(kTileBytesA % 1024 == 0 && kBytesB % 1024 == 0, "tiles stay 1024-byte aligned");
};

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
template <GemmEpilogue kEpilogue, int kBlockN>
__device__ __forceinline__ void epilogue(const float (&d)[kBlockN / 2], const GroupedGemmArgs& p,
                                         int64_t row0, int64_t col_tile) {
  const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32;
  const int64_t r_lo = row0 + 16 * w + l / 4, r_hi = r_lo + 8;
  if constexpr (kEpilogue == GemmEpilogue::store) {
    // n may end halfway through the last tile (n % 128 == 64): TMA zero-filled the missing B
    // rows, and their columns are not stored.
    __nv_bfloat16* out = p.out + col_tile * kBlockN;
    const int64_t valid = p.n - col_tile * kBlockN;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const int c = 8 * j + 2 * (l % 4);
      if (c >= valid) break;
      *reinterpret_cast<__nv_bfloat162*>(out + r_lo * p.n + c) =
          __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<__nv_bfloat162*>(out + r_hi * p.n + c) =
          __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
    }
  } else {
    // The first half of the tile's columns come from gate rows, the second from the up rows of
    // the same outputs: the same thread holds both (registers 4j+q and 4(j+N/16)+q).
    const int64_t width = p.n / 2;
    __nv_bfloat16* out = p.out + col_tile * (kBlockN / 2);
#pragma unroll
    for (int j = 0; j < kBlockN / 16; ++j) {
      const int c = 8 * j + 2 * (l % 4);
      const float* g = &d[4 * j];
      const float* u = &d[4 * (j + kBlockN / 16)];
      *reinterpret_cast<__nv_bfloat162*>(out + r_lo * width + c) =
          __floats2bfloat162_rn(silu(g[0]) * u[0], silu(g[1]) * u[1]);
      *reinterpret_cast<__nv_bfloat162*>(out + r_hi * width + c) =
          __floats2bfloat162_rn(silu(g[2]) * u[2], silu(g[3]) * u[3]);
    }
  }
}

template <GemmEpilogue kEpilogue, int kBlockN>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map,
                        const __grid_constant__ CUtensorMap b_up_map, const GroupedGemmArgs p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  constexpr int kStages = Tile<kBlockN>::kStages;
  constexpr uint32_t kTileBytesB = Tile<kBlockN>::kBytesB;
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

  const TileScheduler sched{p.rows / kBlockM, (p.n + kBlockN - 1) / kBlockN};
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
          // N/2 gate rows then the N/2 up rows of the same outputs: the epilogue pairs them.
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
  float d[kBlockN / 2];
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
        dev::wgmma_bf16<kBlockN>(d, dev::smem_desc_advance(da, 32 * k),
                                 dev::smem_desc_advance(db, 32 * k), kb > 0 || k > 0);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::fence_accumulators(d);
      if (arrives) dev::mbar_arrive(&empty[ring.stage]);
    }
    epilogue<kEpilogue, kBlockN>(d, p, sched.m_tile(t) * kBlockM + wg * 64, sched.n_tile(t));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Per device, once: the SM count and the shared-memory opt-ins (not repeated per call, so calls
// inside a CUDA graph capture make no device queries).
cudaError_t device_setup(int* sms) {
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
    auto opt_in = [&](const void* kernel, int bytes) {
      if (setup.status == cudaSuccess)
        setup.status =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    };
    setup.status = cudaDeviceGetAttribute(&setup.sms, cudaDevAttrMultiProcessorCount, device);
    opt_in((const void*)grouped_gemm_kernel<GemmEpilogue::store, 128>, Tile<128>::kSmemBytes);
    opt_in((const void*)grouped_gemm_kernel<GemmEpilogue::swiglu, 128>, Tile<128>::kSmemBytes);
    opt_in((const void*)grouped_gemm_kernel<GemmEpilogue::store, 256>, Tile<256>::kSmemBytes);
    opt_in((const void*)grouped_gemm_kernel<GemmEpilogue::swiglu, 256>, Tile<256>::kSmemBytes);
  });
  *sms = setup.sms;
  return setup.status;
}

template <int kBlockN>
cudaError_t launch(const GroupedGemmArgs& args, int sms, cudaStream_t stream) {
  const bool swiglu = args.epilogue == GemmEpilogue::swiglu;
  const CUtensorMap a_map = dev::make_bf16_map_2d(args.a, uint64_t(args.rows), uint64_t(args.k),
                                                  uint64_t(args.k), kBlockM);
  // Swiglu: gate and up are [experts, n/2, k] each, read in boxes of N/2 rows.
  const uint64_t b_rows = swiglu ? uint64_t(args.n / 2) : uint64_t(args.n);
  const uint32_t b_box = swiglu ? kBlockN / 2 : kBlockN;
  const CUtensorMap b_map =
      dev::make_bf16_map_3d(args.b, uint64_t(args.experts), b_rows, uint64_t(args.k), b_box);
  const CUtensorMap b_up_map = swiglu ? dev::make_bf16_map_3d(args.b_up, uint64_t(args.experts),
                                                              b_rows, uint64_t(args.k), b_box)
                                      : b_map;
  const int64_t tiles = (args.rows / kBlockM) * ((args.n + kBlockN - 1) / kBlockN);
  const int grid =
      int(std::min<int64_t>(tiles, args.max_ctas > 0 ? std::min(args.max_ctas, sms) : sms));
  auto kernel = swiglu ? grouped_gemm_kernel<GemmEpilogue::swiglu, kBlockN>
                       : grouped_gemm_kernel<GemmEpilogue::store, kBlockN>;
  kernel<<<grid, kThreads, Tile<kBlockN>::kSmemBytes, stream>>>(a_map, b_map, b_up_map, args);
  return cudaGetLastError();
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
      (args.block_n == 256 && args.n % 256 != 0))
    return cudaErrorInvalidValue;
  if (args.rows == 0) return cudaSuccess;
  int sms = 0;
  if (cudaError_t e = device_setup(&sms); e != cudaSuccess) return e;
  // Wider tiles when N allows them and they still give every SM work (wave quantisation).
  const bool wide = args.block_n == 256 || (args.block_n == 0 && args.n % 256 == 0 &&
                                            (args.rows / kBlockM) * (args.n / 256) >= 2 * sms);
  return wide ? launch<256>(args, sms, stream) : launch<128>(args, sms, stream);
}

}  // namespace mok::gpu
