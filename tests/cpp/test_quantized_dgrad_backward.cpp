// The training recipe of the CPU reference that quantizes the dgrad GEMMs only (fp8_block and
// mxfp8; docs/recipes.md), as the GPU backwards compute it: d_out quantized unweighted in the
// recipe's blocks along H (1x128, 1x32) for the dgrad GEMM, the routing weight's gradient
// <d_out_q down_q, act_q>, and the weight gradients from BF16 operands with d_down's B operand
// w * act_q. Each expected value is recomputed here from the public quantizers
// (mok/formats.hpp), not from the reference's row math; bf16 and nvfp4 keep <d_out, y>.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "layer_data.hpp"
#include "mok/compare.hpp"
#include "mok/formats.hpp"
#include "mok/formats/codecs.hpp"
#include "mok/layer.hpp"

using namespace mok;

namespace {

struct Layer {
  Config c;
  LayerParams p;
  Batch b;
  std::vector<double> d_out;
};

// H = I = 256 (two 1x128 blocks per row), 4 experts, top-2, one shared expert (or none), 20
// tokens.
Layer small_layer(int shared = 1) {
  Layer l;
  Config& c = l.c;
  c.hidden = 256;
  c.intermediate = 256;
  c.num_experts = 4;
  c.top_k = 2;
  c.num_shared_experts = shared;
  c.shared_intermediate = 256;
  c.max_tokens_per_rank = 64;
  l.p = tools::random_params(c, 31);
  l.b = tools::random_batch(c, 20, 32);
  l.d_out = tools::random_vector(size_t(20 * c.hidden), 33);
  return l;
}

struct Result {
  std::vector<double> out;
  LayerGradients g;
};
Result run(const Layer& l, ReferenceOptions o) {
  ReferenceForward f = reference_forward(l.c, l.p, l.b, o);
  return {f.out, reference_backward(f.context, l.d_out)};
}

double f32(double v) { return double(float(v)); }  // the reference's FP32 storage
double bf16(double v) { return double(fmt::round_to_bf16(float(v))); }
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// Quantize-dequantize a [rows, cols] matrix in `block`s of recipe q, with the public quantizers.
std::vector<double> qdq(OperandQuant q, const double* v, int64_t rows, int64_t cols,
                        BlockShape block) {
  std::vector<float> f(size_t(rows * cols));
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(v[i]);
  std::vector<float> d;
  if (q == OperandQuant::fp8_block) d = dequantize(quantize_fp8_block(f.data(), rows, cols, block));
  if (q == OperandQuant::mxfp8) d = dequantize(quantize_mxfp8(f.data(), rows, cols, block));
  if (q == OperandQuant::bf16)
    for (float x : f) d.push_back(fmt::round_to_bf16(x));
  return std::vector<double>(d.begin(), d.end());
}

// One expert's weights as the forward and the dgrad GEMMs read them, and one routed row's forward
// and backward, recomputed from the quantizers (FP64 sums, FP32 storage).
struct Expert {
  int64_t H, I;
  std::vector<double> gate, up, down;    // dequantized: [I, H], [I, H], [H, I]
  std::vector<double> down_bwd;          // [H, I], blocks for the contraction over H
  std::vector<double> gate_bwd, up_bwd;  // [I, H], blocks for the contraction over I
};
Expert expert(const Layer& l, int e, OperandQuant q) {
  const int64_t H = l.c.hidden, I = l.c.intermediate;
  const size_t off = size_t(e) * size_t(H * I);
  // fp8_block: 128x128 (one copy for both directions); MXFP8: 1x32 along the forward's K, and
  // 32x1 for the backward's K; BF16: element-wise.
  const BlockShape fwd = q == OperandQuant::fp8_block ? BlockShape{128, 128} : BlockShape{1, 32};
  const BlockShape bwd = q == OperandQuant::fp8_block ? BlockShape{128, 128} : BlockShape{32, 1};
  return {H,
          I,
          qdq(q, &l.p.gate[off], I, H, fwd),
          qdq(q, &l.p.up[off], I, H, fwd),
          qdq(q, &l.p.down[off], H, I, fwd),
          qdq(q, &l.p.down[off], H, I, bwd),
          qdq(q, &l.p.gate[off], I, H, bwd),
          qdq(q, &l.p.up[off], I, H, bwd)};
}

struct Row {
  std::vector<double> g, u, aq, y;  // forward: projections, the quantized activation, y
  std::vector<double> dout, da_raw, dg, du;
  std::vector<double> dx;  // gate_bwd^T q(dg) + up_bwd^T q(du), dg and du in their row blocks
                           // (fp8_block: their BF16 values)
  double weight = 0, d_weight = 0, d_weight_of_y = 0;
};
Row row(const Layer& l, const Expert& m, OperandQuant q, int64_t t, int64_t k) {
  const int64_t H = m.H, I = m.I, K = l.c.top_k;
  const BlockShape act = q == OperandQuant::fp8_block ? BlockShape{1, 128} : BlockShape{1, 32};
  Row r;
  r.weight = f32(l.b.topk_weights[size_t(t * K + k)]);
  const std::vector<double> xq = qdq(q, &l.b.x[size_t(t * H)], 1, H, act);
  std::vector<double> a(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += m.gate[size_t(i * H + h)] * xq[size_t(h)];
      u += m.up[size_t(i * H + h)] * xq[size_t(h)];
    }
    r.g.push_back(f32(g));
    r.u.push_back(f32(u));
    a[size_t(i)] = f32(r.g.back() * sigmoid(r.g.back()) * r.u.back());
  }
  r.aq = qdq(q, a.data(), 1, I, act);
  for (int64_t h = 0; h < H; ++h) {
    double y = 0;
    for (int64_t i = 0; i < I; ++i) y += m.down[size_t(h * I + i)] * r.aq[size_t(i)];
    r.y.push_back(f32(y));
  }
  for (int64_t h = 0; h < H; ++h) r.dout.push_back(f32(l.d_out[size_t(t * H + h)]));
  double dw_y = 0;
  for (int64_t h = 0; h < H; ++h) dw_y += r.dout[size_t(h)] * r.y[size_t(h)];
  r.d_weight_of_y = f32(dw_y);

