// Block quantizers: the scale rules, the edge cases of formats.md, and layouts. Bit-for-bit
// comparison with an independent NumPy implementation is in tests/python/test_formats.py.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "mok/error.hpp"
#include "mok/formats.hpp"

using namespace mok;

namespace {
std::vector<float> random_values(size_t n, uint64_t seed, float log2_spread = 20.0f) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const float mag =
        std::ldexp(std::uniform_real_distribution<float>(1, 2)(rng),
                   int(std::uniform_real_distribution<float>(-log2_spread, log2_spread)(rng)));
    x = (rng() & 1) ? -mag : mag;
  }
  return v;
}
float amax_of(const float* x, size_t n) {
  float a = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) a = std::fmax(a, std::fabs(x[i]));
  return a;
}
}  // namespace

TEST(Mxfp8, RceilScaleKeepsEveryBlockInsideE4M3WithoutSaturation) {
  const int64_t rows = 64, cols = 256;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> x = random_values(size_t(rows * cols), seed, 4);
    const Mxfp8Tensor q = quantize_mxfp8(x.data(), rows, cols, {1, 32});
    const std::vector<float> d = dequantize(q);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols / 32; ++b) {
        const float amax = amax_of(&x[size_t(r * cols + b * 32)], 32);
        const uint8_t s = q.scales[size_t(r * (cols / 32) + b)];
        const double ratio = amax / std::ldexp(1.0, int(s) - 127);
        EXPECT_GT(ratio, 224.0);
        EXPECT_LE(ratio, 448.0);
        for (int i = 0; i < 32; ++i) {
          const size_t k = size_t(r * cols + b * 32 + i);
          // RNE in E4M3: half an ulp (2^-4 relative for normals, plus the subnormal step).
          EXPECT_LE(std::fabs(d[k] - x[k]),
                    std::fabs(x[k]) / 16 + std::ldexp(1.0, int(s) - 127 - 10))
              << k;
        }
      }
    }
  }
}

TEST(Mxfp8, FloorScaleIsTheOcpRule) {
  std::vector<float> x(32, 0.0f);
  for (float amax : {1.0f, 1.5f, 1.9f, 3.0f, 1e-3f, 6e4f}) {
    x[5] = amax;
    const Mxfp8Tensor q = quantize_mxfp8(x.data(), 1, 32, {1, 32}, MxScaleRule::floor);
    EXPECT_EQ(int(q.scales[0]) - 127, int(std::floor(std::log2(double(amax)))) - 8) << amax;
  }
  x[5] = std::ldexp(1.0f, -121);  // below 2^-119: the exponent clamps at -127
  EXPECT_EQ(quantize_mxfp8(x.data(), 1, 32, {1, 32}, MxScaleRule::floor).scales[0], 0);
  x[5] = 1.9f * 256;  // amax mantissa above 1.75 clips under FLOOR
  const Mxfp8Tensor q = quantize_mxfp8(x.data(), 1, 32, {1, 32}, MxScaleRule::floor);
  EXPECT_EQ(q.data[5], 0x7E);
}

TEST(Mxfp8, NonFiniteBlocksDecodeToNaNAndLeaveOtherBlocksAlone) {
  std::vector<float> x = random_values(64, 3, 2);
  const Mxfp8Tensor clean = quantize_mxfp8(x.data(), 1, 64, {1, 32});
  x[3] = NAN;
  x[40] = INFINITY;
  const Mxfp8Tensor q = quantize_mxfp8(x.data(), 1, 64, {1, 32});
  EXPECT_EQ(q.scales[0], 0xFF);
  EXPECT_EQ(q.scales[1], 0xFF);
  EXPECT_EQ(q.data[3], 0x7F);
  EXPECT_EQ(q.data[40], 0x7F);
  EXPECT_EQ(q.data[4], clean.data[4]);  // finite elements still encoded with the finite amax
  EXPECT_TRUE(std::isnan(dequantize(q)[4]));
}

