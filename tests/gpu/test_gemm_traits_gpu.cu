// The GEMM building blocks (pipeline.cuh, mma_traits.cuh, mainloop_sm90.cuh, epilogue_sm90.cuh)
// under each BF16 traits type: TMA through the traits' boxes into the ring, the traits' mainloop,
// the BF16 store epilogue. Groups are ragged in M (0, 1, 77, 128, 300 rows) or in K (the same
// counts: wgrad's per-expert K; multiples of 8 where the dimension is contiguous), K = 200 is not
// a multiple of the k-block and N = 192 not one of every tile width, so TMA's zero fill covers
// the tails. Against an FP64 product of the same BF16
// inputs, outputs poisoned (NaN) first.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/mainloop_sm90.cuh"
#include "mok/device/tensor_map.hpp"
#include "mok/formats/codecs.hpp"

using mok::fmt::bf16_from_float;
using mok::fmt::bf16_to_float;
namespace kern = mok::kern;
namespace dev = mok::dev;

namespace {

// Descriptor fields (start >> 4 | LBO >> 4 << 16 | SBO >> 4 << 32 | 128B swizzle << 62): K-major
// as the forward has always encoded it; MN-major with B's 64-column spans kBlockK * 128 B apart.
static_assert(dev::smem_desc<dev::Major::K>(0x12400) ==
              ((0x12400u >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62)));
static_assert(dev::smem_desc<dev::Major::MN>(0x12400, kern::Bf16MnMajorB::B::kBlockBytes) ==
              ((0x12400u >> 4) | (512ull << 16) | (64ull << 32) | (1ull << 62)));

constexpr int kMaxGroups = 10;
constexpr uint64_t kWaitCycles = 2'000'000'000ull;  // ~1 s: far past any legitimate wait

struct Group {
  int m, n, k;
  int64_t out;  // offset of the [m, n] output in Params::out
};
struct Params {
  CUtensorMap a[kMaxGroups], b[kMaxGroups];
  Group groups[kMaxGroups];
  const int4* tiles;  // (group, m0, n0, -)
  int tile_count;
  __nv_bfloat16* out;
  int* error;
};

// The production kernels' shape: one producer thread, two consumer warpgroups, CTAs striding over
// the tiles so the ring wraps.
template <class Traits, int kBlockN>
__global__ void __launch_bounds__(kern::kThreads, 1)
    traits_gemm_kernel(const __grid_constant__ Params p) {
  using Shape = kern::TileShape<kBlockN, Traits>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[Shape::kStages], empty[Shape::kStages];
  const auto ring = kern::SmemRing<kBlockN, Traits>::make(smem_raw, full, empty);
  __syncthreads();
  dev::RingCursor<Shape::kStages> cursor;
  auto k_blocks = [](const Group& g) { return (g.k + Traits::kBlockK - 1) / Traits::kBlockK; };

  if (threadIdx.x / 128 == kern::kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kern::kProducerRegs));
    if (threadIdx.x % 128 != 0) return;
    for (int t = int(blockIdx.x); t < p.tile_count; t += int(gridDim.x)) {
      const int4 tile = p.tiles[t];
      const Group& g = p.groups[tile.x];
      for (int kb = 0; kb < k_blocks(g); ++kb, cursor.advance()) {
        if (!kern::acquire_stage(ring, cursor, kWaitCycles)) {
          atomicExch(p.error, 1);
          return;
        }
        uint64_t* bar = &ring.full[cursor.stage];
        Traits::A::template load_2d<kern::kBlockM>(ring.a(int(cursor.stage)), &p.a[tile.x], bar, kb,
                                                   tile.y);
        Traits::B::template load_2d<kBlockN>(ring.b(int(cursor.stage)), &p.b[tile.x], bar, kb,
                                             tile.z);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kern::kConsumerRegs));
  const int wg = threadIdx.x / 128;
  float d[kBlockN / 2];
  for (int t = int(blockIdx.x); t < p.tile_count; t += int(gridDim.x)) {
    const int4 tile = p.tiles[t];
    const Group& g = p.groups[tile.x];
#pragma unroll
    for (float& x : d) x = 0.0f;  // K = 0: the product is zero
    if (!kern::mma_tile<kBlockN>(d, ring, cursor, k_blocks(g), wg, kWaitCycles)) {
      atomicExch(p.error, 2);
      return;
    }
    __nv_bfloat16* out = p.out + g.out + tile.z;
    const int row0 = tile.y + wg * 64;
    kern::store_tile<kBlockN>(d, 0, g.n - tile.z, [&](int r) {
      return row0 + r < g.m ? out + int64_t(row0 + r) * g.n : nullptr;
    });
  }
}

