// The routing choices of `mok run` and `mok bench` (tools/layer_data.hpp): balanced gives every
// expert T K / E rows; skewed concentrates the rows on the popular experts as its exponent says
// (a Zipf law sampled without replacement), the same experts for every seed; every choice gives
// K distinct experts per token and weights that sum to 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "layer_data.hpp"

namespace {

using mok::tools::RoutingChoice;
using mok::tools::RoutingKind;

mok::Config layer(int experts, int top_k) {
  mok::Config c = mok::preset("tiny");
  c.num_experts = experts;
  c.top_k = top_k;
  return c;
}

std::vector<int64_t> rows_per_expert(const mok::Routing& r, int experts) {
  std::vector<int64_t> n(static_cast<size_t>(experts), 0);
  for (int32_t id : r.topk_ids) ++n[size_t(id)];
  return n;
}

// The share of all slots that the `top` most loaded experts hold.
double top_share(std::vector<int64_t> n, int top) {
  std::sort(n.rbegin(), n.rend());
  const int64_t all = std::accumulate(n.begin(), n.end(), int64_t(0));
  return double(std::accumulate(n.begin(), n.begin() + top, int64_t(0))) / double(all);
}

void expect_valid(const mok::Routing& r, int64_t tokens, int experts, int top_k) {
  ASSERT_EQ(r.topk_ids.size(), size_t(tokens * top_k));
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> ids;
    float sum = 0;
    for (int k = 0; k < top_k; ++k) {
      const int32_t id = r.topk_ids[size_t(t * top_k + k)];
      ASSERT_GE(id, 0);
      ASSERT_LT(id, experts);
      ids.insert(id);
      sum += r.topk_weights[size_t(t * top_k + k)];
    }
    ASSERT_EQ(ids.size(), size_t(top_k)) << "token " << t;
    ASSERT_NEAR(sum, 1.0f, 1e-5f) << "token " << t;
  }
}

}  // namespace

TEST(RoutingChoice, BalancedGivesEveryExpertTheSameRows) {
  const mok::Config c = layer(64, 8);
  std::mt19937_64 rng(3);
  const mok::Routing r = mok::tools::random_routing(c, 512, rng, {RoutingKind::balanced, 1.0});
  expect_valid(r, 512, 64, 8);
  for (int64_t n : rows_per_expert(r, 64)) EXPECT_EQ(n, 512 * 8 / 64);
}

TEST(RoutingChoice, SkewedConcentratesRowsAsItsExponentSays) {
  const mok::Config c = layer(64, 4);
  const int64_t T = 4000;
  auto share = [&](double zipf, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const mok::Routing r = mok::tools::random_routing(c, T, rng, {RoutingKind::skewed, zipf});
    expect_valid(r, T, 64, 4);
    return top_share(rows_per_expert(r, 64), 8);
  };
  // Uniform: the 8 most loaded of 64 experts hold about 8/64 of the slots (a little more: they
  // are the most loaded). Zipf 1.5: one draw puts ~0.8 of its mass on the 8 most popular;
  // without replacement (4 per token) the share is lower but far above uniform's.
  const double uniform = share(0.0, 1), mild = share(0.7, 1), steep = share(1.5, 1);
  EXPECT_GT(uniform, 0.12);
  EXPECT_LT(uniform, 0.16);
  EXPECT_GT(mild, uniform + 0.1);
  EXPECT_GT(steep, mild + 0.1);
  EXPECT_GT(steep, 0.5);
  // The popular experts are the same for every seed (an EP group's ranks share them).
  std::mt19937_64 a(11), b(12);
  const std::vector<int64_t> na =
      rows_per_expert(mok::tools::random_routing(c, T, a, {RoutingKind::skewed, 1.5}), 64);
  const std::vector<int64_t> nb =
      rows_per_expert(mok::tools::random_routing(c, T, b, {RoutingKind::skewed, 1.5}), 64);
  EXPECT_EQ(std::max_element(na.begin(), na.end()) - na.begin(),
            std::max_element(nb.begin(), nb.end()) - nb.begin());
}

TEST(RoutingChoice, RandomIsTheSoftmaxTopKOfRandomLogits) {
  const mok::Config c = layer(16, 4);
  std::mt19937_64 rng(5);
  const mok::Routing r = mok::tools::random_routing(c, 1000, rng);
  expect_valid(r, 1000, 16, 4);
  const double s = top_share(rows_per_expert(r, 16), 4);  // about 4/16
  EXPECT_GT(s, 0.25);
  EXPECT_LT(s, 0.30);
}
