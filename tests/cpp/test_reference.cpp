// The CPU reference: gradients against central finite differences in FP64, FP32 against FP64,
// the quantized recipes against FP64, odd routings, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "layer_data.hpp"
#include "mok/compare.hpp"
#include "mok/error.hpp"
#include "mok/layer.hpp"

using namespace mok;
using tools::random_batch;
using tools::random_params;
using tools::random_vector;

namespace {

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct Fixture {
  Config c = preset("tiny");
  LayerParams p = random_params(c, 11);
  Batch b = random_batch(c, c.max_tokens_per_rank, 12);
  std::vector<double> d_out = random_vector(size_t(b.tokens * c.hidden), 13);
};

}  // namespace

// L = <d_out, out>. Along a random direction v of one input: (L(+eps v) - L(-eps v)) / 2 eps
// must equal <grad, v>. The central difference's error is O(eps^2), far below the tolerance.
TEST(Reference, GradientsMatchCentralFiniteDifferencesInFp64) {
  Fixture f;
  ReferenceOptions fp64;
  fp64.numerics = Numerics::fp64;
  const ReferenceForward base = reference_forward(f.c, f.p, f.b, fp64);
  const LayerGradients g = reference_backward(base.context, f.d_out);

  struct Input {
    const char* name;
    std::vector<double>* value;
    const std::vector<double>* grad;
  };
  LayerParams p = f.p;
  Batch b = f.b;
  const Input inputs[] = {
      {"x", &b.x, &g.d_x},
      {"topk_weights", &b.topk_weights, &g.d_topk_weights},
      {"shared_gate", &p.shared_gate, &g.d_params.shared_gate},
      {"shared_up", &p.shared_up, &g.d_params.shared_up},
      {"shared_down", &p.shared_down, &g.d_params.shared_down},
      {"gate", &p.gate, &g.d_params.gate},
      {"up", &p.up, &g.d_params.up},
      {"down", &p.down, &g.d_params.down},
  };
  uint64_t seed = 100;
  for (const Input& in : inputs) {
    const std::vector<double> v = random_vector(in.value->size(), ++seed);
    const std::vector<double> original = *in.value;
    double rms = std::sqrt(dot(original, original) / double(original.size()));
    const double eps = 1e-4 * rms;
    auto loss_at = [&](double t) {
      for (size_t i = 0; i < v.size(); ++i) (*in.value)[i] = original[i] + t * v[i];
      return dot(f.d_out, reference_forward(f.c, p, b, fp64).out);
    };
    const double fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    *in.value = original;
    const double analytic = dot(*in.grad, v);
    EXPECT_NEAR(fd, analytic, 1e-7 * std::fabs(analytic)) << in.name;
  }
}

namespace {
struct LayerRun {
  std::vector<double> out;
  LayerGradients g;
};
LayerRun run_layer(const Config& c, const LayerParams& p, const Batch& b,
                   const std::vector<double>& d_out, ReferenceOptions o) {
  ReferenceForward f = reference_forward(c, p, b, o);
  LayerGradients g = reference_backward(f.context, d_out);
  return {f.out, g};
}
std::vector<const std::vector<double>*> all(const LayerRun& r) {
  const LayerParams& d = r.g.d_params;
  return {&r.out,         &r.g.d_x,     &r.g.d_topk_weights,
          &d.shared_gate, &d.shared_up, &d.shared_down,
          &d.gate,        &d.up,        &d.down};
}
}  // namespace

// Each quantized recipe stays within its bound of FP64 on every output and gradient, and is
// really quantized (the error is well above the plain FP32 reference's).
TEST(Reference, QuantizedRecipesStayWithinTheirBoundsOfFp64) {
  Fixture f;
  f.b = random_batch(f.c, 256, 21);
  f.d_out.resize(size_t(256 * f.c.hidden));
  ReferenceOptions fp64;
  fp64.numerics = Numerics::fp64;
  const LayerRun exact = run_layer(f.c, f.p, f.b, f.d_out, fp64);
  for (OperandQuant q : {OperandQuant::none, OperandQuant::bf16, OperandQuant::fp8_block,
                         OperandQuant::mxfp8, OperandQuant::nvfp4, OperandQuant::nvfp4_weights}) {
    ReferenceOptions o;
    o.quant = q;
    const LayerRun got = run_layer(f.c, f.p, f.b, f.d_out, o);
    const auto a = all(got), e = all(exact);
    for (size_t i = 0; i < a.size(); ++i) {
      const double err = relative_l2_error(*a[i], *e[i]);
      EXPECT_LE(err, relative_error_bound(q)) << operand_quant_name(q) << " tensor " << i;
      const bool shared_grad = i >= 3 && i <= 5;  // the shared experts stay BF16
      const double floor = q == OperandQuant::none                    ? 0
                           : (shared_grad || q == OperandQuant::bf16) ? 1e-4
                                                                      : 5e-3;
      EXPECT_GT(err, floor) << operand_quant_name(q) << " tensor " << i << " looks unquantized";
    }
  }
}