// Host copies of one group's operands in the traits' storage order: A K-major [m, k] or MN-major
// [k, m]; B K-major [n, k] or MN-major [k, n].
struct HostGroup {
  int m, n, k;
  std::vector<uint16_t> a, b;
};

template <dev::Major kMajor>
float at(const std::vector<uint16_t>& v, int mn, int kk, int mn_extent, int k_extent) {
  return bf16_to_float(kMajor == dev::Major::K ? v[size_t(mn) * size_t(k_extent) + size_t(kk)]
                                               : v[size_t(kk) * size_t(mn_extent) + size_t(mn)]);
}

// A K-major operand is a [mn, k] map with boxes of mn_box rows, an MN-major one a [k, mn] map
// with boxes of kBlockK rows.
template <dev::Major kMajor, class Tile>
CUtensorMap operand_map(const uint16_t* ptr, int mn, int k, int mn_box) {
  return kMajor == dev::Major::K
             ? dev::make_map_2d(dev::Dtype::bf16, ptr, uint64_t(mn), uint64_t(k), uint64_t(k),
                                Tile::box_rows(mn_box))
             : dev::make_map_2d(dev::Dtype::bf16, ptr, uint64_t(k), uint64_t(mn), uint64_t(mn),
                                Tile::box_rows(mn_box));
}

struct Result {
  double worst = 0;  // max over outputs of |error| / tolerance (NaN: an output left unwritten)
  std::string where;
  bool guard_intact = true;
};

// Runs the (m, n, k) groups; `transpose_b_ref`: the reference reads B in the other major-ness
// (a wrong layout, which the comparison must catch).
template <class Traits, int kBlockN>
Result run(const std::vector<HostGroup>& groups, bool transpose_b_ref = false) {
  Result res;
  Params p{};
  std::vector<int4> tiles;
  std::vector<DeviceBuffer<uint16_t>*> buffers;
  int64_t out_elems = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const HostGroup& g = groups[gi];
    p.groups[gi] = {g.m, g.n, g.k, out_elems};
    out_elems += int64_t(g.m) * g.n;
    auto* a = new DeviceBuffer<uint16_t>(g.a);
    auto* b = new DeviceBuffer<uint16_t>(g.b);
    buffers.push_back(a);
    buffers.push_back(b);
    if (g.m > 0 && g.k > 0)
      p.a[gi] = operand_map<Traits::kMajorA, typename Traits::A>(a->ptr, g.m, g.k, kern::kBlockM);
    if (g.n > 0 && g.k > 0)
      p.b[gi] = operand_map<Traits::kMajorB, typename Traits::B>(b->ptr, g.n, g.k, kBlockN);
    for (int m0 = 0; m0 < g.m; m0 += kern::kBlockM)
      for (int n0 = 0; n0 < g.n; n0 += kBlockN) tiles.push_back({int(gi), m0, n0, 0});
  }
  constexpr int kGuard = 4096;
  DeviceBuffer<uint16_t> out(size_t(out_elems + kGuard), 0xFF);  // 0xFFFF: a BF16 NaN
  DeviceBuffer<int4> tile_buf(tiles);
  DeviceBuffer<int> error(1, 0);
  p.tiles = tile_buf.ptr;
  p.tile_count = int(tiles.size());
  p.out = reinterpret_cast<__nv_bfloat16*>(out.ptr);
  p.error = error.ptr;
  constexpr int smem = kern::TileShape<kBlockN, Traits>::kSmemBytes;
  auto kernel = traits_gemm_kernel<Traits, kBlockN>;
  EXPECT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            cudaSuccess);
  const int grid = std::max(1, std::min(p.tile_count, 3));  // fewer CTAs than tiles: rings wrap
  kernel<<<grid, kern::kThreads, smem>>>(p);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(error.to_host()[0], 0);
  const std::vector<uint16_t> got = out.to_host();
  for (DeviceBuffer<uint16_t>* buf : buffers) delete buf;

  constexpr dev::Major kA = Traits::kMajorA, kB = Traits::kMajorB;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const HostGroup& g = groups[gi];
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) {
        double want = 0, magnitude = 0;
        for (int kk = 0; kk < g.k; ++kk) {
          const double x = at<kA>(g.a, i, kk, g.m, g.k);
          const double y = (kB == dev::Major::K) != transpose_b_ref
                               ? at<dev::Major::K>(g.b, j, kk, g.n, g.k)
                               : at<dev::Major::MN>(g.b, j, kk, g.n, g.k);
          want += x * y;
          magnitude += std::fabs(x * y);
        }
        // BF16 rounding of the output (half an ulp: 2^-9 relative, doubled) and FP32 accumulation
        // over k products (k ulps of the running magnitude at most).
        const double tol =
            std::ldexp(std::fabs(want), -8) + g.k * std::ldexp(magnitude, -23) + 1e-6;
        const double v = bf16_to_float(got[size_t(p.groups[gi].out + int64_t(i) * g.n + j)]);
        const double ratio = std::isfinite(v) ? std::fabs(v - want) / tol : INFINITY;
        if (!(ratio <= res.worst)) {
          res.worst = ratio;
          res.where = "group " + std::to_string(gi) + " (m " + std::to_string(g.m) + ", k " +
                      std::to_string(g.k) + ") at (" + std::to_string(i) + ", " +
                      std::to_string(j) + "): got " + std::to_string(v) + ", want " +
                      std::to_string(want);
        }
      }
  }
  for (int i = 0; i < kGuard; ++i)
    if (got[size_t(out_elems + i)] != 0xFFFF) res.guard_intact = false;
  return res;
}

