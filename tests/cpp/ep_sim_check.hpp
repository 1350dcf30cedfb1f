// What the EP-simulation tests share: a case (a configuration, per-rank token counts, a routing,
// ring, numerics and delays) run through the simulated group and the single-rank reference, every
// result compared bit for bit. A row lost, duplicated or summed in another order changes bits.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "layer_data.hpp"
#include "mok/ep_sim.hpp"
#include "mok/error.hpp"

namespace ep_check {

using namespace mok;

inline Config small_config() {
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
  Config config = small_config();  // the single-rank layer (its ep_size is ignored)
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

inline void expect_bits(const std::vector<double>& got, const std::vector<double>& want,
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
inline void check_case(const Case& k) {
  const Config single = k.config;
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

}  // namespace ep_check
