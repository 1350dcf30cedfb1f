// NaN and Inf (issue 33): a non-finite value in x, in an expert's weights or in d_out propagates
// by IEEE arithmetic into the tokens it touches and no others. Every other token's output, d_x
// and d_topk_weights, and every untouched expert's weight gradients are bitwise those of the
// clean run, in the reference and in the simulated EP group (which nothing makes wait forever).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "layer_data.hpp"
#include "mok/ep_sim.hpp"
#include "mok/layer.hpp"

using namespace mok;

namespace {

struct Result {
  std::vector<double> out;
  LayerGradients g;
};

Result reference(const Config& c, const LayerParams& p, const Batch& b,
                 const std::vector<double>& d_out) {
  ReferenceForward f = reference_forward(c, p, b);
  Result r{f.out, reference_backward(f.context, d_out)};
  return r;
}

// The simulated group of 4 ranks, its rows reassembled in global order (routed weight gradients
// concatenated by rank; the shared ones are partials and not compared).
Result simulated(const Config& c, const LayerParams& p, const Batch& b,
                 const std::vector<double>& d_out) {
  const int ep = 4;
  Config g = c;
  g.ep_size = ep;
  const int64_t H = c.hidden, K = c.top_k, per = b.tokens / ep;
  std::vector<Batch> batches;
  std::vector<std::vector<double>> d_outs;
  std::vector<LayerParams> params;
  for (int r = 0; r < ep; ++r) {
    auto rows = [&](const auto& v, int64_t w) {
      return std::vector<typename std::decay_t<decltype(v)>::value_type>(
          v.begin() + r * per * w, v.begin() + (r + 1) * per * w);
    };
    batches.push_back({per, rows(b.x, H), rows(b.topk_ids, K), rows(b.topk_weights, K)});
    d_outs.push_back(rows(d_out, H));
    params.push_back(slice_params(c, p, ep, r));
  }
  std::vector<const LayerParams*> pp;
  for (const LayerParams& q : params) pp.push_back(&q);
  SimOptions o;
  o.max_delay_us = 20;
  o.seed = 3;
  const SimForward f = simulate_forward(g, batches, pp, o);
  const std::vector<LayerGradients> grads = simulate_backward(g, batches, pp, f, d_outs, o);
  Result res;
  for (int r = 0; r < ep; ++r) {
    auto append = [](std::vector<double>& a, const std::vector<double>& v) {
      a.insert(a.end(), v.begin(), v.end());
    };
    append(res.out, f.out[size_t(r)]);
    append(res.g.d_x, grads[size_t(r)].d_x);
    append(res.g.d_topk_weights, grads[size_t(r)].d_topk_weights);
    append(res.g.d_params.gate, grads[size_t(r)].d_params.gate);
    append(res.g.d_params.up, grads[size_t(r)].d_params.up);
    append(res.g.d_params.down, grads[size_t(r)].d_params.down);
  }
  return res;
}

bool row_has_nonfinite(const std::vector<double>& v, int64_t row, int64_t width) {
  for (int64_t i = 0; i < width; ++i)
    if (!std::isfinite(v[size_t(row * width + i)])) return true;
  return false;
}

bool row_bits_equal(const std::vector<double>& a, const std::vector<double>& b, int64_t row,
                    int64_t width) {
  return std::memcmp(a.data() + row * width, b.data() + row * width,
                     size_t(width) * sizeof(double)) == 0;
}

// Rows in `touched` must hold a non-finite value, every other row the clean run's bits.
void expect_rows(const std::vector<double>& got, const std::vector<double>& clean,
                 const std::set<int64_t>& touched, int64_t rows, int64_t width,
                 const std::string& what) {
  ASSERT_EQ(got.size(), size_t(rows * width)) << what;
  for (int64_t r = 0; r < rows; ++r) {
    if (touched.count(r))
      EXPECT_TRUE(row_has_nonfinite(got, r, width)) << what << " row " << r << " stayed finite";
    else
      EXPECT_TRUE(row_bits_equal(got, clean, r, width)) << what << " row " << r << " changed";
  }
}

struct Layer {
  Config c = preset("tiny");
  LayerParams p;
  Batch b;
  std::vector<double> d_out;
  Layer() {
    c.max_tokens_per_rank = 64;
    p = tools::random_params(c, 21);
    b = tools::random_batch(c, 64, 22);
    d_out = tools::random_vector(size_t(64 * c.hidden), 23);
  }
  std::set<int64_t> tokens_of(int expert) const {
    std::set<int64_t> t;
    for (int64_t i = 0; i < b.tokens * c.top_k; ++i)
      if (b.topk_ids[size_t(i)] == expert) t.insert(i / c.top_k);
    return t;
  }
  std::set<int64_t> experts_of(int64_t token) const {
    std::set<int64_t> e;
    for (int k = 0; k < c.top_k; ++k) e.insert(b.topk_ids[size_t(token * c.top_k + k)]);
    return e;
  }
};

void check(const Layer& clean, const Layer& bad, const std::set<int64_t>& tokens,
           const std::set<int64_t>& experts, bool d_x_too) {
  const int64_t T = clean.b.tokens, H = clean.c.hidden, K = clean.c.top_k;
  const int64_t expert_block = int64_t(clean.c.intermediate) * H;
  for (bool sim : {false, true}) {
    SCOPED_TRACE(sim ? "simulated EP group of 4" : "reference");
    auto run = sim ? simulated : reference;
    const Result a = run(clean.c, clean.p, clean.b, clean.d_out);
    const Result r = run(bad.c, bad.p, bad.b, bad.d_out);
    expect_rows(r.out, a.out, d_x_too ? tokens : std::set<int64_t>{}, T, H, "out");
    expect_rows(r.g.d_x, a.g.d_x, tokens, T, H, "d_x");
    expect_rows(r.g.d_topk_weights, a.g.d_topk_weights, tokens, T, K, "d_topk_weights");
    for (auto [name, got, want] : {std::tuple{"d_gate", &r.g.d_params.gate, &a.g.d_params.gate},
                                   {"d_up", &r.g.d_params.up, &a.g.d_params.up},
                                   {"d_down", &r.g.d_params.down, &a.g.d_params.down}})
      expect_rows(*got, *want, experts, clean.c.num_experts, expert_block, name);
  }
}

}  // namespace

