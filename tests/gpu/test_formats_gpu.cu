// Device quantizers give the host quantizers' bits (which tests/python checks against NumPy).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "gpu_test_util.hpp"
#include "kernels/moe_forward/source_rows.hpp"
#include "mok/formats.hpp"
#include "mok/gpu/formats_gpu.hpp"

namespace {
std::vector<float> test_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int e = int(rng() % 260) - 140;  // per-row scale: subnormal to huge blocks
    for (int64_t c = 0; c < cols; ++c)
      x[size_t(r * cols + c)] = std::ldexp(float(std::normal_distribution<double>(0, 1)(rng)), e);
  }
  x[3] = NAN;
  x[size_t(cols + 5)] = INFINITY;
  x[size_t(2 * cols + 1)] = -0.0f;
  for (int64_t c = 0; c < cols; ++c) x[size_t(4 * cols + c)] = 0.0f;
  x[size_t(5 * cols)] = 3.4e38f;
  return x;
}

// About 10^7 values for the bit-for-bit comparisons (issue 30): test_matrix's random rows, then
// rows of the edge cases formats.md decides, each pattern repeated along its row so that every
// block position meets it. `finite_range`: NVFP4's one global scale, where a huge value would
// flush every other block to zero, so values stay within [-1e3, 1e3] and no Inf or FLT_MAX.
std::vector<float> edge_case_matrix(int64_t cols, uint64_t seed, bool finite_range = false) {
  const int64_t rows = (int64_t(10'000'000) + cols - 1) / cols;
  std::vector<float> x = test_matrix(rows, cols, seed);
  if (finite_range)
    for (float& v : x) v = std::isfinite(v) ? std::fmod(v, 1e3f) : 0.0f;
  std::mt19937_64 rng(seed + 1);
  auto row = [&](int64_t r, auto value) {
    for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] = value(c);
  };
  const float big = finite_range ? 448.0f : 448.0f * 1024.0f;
  int64_t r = 6;
  // Ties of E4M3 once scaled (amax 448 x 2^k gives scale 2^k): 1 + 1/16 lies between 1 and 1.125.
  for (int k : {-3, 0, 5}) {
    row(r++, [&](int64_t c) {
      return c % 32 == 0 ? std::ldexp(big, k) : std::ldexp(1.0f + float(c % 16) / 16.0f, k);
    });
  }
  // Just above and below the scale boundaries (RCEIL / FLOOR differ there).
  row(r++,
      [&](int64_t c) { return c % 2 ? std::nextafter(big, 0.0f) : std::nextafter(big, 1e9f); });
  // E2M1 thresholds (0.25 ... 5 times a power of two) and their neighbours.
  const float thresholds[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  row(r++, [&](int64_t c) { return (c % 2 ? -1.0f : 1.0f) * thresholds[c % 8] * 4.0f; });
  row(r++, [&](int64_t c) { return std::nextafter(thresholds[c % 8], c % 3 ? 0.0f : 8.0f); });
  // FP32 subnormals, and a block amax below 448 x 2^-127 (MXFP8 flushes it to zero).
  row(r++, [&](int64_t c) { return std::numeric_limits<float>::denorm_min() * float(c + 1); });
  row(r++, [&](int64_t c) { return finite_range ? 1e-30f * float(c % 7) : 1e-37f * float(c % 7); });
  // Negative zero only; zero with one tiny value; one value per block and the rest zero.
  row(r++, [&](int64_t) { return -0.0f; });
  row(r++, [&](int64_t c) { return c % 16 == 5 ? 1e-3f : 0.0f; });
  row(r++, [&](int64_t c) { return c % 128 == 0 ? -7.0f : 0.0f; });
  // Huge beside tiny in one block: the tiny ones round to zero.
  row(r++, [&](int64_t c) { return c % 8 == 0 ? big : 1e-6f; });
  // NaN or +-Inf at every position once (non-finite blocks decode to NaN), and mixed signs.
  if (!finite_range) {
    row(r++, [&](int64_t c) { return c % 33 == 0 ? NAN : 1.0f; });
    row(r++, [&](int64_t c) { return c % 29 == 0 ? (c % 2 ? INFINITY : -INFINITY) : -2.0f; });
    row(r++, [&](int64_t c) { return c % 64 == 0 ? std::numeric_limits<float>::max() : 1.0f; });
  } else {
    row(r++, [&](int64_t c) { return c % 33 == 0 ? NAN : 1.0f; });
  }
  // Random signs and magnitudes spanning E4M3's range inside one block.
  for (int i = 0; i < 4; ++i)
    row(r++, [&](int64_t) {
      const float m = std::ldexp(1.0f + float(rng() % 8) / 8.0f, int(rng() % 20) - 10);
      return rng() % 2 ? -m : m;
    });
  return x;
}
}  // namespace

