// Fuzzing the expert-parallel schedule (issue 33): random configurations (shapes, top-k, shared
// experts, EP sizes, ring sizes), random routings (uniform, power-law skewed, one expert, one
// rank's experts, most experts empty) and per-rank token counts (zero included), delays injected
// into a quarter: the simulated group forward and backward against the single-rank reference,
// bit for bit (a row lost, duplicated or summed in another order changes bits). MOK_FUZZ_CASES
// sets the count (default 300, a CI-sized subset; the full run: 10000) and MOK_FUZZ_SEED the
// first case's seed; every case's seed is printed with its failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "ep_sim_check.hpp"

using namespace mok;
using ep_check::Case;

namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// One random valid case from `seed`.
Case random_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  Case k;
  k.seed = seed;
  const int eps[] = {1, 2, 4, 8};
  k.ep = eps[pick(0, 3)];
  Config& c = k.config;
  c.hidden = int(64 * pick(1, 3));
  c.intermediate = int(64 * pick(1, 2));
  c.num_experts = int(k.ep * pick(1, 32 / k.ep));  // 1 to 32 experts, a multiple of ep
  c.top_k = int(pick(1, std::min<int64_t>(8, c.num_experts)));
  c.num_shared_experts = int(pick(0, 1));
  c.shared_intermediate = c.num_shared_experts ? 64 : 0;
  for (int r = 0; r < k.ep; ++r) k.tokens.push_back(pick(0, 3) == 0 ? 0 : pick(1, 48));
  const int E = c.num_experts, per_rank = E / k.ep;
  switch (pick(0, 4)) {
    case 0:  // uniform
      k.ids = [E](std::mt19937_64& g, int, int64_t, int) { return int32_t(g() % uint64_t(E)); };
      break;
    case 1: {  // power-law skew towards expert 0
      const double skew = 1.0 + double(pick(1, 4));
      k.ids = [E, skew](std::mt19937_64& g, int, int64_t, int) {
        const double u = std::uniform_real_distribution<double>(0, 1)(g);
        return int32_t(std::min<double>(E - 1, std::floor(E * std::pow(u, skew))));
      };
      break;
    }
    case 2: {  // every row to one expert
      const int32_t e = int32_t(pick(0, E - 1));
      k.ids = [e](std::mt19937_64&, int, int64_t, int) { return e; };
      break;
    }
    case 3: {  // every row to one rank's experts
      const int owner = int(pick(0, k.ep - 1));
      k.ids = [=](std::mt19937_64& g, int, int64_t, int) {
        return int32_t(owner * per_rank + int(g() % uint64_t(per_rank)));
      };
      break;
    }
    default: {  // three experts used, the rest empty
      const int32_t used[] = {int32_t(pick(0, E - 1)), int32_t(pick(0, E - 1)),
                              int32_t(pick(0, E - 1))};
      k.ids = [=](std::mt19937_64& g, int, int64_t, int) { return used[g() % 3]; };
    }
  }
  k.ring_rows = pick(0, 1) ? 0 : 64 * pick(1, 3);
  k.max_delay_us = pick(0, 3) == 0 ? 20 : 0;
  k.numerics = pick(0, 1) ? Numerics::fp32 : Numerics::fp64;
  return k;
}

std::string describe(const Case& k) {
  std::string s("seed ");  // appended piece by piece: GCC 12's -Wrestrict misjudges operator+
  s.append(std::to_string(k.seed)).append(": EP ").append(std::to_string(k.ep)).append(", ");
  s.append(k.config.describe()).append(", ring ").append(std::to_string(k.ring_rows));
  s.append(", tokens");
  for (int64_t t : k.tokens) s.append(" ").append(std::to_string(t));
  return s;
}

}  // namespace

TEST(EpFuzz, RandomConfigurationsGiveTheSingleRankBits) {
  const int64_t cases = env_int("MOK_FUZZ_CASES", 300);
  const uint64_t first = uint64_t(env_int("MOK_FUZZ_SEED", 20261204));
  int64_t rows = 0;
  for (int64_t i = 0; i < cases; ++i) {
    const Case k = random_case(first + uint64_t(i));
    SCOPED_TRACE(describe(k));
    ep_check::check_case(k);
    if (HasFailure()) return;
    for (int64_t t : k.tokens) rows += t * k.config.top_k;
  }
  std::printf("EpFuzz: %lld cases from seed %llu, %lld routed rows, every one bit-equal to EP=1\n",
              (long long)cases, (unsigned long long)first, (long long)rows);
}
