// Each device primitive on the GPU: TMA loads through an mbarrier ring (swizzle layout and phase
// bookkeeping), TMA stores, wgmma against a CPU product, release/acquire handoffs between CTAs,
// a bounded wait that times out, named barriers, elect_one and thread_index_here, and cp.async row
// gathers tracked by an mbarrier (counted and extra arrivals, zero fill, the 128B swizzle).
#include <cuda_bf16.h>

#include <cmath>
#include <random>

#include "gpu_test_util.hpp"
#include "mok/device/cp_async.cuh"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/tensor_map.hpp"
#include "mok/device/tma.cuh"
#include "mok/device/wgmma.cuh"
#include "mok/formats/codecs.hpp"

using namespace mok::dev;

namespace {

constexpr uint64_t kTimeoutCycles = 2'000'000'000ull;  // ~1 s: far past any legitimate wait

std::vector<uint16_t> pattern(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint16_t(i * 2654435761u >> 16);
  return v;
}

// ---- TMA loads through a 2-stage ring: a producer thread and a consumer warp -------------------
constexpr int kBoxRows = 64, kBoxBytes = kBoxRows * 128;

__global__ void ring_load_kernel(const __grid_constant__ CUtensorMap map, int tiles, int tiles_x,
                                 uint8_t* out, int* error) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  __shared__ uint64_t full[2], empty[2];
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 1);
    mbar_fence_init();
  }
  __syncthreads();
  RingCursor<2> ring;
  if (threadIdx.x / 32 == 0) {  // producer warp
    if (!elect_one()) return;
    tma_prefetch_map(&map);
    for (int t = 0; t < tiles; ++t, ring.advance()) {
      if (!mbar_wait(&empty[ring.stage], ring.phase ^ 1u, kTimeoutCycles)) {
        atomicExch(error, 1);
        return;
      }
      mbar_arrive_expect_tx(&full[ring.stage], kBoxBytes);
      tma_load_2d(smem + ring.stage * kBoxBytes, &map, &full[ring.stage], (t % tiles_x) * 64,
                  (t / tiles_x) * kBoxRows);
    }
  } else {  // consumer warp: copies each tile out raw (swizzled), then frees the stage
    for (int t = 0; t < tiles; ++t, ring.advance()) {
      if (!mbar_wait(&full[ring.stage], ring.phase, kTimeoutCycles)) {
        atomicExch(error, 2);
        return;
      }
      const uint8_t* tile = smem + ring.stage * kBoxBytes;
      for (int i = threadIdx.x - 32; i < kBoxBytes; i += 32)
        out[size_t(t) * kBoxBytes + i] = tile[i];
      __syncwarp();
      if (threadIdx.x == 32) mbar_arrive(&empty[ring.stage]);
    }
  }
}

// ---- TMA store of a swizzled smem box
// ------------------------------------------------------------
__global__ void store_kernel(const __grid_constant__ CUtensorMap map, int x, int y) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint16_t* box = reinterpret_cast<uint16_t*>(smem);
  for (int i = threadIdx.x; i < kBoxRows * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    box[swizzle128_offset(r, c * 2) / 2] = uint16_t(r * 64 + c);
  }
  fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_store_2d(&map, smem, x, y);
    tma_store_commit();
    tma_store_wait_all();
  }
}

// ---- wgmma: D[64x128] = A[64x64] B[128x64]^T from TMA-loaded tiles -----------------------------
__global__ void __launch_bounds__(128, 1)
    wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                 const __grid_constant__ CUtensorMap map_b, float* d_out, int* error) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* a = smem;             // 64 rows x 128 B
  uint8_t* b = smem + 64 * 128;  // 128 rows x 128 B (8 KB offset: 1024-aligned)
  __shared__ uint64_t full;
  if (threadIdx.x == 0) {
    mbar_init(&full, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&full, (64 + 128) * 128);
    tma_load_2d(a, &map_a, &full, 0, 0);
    tma_load_2d(b, &map_b, &full, 0, 0);
  }
  if (!mbar_wait(&full, 0, kTimeoutCycles)) {
    atomicExch(error, 1);
    return;
  }
  float d[64];
  const uint64_t da = smem_desc<Major::K>(smem_addr(a)), db = smem_desc<Major::K>(smem_addr(b));
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k)  // 4 x k16 = 64: 32 bytes further along the 128-byte row each step
    wgmma<__nv_bfloat16, 128>(d, smem_desc_advance(da, 32 * k), smem_desc_advance(db, 32 * k),
                              k > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(d);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int row = 16 * w + l / 4, col = 8 * j + 2 * (l % 4);
    d_out[row * 128 + col] = d[4 * j];
    d_out[row * 128 + col + 1] = d[4 * j + 1];
    d_out[(row + 8) * 128 + col] = d[4 * j + 2];
    d_out[(row + 8) * 128 + col + 1] = d[4 * j + 3];
  }
}

