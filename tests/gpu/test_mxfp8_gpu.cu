// mxfp8 on the GPU (MX semantics on Hopper: the routed experts' weights E4M3 with E8M0 scales per
// 32 along K, widened exactly to BF16 in shared memory; x and the activations rounded to their MX
// values by the dispatch copy and the gate/up epilogue; BF16 wgmma on those exact values, FP32
// accumulation): the widening is exact for every code and scale; Mxfp8Experts packs the host
// quantizer's codes and scales (the backward's transposed copies too); dispatch writes the CPU's MX
// values of every routed row; the forward matches the quantized CPU reference (the same operand
// quantization, FP64 math) within its bound on odd shapes and routings, outputs poisoned first; its
// bits repeat under dispatch delays and at EP 2 and 4 (emulated groups); and the configurations it
// does not take are clear errors.
#include <cmath>
#include <cstring>

#include "quantized_forward_util.hpp"
#include "mok/formats.hpp"
#include "mok/formats/mxfp8_widen.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/mxfp8_experts.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "widen_test_util.cuh"

using namespace fwd_test;
using mok::gpu::MoeForward;
using mok::gpu::Mxfp8Experts;

namespace {

mok::Config mxfp8_config(int H, int I, int E, int K, int shared, int max_tokens) {
  return quantized_config(mok::Precision::mxfp8, H, I, E, K, shared, max_tokens);
}
using Mxfp8Layer = QuantizedLayer<Mxfp8Experts>;

}  // namespace

// The widening alone: every finite E4M3 code at every position of a 128 x 64 stage across scales
// from 2^-127 to 2^127 (and NaN), widened by the hardware's mul.bf16x2 (BF16 subnormals on the
// way), equals E4M3 * 2^(scale - 127) wherever that is a normal BF16 number, each element where
// TMA's 128B swizzle would have put it.
TEST(Mxfp8Gpu, WideningIsExactForEveryCodeAndScale) {
  MOK_REQUIRE_GPU();
  using Stage = mok::kern::Mxfp8Stage<128>;
  std::vector<uint8_t> slot(Stage::kSlotBytes, 0);
  std::vector<uint8_t> codes(128 * 64), scales(128 * 2);  // per row two 32-column blocks
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = uint8_t(i * 37 % 256);
    if ((codes[i] & 0x7F) == 0x7F) codes[i] ^= 1;  // no NaN codes (only in NaN-scale blocks)
  }
  for (size_t b = 0; b < scales.size(); ++b) scales[b] = uint8_t(b % 2 ? 127 + b / 4 : b);
  scales[77] = 0xFF;                              // a NaN block
  for (size_t i = 0; i < codes.size(); i += 4) {  // the packed words Mxfp8Experts writes
    uint32_t word = 0;
    std::memcpy(&word, &codes[i], 4);
    word = mok::fmt::mxfp8_packed_word(word);
    std::memcpy(&slot[i], &word, 4);
  }
  for (uint32_t r = 0; r < 128; ++r)
    for (uint32_t b = 0; b < 2; ++b) {
      const uint16_t f = mok::fmt::mxfp8_widen_factor(scales[r * 2 + b]);
      std::memcpy(&slot[Stage::factor_offset(r, b)], &f, 2);
    }
  const std::vector<uint8_t> tile = widen_test::widen_on_gpu<Stage, 3, 128 * 128>(slot);
  int64_t checked = 0;
  for (uint32_t r = 0; r < 128; ++r)
    for (uint32_t k = 0; k < 64; ++k) {
      uint16_t got = 0;
      std::memcpy(&got, &tile[mok::dev::swizzle128_offset(r, k * 2)], 2);
      const uint8_t scale = scales[r * 2 + k / 32];
      const double g = mok::fmt::bf16_to_float(got);
      if (scale == 0xFF) {
        ASSERT_TRUE(std::isnan(g)) << r << "," << k;
        continue;
      }
      const double want =
          double(mok::fmt::e4m3_to_float(codes[r * 64 + k])) * std::ldexp(1.0, int(scale) - 127);
      const double a = std::fabs(want);
      if (a != 0 && (a < std::ldexp(1.0, -126) || a > 3.3895313892515355e38)) continue;
      ASSERT_EQ(g, want) << "row " << r << " column " << k << " code " << int(codes[r * 64 + k])
                         << " scale " << int(scale);
      ++checked;
    }
  EXPECT_GT(checked, 7000);
}

