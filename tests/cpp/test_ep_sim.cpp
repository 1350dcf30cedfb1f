// EP invariance: the simulated group of N ranks gives the single-rank reference's bits on the same
// global batch, for random and odd routings, with injected delays and small rings; capacity
// overflow and an absent peer end in clear errors on every rank, never in a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <algorithm>
#include <functional>
#include <random>

#include "ep_sim_check.hpp"
#include "layer_data.hpp"
#include "mok/ep_sim.hpp"
#include "mok/error.hpp"
#include "mok/schedule/routing_layout.hpp"

using namespace mok;

namespace {

using ep_check::Case;
using ep_check::check_case;
using ep_check::expect_bits;
using ep_check::IdFn;
using ep_check::small_config;

IdFn uniform_ids(int E) {
  return [E](std::mt19937_64& rng, int, int64_t, int) { return int32_t(rng() % uint64_t(E)); };
}

}  // namespace

class EpInvariance : public ::testing::TestWithParam<int> {};

// 200 random routings per EP size: random token counts (zero included), uniform or skewed expert
// choice, random ring sizes down to one tile, delays injected in a quarter of them.
TEST_P(EpInvariance, RandomRoutingsGiveTheSingleRankBits) {
  const int ep = GetParam();
  std::mt19937_64 rng(uint64_t(ep) * 1000);
  for (int trial = 0; trial < 200; ++trial) {
    Case k;
    k.ep = ep;
    k.seed = rng();
    for (int r = 0; r < ep; ++r) k.tokens.push_back(int64_t(rng() % 41));
    const double skew = (trial % 3 == 0) ? 3.0 : 0.0;  // power-law expert choice in a third
    k.ids = [skew](std::mt19937_64& g, int, int64_t, int) {
      const double u = std::uniform_real_distribution<double>(0, 1)(g);
      return int32_t(std::min(15.0, std::floor(16.0 * std::pow(u, 1.0 + skew))));
    };
    k.ring_rows = (trial % 2) ? int64_t(64 * (1 + rng() % 3)) : 0;
    k.max_delay_us = (trial % 4 == 0) ? 30 : 0;
    k.numerics = (trial % 2) ? Numerics::fp32 : Numerics::fp64;
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_case(k);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

TEST_P(EpInvariance, EveryRowToOneExpert) {
  Case k;
  k.ep = GetParam();
  k.seed = 5;
  k.tokens.assign(size_t(k.ep), 23);
  k.ids = [](std::mt19937_64&, int, int64_t, int) { return int32_t(9); };
  k.ring_rows = 64;  // the expert's 4 * 23 * ep rows stream through one tile
  k.max_delay_us = 20;
  check_case(k);
}

TEST_P(EpInvariance, EveryTokenToTheLastRank) {
  Case k;
  k.ep = GetParam();
  k.seed = 6;
  k.tokens.assign(size_t(k.ep), 31);
  const int per_rank = 16 / k.ep, first = 16 - per_rank;
  k.ids = [=](std::mt19937_64& g, int, int64_t, int) {
    return int32_t(first + int(g() % uint64_t(per_rank)));
  };
  check_case(k);
}

TEST_P(EpInvariance, MostExpertsEmptyAndOddTokenCounts) {
  Case k;
  k.ep = GetParam();
  k.seed = 7;
  const int64_t odd[] = {1, 7, 13, 29, 37, 3, 11, 17};
  for (int r = 0; r < k.ep; ++r) k.tokens.push_back(odd[r]);
  const int32_t used[] = {1, 6, 11};
  k.ids = [&used](std::mt19937_64& g, int, int64_t, int) { return used[g() % 3]; };
  check_case(k);
}

TEST_P(EpInvariance, EmptyRanksAndEmptyBatch) {
  Case k;
  k.ep = GetParam();
  k.seed = 8;
  k.ids = uniform_ids(16);
  for (int r = 0; r < k.ep; ++r) k.tokens.push_back(r % 2 ? 0 : 19);
  check_case(k);
  k.tokens.assign(size_t(k.ep), 0);
  check_case(k);
}

TEST_P(EpInvariance, QuantizedRecipes) {
  for (OperandQuant q : {OperandQuant::bf16, OperandQuant::fp8_block, OperandQuant::mxfp8,
                         OperandQuant::nvfp4, OperandQuant::nvfp4_weights}) {
    Case k;
    k.ep = GetParam();
    k.seed = 9 + uint64_t(q);
    k.tokens.assign(size_t(k.ep), 150 / k.ep + 3);  // experts with > 64 rows: several wgrad tiles
    k.ids = uniform_ids(16);
    k.quant = q;
    k.numerics = Numerics::fp32;
    k.ring_rows = 128;
    SCOPED_TRACE(operand_quant_name(q));
    check_case(k);
  }
}

INSTANTIATE_TEST_SUITE_P(Ep, EpInvariance, ::testing::Values(1, 2, 4, 8));

namespace {
struct Group {
  Config c = small_config();
  std::vector<Batch> batches;
  std::vector<LayerParams> params;
  std::vector<const LayerParams*> pp;
  Group(int ep, int64_t tokens, const IdFn& ids) {
    c.ep_size = ep;
    c.max_tokens_per_rank = int(tokens);
    const LayerParams all = tools::random_params(small_config(), 1);
    std::mt19937_64 rng(2);
    for (int r = 0; r < ep; ++r) {
      Batch b;
      b.tokens = tokens;
      b.x = tools::random_vector(size_t(tokens * c.hidden), uint64_t(r));
      b.topk_weights.assign(size_t(tokens * c.top_k), 0.25);
      for (int64_t i = 0; i < tokens * c.top_k; ++i)
        b.topk_ids.push_back(ids(rng, r, i / c.top_k, 0));
      batches.push_back(b);
      params.push_back(slice_params(small_config(), all, ep, r));
    }
    for (const LayerParams& p : params) pp.push_back(&p);
  }
};
}  // namespace

TEST(EpSimErrors, CapacityOverflowIsReportedByEveryRankWithTheRowsNeeded) {
  for (int ep : {1, 2, 4, 8}) {
    Group g(ep, 40, [](std::mt19937_64&, int, int64_t, int) { return int32_t(0); });
    g.c.routed_capacity_rows = 128;
    // Expert 0 (rank 0) receives every row: 40 tokens * 4 * ep, padded to 64.
    const int64_t need = sched::pad_to_tile(40 * 4 * ep, 64);
    try {
      simulate_forward(g.c, g.batches, g.pp, {});
      FAIL() << "no error at ep " << ep;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::capacity_exceeded);
      const std::string m = e.what();
      EXPECT_NE(m.find("rank 0 needs " + std::to_string(need) +
                       " padded routed rows but the capacity is 128"),
                std::string::npos)
          << m;
      for (int r = 0; r < ep; ++r)
        EXPECT_NE(m.find("rank " + std::to_string(r) + " (schedule): capacity exceeded"),
                  std::string::npos)
            << m;
      EXPECT_EQ(m.find("peer failed"), std::string::npos) << m;
    }
    g.c.routed_capacity_rows = need;  // exactly enough
    EXPECT_NO_THROW(simulate_forward(g.c, g.batches, g.pp, {}));
  }
}

TEST(EpSimErrors, AnAbsentPeerEndsInABoundedWaitThatNamesIt) {
  for (int ep : {2, 4, 8}) {
    Group g(ep, 10, uniform_ids(16));
    SimOptions o;
    o.absent_rank = ep - 1;
    o.wait_timeout_ms = 300;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      simulate_forward(g.c, g.batches, g.pp, o);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::peer_timeout);
      const std::string m = e.what();
      EXPECT_NE(
          m.find("rank 0 (schedule): peer timeout: waited 300 ms for the expert counts of rank " +
                 std::to_string(ep - 1)),
          std::string::npos)
          << m;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));

    // In the backward the absent rank never sends its rows back.
    const SimForward f = simulate_forward(g.c, g.batches, g.pp, {});
    std::vector<std::vector<double>> d_out;
    for (const Batch& b : g.batches) d_out.push_back(b.x);
    try {
      simulate_backward(g.c, g.batches, g.pp, f, d_out, o);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::peer_timeout);
      EXPECT_NE(std::string(e.what()).find(
                    "(combine): peer timeout: waited 300 ms for its routed rows to come back"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(EpSimErrors, MismatchedInputsAreNamed) {
  Group g(2, 4, uniform_ids(16));
  g.batches[1].topk_ids[3] = 99;
  try {
    simulate_forward(g.c, g.batches, g.pp, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_ids[0, 3] = 99"), std::string::npos) << e.what();
  }
  g.pp.pop_back();
  EXPECT_THROW(simulate_forward(g.c, g.batches, g.pp, {}), Error);
}
