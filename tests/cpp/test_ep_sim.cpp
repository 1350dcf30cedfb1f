// EP invariance: the simulated group of N ranks gives the single-rank reference's bits on the same
// global batch, for random and odd routings, with injected delays and small rings; capacity
// overflow and an absent peer end in clear errors on every rank, never in a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <algorithm>
#include <functional>
#include <random>

#include "layer_data.hpp"
#include "mok/ep_sim.hpp"
#include "mok/error.hpp"
#include "mok/schedule/routing_layout.hpp"

using namespace mok;

namespace {

Config small_config() {
  Config c;
  c.hidden = 64;
  c.intermediate = 64;
  c.num_experts = 16;
  c.top_k = 4;
  c.num_shared_experts = 1;
  c.shared_intermediate = 64;
  c.tile_rows = 64;
  c.max_tokens_per_rank = 1 << 12;
  return c;
}

using IdFn = std::function<int32_t(std::mt19937_64&, int rank, int64_t t, int k)>;

struct Case {
  int ep = 1;
  std::vector<int64_t> tokens;  // per rank
  IdFn ids;
  int64_t ring_rows = 0;
  OperandQuant quant = OperandQuant::none;
  // FP64 storage makes every sum's order visible in the bits (FP32 storage of FP64 sums
  // hides most order changes), so half the cases run with it.
  Numerics numerics = Numerics::fp64;
  int max_delay_us = 0;
  uint64_t seed = 0;
};

void expect_bits(const std::vector<double>& got, const std::vector<double>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(double)) == 0) return;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(double)) != 0)
      FAIL() << what << ": first difference at " << i << ": " << got[i] << " vs " << want[i];
}

template <class T>
std::vector<T> slice(const std::vector<T>& v, int64_t begin, int64_t n, int64_t width) {
  return std::vector<T>(v.begin() + begin * width, v.begin() + (begin + n) * width);
}

// Runs the case through the simulation and the reference and compares every result bit for bit.
void check_case(const Case& k) {
  const Config single = small_config();
  const int64_t H = single.hidden, K = single.top_k;
  std::mt19937_64 rng(k.seed);
  int64_t total = 0;
  for (int64_t t : k.tokens) total += t;

  Batch global;
  global.tokens = total;
  global.x = tools::random_vector(size_t(total * H), k.seed + 1);
  global.topk_weights = tools::random_vector(size_t(total * K), k.seed + 2, 0.3);
  const std::vector<double> d_out = tools::random_vector(size_t(total * H), k.seed + 3);
  for (int r = 0, t0 = 0; r < k.ep; t0 += int(k.tokens[size_t(r)]), ++r)
    for (int64_t t = 0; t < k.tokens[size_t(r)]; ++t)
      for (int j = 0; j < K; ++j) global.topk_ids.push_back(k.ids(rng, r, t, j));
  const LayerParams params = tools::random_params(single, k.seed + 4);

  ReferenceOptions ro;
  ro.quant = k.quant;
  ro.numerics = k.numerics;
  const ReferenceForward ref = reference_forward(single, params, global, ro);
  const LayerGradients ref_g = reference_backward(ref.context, d_out);

  Config group = single;
  group.ep_size = k.ep;
  group.ring_rows = k.ring_rows;
  group.max_tokens_per_rank = int(*std::max_element(k.tokens.begin(), k.tokens.end()));
  std::vector<Batch> batches;
  std::vector<std::vector<double>> d_outs;
  std::vector<LayerParams> rank_params;
  int64_t begin = 0;
  for (int r = 0; r < k.ep; ++r) {
    const int64_t n = k.tokens[size_t(r)];
    batches.push_back({n, slice(global.x, begin, n, H), slice(global.topk_ids, begin, n, K),
                       slice(global.topk_weights, begin, n, K)});
    d_outs.push_back(slice(d_out, begin, n, H));
    rank_params.push_back(slice_params(single, params, k.ep, r));
    begin += n;
  }
  std::vector<const LayerParams*> pp;
  for (const LayerParams& p : rank_params) pp.push_back(&p);
  SimOptions so;
  so.numerics = ro;
  so.seed = k.seed;
  so.max_delay_us = k.max_delay_us;
  const SimForward f = simulate_forward(group, batches, pp, so);
  const std::vector<LayerGradients> g = simulate_backward(group, batches, pp, f, d_outs, so);

  const int64_t per_rank = int64_t(single.num_experts / k.ep) * single.intermediate * H;
  begin = 0;
  for (int r = 0; r < k.ep; ++r) {
    const int64_t n = k.tokens[size_t(r)];
    const std::string at = "rank " + std::to_string(r) + " of " + std::to_string(k.ep) + ", ";
    expect_bits(f.out[size_t(r)], slice(ref.out, begin, n, H), at + "out");
    expect_bits(g[size_t(r)].d_x, slice(ref_g.d_x, begin, n, H), at + "d_x");
    expect_bits(g[size_t(r)].d_topk_weights, slice(ref_g.d_topk_weights, begin, n, K),
                at + "d_topk_weights");
    expect_bits(g[size_t(r)].d_params.gate, slice(ref_g.d_params.gate, r, 1, per_rank),
                at + "d_gate");
    expect_bits(g[size_t(r)].d_params.up, slice(ref_g.d_params.up, r, 1, per_rank), at + "d_up");
    expect_bits(g[size_t(r)].d_params.down, slice(ref_g.d_params.down, r, 1, per_rank),
                at + "d_down");
    // Shared experts: each rank's partial equals the reference on that rank's tokens alone.
    const ReferenceForward sub = reference_forward(single, params, batches[size_t(r)], ro);
    const LayerGradients sub_g = reference_backward(sub.context, d_outs[size_t(r)]);
    expect_bits(g[size_t(r)].d_params.shared_gate, sub_g.d_params.shared_gate,
                at + "d_shared_gate");
    expect_bits(g[size_t(r)].d_params.shared_up, sub_g.d_params.shared_up, at + "d_shared_up");
    expect_bits(g[size_t(r)].d_params.shared_down, sub_g.d_params.shared_down,
                at + "d_shared_down");
    begin += n;
  }
}

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
  for (OperandQuant q :
       {OperandQuant::bf16, OperandQuant::fp8_block, OperandQuant::mxfp8, OperandQuant::nvfp4}) {
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