TEST(Mxfp8Gpu, ExpertsPackTheHostQuantizersCodesAndFactors) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mxfp8_config(320, 192, 4, 2, 0, 64);  // neither a multiple of 128
  mok::LayerParams p = mok::tools::random_params(c, 5);
  const int64_t H = c.hidden, I = c.intermediate, E = c.num_experts;
  p.gate[size_t(1 * I * H + 17 * H + 40)] = std::nan("");  // its block's scale is NaN
  p.up[size_t(2 * I * H + 100 * H + 300)] = INFINITY;
  for (int64_t k = 64; k < 96; ++k) p.down[size_t(3 * H * I + 40 * I + k)] = 0.0;
  p.down[size_t(5 * I + 7)] = 1e-30;
  p.gate[size_t(3 * I * H + 5)] = 3e30;
  const GpuLayer bf16(p);
  Mxfp8Experts experts(c, /*backward=*/true);
  experts.quantize(bf16.weights(), nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const mok::gpu::Mxfp8Weights q = experts.weights();
  // The forward's copies, then the backward's: each matrix's transpose [cols, rows] quantized
  // along its columns.
  const struct {
    const std::vector<double>* w;
    int64_t rows, cols;
    bool transposed;
    const uint8_t* codes;
    const uint16_t* factors;
  } parts[6] = {{&p.gate, I, H, false, q.gate, q.gate_factors},
                {&p.up, I, H, false, q.up, q.up_factors},
                {&p.down, H, I, false, q.down, q.down_factors},
                {&p.gate, I, H, true, q.gate_t, q.gate_t_factors},
                {&p.up, I, H, true, q.up_t, q.up_t_factors},
                {&p.down, H, I, true, q.down_t, q.down_t_factors}};
  for (int m = 0; m < 6; ++m) {
    SCOPED_TRACE("matrix " + std::to_string(m));
    const auto& part = parts[m];
    const int64_t n = part.rows * part.cols;
    const int64_t rows = part.transposed ? part.cols : part.rows,
                  cols = part.transposed ? part.rows : part.cols;
    const std::vector<uint8_t> codes = fetch(part.codes, size_t(E * n));
    const std::vector<uint16_t> factors = fetch(part.factors, size_t(E * n / 32));
    for (int64_t e = 0; e < E; ++e) {
      std::vector<float> w(static_cast<size_t>(n));
      for (int64_t r = 0; r < part.rows; ++r)
        for (int64_t k = 0; k < part.cols; ++k)
          w[size_t(part.transposed ? k * part.rows + r : r * part.cols + k)] =
              mok::fmt::round_to_bf16(float((*part.w)[size_t(e * n + r * part.cols + k)]));
      const mok::Mxfp8Tensor want = mok::quantize_mxfp8(w.data(), rows, cols, {1, 32});
      for (int64_t i = 0; i < n; i += 4) {  // each word of four codes, packed
        uint32_t word = 0, got = 0;
        std::memcpy(&word, &want.data[size_t(i)], 4);
        std::memcpy(&got, &codes[size_t(e * n + i)], 4);
        ASSERT_EQ(got, mok::fmt::mxfp8_packed_word(word)) << "expert " << e << " code " << i;
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < cols / 32; ++b) {
          const int64_t at = mok::fmt::mxfp8_widen_factor_offset(rows, r, b / 2, int(b % 2));
          ASSERT_EQ(factors[size_t(e * n / 32 + at / 2)],
                    mok::fmt::mxfp8_widen_factor(want.scales[size_t(r * (cols / 32) + b)]))
              << "expert " << e << " row " << r << " block " << b;
        }
    }
  }
}

