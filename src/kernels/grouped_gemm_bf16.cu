// BF16 grouped GEMM, sm_90a: the pipeline of kernels/gemm/pipeline.cuh (one producer thread,
// two consumer warpgroups) over the routed-row layout, with a store or a SwiGLU epilogue.
#include <algorithm>
#include <mutex>

#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/mainloop_sm90.cuh"
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
struct TileScheduler {
  int64_t m_tiles, n_tiles;
  __device__ int64_t count() const { return m_tiles * n_tiles; }
  __device__ int64_t m_tile(int64_t t) const { return t / n_tiles; }
  __device__ int64_t n_tile(int64_t t) const { return t % n_tiles; }
};

template <GemmEpilogue kEpilogue, int kBlockN>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map,
                        const __grid_constant__ CUtensorMap b_up_map, const GroupedGemmArgs p) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[Tile<kBlockN>::kStages], empty[Tile<kBlockN>::kStages];
  const auto ring = kern::SmemRing<kBlockN>::make(smem_raw, full, empty);
  __syncthreads();

  const TileScheduler sched{p.rows / kBlockM, (p.n + kBlockN - 1) / kBlockN};
  const int k_blocks = p.k / kBlockK;
  dev::RingCursor<Tile<kBlockN>::kStages> cursor;

  if (threadIdx.x / 128 == kern::kConsumers) {  // producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kern::kProducerRegs));
    if (threadIdx.x % 128 >= 32 || !dev::elect_one()) return;
    dev::tma_prefetch_map(&a_map);
    dev::tma_prefetch_map(&b_map);
    if constexpr (kEpilogue == GemmEpilogue::swiglu) dev::tma_prefetch_map(&b_up_map);
    for (int64_t t = blockIdx.x; t < sched.count(); t += gridDim.x) {
      const int expert = p.tile_expert[sched.m_tile(t)];
      if (expert < 0) continue;
      for (int kb = 0; kb < k_blocks; ++kb, cursor.advance()) {
        if (!kern::acquire_stage(ring, cursor, kWaitCycles)) {
          atomicExch(p.error, kProducerTimeout);
          return;
        }
        uint64_t* bar = &ring.full[cursor.stage];
        dev::tma_load_2d(ring.a(cursor.stage), &a_map, bar, kb * kBlockK,
                         int32_t(sched.m_tile(t) * kBlockM));
        uint8_t* tile_b = ring.b(cursor.stage);
        if constexpr (kEpilogue == GemmEpilogue::swiglu) {
          // N/2 gate rows then the N/2 up rows of the same outputs: the epilogue pairs them.
          const int32_t row = int32_t(sched.n_tile(t) * (kBlockN / 2));
          dev::tma_load_3d(tile_b, &b_map, bar, kb * kBlockK, row, expert);
          dev::tma_load_3d(tile_b + Tile<kBlockN>::kBytesB / 2, &b_up_map, bar, kb * kBlockK, row,
                           expert);
        } else {
          dev::tma_load_3d(tile_b, &b_map, bar, kb * kBlockK, int32_t(sched.n_tile(t) * kBlockN),
                           expert);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kern::kConsumerRegs));
  const int wg = threadIdx.x / 128;
  float d[kBlockN / 2];
  for (int64_t t = blockIdx.x; t < sched.count(); t += gridDim.x) {
    if (p.tile_expert[sched.m_tile(t)] < 0) continue;
    if (!kern::mma_tile<kBlockN>(d, ring, cursor, k_blocks, wg, kWaitCycles)) {
      atomicExch(p.error, kConsumerTimeout);
      return;
    }
    const int64_t row0 = sched.m_tile(t) * kBlockM + wg * 64;
    if constexpr (kEpilogue == GemmEpilogue::store) {
      __nv_bfloat16* out = p.out + sched.n_tile(t) * kBlockN;
      kern::store_tile<kBlockN>(d, 0, int(p.n - sched.n_tile(t) * kBlockN),
                                [&](int r) { return out + (row0 + r) * p.n; });
    } else {
      const int64_t width = p.n / 2;
      __nv_bfloat16* out = p.out + row0 * width + sched.n_tile(t) * (kBlockN / 2);
      const int r = kern::Fragment::mine().row_lo;
      kern::swiglu_tile<kBlockN>(d, out + r * width, out + (r + 8) * width);
    }
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
  const CUtensorMap a_map = dev::make_map_2d(dev::Dtype::bf16, args.a, uint64_t(args.rows),
                                             uint64_t(args.k), uint64_t(args.k), kBlockM);
  // Swiglu: gate and up are [experts, n/2, k] each, read in boxes of N/2 rows.
  const uint64_t b_rows = swiglu ? uint64_t(args.n / 2) : uint64_t(args.n);
  const uint32_t b_box = swiglu ? kBlockN / 2 : kBlockN;
  const CUtensorMap b_map = dev::make_map_3d(dev::Dtype::bf16, args.b, uint64_t(args.experts),
                                             b_rows, uint64_t(args.k), b_box);
  const CUtensorMap b_up_map =
      swiglu ? dev::make_map_3d(dev::Dtype::bf16, args.b_up, uint64_t(args.experts), b_rows,
                                uint64_t(args.k), b_box)
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