// Ragged M (K = 200), then ragged K (M = 160), N = 192, random BF16 in [-1, 1), stored for
// Traits. TMA needs 16-byte row strides, so a dimension contiguous in an operand stays a multiple
// of 8 (the ragged counts 0, 8, 72, 128, 296), else it takes 0, 1, 77, 128, 300.
template <class Traits>
std::vector<HostGroup> ragged_groups(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::vector<int> any = {0, 1, 77, 128, 300}, by8 = {0, 8, 72, 128, 296};
  constexpr bool kContiguousM = Traits::kMajorA == dev::Major::MN;
  constexpr bool kContiguousK =
      Traits::kMajorA == dev::Major::K || Traits::kMajorB == dev::Major::K;
  std::vector<HostGroup> groups;
  for (int rows : kContiguousM ? by8 : any) groups.push_back({rows, 192, 200, {}, {}});
  for (int rows : kContiguousK ? by8 : any) groups.push_back({160, 192, rows, {}, {}});
  for (HostGroup& g : groups) {
    g.a.resize(size_t(g.m) * size_t(g.k));
    g.b.resize(size_t(g.n) * size_t(g.k));
    for (uint16_t& v : g.a) v = bf16_from_float(dist(rng));
    for (uint16_t& v : g.b) v = bf16_from_float(dist(rng));
  }
  return groups;
}

template <class Traits, int kBlockN>
void expect_matches(unsigned seed) {
  const Result r = run<Traits, kBlockN>(ragged_groups<Traits>(seed));
  EXPECT_LE(r.worst, 1.0) << "worst error / tolerance at " << r.where;
  EXPECT_TRUE(r.guard_intact) << "a store past the last group's output";
}

}  // namespace

TEST(GemmTraitsGpu, Bf16KMajorMatchesTheCpuProduct) {
  MOK_REQUIRE_GPU();
  expect_matches<kern::Bf16KMajor, 128>(1);
  expect_matches<kern::Bf16KMajor, 64>(2);
}

TEST(GemmTraitsGpu, Bf16MnMajorBMatchesTheCpuProduct) {
  MOK_REQUIRE_GPU();
  expect_matches<kern::Bf16MnMajorB, 128>(3);
  expect_matches<kern::Bf16MnMajorB, 256>(4);  // four 64-wide atoms along N: the LBO
}

TEST(GemmTraitsGpu, Bf16MnMajorABMatchesTheCpuProduct) {
  MOK_REQUIRE_GPU();
  expect_matches<kern::Bf16MnMajorAB, 128>(5);
  expect_matches<kern::Bf16MnMajorAB, 192>(6);
}

// The comparison can fail: an MN-major B compared as if it were K-major is far off.
TEST(GemmTraitsGpu, AWrongLayoutIsCaught) {
  MOK_REQUIRE_GPU();
  std::vector<HostGroup> groups = ragged_groups<kern::Bf16MnMajorB>(7);
  const Result r = run<kern::Bf16MnMajorB, 128>(groups, true);
  EXPECT_GT(r.worst, 100.0);
}
