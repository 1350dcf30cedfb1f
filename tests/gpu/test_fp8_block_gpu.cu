// fp8_block on the GPU (DeepSeek-V3's recipe for the routed experts): the hardware E4M3 pair
// conversion equals the codec on every finite FP32 value; the weight quantizer equals the CPU's
// quantize_fp8_block bit for bit (edge blocks, NaN, Inf, tiny and huge values, both scale kinds,
// both orientations); the forward's dispatch puts exactly the CPU's 1x128 codes and scales of
// every routed row into the token ring; the forward matches the quantized CPU reference (the
// same operand quantization, FP64 math) within its bound, on odd shapes and routings, outputs
// poisoned first; its bits repeat under dispatch delays and at EP 2 and 4 (emulated groups);
// and the configurations it does not take are clear errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "quantized_forward_util.hpp"
#include "layer/layer_runner.hpp"
#include "mok/formats.hpp"
#include "mok/formats/fp8_block_device.cuh"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/formats_gpu.hpp"
#include "mok/gpu/fp8_block_experts.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/schedule/routing_layout.hpp"

using namespace fwd_test;
using mok::gpu::Fp8BlockExperts;
using mok::gpu::MoeForward;

namespace {

// ---- The conversion ------------------------------------------------------------------------

struct Mismatch {
  unsigned long long count;
  uint32_t first_bits, first_got, first_want;
};

__global__ void e4m3_pairs_kernel(uint64_t begin, uint64_t end, Mismatch* m) {
  for (uint64_t i = begin + uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t bits = uint32_t(i);
    if (!mok::is_finite_bits(bits)) continue;
    const float x = mok::bits_float(bits), y = -x * 0.75f;  // a second, different value
    const uint32_t got = mok::fmt::e4m3x2_from_finite(x, y);
    const uint32_t want =
        uint32_t(mok::fmt::e4m3_from_float(x)) | uint32_t(mok::fmt::e4m3_from_float(y)) << 8;
    if (got != want && atomicAdd(&m->count, 1ull) == 0)
      m->first_bits = bits, m->first_got = got, m->first_want = want;
  }
}

// ---- Layers --------------------------------------------------------------------------------

mok::Config fp8_config(int H, int I, int E, int K, int shared, int max_tokens) {
  return quantized_config(mok::Precision::fp8_block, H, I, E, K, shared, max_tokens);
}
using Fp8Layer = QuantizedLayer<Fp8BlockExperts>;

mok::Config ue8m0(mok::Config c) {
  c.fp8_ue8m0 = true;
  return c;
}

}  // namespace

TEST(Fp8BlockGpu, HardwarePairConversionEqualsTheCodecOnEveryFiniteFloat) {
  MOK_REQUIRE_GPU();
  DeviceBuffer<Mismatch> m(1, 0);
  for (uint64_t begin = 0; begin < (1ull << 32); begin += 1ull << 30)
    e4m3_pairs_kernel<<<1024, 256>>>(begin, begin + (1ull << 30), m.ptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const Mismatch got = m.to_host()[0];
  EXPECT_EQ(got.count, 0ull) << "first at bits 0x" << std::hex << got.first_bits << ": got 0x"
                             << got.first_got << ", codec 0x" << got.first_want;
}

TEST(Fp8BlockGpu, WeightQuantizerEqualsTheCpuBitForBit) {
  MOK_REQUIRE_GPU();
  // 8 x rows x 1288 (10.6 M values): partial edge blocks both ways; 1030 rows: the transposed
  // copy's rows stored byte by byte, 1032: in 8-byte vectors (the partial block's 8 rows too).
  for (const int64_t rows : {int64_t(1030), int64_t(1032)}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const int64_t batches = 8, cols = 1288, n = batches * rows * cols;
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(n));
    for (auto& v : x) v = mok::fmt::bf16_from_float(normal(rng) * 0.02f);
    auto at = [&](int64_t b, int64_t r, int64_t c) -> uint16_t& {
      return x[size_t((b * rows + r) * cols + c)];
    };
    // Edge blocks of matrix 1: all zeros, one NaN, one +Inf and one -Inf, amax below the 1e-4
    // floor, BF16 subnormals, values near FLT_MAX, and the last partial block with a NaN.
    for (int64_t r = 0; r < 128; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        at(1, r, c) = 0;
        at(1, r, 128 + c) = mok::fmt::bf16_from_float(normal(rng) * 1e-6f);
        at(1, r, 256 + c) = uint16_t(0x0001 + (r * 128 + c) % 0x7F);  // subnormals
        at(1, 128 + r, c) =  // finite, up to 3e38 (BF16 holds up to ~3.39e38)
            mok::fmt::bf16_from_float(std::clamp(normal(rng) * 1e38f, -3e38f, 3e38f));
      }
    at(1, 5, 400) = 0x7FC0;                           // NaN
    at(1, 200, 700) = 0x7F80;                         // +Inf
    at(1, 300, 900) = 0xFF80;                         // -Inf
    at(1, 1029, 1287) = 0xFFC1;                       // NaN in the corner's partial block
    at(2, 7, 9) = mok::fmt::bf16_from_float(448.0f);  // one value at the E4M3 maximum
    DeviceBuffer<uint16_t> dx(x);
    std::vector<float> xf(static_cast<size_t>(rows * cols));
    for (bool ue8m0 : {false, true})
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(std::string(ue8m0 ? "ue8m0" : "fp32") + " scales" +
                     (transposed ? ", transposed" : ""));
        const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
        DeviceBuffer<uint8_t> data(size_t(n), 0xAB);
        DeviceBuffer<float> scales(size_t(batches * br * bc), 0xAB);
        MOK_CUDA_OK(mok::gpu::quantize_fp8_block_weights(
            reinterpret_cast<const __nv_bfloat16*>(dx.ptr), batches, rows, cols, ue8m0, transposed,
            data.ptr, scales.ptr, nullptr));
        MOK_CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint8_t> got = data.to_host();
        const std::vector<float> got_scales = scales.to_host();
        for (int64_t b = 0; b < batches; ++b) {
          for (int64_t i = 0; i < rows * cols; ++i)
            xf[size_t(i)] = mok::fmt::bf16_to_float(x[size_t(b * rows * cols + i)]);
          const mok::Fp8BlockTensor want =
              mok::quantize_fp8_block(xf.data(), rows, cols, {128, 128}, ue8m0);
          int64_t bad = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              const uint8_t g =
                  got[size_t(b * rows * cols + (transposed ? c * rows + r : r * cols + c))];
              bad += g != want.data[size_t(r * cols + c)];
            }
          EXPECT_EQ(bad, 0) << "codes differ in matrix " << b;
          for (int64_t i = 0; i < br; ++i)
            for (int64_t j = 0; j < bc; ++j) {
              const float g =
                  got_scales[size_t(b * br * bc + (transposed ? j * br + i : i * bc + j))];
              const float w = want.scales[size_t(i * bc + j)];
              EXPECT_EQ(std::memcmp(&g, &w, 4), 0)
                  << "scale of block (" << i << ", " << j << ") of matrix " << b << ": " << g
                  << " vs " << w;
            }
        }
      }
  }
}

