#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "mok/error.hpp"
#include "mok/router.hpp"

using namespace mok;

namespace {
// Brute force: indices sorted by (score desc, id asc), first k.
std::vector<int32_t> brute_top(const std::vector<float>& s, int k,
                               const std::vector<bool>& allowed) {
  std::vector<int32_t> idx;
  for (int i = 0; i < int(s.size()); ++i)
    if (allowed.empty() || allowed[size_t(i)]) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return s[size_t(a)] > s[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}
}  // namespace

TEST(Router, SoftmaxTopKMatchesBruteForceAndBreaksTiesByLowerId) {
  std::mt19937 rng(1);
  const int E = 24, K = 5, T = 50;
  std::vector<float> logits(size_t(T * E));
  for (float& l : logits) l = float(int(rng() % 7)) * 0.5f;  // many ties
  const Routing r = route_softmax_topk(logits.data(), T, E, K, false);
  for (int t = 0; t < T; ++t) {
    std::vector<float> l(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const std::vector<int32_t> want = brute_top(l, K, {});
    const std::vector<int32_t> got(r.topk_ids.begin() + t * K, r.topk_ids.begin() + (t + 1) * K);
    EXPECT_EQ(got, want) << t;
    double z = 0, m = *std::max_element(l.begin(), l.end());
    for (float v : l) z += std::exp(double(v) - m);
    for (int k = 0; k < K; ++k)
      EXPECT_FLOAT_EQ(r.topk_weights[size_t(t * K + k)],
                      float(std::exp(double(l[size_t(want[size_t(k)])]) - m) / z));
  }
  const Routing n = route_softmax_topk(logits.data(), T, E, K, true);
  for (int t = 0; t < T; ++t)
    EXPECT_NEAR(
        std::accumulate(n.topk_weights.begin() + t * K, n.topk_weights.begin() + (t + 1) * K, 0.0),
        1.0, 1e-6);
}

TEST(Router, DeepSeekV3GroupLimitedBiasedSelection) {
  std::mt19937 rng(2);
  const int E = 32, T = 40;
  DeepSeekRouter cfg;
  cfg.top_k = 4;
  cfg.num_groups = 8;
  cfg.topk_groups = 3;
  cfg.scaling_factor = 2.5f;
  std::vector<float> logits(size_t(T * E)), bias(E);
  for (float& l : logits) l = std::normal_distribution<float>(0, 1)(rng);
  for (float& b : bias) b = std::normal_distribution<float>(0, 0.3f)(rng);
  const Routing r = route_deepseek_v3(logits.data(), bias.data(), T, E, cfg);
  const int gs = E / cfg.num_groups;
  for (int t = 0; t < T; ++t) {
    std::vector<float> s(E), c(E);
    for (int e = 0; e < E; ++e) {
      s[size_t(e)] = float(1.0 / (1.0 + std::exp(-double(logits[size_t(t * E + e)]))));
      c[size_t(e)] = s[size_t(e)] + bias[size_t(e)];
    }
    std::vector<float> gscore(size_t(cfg.num_groups));
    for (int g = 0; g < cfg.num_groups; ++g) {
      std::vector<float> v(c.begin() + g * gs, c.begin() + (g + 1) * gs);
      std::sort(v.begin(), v.end(), std::greater<float>());
      gscore[size_t(g)] = v[0] + v[1];
    }
    const std::vector<int32_t> groups = brute_top(gscore, cfg.topk_groups, {});
    std::vector<bool> allowed(E, false);
    for (int g : groups)
      for (int e = g * gs; e < (g + 1) * gs; ++e) allowed[size_t(e)] = true;
    const std::vector<int32_t> want = brute_top(c, cfg.top_k, allowed);
    float sum = 0;
    for (int32_t e : want) sum += s[size_t(e)];
    for (int k = 0; k < cfg.top_k; ++k) {
      EXPECT_EQ(r.topk_ids[size_t(t * cfg.top_k + k)], want[size_t(k)]);
      // weights from the unbiased scores
      EXPECT_FLOAT_EQ(r.topk_weights[size_t(t * cfg.top_k + k)],
                      s[size_t(want[size_t(k)])] / (sum + 1e-20f) * 2.5f);
    }
  }
}

TEST(Router, NaNScoresRankLastAndBadArgumentsAreNamed) {
  // Softmax: one NaN logit makes the token's probabilities NaN; the weights carry it onward.
  std::vector<float> logits = {NAN, 1.0f, 0.5f, 2.0f};
  const Routing r = route_softmax_topk(logits.data(), 1, 4, 2);
  EXPECT_EQ(r.topk_ids, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(std::isnan(r.topk_weights[0]) && std::isnan(r.topk_weights[1]));
  // Sigmoid scores are per expert: the NaN expert ranks last, the others are chosen normally.
  DeepSeekRouter one_group;
  one_group.top_k = 2;
  one_group.num_groups = 1;
  one_group.topk_groups = 1;
  const Routing d = route_deepseek_v3(logits.data(), nullptr, 1, 4, one_group);
  EXPECT_EQ(d.topk_ids, (std::vector<int32_t>{3, 1}));
  EXPECT_FALSE(std::isnan(d.topk_weights[0]));
  try {
    route_softmax_topk(logits.data(), 1, 4, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k = 5"), std::string::npos);
  }
  DeepSeekRouter cfg;
  cfg.num_groups = 3;
  EXPECT_THROW(route_deepseek_v3(logits.data(), nullptr, 1, 4, cfg), Error);
}