TEST(FormatsGpu, Mxfp8RowsMatchHostBits) {
  MOK_REQUIRE_GPU();
  const int64_t rows = 257, cols = 512;
  const std::vector<float> x = test_matrix(rows, cols, 1);
  for (mok::MxScaleRule rule : {mok::MxScaleRule::rceil, mok::MxScaleRule::floor}) {
    DeviceBuffer<float> dx(x);
    DeviceBuffer<uint8_t> data(size_t(rows * cols)), scales(size_t(rows * cols / 32));
    MOK_CUDA_OK(
        mok::gpu::quantize_mxfp8_rows(dx.ptr, rows, cols, rule, data.ptr, scales.ptr, nullptr));
    MOK_CUDA_OK(cudaDeviceSynchronize());
    const mok::Mxfp8Tensor want = mok::quantize_mxfp8(x.data(), rows, cols, {1, 32}, rule);
    EXPECT_EQ(data.to_host(), want.data);
    EXPECT_EQ(scales.to_host(), want.scales);
  }
}

TEST(FormatsGpu, Nvfp4RowsMatchHostBits) {
  MOK_REQUIRE_GPU();
  const int64_t rows = 100, cols = 256;
  std::vector<float> x = test_matrix(rows, cols, 2);
  for (float& v : x) v = std::isfinite(v) ? std::fmod(v, 1e3f) : v;  // keep one global range
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint8_t> data(size_t(rows * cols / 2)), scales(size_t(rows * cols / 16));
  DeviceBuffer<float> s_dec(1);
  DeviceBuffer<uint32_t> scratch(1);
  MOK_CUDA_OK(mok::gpu::quantize_nvfp4_rows(dx.ptr, rows, cols, data.ptr, scales.ptr, s_dec.ptr,
                                            scratch.ptr, nullptr));
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const mok::Nvfp4Tensor want = mok::quantize_nvfp4(x.data(), rows, cols, {1, 16});
  EXPECT_EQ(data.to_host(), want.data);
  EXPECT_EQ(scales.to_host(), want.scales);
  EXPECT_EQ(s_dec.to_host()[0], want.s_dec);
}

TEST(FormatsGpu, Fp8BlockRowsMatchHostBits) {
  MOK_REQUIRE_GPU();
  const int64_t rows = 77, cols = 1024;
  const std::vector<float> x = test_matrix(rows, cols, 3);
  for (bool ue8m0 : {false, true}) {
    DeviceBuffer<float> dx(x);
    DeviceBuffer<uint8_t> data(size_t(rows * cols));
    DeviceBuffer<float> scales(size_t(rows * cols / 128));
    MOK_CUDA_OK(mok::gpu::quantize_fp8_block_rows(dx.ptr, rows, cols, ue8m0, data.ptr, scales.ptr,
                                                  nullptr));
    MOK_CUDA_OK(cudaDeviceSynchronize());
    const mok::Fp8BlockTensor want = mok::quantize_fp8_block(x.data(), rows, cols, {1, 128}, ue8m0);
    EXPECT_EQ(data.to_host(), want.data);
    const std::vector<float> got = scales.to_host();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(got[i] == want.scales[i] || (std::isnan(got[i]) && std::isnan(want.scales[i])))
          << i;
  }
}

TEST(FormatsGpu, RejectsColumnCountsThatSplitABlock) {
  MOK_REQUIRE_GPU();
  EXPECT_EQ(mok::gpu::quantize_mxfp8_rows(nullptr, 1, 33, mok::MxScaleRule::rceil, nullptr, nullptr,
                                          nullptr),
            cudaErrorInvalidValue);
}