TEST(Mxfp8, ZeroBlockAndSmallestScale) {
  std::vector<float> x(32, 0.0f);
  x[0] = -0.0f;
  const Mxfp8Tensor q = quantize_mxfp8(x.data(), 1, 32, {1, 32});
  EXPECT_EQ(q.scales[0], 0);  // 2^-127 by the definition, not 1
  EXPECT_EQ(q.data[0], 0x80);
  EXPECT_EQ(q.data[1], 0x00);
  x[1] = std::ldexp(1.0f, -136);  // = 2^-9 (the smallest E4M3 subnormal) * 2^-127
  const Mxfp8Tensor tiny = quantize_mxfp8(x.data(), 1, 32, {1, 32});
  EXPECT_EQ(tiny.scales[0], 0);
  EXPECT_EQ(tiny.data[1], 0x01);
  EXPECT_EQ(dequantize(tiny)[1], x[1]);
}

TEST(Mxfp8, ColumnBlocksEqualRowBlocksOfTheTranspose) {
  const int64_t rows = 96, cols = 40;  // 40 columns: partial edge blocks in the transpose
  const std::vector<float> x = random_values(size_t(rows * cols), 11, 6);
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) xt[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  const Mxfp8Tensor col = quantize_mxfp8(x.data(), rows, cols, {32, 1});
  const Mxfp8Tensor row = quantize_mxfp8(xt.data(), cols, rows, {1, 32});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(col.data[size_t(r * cols + c)], row.data[size_t(c * rows + r)]);
  for (int64_t br = 0; br < rows / 32; ++br)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(col.scales[size_t(br * cols + c)], row.scales[size_t(c * (rows / 32) + br)]);
}

TEST(Nvfp4, TwoLevelScalesFollowTheRecipe) {
  const int64_t rows = 16, cols = 64;
  const std::vector<float> x = random_values(size_t(rows * cols), 5, 3);
  const Nvfp4Tensor q = quantize_nvfp4(x.data(), rows, cols, {1, 16});
  const float g = amax_of(x.data(), x.size());
  EXPECT_EQ(q.global_amax, g);
  const float s_enc = 2688.0f / g;
  EXPECT_EQ(q.s_dec, 1.0f / s_enc);
  const std::vector<float> d = dequantize(q);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 16; ++b) {
      const float bamax = amax_of(&x[size_t(r * cols + b * 16)], 16);
      const uint8_t s = q.scales[size_t(r * (cols / 16) + b)];
      EXPECT_EQ(s, fmt::ue4m3_from_float(bamax * (s_enc * (1.0f / 6.0f))));
      const double block_scale = double(fmt::ue4m3_to_float(s)) * q.s_dec;
      for (int i = 0; i < 16; ++i) {
        const size_t k = size_t(r * cols + b * 16 + i);
        // E2M1 spacing is at most 2 (between 4 and 6): error <= one step of the block's grid,
        // plus the rounding of the block scale itself.
        EXPECT_LE(std::fabs(d[k] - x[k]), 1.0 * block_scale + 0.07 * std::fabs(x[k])) << k;
      }
    }
  }
}

TEST(Nvfp4, PackingZerosNaNAndNegativeZero) {
  std::vector<float> x(32, 0.0f);
  Nvfp4Tensor z = quantize_nvfp4(x.data(), 1, 32, {1, 16});
  EXPECT_EQ(z.s_dec, 1.0f);  // S_enc = 1 when the tensor is all zero
  x[0] = 6.0f;
  x[1] = -0.01f;  // rounds to -0: code 0x8 in the high nibble of byte 0
  x[17] = NAN;
  const Nvfp4Tensor q = quantize_nvfp4(x.data(), 1, 32, {1, 16});
  EXPECT_EQ(q.data[0] & 0xF, 0x7);
  EXPECT_EQ(q.data[0] >> 4, 0x8);
  EXPECT_EQ(q.scales[1], 0x7F);  // block with a NaN decodes to NaN
  EXPECT_EQ(q.data[8] >> 4, 0x0);
  const std::vector<float> d = dequantize(q);
  EXPECT_FLOAT_EQ(d[0], 6.0f);  // 6 * 448 * fl(1/448)
  EXPECT_TRUE(std::signbit(d[1]) && d[1] == 0.0f);
  EXPECT_TRUE(std::isnan(d[16]));
}