TEST(Mxfp8Gpu, DispatchWritesTheCpuMxValuesOfEveryRoutedRow) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mxfp8_config(320, 256, 8, 2, 1, 300);  // H ends in a half 128 chunk
  const mok::LayerParams p = mok::tools::random_params(c, 11);
  mok::Batch b = mok::tools::random_batch(c, 300, 12);
  b.x[7] = std::nan("");  // a NaN block: all its values NaN
  b.x[size_t(9 * c.hidden + 200)] = mok::fmt::round_to_bf16(1e30f);  // one huge value
  const Mxfp8Layer layer(c, p);
  mok::Config whole = c;  // a ring that holds the whole batch: every routed row stays in it
  whole.ring_rows = mok::sched::pad_to_tile(c.capacity_rows(), 128);
  MoeForward f(whole);
  (void)gpu_forward(f, c, layer.weights(c, 0, 1), b, false);
  f.check(nullptr);
  const auto& rank = f.runner().rank(0);
  const int64_t H = c.hidden, rows = rank.capacity_blocks * 128;
  ASSERT_EQ(rank.ring_blocks, rank.capacity_blocks) << "the ring must hold the whole batch";
  const std::vector<uint16_t> ring =
      fetch(reinterpret_cast<const uint16_t*>(rank.routed_x), size_t(rows * H));
  const std::vector<int64_t> destination = fetch(rank.schedule.row_destination, size_t(rows));
  int64_t used = 0;
  MOK_CUDA_OK(
      cudaMemcpy(&used, rank.schedule.sched.seg_begin + c.num_experts, 8, cudaMemcpyDeviceToHost));
  int64_t routed = 0;
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t r = 0; r < used; ++r) {
    const int64_t d = destination[size_t(r)];
    if (d < 0) {
      for (int64_t i = 0; i < H; ++i) ASSERT_EQ(ring[size_t(r * H + i)], 0) << "row " << r;
      continue;
    }
    const int64_t token = mok::sched::slot_token(mok::sched::RowDestination::slot(d), c.top_k);
    for (int64_t i = 0; i < H; ++i) row[size_t(i)] = float(b.x[size_t(token * H + i)]);
    const std::vector<float> want = mok::dequantize(mok::quantize_mxfp8(row.data(), 1, H, {1, 32}));
    for (int64_t i = 0; i < H; ++i) {
      const uint16_t got = ring[size_t(r * H + i)];
      if (std::isnan(want[size_t(i)])) {
        ASSERT_TRUE(std::isnan(mok::fmt::bf16_to_float(got))) << "row " << r << " column " << i;
      } else {
        ASSERT_EQ(got, mok::fmt::bf16_from_float(want[size_t(i)]))
            << "row " << r << " column " << i;
      }
    }
    ++routed;
  }
  EXPECT_EQ(routed, 300 * c.top_k);
}

TEST(Mxfp8Gpu, ForwardMatchesTheQuantizedReference) {
  MOK_REQUIRE_GPU();
  const std::vector<QuantizedCase> cases = {
      {mxfp8_config(256, 256, 8, 2, 1, 300), 300, 0},    // T not a multiple of 128
      {mxfp8_config(320, 192, 8, 2, 1, 257), 257, 1},    // skewed; H, I multiples of 64 only
      {mxfp8_config(512, 384, 16, 4, 0, 200), 200, 2},   // no shared expert, odd experts empty
      {mxfp8_config(256, 128, 4, 1, 2, 1), 1, 0},        // one token
      {mxfp8_config(1024, 512, 32, 8, 1, 700), 700, 0},  // several stages, tiles and slots
  };
  // Against the same quantization in FP64: the weights and x are the same MX values on both
  // sides, the products exact; what differs is the BF16 rounding of y and out, and the MX
  // rounding of the activations, computed in FP32 here and in FP64 there, which may take the
  // other code now and then (fp8_block's 1e-2). Against the BF16 layer, MX's own rounding (the
  // CPU references of such cases differ by 2.5e-2 to 6.6e-2).
  expect_forward_matches_quantized_reference<Mxfp8Experts>(
      cases, mok::OperandQuant::mxfp8, 1e-2, mok::OperandQuant::bf16, 1.2e-2,
      mok::relative_error_bound(mok::OperandQuant::mxfp8));
}