  // The backward: d_out unweighted, the recipe's blocks along H.
  const std::vector<double> dq = qdq(q, r.dout.data(), 1, H, act);
  double dw = 0;
  for (int64_t i = 0; i < I; ++i) {
    double s = 0;
    for (int64_t h = 0; h < H; ++h) s += m.down_bwd[size_t(h * I + i)] * dq[size_t(h)];
    r.da_raw.push_back(f32(s));
    dw += r.da_raw.back() * r.aq[size_t(i)];
    // The SwiGLU backward reads g and u as the forward's context keeps them: BF16.
    const double da = f32(r.weight * r.da_raw.back()), g = bf16(r.g[size_t(i)]), sg = sigmoid(g);
    r.dg.push_back(f32(da * bf16(r.u[size_t(i)]) * sg * (1.0 + g * (1.0 - sg))));
    r.du.push_back(f32(da * g * sg));
  }
  r.d_weight = f32(dw);
  // fp8_block quantizes dg | du as stored in BF16, mxfp8 the FP32 values.
  std::vector<double> dg_in = r.dg, du_in = r.du;
  if (q == OperandQuant::fp8_block)
    for (int64_t i = 0; i < I; ++i)
      dg_in[size_t(i)] = bf16(dg_in[size_t(i)]), du_in[size_t(i)] = bf16(du_in[size_t(i)]);
  const std::vector<double> dgq = qdq(q, dg_in.data(), 1, I, act),
                            duq = qdq(q, du_in.data(), 1, I, act);
  std::vector<double> dx(size_t(H), 0.0);  // per h over the gate rows, then the up rows
  for (int64_t i = 0; i < I; ++i)
    for (int64_t h = 0; h < H; ++h) dx[size_t(h)] += m.gate_bwd[size_t(i * H + h)] * dgq[size_t(i)];
  for (int64_t i = 0; i < I; ++i)
    for (int64_t h = 0; h < H; ++h) dx[size_t(h)] += m.up_bwd[size_t(i * H + h)] * duq[size_t(i)];
  for (const double v : dx) r.dx.push_back(f32(v));
  return r;
}