// About 10^7 values each, with formats.md's edge cases (edge_case_matrix): the device quantizers
// give the host ones' bits, NaN scales compared as NaN.
TEST(FormatsGpu, TenMillionValuesWithEdgeCasesMatchHostBits) {
  MOK_REQUIRE_GPU();
  {
    const int64_t cols = 2048;
    const std::vector<float> x = edge_case_matrix(cols, 11);
    const int64_t rows = int64_t(x.size()) / cols;
    DeviceBuffer<float> dx(x);
    for (mok::MxScaleRule rule : {mok::MxScaleRule::rceil, mok::MxScaleRule::floor}) {
      DeviceBuffer<uint8_t> data(x.size()), scales(x.size() / 32);
      MOK_CUDA_OK(
          mok::gpu::quantize_mxfp8_rows(dx.ptr, rows, cols, rule, data.ptr, scales.ptr, nullptr));
      MOK_CUDA_OK(cudaDeviceSynchronize());
      const mok::Mxfp8Tensor want = mok::quantize_mxfp8(x.data(), rows, cols, {1, 32}, rule);
      EXPECT_TRUE(data.to_host() == want.data) << "mxfp8 codes";
      EXPECT_TRUE(scales.to_host() == want.scales) << "mxfp8 scales";
    }
    for (bool ue8m0 : {false, true}) {
      DeviceBuffer<uint8_t> data(x.size());
      DeviceBuffer<float> scales(x.size() / 128);
      MOK_CUDA_OK(mok::gpu::quantize_fp8_block_rows(dx.ptr, rows, cols, ue8m0, data.ptr, scales.ptr,
                                                    nullptr));
      MOK_CUDA_OK(cudaDeviceSynchronize());
      const mok::Fp8BlockTensor want =
          mok::quantize_fp8_block(x.data(), rows, cols, {1, 128}, ue8m0);
      EXPECT_TRUE(data.to_host() == want.data) << "fp8_block codes";
      const std::vector<float> got = scales.to_host();
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i)
        differ += !(got[i] == want.scales[i] || (std::isnan(got[i]) && std::isnan(want.scales[i])));
      EXPECT_EQ(differ, 0u) << "fp8_block scales";
    }
  }
  const int64_t cols = 1024;
  const std::vector<float> x = edge_case_matrix(cols, 12, /*finite_range=*/true);
  const int64_t rows = int64_t(x.size()) / cols;
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint8_t> data(x.size() / 2), scales(x.size() / 16);
  DeviceBuffer<float> s_dec(1);
  DeviceBuffer<uint32_t> scratch(1);
  MOK_CUDA_OK(mok::gpu::quantize_nvfp4_rows(dx.ptr, rows, cols, data.ptr, scales.ptr, s_dec.ptr,
                                            scratch.ptr, nullptr));
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const mok::Nvfp4Tensor want = mok::quantize_nvfp4(x.data(), rows, cols, {1, 16});
  EXPECT_TRUE(data.to_host() == want.data) << "nvfp4 codes";
  EXPECT_TRUE(scales.to_host() == want.scales) << "nvfp4 scales";
  EXPECT_EQ(s_dec.to_host()[0], want.s_dec);
}

namespace {
// Expert weights [batches, rows, cols] as BF16 bits (test_matrix's values rounded), and matrix b
// of them as floats, as given or transposed.
std::vector<uint16_t> bf16_weights(int64_t batches, int64_t rows, int64_t cols, uint64_t seed,
                                   bool finite_range) {
  std::vector<float> x = test_matrix(batches * rows, cols, seed);
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float v = x[i];
    if (finite_range) v = std::isfinite(v) ? std::fmod(v, 1e3f) : v;
    bits[i] = mok::fmt::bf16_from_float(v);
  }
  return bits;
}
std::vector<float> matrix(const std::vector<uint16_t>& bits, int64_t b, int64_t rows, int64_t cols,
                          bool transposed) {
  std::vector<float> m(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[size_t(transposed ? c * rows + r : r * cols + c)] =
          mok::fmt::bf16_to_float(bits[size_t((b * rows + r) * cols + c)]);
  return m;
}
template <class T>
std::vector<T> part(const std::vector<T>& v, size_t at, size_t n) {
  return std::vector<T>(v.begin() + std::ptrdiff_t(at), v.begin() + std::ptrdiff_t(at + n));
}
}  // namespace