TEST(Fp8BlockGpu, DispatchWritesTheCpuCodesAndScalesOfEveryRoutedRow) {
  MOK_REQUIRE_GPU();
  const mok::Config c = fp8_config(384, 256, 8, 2, 1, 300);
  const mok::LayerParams p = mok::tools::random_params(c, 11);
  mok::Batch b = mok::tools::random_batch(c, 300, 12);
  b.x[7] = std::nan("");  // a NaN row block: its scale is NaN, its codes the codec's
  b.x[size_t(9 * c.hidden + 200)] = mok::fmt::round_to_bf16(1e30f);  // one huge value
  const Fp8Layer layer(c, p);
  mok::Config whole = c;  // a ring that holds the whole batch: every routed row stays in it
  whole.ring_rows = mok::sched::pad_to_tile(c.capacity_rows(), 128);
  MoeForward f(whole);
  const std::vector<double> got = gpu_forward(f, c, layer.weights(c, 0, 1), b);
  (void)got;
  const auto& rank = f.runner().rank(0);
  const int64_t H = c.hidden, blocks = H / 128, rows = rank.capacity_blocks * 128;
  ASSERT_EQ(rank.ring_blocks, rank.capacity_blocks) << "the ring must hold the whole batch";
  std::vector<uint8_t> codes(static_cast<size_t>(rows * H));
  std::vector<float> scales(static_cast<size_t>(rows * blocks));
  std::vector<int64_t> destination(static_cast<size_t>(rows));
  MOK_CUDA_OK(cudaMemcpy(codes.data(), rank.routed_x_e4m3, codes.size(), cudaMemcpyDeviceToHost));
  MOK_CUDA_OK(
      cudaMemcpy(scales.data(), rank.routed_x_scales, scales.size() * 4, cudaMemcpyDeviceToHost));
  MOK_CUDA_OK(cudaMemcpy(destination.data(), rank.schedule.row_destination, rows * 8,
                         cudaMemcpyDeviceToHost));
  int64_t used = 0;  // the padded segments' rows (row_destination holds only those)
  MOK_CUDA_OK(
      cudaMemcpy(&used, rank.schedule.sched.seg_begin + c.num_experts, 8, cudaMemcpyDeviceToHost));
  ASSERT_LE(used, rows);
  int64_t routed = 0, padding = 0;
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t r = 0; r < used; ++r) {
    const int64_t d = destination[size_t(r)];
    if (d < 0) {  // padding: zero codes
      for (int64_t i = 0; i < H; ++i) ASSERT_EQ(codes[size_t(r * H + i)], 0) << "row " << r;
      ++padding;
      continue;
    }
    const int64_t token = mok::sched::slot_token(mok::sched::RowDestination::slot(d), c.top_k);
    for (int64_t i = 0; i < H; ++i) row[size_t(i)] = float(b.x[size_t(token * H + i)]);
    const mok::Fp8BlockTensor want = mok::quantize_fp8_block(row.data(), 1, H, {1, 128});
    ASSERT_EQ(std::memcmp(want.data.data(), &codes[size_t(r * H)], size_t(H)), 0) << "row " << r;
    ASSERT_EQ(std::memcmp(want.scales.data(), &scales[size_t(r * blocks)], size_t(blocks) * 4), 0)
        << "row " << r;
    ++routed;
  }
  EXPECT_EQ(routed, 300 * c.top_k);
  EXPECT_GT(padding, 0);
}

