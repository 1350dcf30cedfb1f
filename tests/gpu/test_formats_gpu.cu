// Device quantizers give the host quantizers' bits (which tests/python checks against NumPy).
#include <cmath>
#include <random>

#include "gpu_test_util.hpp"
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