// MXFP8 expert weights, each matrix as the host quantizes it: blocks of 32 along the columns
// (the forward's copy) or, transposed, the transpose's (the backward's K-major copy).
TEST(FormatsGpu, Mxfp8WeightsMatchHostBitsInBothOrientations) {
  MOK_REQUIRE_GPU();
  const int64_t batches = 3, rows = 96, cols = 160;
  const std::vector<uint16_t> w = bf16_weights(batches, rows, cols, 21, false);
  DeviceBuffer<uint16_t> dw(w);
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(dw.ptr);
  for (bool transposed : {false, true})
    for (mok::MxScaleRule rule : {mok::MxScaleRule::rceil, mok::MxScaleRule::floor}) {
      SCOPED_TRACE(transposed ? "transposed" : "as given");
      DeviceBuffer<uint8_t> data(w.size(), 0xEE), scales(w.size() / 32, 0xEE);
      MOK_CUDA_OK(mok::gpu::quantize_mxfp8_weights(x, batches, rows, cols, rule, transposed,
                                                   data.ptr, scales.ptr, nullptr));
      MOK_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint8_t> got = data.to_host(), got_scales = scales.to_host();
      const int64_t out_rows = transposed ? cols : rows, out_cols = transposed ? rows : cols;
      for (int64_t b = 0; b < batches; ++b) {
        const std::vector<float> m = matrix(w, b, rows, cols, transposed);
        const mok::Mxfp8Tensor want =
            mok::quantize_mxfp8(m.data(), out_rows, out_cols, {1, 32}, rule);
        const size_t n = size_t(rows * cols);
        EXPECT_EQ(part(got, size_t(b) * n, n), want.data) << "matrix " << b;
        EXPECT_EQ(part(got_scales, size_t(b) * n / 32, n / 32), want.scales) << "matrix " << b;
      }
    }
  EXPECT_EQ(mok::gpu::quantize_mxfp8_weights(x, 1, 40, 64, mok::MxScaleRule::rceil, true, nullptr,
                                             nullptr, nullptr),
            cudaErrorInvalidValue);  // 40 rows do not split into blocks of 32
  EXPECT_EQ(mok::gpu::quantize_mxfp8_weights(x + 1, 1, 32, 32, mok::MxScaleRule::rceil, false,
                                             nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);  // the 16-byte loads need x 16-byte aligned
}

// NVFP4 expert weights: 16x16 blocks, each matrix's own per-tensor factor, as given or as the
// quantized transpose; 80 and 400 columns: a warp's 256-column strip partly and wholly inside.
TEST(FormatsGpu, Nvfp4WeightsMatchHostBitsInBothOrientations) {
  MOK_REQUIRE_GPU();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{48, 80}, {32, 400}}) {
    const int64_t batches = 3;
    const std::vector<uint16_t> w = bf16_weights(batches, rows, cols, 22, true);
    DeviceBuffer<uint16_t> dw(w);
    const auto* x = reinterpret_cast<const __nv_bfloat16*>(dw.ptr);
    for (bool transposed : {false, true}) {
      SCOPED_TRACE((transposed ? "transposed, " : "as given, ") + std::to_string(cols) +
                   " columns");
      DeviceBuffer<uint8_t> data(w.size() / 2, 0xEE), scales(w.size() / 256, 0xEE);
      DeviceBuffer<float> s_dec{size_t(batches)};
      DeviceBuffer<uint32_t> scratch{size_t(batches)};
      MOK_CUDA_OK(mok::gpu::quantize_nvfp4_weights(x, batches, rows, cols, transposed, data.ptr,
                                                   scales.ptr, s_dec.ptr, scratch.ptr, nullptr));
      MOK_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint8_t> got = data.to_host(), got_scales = scales.to_host();
      const std::vector<float> got_s_dec = s_dec.to_host();
      for (int64_t b = 0; b < batches; ++b) {
        const std::vector<float> m = matrix(w, b, rows, cols, transposed);
        const mok::Nvfp4Tensor want = mok::quantize_nvfp4(m.data(), transposed ? cols : rows,
                                                          transposed ? rows : cols, {16, 16});
        const size_t n = size_t(rows * cols);
        EXPECT_EQ(part(got, size_t(b) * n / 2, n / 2), want.data) << "matrix " << b;
        EXPECT_EQ(part(got_scales, size_t(b) * n / 256, n / 256), want.scales) << "matrix " << b;
        EXPECT_EQ(got_s_dec[size_t(b)], want.s_dec) << "matrix " << b;
      }
    }
    EXPECT_EQ(mok::gpu::quantize_nvfp4_weights(x, 1, 40, 24, false, nullptr, nullptr, nullptr,
                                               nullptr, nullptr),
              cudaErrorInvalidValue);  // 24 columns do not split into blocks of 16
    EXPECT_EQ(mok::gpu::quantize_nvfp4_weights(x + 1, 1, 16, 16, false, nullptr, nullptr, nullptr,
                                               nullptr, nullptr),
              cudaErrorInvalidValue);  // the 16-byte loads need x 16-byte aligned
  }
}