// ---- Release/acquire between CTAs, and a bounded wait that times out ---------------------------
// The writer releases the flag with a release increment (mode 0) or with a fence and a relaxed
// increment, at GPU (1) or system (2) scope.
__global__ void handoff_kernel(float* data, uint32_t* flag, float* out, int n, int* timed_out,
                               int mode) {
  if (blockIdx.x == 0) {  // writer
    for (int i = threadIdx.x; i < n; i += blockDim.x) data[i] = float(i) * 0.5f + 1.0f;
    __syncthreads();
    if (threadIdx.x == 0 && mode == 0) add_release_gpu(flag, 1);
    if (threadIdx.x == 0 && mode == 1) fence_acq_rel_gpu(), add_relaxed_gpu(flag, 1);
    if (threadIdx.x == 0 && mode == 2) fence_acq_rel_sys(), add_relaxed_sys(flag, 1);
  } else {  // reader: one thread acquires, the block reads after a barrier
    __shared__ int ok;
    if (threadIdx.x == 0) ok = wait_flag_at_least(flag, 1, kTimeoutCycles);
    __syncthreads();
    if (!ok) {
      if (threadIdx.x == 0) atomicExch(timed_out, 1);
      return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = data[i];
  }
}

__global__ void never_arrives_kernel(const uint32_t* flag, uint64_t cycles, int* timed_out) {
  if (!wait_flag_at_least(flag, 1, cycles)) *timed_out = 1;
}

// ---- Named barriers and elect_one
// ----------------------------------------------------------------
__global__ void named_barrier_kernel(int* out, int* elected, int* wrong_index) {
  __shared__ int values[64];
  if (elect_one()) atomicAdd(elected, 1);
  if (thread_index_here() != threadIdx.x) atomicAdd(wrong_index, 1);
  if (threadIdx.x < 64) {
    if (threadIdx.x < 32) values[threadIdx.x] = int(threadIdx.x) * 3 + 1;
    named_barrier_sync(1, 64);  // only the first two warps take part
    if (threadIdx.x >= 32) out[threadIdx.x - 32] = values[threadIdx.x - 32];
  }
}

int opt_in_smem(const void* kernel, int bytes) {
  return int(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

// ---- A warp gathers 128 scattered rows (64 BF16 each) into a swizzled tile, over several laps of
// one stage: lanes 1..31 arrive counted, lane 0 extra and then with the TMA-style expect_tx of 0
// bytes, as the forward's producer does. Row `rows[i]` < 0 is zero-filled.
__global__ void gather_kernel(const uint16_t* src, const int* rows, int laps, uint8_t* out,
                              int* error) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* tile =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  __shared__ uint64_t full;
  if (threadIdx.x == 0) {
    mbar_init(&full, 32);
    mbar_fence_init();
  }
  __syncthreads();
  const int lane = int(threadIdx.x);
  for (int lap = 0; lap < laps; ++lap) {
    for (int i = 0; i < 4; ++i) {
      const int row = lane + 32 * i, from = rows[lap * 128 + row];
      for (int chunk = 0; chunk < 8; ++chunk)
        cp_async_16(tile + swizzle128_offset(uint32_t(row), uint32_t(chunk) * 16u),
                    from >= 0 ? static_cast<const void*>(src + from * 64 + chunk * 8)
                              : static_cast<const void*>(src),
                    from >= 0 ? 16u : 0u);
    }
    if (lane == 0) {
      cp_async_arrive_extra(&full);
      mbar_arrive_expect_tx(&full, 0);
    } else {
      cp_async_arrive_counted(&full);
    }
    if (!mbar_wait(&full, uint32_t(lap & 1), kTimeoutCycles)) {
      atomicExch(error, 1);
      return;
    }
    for (int b = lane; b < 128 * 128; b += 32) out[size_t(lap) * 128 * 128 + b] = tile[b];
    __syncwarp();  // every lane has read the tile before any lane overwrites it
  }
}

TEST(PrimitivesGpu, CpAsyncGatherFillsTheSwizzledTileAndCompletesTheBarrier) {
  MOK_REQUIRE_GPU();
  const int src_rows = 300, laps = 3;
  const std::vector<uint16_t> src = pattern(size_t(src_rows) * 64);
  std::vector<int> rows(size_t(laps) * 128);
  std::mt19937 rng(5);
  for (int& r : rows) r = int(rng() % (src_rows + 40)) - 40;  // about 12% padding rows
  DeviceBuffer<uint16_t> g(src);
  DeviceBuffer<int> r(rows);
  DeviceBuffer<uint8_t> out(size_t(laps) * 128 * 128);  // poisoned
  DeviceBuffer<int> error(1, 0);
  const int smem = 128 * 128 + 1024;
  gather_kernel<<<1, 32, smem>>>(g.ptr, r.ptr, laps, out.ptr, error.ptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(error.to_host()[0], 0);
  const std::vector<uint8_t> got = out.to_host();
  for (int lap = 0; lap < laps; ++lap)
    for (int row = 0; row < 128; ++row)
      for (int c = 0; c < 64; ++c) {
        uint16_t v;
        std::memcpy(&v, &got[size_t(lap) * 128 * 128 + swizzle128_offset(row, c * 2)], 2);
        const int from = rows[size_t(lap * 128 + row)];
        ASSERT_EQ(v, from >= 0 ? src[size_t(from) * 64 + c] : 0) << lap << " " << row << " " << c;
      }
}

TEST(PrimitivesGpu, TmaLoadsThroughAnMbarrierRingFollowTheSwizzle) {
  MOK_REQUIRE_GPU();
  const int rows = 4 * kBoxRows, cols = 3 * 64, tiles = 12;  // 12 tiles through 2 stages: 6 laps
  const std::vector<uint16_t> src = pattern(size_t(rows * cols));
  DeviceBuffer<uint16_t> g(src);
  DeviceBuffer<uint8_t> out(size_t(tiles) * kBoxBytes);
  DeviceBuffer<int> error(1, 0);
  const CUtensorMap map = make_map_2d(Dtype::bf16, g.ptr, rows, cols, cols, kBoxRows);
  const int smem = 2 * kBoxBytes + 1024;
  MOK_CUDA_OK(cudaError_t(opt_in_smem((const void*)ring_load_kernel, smem)));
  ring_load_kernel<<<1, 64, smem>>>(map, tiles, 3, out.ptr, error.ptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(error.to_host()[0], 0);
  const std::vector<uint8_t> got = out.to_host();
  for (int t = 0; t < tiles; ++t)
    for (int r = 0; r < kBoxRows; ++r)
      for (int c = 0; c < 64; ++c) {
        uint16_t v;
        std::memcpy(&v, &got[size_t(t) * kBoxBytes + swizzle128_offset(r, c * 2)], 2);
        ASSERT_EQ(v, src[size_t((t / 3) * kBoxRows + r) * cols + (t % 3) * 64 + c])
            << t << " " << r << " " << c;
      }
}

TEST(PrimitivesGpu, TmaStoreWritesTheBoxAndNothingElse) {
  MOK_REQUIRE_GPU();
  const int rows = 3 * kBoxRows, cols = 3 * 64;
  DeviceBuffer<uint16_t> g(size_t(rows * cols), 0xAB);  // poisoned
  const CUtensorMap map = make_map_2d(Dtype::bf16, g.ptr, rows, cols, cols, kBoxRows);
  MOK_CUDA_OK(cudaError_t(opt_in_smem((const void*)store_kernel, kBoxBytes + 1024)));
  store_kernel<<<1, 128, kBoxBytes + 1024>>>(map, 64, kBoxRows);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = g.to_host();
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const bool inside = r >= kBoxRows && r < 2 * kBoxRows && c >= 64 && c < 128;
      const uint16_t want = inside ? uint16_t((r - kBoxRows) * 64 + (c - 64)) : uint16_t(0xABAB);
      ASSERT_EQ(got[size_t(r * cols + c)], want) << r << " " << c;
    }
}

TEST(PrimitivesGpu, WgmmaBf16MatchesTheCpuProduct) {
  MOK_REQUIRE_GPU();
  std::mt19937 rng(5);
  std::vector<uint16_t> a(64 * 64), b(128 * 64);
  for (uint16_t& v : a)
    v = mok::fmt::bf16_from_float(std::uniform_real_distribution<float>(-1, 1)(rng));
  for (uint16_t& v : b)
    v = mok::fmt::bf16_from_float(std::uniform_real_distribution<float>(-1, 1)(rng));
  DeviceBuffer<uint16_t> ga(a), gb(b);
  DeviceBuffer<float> d(64 * 128, 0xFF);  // NaN poison
  DeviceBuffer<int> error(1, 0);
  const CUtensorMap ma = make_map_2d(Dtype::bf16, ga.ptr, 64, 64, 64, 64);
  const CUtensorMap mb = make_map_2d(Dtype::bf16, gb.ptr, 128, 64, 64, 128);
  const int smem = (64 + 128) * 128 + 1024;
  MOK_CUDA_OK(cudaError_t(opt_in_smem((const void*)wgmma_kernel, smem)));
  wgmma_kernel<<<1, 128, smem>>>(ma, mb, d.ptr, error.ptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(error.to_host()[0], 0);
  const std::vector<float> got = d.to_host();
  double max_err = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      double want = 0;
      for (int k = 0; k < 64; ++k)
        want += double(mok::fmt::bf16_to_float(a[size_t(i * 64 + k)])) *
                mok::fmt::bf16_to_float(b[size_t(j * 64 + k)]);
      const double err = std::fabs(double(got[size_t(i * 128 + j)]) - want);
      max_err = std::isfinite(err) ? std::max(max_err, err) : INFINITY;  // NaN: unwritten
    }
  EXPECT_LT(max_err, 1e-4);  // 64 FP32 additions of products below 1
}

TEST(PrimitivesGpu, ReleaseAcquireHandsDataToAnotherBlockAndWaitsAreBounded) {
  MOK_REQUIRE_GPU();
  const int n = 1 << 16;
  for (int round = 0; round < 30; ++round) {
    DeviceBuffer<float> data(size_t(n), 0xFF), out(size_t(n), 0xFF);
    DeviceBuffer<uint32_t> flag(1, 0);
    DeviceBuffer<int> timed_out(1, 0);
    handoff_kernel<<<2, 256>>>(data.ptr, flag.ptr, out.ptr, n, timed_out.ptr, round % 3);
    MOK_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(timed_out.to_host()[0], 0);
    const std::vector<float> got = out.to_host();
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], float(i) * 0.5f + 1.0f) << i;
  }
  DeviceBuffer<uint32_t> flag(1, 0);
  DeviceBuffer<int> timed_out(1, 0);
  never_arrives_kernel<<<1, 1>>>(flag.ptr, 10'000'000ull, timed_out.ptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(timed_out.to_host()[0], 1);
}

TEST(PrimitivesGpu, NamedBarrierElectOneAndThreadIndex) {
  MOK_REQUIRE_GPU();
  DeviceBuffer<int> out(32, 0xFF), elected(1, 0), wrong_index(1, 0);
  named_barrier_kernel<<<1, 256>>>(out.ptr, elected.ptr, wrong_index.ptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(elected.to_host()[0], 8);      // one lane in each of the 8 warps
  EXPECT_EQ(wrong_index.to_host()[0], 0);  // thread_index_here() is threadIdx.x
  const std::vector<int> got = out.to_host();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[size_t(i)], i * 3 + 1);
}