TEST(Fp8BlockGpu, ForwardMatchesTheQuantizedReference) {
  MOK_REQUIRE_GPU();
  const std::vector<QuantizedCase> cases = {
      {fp8_config(256, 256, 8, 2, 1, 300), 300, 0},         // T not a multiple of 128
      {fp8_config(384, 256, 8, 2, 1, 257), 257, 1},         // skewed; H ends in a half down tile
      {fp8_config(512, 384, 16, 4, 0, 200), 200, 2},        // no shared expert, odd experts empty
      {fp8_config(256, 128, 4, 1, 2, 1), 1, 0},             // one token
      {fp8_config(1024, 512, 32, 8, 1, 700), 700, 0},       // several k-blocks and tiles
      {ue8m0(fp8_config(384, 256, 8, 2, 1, 257)), 257, 1},  // power-of-two scales (UE8M0)
      {ue8m0(fp8_config(1024, 512, 32, 8, 1, 700)), 700, 0},
  };
  // Against the same quantization in FP64: the GPU also rounds y and out to BF16 (2^-9) and
  // quantizes its own FP32 activations, whose block amax and rounding may differ from the
  // reference's in an element now and then: well inside 1e-2. Against the unquantized layer: the
  // recipe's own error, recipes.md's bound (0.12); a BF16 computation would pass that one but not
  // the first.
  expect_forward_matches_quantized_reference<Fp8BlockExperts>(
      cases, mok::OperandQuant::fp8_block, 1e-2, mok::OperandQuant::none, 0.0, 0.12);
}

TEST(Fp8BlockGpu, BitsRepeatUnderDelaysAndAcrossEpSizes) {
  MOK_REQUIRE_GPU();
  const mok::Config c = fp8_config(512, 256, 16, 4, 1, 256);
  const mok::LayerParams p = mok::tools::random_params(c, 71);
  expect_bits_repeat_under_delays_and_across_ep_sizes<Fp8BlockExperts>(c, p);
}

TEST(Fp8BlockGpu, ConfigurationsItDoesNotTakeAreClearErrors) {
  MOK_REQUIRE_GPU();
  mok::Config c = fp8_config(320, 256, 8, 2, 1, 64);  // H not a multiple of 128
  expect_error([&] { MoeForward f(c); }, mok::ErrorCode::unsupported,
               "precision fp8_block needs hidden, intermediate and the shared width to be "
               "multiples of 128");
  expect_error([&] { Fp8BlockExperts e(c); }, mok::ErrorCode::unsupported,
               "hidden and intermediate must be multiples of 128, got H = 320");
  c.hidden = 256;
  mok::gpu::ForwardOptions narrow;
  narrow.block_n = 128;
  expect_error([&] { MoeForward f(c, narrow); }, mok::ErrorCode::invalid_argument,
               "block_n 128 are not available");

  const mok::LayerParams p = mok::tools::random_params(c, 81);
  const mok::Batch b = mok::tools::random_batch(c, 64, 82);
  const Fp8Layer layer(c, p);
  MoeForward f(c);
  const SmallBatch small(c, b);
  const mok::gpu::DeviceBatch batch = small.batch(64);
  __nv_bfloat16* o = small.output();
  expect_error([&] { f.forward(batch, layer.weights(c, 0, 1, false), o, nullptr); },
               mok::ErrorCode::invalid_argument, "fp8_block gate weights");
  mok::gpu::Schedule s(c);
  f.schedule(batch, s, nullptr);
  // A training forward keeps its E4M3 activations: not in a context that keeps nothing, nor in a
  // bf16 one.
  mok::gpu::ForwardContext keeps_nothing(c, mok::gpu::GateUpMode::recompute);
  expect_error([&] { f.forward(s, batch, layer.weights(c, 0, 1), o, &keeps_nothing, nullptr); },
               mok::ErrorCode::unsupported, "a GateUpMode::recompute context is for bf16");
  mok::Config bf = c;
  bf.precision = mok::Precision::bf16;
  mok::gpu::ForwardContext bf16_context(bf);
  expect_error([&] { f.forward(s, batch, layer.weights(c, 0, 1), o, &bf16_context, nullptr); },
               mok::ErrorCode::invalid_argument,
               "the ForwardContext was made for precision bf16, this forward runs fp8_block");
  // Nothing above reached the device: a valid forward still runs.
  f.forward(batch, layer.weights(c, 0, 1), o, nullptr);
  f.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
}