// x quantized on its source rank (kern::quantize_source_rows, what dispatch pulls under fp8_block
// and mxfp8): every row's codes and scales as the host quantizes the BF16 row (fp8_block: 1x128,
// FP32 and UE8M0 scales; mxfp8: 1x32, RCEIL), on ~10^7 values with formats.md's edge cases, in the
// row layout (codes, then scales, padded to 16 bytes; the padding left as it was). Both H
// leave padding (1152: 36 bytes of FP32 scales; 1088, mxfp8's, not a multiple of 128: 34 bytes).
TEST(FormatsGpu, SourceRowsMatchHostBits) {
  MOK_REQUIRE_GPU();
  struct Case {
    bool mx, ue8m0;
    int64_t cols;
  };
  for (const Case k :
       {Case{false, false, 1152}, Case{false, true, 1152}, Case{true, false, 1088}}) {
    SCOPED_TRACE(k.mx ? "mxfp8" : k.ue8m0 ? "fp8_block, UE8M0 scales" : "fp8_block");
    const int64_t H = k.cols;
    const std::vector<float> x = edge_case_matrix(H, 31);
    const int64_t rows = int64_t(x.size()) / H;
    std::vector<uint16_t> bits(x.size());
    std::vector<float> rounded(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      bits[i] = mok::fmt::bf16_from_float(x[i]);
      rounded[i] = mok::fmt::bf16_to_float(bits[i]);
    }
    const mok::kern::SourceRowLayout layout = mok::kern::source_row_layout(k.mx, H);
    DeviceBuffer<uint16_t> dx(bits);
    DeviceBuffer<uint8_t> out(size_t(rows * layout.bytes()), 0xEE);
    MOK_CUDA_OK(mok::kern::quantize_source_rows(reinterpret_cast<const __nv_bfloat16*>(dx.ptr),
                                                rows, H, k.mx, k.ue8m0, out.ptr, nullptr));
    MOK_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = out.to_host();
    std::vector<uint8_t> codes, scales, padding;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = got.data() + r * layout.bytes();
      codes.insert(codes.end(), row, row + H);
      scales.insert(scales.end(), row + H, row + H + layout.scale_bytes);
      padding.insert(padding.end(), row + H + layout.scale_bytes, row + layout.bytes());
    }
    EXPECT_EQ(padding, std::vector<uint8_t>(padding.size(), 0xEE)) << "the padding was written";
    if (k.mx) {
      const mok::Mxfp8Tensor want =
          mok::quantize_mxfp8(rounded.data(), rows, H, {1, 32}, mok::MxScaleRule::rceil);
      EXPECT_EQ(codes, want.data);
      EXPECT_EQ(scales, want.scales);
    } else {
      const mok::Fp8BlockTensor want =
          mok::quantize_fp8_block(rounded.data(), rows, H, {1, 128}, k.ue8m0);
      EXPECT_EQ(codes, want.data);
      ASSERT_EQ(scales.size(), want.scales.size() * 4);
      int64_t wrong = 0;
      for (size_t i = 0; i < want.scales.size(); ++i) {
        float v;
        std::memcpy(&v, &scales[4 * i], 4);
        wrong += !(v == want.scales[i] || (std::isnan(v) && std::isnan(want.scales[i])));
      }
      EXPECT_EQ(wrong, 0) << "scales differ";
    }
  }
  EXPECT_EQ(mok::kern::quantize_source_rows(nullptr, 4, 1088, false, false, nullptr, nullptr),
            cudaErrorInvalidValue);  // fp8_block's blocks of 128 do not split 1088
  DeviceBuffer<uint16_t> x(64 * 8);
  DeviceBuffer<uint8_t> rows(64 * 80);
  EXPECT_EQ(mok::kern::quantize_source_rows(reinterpret_cast<const __nv_bfloat16*>(x.ptr) + 1, 8,
                                            64, true, false, rows.ptr, nullptr),
            cudaErrorInvalidValue);  // the 16-byte loads need x 16-byte aligned
}