TEST(Mxfp8Gpu, BitsRepeatUnderDelaysAndAcrossEpSizes) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mxfp8_config(512, 256, 16, 4, 1, 256);
  const mok::LayerParams p = mok::tools::random_params(c, 71);
  expect_bits_repeat_under_delays_and_across_ep_sizes<Mxfp8Experts>(c, p);
}

TEST(Mxfp8Gpu, ConfigurationsItDoesNotTakeAreClearErrors) {
  MOK_REQUIRE_GPU();
  mok::Config c = mxfp8_config(256, 256, 8, 2, 1, 64);
  expect_error([&] { Mxfp8Experts e(mxfp8_config(288, 256, 8, 2, 1, 64)); },
               mok::ErrorCode::unsupported,
               "hidden and intermediate must be multiples of 64, got H = 288");
  mok::gpu::ForwardOptions wide;
  wide.block_n = 256;
  expect_error([&] { MoeForward f(c, wide); }, mok::ErrorCode::invalid_argument,
               "row_path producer_gather and block_n 256 are not available");
  mok::gpu::ForwardOptions gather;
  gather.row_path = mok::gpu::RowPath::producer_gather;
  expect_error([&] { MoeForward f(c, gather); }, mok::ErrorCode::invalid_argument,
               "row_path producer_gather and block_n 256 are not available");
  mok::Config floor = c;  // the CPU reference's other scale rule
  floor.mx_scale_rule = mok::MxScaleRule::floor;
  expect_error([&] { MoeForward f(floor); }, mok::ErrorCode::unsupported,
               "precision mxfp8 on the GPU rounds with RCEIL scales");
  // The forward takes a shared width of 64, the backward's 128-wide tiles do not.
  mok::Config narrow = c;
  narrow.shared_intermediate = 64;
  expect_error([&] { mok::gpu::MoeBackward bw(narrow); }, mok::ErrorCode::unsupported,
               "the shared width to be multiples of 128");

  const mok::LayerParams p = mok::tools::random_params(c, 81);
  const mok::Batch b = mok::tools::random_batch(c, 64, 82);
  const Mxfp8Layer layer(c, p);
  MoeForward f(c);
  const SmallBatch small(c, b);
  const mok::gpu::DeviceBatch batch = small.batch(64);
  __nv_bfloat16* o = small.output();
  expect_error([&] { f.forward(batch, layer.weights(c, 0, 1, false), o, nullptr); },
               mok::ErrorCode::invalid_argument, "mxfp8 gate weights");
  mok::gpu::Schedule s(c);
  f.schedule(batch, s, nullptr);
  mok::gpu::ForwardContext recomputing(c, mok::gpu::GateUpMode::recompute);
  expect_error([&] { f.forward(s, batch, layer.weights(c, 0, 1), o, &recomputing, nullptr); },
               mok::ErrorCode::unsupported, "a GateUpMode::recompute context is for bf16");
  // Nothing above reached the device: a valid forward still runs, and the training one.
  f.forward(batch, layer.weights(c, 0, 1), o, nullptr);
  mok::gpu::ForwardContext context(c);
  f.forward(s, batch, layer.weights(c, 0, 1), o, &context, nullptr);
  f.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
}