TEST(Reference, Fp8BlockPowerOfTwoScalesAndMxFloorAreOptionsThatChangeBits) {
  Fixture f;
  f.b = random_batch(f.c, 64, 22);
  f.d_out.resize(size_t(64 * f.c.hidden));
  ReferenceOptions a, b;
  a.quant = b.quant = OperandQuant::fp8_block;
  b.fp8_ue8m0 = true;
  EXPECT_NE(run_layer(f.c, f.p, f.b, f.d_out, a).out, run_layer(f.c, f.p, f.b, f.d_out, b).out);
  a.quant = b.quant = OperandQuant::mxfp8;
  b.mx_scale_rule = MxScaleRule::floor;
  EXPECT_NE(run_layer(f.c, f.p, f.b, f.d_out, a).out, run_layer(f.c, f.p, f.b, f.d_out, b).out);
}

TEST(Reference, ZeroTokensEmptyExpertsAndOneHotRouting) {
  Fixture f;
  Batch empty;
  const LayerRun none = run_layer(f.c, f.p, empty, {}, {});
  EXPECT_TRUE(none.out.empty());
  for (double v : none.g.d_params.gate) ASSERT_EQ(v, 0.0);

  // Every token to expert 3 (and duplicates across k): other experts get exactly zero gradient.
  Batch b = random_batch(f.c, 37, 5);
  for (int32_t& id : b.topk_ids) id = 3;
  const std::vector<double> d_out = random_vector(size_t(37 * f.c.hidden), 6);
  const LayerRun r = run_layer(f.c, f.p, b, d_out, {});
  const size_t n = size_t(f.c.intermediate * f.c.hidden);
  for (int e = 0; e < f.c.num_experts; ++e) {
    bool nonzero = false;
    for (size_t i = 0; i < n; ++i) nonzero |= r.g.d_params.gate[size_t(e) * n + i] != 0.0;
    EXPECT_EQ(nonzero, e == 3) << e;
  }
  // Duplicate ids in a token are legal: the output is still finite everywhere.
  for (double v : r.out) ASSERT_TRUE(std::isfinite(v));
}

TEST(Reference, NaNInOneTokenStaysInThatToken) {
  Fixture f;
  Batch b = random_batch(f.c, 16, 7);
  b.x[5 * size_t(f.c.hidden) + 3] = NAN;
  const ReferenceForward r = reference_forward(f.c, f.p, b);
  for (int64_t t = 0; t < b.tokens; ++t) {
    bool any_nan = false;
    for (int64_t h = 0; h < f.c.hidden; ++h)
      any_nan |= std::isnan(r.out[size_t(t * f.c.hidden + h)]);
    EXPECT_EQ(any_nan, t == 5) << t;
  }
}

TEST(Reference, BadInputIsNamed) {
  Fixture f;
  auto expect_error = [&](const Batch& b, const std::string& needle) {
    try {
      reference_forward(f.c, f.p, b);
      FAIL() << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Batch b = random_batch(f.c, 8, 1);
  b.topk_ids[6] = 16;
  expect_error(b, "topk_ids[1, 2] = 16 is not an expert id (allowed: 0 to 15)");
  b = random_batch(f.c, 8, 1);
  b.topk_ids[0] = -1;
  expect_error(b, "topk_ids[0, 0] = -1");
  b = random_batch(f.c, 8, 1);
  b.x.pop_back();
  expect_error(b, "x has 2047 elements, expected 2048 (shape [8, 256])");
  b = random_batch(f.c, 8, 1);
  b.topk_weights.resize(3);
  expect_error(b, "topk_weights has 3 elements");
  b = random_batch(f.c, 8, 1);
  b.tokens = 9;
  expect_error(b, "x has 2048 elements, expected 2304");
  Config big = f.c;
  big.max_tokens_per_rank = 4;
  EXPECT_THROW(reference_forward(big, f.p, random_batch(f.c, 8, 1)), Error);
  LayerParams p = f.p;
  p.down.resize(10);
  try {
    reference_forward(f.c, p, random_batch(f.c, 8, 1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("down has 10 elements, expected 524288 (shape [16, 256, 128])"),
        std::string::npos)
        << e.what();
  }
  Config ep = f.c;
  ep.ep_size = 2;
  EXPECT_THROW(reference_forward(ep, f.p, random_batch(f.c, 8, 1)), Error);
}
