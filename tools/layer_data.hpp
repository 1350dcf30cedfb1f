// Random layer inputs for the CLI and the tests: BF16-representable values, softmax top-k routing
// (random, balanced or skewed).
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdint>
#include <random>
#include <vector>

#include "mok/formats/codecs.hpp"
#include "mok/layer.hpp"
#include "mok/router.hpp"

namespace mok::tools {

inline double bf16_normal(std::mt19937_64& rng, double stddev) {
  return double(fmt::round_to_bf16(float(std::normal_distribution<double>(0.0, stddev)(rng))));
}

// Parameters for rank c.ep_rank; weights ~ N(0, 1/fan_in), rounded to BF16.
inline LayerParams random_params(const Config& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  LayerParams p = LayerParams::zeros(c);
  const double sh = 1.0 / std::sqrt(double(c.hidden));
  const double si = 1.0 / std::sqrt(double(c.intermediate));
  const double ss = c.shared_width() > 0 ? 1.0 / std::sqrt(double(c.shared_width())) : 0.0;
  for (double& v : p.shared_gate) v = bf16_normal(rng, sh);
  for (double& v : p.shared_up) v = bf16_normal(rng, sh);
  for (double& v : p.shared_down) v = bf16_normal(rng, ss);
  for (double& v : p.gate) v = bf16_normal(rng, sh);
  for (double& v : p.up) v = bf16_normal(rng, sh);
  for (double& v : p.down) v = bf16_normal(rng, si);
  return p;
}

// How a benchmark's or a check's tokens are routed.
//  random:   softmax top-k of N(0, 1) logits (every expert equally likely);
//  balanced: slot (t, k) to expert (t K + k) mod E (every expert T K / E rows), the weights as
//            random's;
//  skewed:   Zipf-like: expert of popularity rank r (a fixed permutation of the experts, the same
//            for every seed and rank, so an EP group's ranks share their hot experts) is drawn
//            with probability proportional to (r + 1)^-zipf, K distinct per token (top-k of its
//            log-probability plus Gumbel noise, which samples without replacement); the weights
//            are the softmax of those logits over the chosen experts. zipf = 0 is uniform.
enum class RoutingKind { random, balanced, skewed };
struct RoutingChoice {
  RoutingKind kind = RoutingKind::random;
  double zipf = 1.0;
};

// The routing of `tokens` tokens over c.num_experts experts drawn from rng.
inline Routing random_routing(const Config& c, int64_t tokens, std::mt19937_64& rng,
                              const RoutingChoice& choice = {}) {
  const int E = c.num_experts;
  std::vector<float> logits(static_cast<size_t>(tokens * E));
  if (choice.kind == RoutingKind::skewed) {
    std::vector<int> rank(static_cast<size_t>(E));
    std::iota(rank.begin(), rank.end(), 0);
    std::mt19937_64 popularity(0x9E3779B97F4A7C15ull ^ uint64_t(E));
    std::shuffle(rank.begin(), rank.end(), popularity);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int64_t t = 0; t < tokens; ++t)
      for (int e = 0; e < E; ++e) {
        const double gumbel = -std::log(-std::log(std::max(uniform(rng), 1e-300)));
        logits[size_t(t * E + e)] =
            float(-choice.zipf * std::log(1.0 + double(rank[size_t(e)])) + gumbel);
      }
  } else {
    for (float& l : logits) l = float(std::normal_distribution<double>(0.0, 1.0)(rng));
  }
  Routing r = route_softmax_topk(logits.data(), tokens, E, c.top_k, true);
  if (choice.kind == RoutingKind::balanced)
    for (size_t i = 0; i < r.topk_ids.size(); ++i) r.topk_ids[i] = int32_t(i % size_t(E));
  return r;
}

// x ~ N(0, 1) in BF16; routing by `choice` (renormalised weights).
inline Batch random_batch(const Config& c, int64_t tokens, uint64_t seed,
                          const RoutingChoice& choice = {}) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.tokens = tokens;
  b.x.resize(size_t(tokens * c.hidden));
  for (double& v : b.x) v = bf16_normal(rng, 1.0);
  Routing r = random_routing(c, tokens, rng, choice);
  b.topk_ids = std::move(r.topk_ids);
  b.topk_weights.assign(r.topk_weights.begin(), r.topk_weights.end());
  return b;
}

inline std::vector<double> random_vector(size_t n, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = bf16_normal(rng, stddev);
  return v;
}

}  // namespace mok::tools