void expect_close(double got, double want, double rel, const char* what) {
  EXPECT_LE(std::fabs(got - want), rel * std::fabs(want)) << what << ": " << got << " vs " << want;
}

// The slots (t * K + k) routed to expert e, in (token, k) order.
std::vector<int64_t> slots_of(const Layer& l, int e) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < int64_t(l.b.topk_ids.size()); ++i)
    if (l.b.topk_ids[size_t(i)] == e) s.push_back(i);
  return s;
}

// The weight gradients of experts 0 and 3 under recipe q against sums of BF16 operands.
void weight_gradients_use_bf16_operands(const Layer& l, OperandQuant q) {
  ReferenceOptions o;
  o.quant = q;
  const Result got = run(l, o);
  const int64_t H = l.c.hidden, I = l.c.intermediate, K = l.c.top_k;
  for (int e : {0, 3}) {
    const std::vector<int64_t> slots = slots_of(l, e);
    ASSERT_GE(slots.size(), 2u) << "expert " << e;
    const Expert m = expert(l, e, q);
    std::vector<double> d_down(size_t(H * I), 0.0), d_gate(size_t(I * H), 0.0),
        d_up(size_t(I * H), 0.0);
    for (int64_t s : slots) {  // (token, k) order, as the reference sums
      const Row r = row(l, m, q, s / K, s % K);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < I; ++i)
          d_down[size_t(h * I + i)] +=
              bf16(r.dout[size_t(h)]) * bf16(f32(r.weight * r.aq[size_t(i)]));
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          const double x = bf16(l.b.x[size_t((s / K) * H + h)]);
          d_gate[size_t(i * H + h)] += bf16(r.dg[size_t(i)]) * x;
          d_up[size_t(i * H + h)] += bf16(r.du[size_t(i)]) * x;
        }
      }
    }
    const size_t off = size_t(e) * size_t(H * I);
    double worst = 0;
    for (size_t j = 0; j < d_down.size(); ++j) {
      const double scale = std::fmax(std::fabs(f32(d_down[j])), 1e-30);
      worst = std::fmax(worst, std::fabs(got.g.d_params.down[off + j] - f32(d_down[j])) / scale);
      worst = std::fmax(worst, std::fabs(got.g.d_params.gate[off + j] - f32(d_gate[j])) /
                                   std::fmax(std::fabs(f32(d_gate[j])), 1e-30));
      worst = std::fmax(worst, std::fabs(got.g.d_params.up[off + j] - f32(d_up[j])) /
                                   std::fmax(std::fabs(f32(d_up[j])), 1e-30));
    }
    EXPECT_LE(worst, 1e-12) << "expert " << e;
  }
}

constexpr OperandQuant kRecipes[] = {OperandQuant::fp8_block, OperandQuant::mxfp8};

}  // namespace

