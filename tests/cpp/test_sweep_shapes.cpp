// `mok bench --sweep`'s shapes: valid, inside issue 32's ranges, within the weight budget, the
// same for a seed everywhere, and both with and without shared experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "sweep_shapes.hpp"

using mok::tools::sweep_shapes;

TEST(SweepShapes, ValidInsideTheRangesAndTheBudget) {
  const auto shapes = sweep_shapes(400, 7);
  ASSERT_EQ(shapes.size(), 400u);
  int shared = 0;
  std::set<std::string> names;
  for (const auto& s : shapes) {
    const mok::Config& c = s.config;
    SCOPED_TRACE(s.name);
    EXPECT_NO_THROW(c.validate());
    for (const int d : {c.hidden, c.intermediate}) {
      EXPECT_EQ(d % 64, 0);
      EXPECT_GE(d, 256);
      EXPECT_LE(d, 8192);
    }
    EXPECT_GE(c.num_experts, 8);
    EXPECT_LE(c.num_experts, 512);
    EXPECT_GE(c.top_k, 1);
    EXPECT_LE(c.top_k, std::min(16, c.num_experts));
    EXPECT_GE(s.tokens, 1);
    EXPECT_LE(s.tokens, 16384);
    EXPECT_EQ(c.max_tokens_per_rank, s.tokens);
    EXPECT_LE(6.0 * c.num_experts * double(c.hidden) * c.intermediate,
              mok::tools::kSweepWeightBytes);
    if (c.num_shared_experts > 0) {
      ++shared;
      EXPECT_EQ(c.num_shared_experts, 1);
      EXPECT_EQ(c.shared_intermediate % 64, 0);
    }
    names.insert(s.name);
  }
  EXPECT_EQ(names.size(), shapes.size());
  // The ranges' far ends come up too.
  auto any = [&](auto pred) { return std::any_of(shapes.begin(), shapes.end(), pred); };
  EXPECT_TRUE(any([](const auto& s) { return s.config.top_k == 16; }));
  EXPECT_TRUE(any([](const auto& s) { return s.config.num_experts > 256; }));
  EXPECT_TRUE(any([](const auto& s) { return s.tokens < 16; }));
  EXPECT_TRUE(any([](const auto& s) { return s.tokens > 8192; }));
  EXPECT_GT(shared, 100);
  EXPECT_LT(shared, 300);
}

TEST(SweepShapes, ASeedGivesTheSameShapesAndAnotherSeedOthers) {
  const auto a = sweep_shapes(40, 1), b = sweep_shapes(40, 1), c = sweep_shapes(40, 2);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].tokens, b[i].tokens);
  }
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i].name == c[i].name;
  EXPECT_LT(same, 3);
  // A small budget lowers E (never below 8): 8192 x 8192 experts of 402 MB, 4 GB: at most 10.
  for (const auto& s : sweep_shapes(200, 3, 4e9)) {
    const double bytes = 6.0 * double(s.config.hidden) * s.config.intermediate;
    EXPECT_TRUE(s.config.num_experts == 8 || s.config.num_experts * bytes <= 4e9) << s.name;
  }
}
