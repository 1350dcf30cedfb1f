// Random layer inputs for the CLI and the tests: BF16-representable values, softmax top-k routing.
#pragma once
#include <cmath>
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

// x ~ N(0, 1) in BF16; routing by softmax top-k of random logits (renormalised weights).
inline Batch random_batch(const Config& c, int64_t tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.tokens = tokens;
  b.x.resize(size_t(tokens * c.hidden));
  for (double& v : b.x) v = bf16_normal(rng, 1.0);
  std::vector<float> logits(size_t(tokens * c.num_experts));
  for (float& l : logits) l = float(std::normal_distribution<double>(0.0, 1.0)(rng));
  Routing r = route_softmax_topk(logits.data(), tokens, c.num_experts, c.top_k, true);
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