// d_topk_weights[t, k] = <q(d_out[t]) down_q, act_q>: the dgrad GEMM's accumulator against the
// forward's quantized activation, not <d_out, y> (which differs by the FP8 roundings).
TEST(QuantizedDgradBackward, RoutingWeightGradientIsTheDgradAccumulatorDotTheQuantizedActivation) {
  const Layer l = small_layer();
  for (const OperandQuant q : kRecipes) {
    ReferenceOptions o;
    o.quant = q;
    const Result got = run(l, o);
    const int64_t K = l.c.top_k;
    int checked = 0;
    for (int64_t t : {0, 7, 13, 19}) {
      for (int64_t k = 0; k < K; ++k) {
        const int e = l.b.topk_ids[size_t(t * K + k)];
        const Row r = row(l, expert(l, e, q), q, t, k);
        const double dw = got.g.d_topk_weights[size_t(t * K + k)];
        expect_close(dw, r.d_weight, 1e-12, operand_quant_name(q));
        // The other rule is far from it: the test tells the two apart.
        EXPECT_GT(std::fabs(dw - r.d_weight_of_y), 1e-6 * std::fabs(r.d_weight))
            << operand_quant_name(q) << " " << t << ", " << k;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 8);
  }
}

// d_x[t] = sum over k of gate_bwd^T q(dg) + up_bwd^T q(du): dg | du rounded in the recipe's
// blocks along the row, the weights in blocks along the contraction over I (MXFP8: 32x1, the
// backward's own copy). No shared experts, so d_x is the routed slots' sum alone.
TEST(QuantizedDgradBackward, InputGradientReadsRoundedDgDuAndTheBackwardsWeightBlocks) {
  const Layer l = small_layer(0);
  const int64_t H = l.c.hidden, K = l.c.top_k;
  for (const OperandQuant q : kRecipes) {
    ReferenceOptions o;
    o.quant = q;
    const Result got = run(l, o);
    for (int64_t t : {1, 10, 18}) {
      std::vector<double> want(size_t(H), 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const Row r = row(l, expert(l, l.b.topk_ids[size_t(t * K + k)], q), q, t, k);
        for (int64_t h = 0; h < H; ++h) want[size_t(h)] += r.dx[size_t(h)];
      }
      for (int64_t h = 0; h < H; ++h)
        expect_close(got.g.d_x[size_t(t * H + h)], f32(want[size_t(h)]), 1e-12,
                     operand_quant_name(q));
    }
  }
}

// d_down = sum over the expert's rows of bf16(d_out)^T bf16(w * act_q); d_gate, d_up = sums of
// bf16(dg)^T bf16(x), bf16(du)^T bf16(x): BF16 operands, not the recipe's blocks along tokens.
TEST(QuantizedDgradBackward, WeightGradientsUseBf16OperandsAndTheWeightedQuantizedActivation) {
  const Layer l = small_layer();
  for (const OperandQuant q : kRecipes) {
    SCOPED_TRACE(operand_quant_name(q));
    weight_gradients_use_bf16_operands(l, q);
  }
}

// Every output and gradient within FP8's bound of the unquantized FP64 reference (compare.hpp),
// and really quantized.
TEST(QuantizedDgradBackward, GradientsStayWithinTheFp8BoundOfFp64) {
  const Layer l = small_layer();
  ReferenceOptions fp64;
  fp64.numerics = Numerics::fp64;
  const Result exact = run(l, fp64);
  for (const OperandQuant q : kRecipes) {
    ReferenceOptions fp8;
    fp8.quant = q;
    const Result got = run(l, fp8);
    const LayerParams &d = got.g.d_params, &e = exact.g.d_params;
    const struct {
      const char* name;
      const std::vector<double>*got, *want;
      bool bf16_only;  // the shared experts stay BF16
    } all[] = {{"out", &got.out, &exact.out, false},
               {"d_x", &got.g.d_x, &exact.g.d_x, false},
               {"d_topk_weights", &got.g.d_topk_weights, &exact.g.d_topk_weights, false},
               {"d_shared_gate", &d.shared_gate, &e.shared_gate, true},
               {"d_shared_up", &d.shared_up, &e.shared_up, true},
               {"d_shared_down", &d.shared_down, &e.shared_down, true},
               {"d_gate", &d.gate, &e.gate, false},
               {"d_up", &d.up, &e.up, false},
               {"d_down", &d.down, &e.down, false}};
    for (const auto& t : all) {
      const double err = relative_l2_error(*t.got, *t.want);
      EXPECT_LE(err, relative_error_bound(q)) << operand_quant_name(q) << " " << t.name;
      EXPECT_GT(err, t.bf16_only ? 1e-4 : 5e-3)
          << operand_quant_name(q) << " " << t.name << " looks unquantized";
    }
  }
}

// BF16 keeps the routing weight's gradient <d_out, y> (as nvfp4 and none do).
TEST(QuantizedDgradBackward, Bf16KeepsTheRoutingWeightGradientOfTheExpertOutput) {
  const Layer l = small_layer();
  const int64_t K = l.c.top_k;
  const OperandQuant q = OperandQuant::bf16;
  ReferenceOptions o;
  o.quant = q;
  const Result got = run(l, o);
  for (int64_t t : {2, 11}) {
    for (int64_t k = 0; k < K; ++k) {
      const Row r = row(l, expert(l, l.b.topk_ids[size_t(t * K + k)], q), q, t, k);
      expect_close(got.g.d_topk_weights[size_t(t * K + k)], r.d_weight_of_y, 1e-12, "bf16");
    }
  }
}