TEST(Nvfp4, SquareBlocksGiveTheSameCodesForATensorAndItsTranspose) {
  const int64_t n = 48;
  const std::vector<float> x = random_values(size_t(n * n), 8, 5);
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c) xt[size_t(c * n + r)] = x[size_t(r * n + c)];
  const std::vector<float> a = dequantize(quantize_nvfp4(x.data(), n, n, {16, 16}));
  const std::vector<float> b = dequantize(quantize_nvfp4(xt.data(), n, n, {16, 16}));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c) EXPECT_EQ(a[size_t(r * n + c)], b[size_t(c * n + r)]);
}

TEST(Fp8Block, ScalesAreAmaxOver448WithAFloor) {
  std::vector<float> x = random_values(256, 4, 3);
  const Fp8BlockTensor q = quantize_fp8_block(x.data(), 1, 256, {1, 128});
  for (int b = 0; b < 2; ++b)
    EXPECT_EQ(q.scales[size_t(b)], amax_of(&x[size_t(b * 128)], 128) / 448.0f);
  std::vector<float> small(128, 1e-6f);
  EXPECT_EQ(quantize_fp8_block(small.data(), 1, 128, {1, 128}).scales[0], 1e-4f / 448.0f);
  const Fp8BlockTensor p2 = quantize_fp8_block(x.data(), 1, 256, {1, 128}, true);
  for (int b = 0; b < 2; ++b) {
    const float s = p2.scales[size_t(b)];
    int e;
    EXPECT_EQ(std::frexp(s, &e), 0.5f);                        // a power of two
    EXPECT_GE(s * 448.0f, amax_of(&x[size_t(b * 128)], 128));  // rounded up: no saturation
  }
  x[7] = -INFINITY;
  const Fp8BlockTensor bad = quantize_fp8_block(x.data(), 1, 256, {1, 128});
  EXPECT_TRUE(std::isnan(bad.scales[0]));
  EXPECT_FALSE(std::isnan(bad.scales[1]));
  EXPECT_EQ(bad.data[7], 0x7F);
}

TEST(Fp8Block, WeightBlocksAre128By128WithPartialEdges) {
  const int64_t rows = 200, cols = 300;
  const std::vector<float> x = random_values(size_t(rows * cols), 9, 8);
  const Fp8BlockTensor q = quantize_fp8_block(x.data(), rows, cols, {128, 128});
  ASSERT_EQ(q.scales.size(), 2u * 3u);
  float amax = 0;
  for (int64_t r = 128; r < rows; ++r)
    for (int64_t c = 256; c < cols; ++c) amax = std::fmax(amax, std::fabs(x[size_t(r * cols + c)]));
  EXPECT_EQ(q.scales[5], amax / 448.0f);
}

TEST(Quantizers, RejectShapesTheFormatDoesNotDefine) {
  std::vector<float> x(64, 1.0f);
  try {
    quantize_mxfp8(x.data(), 2, 32, {16, 16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1x32, 32x1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_nvfp4(x.data(), 1, 63, {1, 16}), Error);
  EXPECT_THROW(quantize_fp8_block(x.data(), 1, 64, {1, 32}), Error);
}

// Issue 33's finding: dequantize read past scales too short for the tensor. Every size is
// checked before any element is read.
TEST(Quantizers, DequantizeRefusesDataOrScalesOfTheWrongSize) {
  std::vector<float> x(size_t(64 * 256), 0.5f);
  Mxfp8Tensor mx = quantize_mxfp8(x.data(), 64, 256, {1, 32});
  mx.scales.resize(1);
  try {
    dequantize(mx);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 512 scales; the tensor holds 1"), std::string::npos)
        << e.what();
  }
  Nvfp4Tensor nv = quantize_nvfp4(x.data(), 64, 256, {16, 16});
  nv.data.pop_back();
  EXPECT_THROW(dequantize(nv), Error);
  Fp8BlockTensor fb = quantize_fp8_block(x.data(), 64, 256, {1, 128});
  fb.block = {128, 128};  // the scales of 1x128 blocks read as 128x128 ones: a size mismatch
  EXPECT_THROW(dequantize(fb), Error);
  fb.block = {1, 64};
  EXPECT_THROW(dequantize(fb), Error);
}
