// The layers of `mok bench --sweep N`: N random valid shapes from a seed, as users bring them
// (issue 32): H and I multiples of 64 in [256, 8192], E in [8, 512], K in [1, min(16, E)], T in
// [1, 16384] (log-uniform, so small batches come up as often as large ones), half of them with
// one shared expert of a random width. The routed weights are kept within a memory budget (E
// lowered where 3 E H I BF16 values would not fit, never below 8), so every shape runs beside its
// baselines on one GPU. The same seed gives the same shapes everywhere.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "mok/config.hpp"

namespace mok::tools {

struct BenchShape {
  std::string name;  // in the tables
  Config config;
  int64_t tokens = 0;  // per rank
};

constexpr double kSweepWeightBytes = 48.0 * (1ull << 30);

inline std::vector<BenchShape> sweep_shapes(int n, uint64_t seed,
                                            double max_weight_bytes = kSweepWeightBytes) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<BenchShape> out;
  for (int i = 0; i < n; ++i) {
    Config c;
    c.hidden = int(64 * uniform(4, 128));
    c.intermediate = int(64 * uniform(4, 128));
    const double per_expert = 3.0 * 2.0 * double(c.hidden) * double(c.intermediate);
    const int64_t most = std::min<int64_t>(512, int64_t(max_weight_bytes / per_expert));
    c.num_experts = int(uniform(8, std::max<int64_t>(8, most)));
    c.top_k = int(uniform(1, std::min(16, c.num_experts)));
    if (uniform(0, 1) == 1) {
      c.num_shared_experts = 1;
      c.shared_intermediate = int(64 * uniform(4, 128));
    }
    const double log_tokens = std::uniform_real_distribution<double>(0.0, std::log(16384.0))(rng);
    const int64_t tokens = std::clamp<int64_t>(std::llround(std::exp(log_tokens)), 1, 16384);
    c.max_tokens_per_rank = int(tokens);
    c.validate();
    char name[80];  // snprintf: GCC 12 warns falsely (-Wrestrict) on chained string additions
    const int n_chars = std::snprintf(name, sizeof name, "s%d %dx%dx%d/%d", i, c.hidden,
                                      c.intermediate, c.num_experts, c.top_k);
    if (c.num_shared_experts)
      std::snprintf(name + n_chars, sizeof name - size_t(n_chars), "+%d", c.shared_intermediate);
    out.push_back({std::string(name), c, tokens});
  }
  return out;
}

}  // namespace mok::tools