TEST(NonFinite, NaNInATokensXStaysInThatTokenAndItsExperts) {
  const Layer clean;
  Layer bad = clean;
  bad.b.x[size_t(17 * bad.c.hidden + 40)] = std::numeric_limits<double>::quiet_NaN();
  check(clean, bad, {17}, clean.experts_of(17), true);
}

TEST(NonFinite, InfInAnExpertsWeightsStaysInItsTokens) {
  const Layer clean;
  Layer bad = clean;
  const int e = clean.b.topk_ids[size_t(5 * clean.c.top_k)];  // an expert token 5 uses
  bad.p.gate[size_t(e) * clean.c.intermediate * clean.c.hidden + 7] =
      std::numeric_limits<double>::infinity();
  const std::set<int64_t> tokens = clean.tokens_of(e);
  ASSERT_FALSE(tokens.empty());
  // The tokens routed to e touch every expert they use in the backward (their d_out rows flow
  // through x's gradient only; the other experts' weight gradients see their finite rows).
  check(clean, bad, tokens, {e}, true);
}

TEST(NonFinite, NaNInATokensDOutStaysInThatTokensGradients) {
  const Layer clean;
  Layer bad = clean;
  bad.d_out[size_t(41 * bad.c.hidden + 3)] = std::numeric_limits<double>::quiet_NaN();
  check(clean, bad, {41}, clean.experts_of(41), false);
}
