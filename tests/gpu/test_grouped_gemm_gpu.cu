// The BF16 grouped GEMM against an FP64 product of the same BF16 inputs, with both epilogues,
// experts of unequal (and zero) size, rings that wrap, grids smaller than the tile count,
// poisoned outputs, and bitwise repeatability.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "gpu_test_util.hpp"
#include "mok/formats/codecs.hpp"
#include "mok/gpu/grouped_gemm.hpp"

using mok::fmt::bf16_from_float;
using mok::fmt::bf16_to_float;

namespace {

struct Problem {
  std::vector<int> expert_rows;  // real rows per expert; segments padded to 128
  int n, k;
};

struct Data {
  int64_t rows = 0;
  std::vector<uint16_t> a, b;
  std::vector<int32_t> tile_expert;
};

Data make(const Problem& pr, uint64_t seed, int b_rows) {
  std::mt19937_64 rng(seed);
  Data d;
  for (int e = 0; e < int(pr.expert_rows.size()); ++e) {
    const int64_t padded = (pr.expert_rows[size_t(e)] + 127) / 128 * 128;
    for (int64_t t = 0; t < padded / 128; ++t) d.tile_expert.push_back(e);
    d.rows += padded;
  }
  d.tile_expert.push_back(-1);  // a trailing tile with no work: its rows must stay untouched
  d.rows += 128;
  auto draw = [&] { return bf16_from_float(std::uniform_real_distribution<float>(-1, 1)(rng)); };
  d.a.resize(size_t(d.rows * pr.k));
  for (uint16_t& v : d.a) v = draw();
  d.b.resize(size_t(pr.expert_rows.size()) * size_t(b_rows) * size_t(pr.k));
  for (uint16_t& v : d.b) v = draw();
  return d;
}

double dot_bf16(const uint16_t* x, const uint16_t* y, int k) {
  double s = 0;
  for (int i = 0; i < k; ++i) s += double(bf16_to_float(x[i])) * double(bf16_to_float(y[i]));
  return s;
}

std::vector<uint16_t> run(const Data& d, const Problem& pr, mok::gpu::GemmEpilogue epi,
                          int out_cols, int max_ctas, int block_n = 128) {
  DeviceBuffer<uint16_t> a(d.a), b(d.b);
  const size_t half = d.b.size() / 2;  // swiglu: gate is the first half of b, up the second
  DeviceBuffer<int32_t> tiles(d.tile_expert);
  DeviceBuffer<uint16_t> out(size_t(d.rows * out_cols), 0xFF);  // BF16 NaN poison
  DeviceBuffer<int> error(1, 0);
  mok::gpu::GroupedGemmArgs args;
  args.a = reinterpret_cast<const __nv_bfloat16*>(a.ptr);
  args.b = reinterpret_cast<const __nv_bfloat16*>(b.ptr);
  args.b_up = reinterpret_cast<const __nv_bfloat16*>(b.ptr + half);
  args.tile_expert = tiles.ptr;
  args.out = reinterpret_cast<__nv_bfloat16*>(out.ptr);
  args.rows = d.rows;
  args.n = pr.n;
  args.k = pr.k;
  args.experts = int(pr.expert_rows.size());
  args.epilogue = epi;
  args.error = error.ptr;
  args.max_ctas = max_ctas;
  args.block_n = block_n;
  EXPECT_EQ(mok::gpu::grouped_gemm_bf16(args, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(error.to_host()[0], 0);
  return out.to_host();
}

// BF16 output: the FP32 sum differs from FP64 by far less than the final rounding (2^-9 relative).
void expect_close(float got, double want, double scale, const char* what, int64_t r, int c) {
  ASSERT_FALSE(std::isnan(got)) << what << " unwritten at " << r << "," << c;
  ASSERT_LE(std::fabs(double(got) - want), std::fabs(want) * 0.0079 + 1e-3 * scale)
      << what << " at " << r << "," << c << ": " << got << " vs " << want;
}

}  // namespace

TEST(GroupedGemmGpu, StoreEpilogueMatchesFp64) {
  MOK_REQUIRE_GPU();
  const Problem pr{{128, 0, 300, 256, 1}, 256, 1024};  // 16 k-blocks through a 6-stage ring
  const Data d = make(pr, 1, pr.n);
  for (auto [ctas, block_n] : {std::pair{0, 128}, {3, 128}, {0, 256}, {3, 256}}) {
    SCOPED_TRACE("ctas " + std::to_string(ctas) + ", block_n " + std::to_string(block_n));
    const std::vector<uint16_t> out =
        run(d, pr, mok::gpu::GemmEpilogue::store, pr.n, ctas, block_n);
    for (int64_t r = 0; r < d.rows; ++r) {
      const int e = d.tile_expert[size_t(r / 128)];
      for (int c = 0; c < pr.n; ++c) {
        const float got = bf16_to_float(out[size_t(r * pr.n + c)]);
        if (e < 0) {
          ASSERT_TRUE(std::isnan(got)) << "row " << r << " of a tile with no work was written";
          continue;
        }
        const double want =
            dot_bf16(&d.a[size_t(r * pr.k)], &d.b[(size_t(e) * pr.n + size_t(c)) * pr.k], pr.k);
        expect_close(got, want, std::sqrt(double(pr.k)), "store", r, c);
      }
    }
  }
}

void check_swiglu(int I, int block_n) {
  const int H = 320;  // K = 5 blocks of 64
  const Problem pr{{130, 256, 0, 64}, 2 * I, H};
  Data d = make(pr, 2, 2 * I);
  // d.b holds [gate of all experts | up of all experts], each [E, I, H].
  const size_t per = size_t(I) * H;
  const std::vector<uint16_t> gate(d.b.begin(), d.b.begin() + long(pr.expert_rows.size() * per));
  const std::vector<uint16_t> up(d.b.begin() + long(pr.expert_rows.size() * per), d.b.end());
  const std::vector<uint16_t> out = run(d, pr, mok::gpu::GemmEpilogue::swiglu, I, 0, block_n);
  for (int64_t r = 0; r < d.rows; ++r) {
    const int e = d.tile_expert[size_t(r / 128)];
    for (int i = 0; i < I; ++i) {
      const float got = bf16_to_float(out[size_t(r * I + i)]);
      if (e < 0) {
        ASSERT_TRUE(std::isnan(got));
        continue;
      }
      const double g = dot_bf16(&d.a[size_t(r * H)], &gate[size_t(e) * per + size_t(i) * H], H);
      const double u = dot_bf16(&d.a[size_t(r * H)], &up[size_t(e) * per + size_t(i) * H], H);
      expect_close(got, g / (1 + std::exp(-g)) * u, double(H) / 16, "swiglu", r, i);
    }
  }
  EXPECT_EQ(run(d, pr, mok::gpu::GemmEpilogue::swiglu, I, 0, block_n), out);
  EXPECT_EQ(run(d, pr, mok::gpu::GemmEpilogue::swiglu, I, 2, block_n), out);  // another grid
}

TEST(GroupedGemmGpu, SwigluEpilogueMatchesFp64AndRepeatsBitwise) {
  MOK_REQUIRE_GPU();
  check_swiglu(192, 128);  // 3 blocks of 64 outputs
  check_swiglu(256, 256);  // one 256-wide tile: 128 gate rows + 128 up rows
}

// n = 192: the last 128-wide tile is half outside B (TMA fills zeros) and half its columns are
// not stored; the column after the output must stay untouched.
TEST(GroupedGemmGpu, StoreEpilogueWithNotAMultipleOf128) {
  MOK_REQUIRE_GPU();
  const Problem pr{{256, 130}, 192, 256};
  const Data d = make(pr, 3, pr.n);
  const std::vector<uint16_t> out = run(d, pr, mok::gpu::GemmEpilogue::store, pr.n, 0);
  for (int64_t r = 0; r < d.rows; ++r) {
    const int e = d.tile_expert[size_t(r / 128)];
    for (int c = 0; c < pr.n; ++c) {
      const float got = bf16_to_float(out[size_t(r * pr.n + c)]);
      if (e < 0) {
        ASSERT_TRUE(std::isnan(got));
        continue;
      }
      const double want =
          dot_bf16(&d.a[size_t(r * pr.k)], &d.b[(size_t(e) * pr.n + size_t(c)) * pr.k], pr.k);
      expect_close(got, want, std::sqrt(double(pr.k)), "store n=192", r, c);
    }
  }
}

TEST(GroupedGemmGpu, RejectsShapesItDoesNotTake) {
  MOK_REQUIRE_GPU();
  mok::gpu::GroupedGemmArgs args;
  int* error = nullptr;
  ASSERT_EQ(cudaMalloc(&error, sizeof(int)), cudaSuccess);
  args.error = error;
  args.rows = 100;  // not a multiple of 128
  args.n = 128;
  args.k = 64;
  args.experts = 1;
  args.tile_expert = reinterpret_cast<const int32_t*>(error);
  EXPECT_EQ(mok::gpu::grouped_gemm_bf16(args, nullptr), cudaErrorInvalidValue);
  args.rows = 128;
  args.n = 96;  // not a multiple of 64
  EXPECT_EQ(mok::gpu::grouped_gemm_bf16(args, nullptr), cudaErrorInvalidValue);
  args.n = 192;  // swiglu needs whole 128-wide tiles (64 gate + 64 up rows)
  args.epilogue = mok::gpu::GemmEpilogue::swiglu;
  args.b_up = reinterpret_cast<const __nv_bfloat16*>(error);  // present, so only n is wrong
  EXPECT_EQ(mok::gpu::grouped_gemm_bf16(args, nullptr), cudaErrorInvalidValue);
  cudaFree(error);
}
