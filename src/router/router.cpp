#include "mok/router.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "mok/error.hpp"

namespace mok {
namespace {

// a ranks before b (scores sa, sb; ids ia < ib decide ties): larger first, NaN last.
bool ranks_before(float sa, int ia, float sb, int ib) {
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return ia < ib;
}

// Indices of the k best of scores[0..n) among those with allowed[i], best first.
void select_top(const float* scores, const std::vector<bool>* allowed, int n, int k, int32_t* out) {
  std::vector<bool> taken(size_t(n), false);
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (taken[size_t(i)] || (allowed && !(*allowed)[size_t(i)])) continue;
      if (best < 0 || ranks_before(scores[i], i, scores[best], best)) best = i;
    }
    taken[size_t(best)] = true;
    out[j] = best;
  }
}

void check_common(int64_t tokens, int num_experts, int top_k) {
  if (tokens < 0) throw Error(ErrorCode::invalid_argument, "router: tokens must be >= 0");
  if (num_experts < 1) throw Error(ErrorCode::invalid_argument, "router: num_experts must be >= 1");
  if (top_k < 1 || top_k > num_experts) {
    throw Error(ErrorCode::invalid_argument,
                "router: top_k = " + std::to_string(top_k) +
                    " must be in [1, num_experts = " + std::to_string(num_experts) + "]");
  }
}

}  // namespace

Routing route_softmax_topk(const float* logits, int64_t tokens, int num_experts, int top_k,
                           bool renormalize) {
  check_common(tokens, num_experts, top_k);
  Routing r{std::vector<int32_t>(size_t(tokens * top_k)),
            std::vector<float>(size_t(tokens * top_k))};
  std::vector<float> probs(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * num_experts;
    double m = -INFINITY;
    for (int e = 0; e < num_experts; ++e) m = std::fmax(m, double(l[e]));
    double sum = 0;
    for (int e = 0; e < num_experts; ++e) sum += std::exp(double(l[e]) - m);
    for (int e = 0; e < num_experts; ++e)
      probs[size_t(e)] = float(std::exp(double(l[e]) - m) / sum);
    int32_t* ids = &r.topk_ids[size_t(t * top_k)];
    float* w = &r.topk_weights[size_t(t * top_k)];
    select_top(probs.data(), nullptr, num_experts, top_k, ids);
    double chosen = 0;
    for (int k = 0; k < top_k; ++k) chosen += probs[size_t(ids[k])];
    for (int k = 0; k < top_k; ++k)
      w[k] = renormalize ? float(probs[size_t(ids[k])] / chosen) : probs[size_t(ids[k])];
  }
  return r;
}

Routing route_deepseek_v3(const float* logits, const float* expert_bias, int64_t tokens,
                          int num_experts, const DeepSeekRouter& cfg) {
  check_common(tokens, num_experts, cfg.top_k);
  if (cfg.num_groups < 1 || num_experts % cfg.num_groups != 0) {
    throw Error(ErrorCode::invalid_argument,
                "router: num_groups = " + std::to_string(cfg.num_groups) +
                    " must divide num_experts = " + std::to_string(num_experts));
  }
  const int group_size = num_experts / cfg.num_groups;
  if (cfg.topk_groups < 1 || cfg.topk_groups > cfg.num_groups ||
      cfg.topk_groups * group_size < cfg.top_k) {
    throw Error(ErrorCode::invalid_argument,
                "router: topk_groups = " + std::to_string(cfg.topk_groups) + " must be in [1, " +
                    std::to_string(cfg.num_groups) +
                    "] and keep at least top_k = " + std::to_string(cfg.top_k) +
                    " experts (groups of " + std::to_string(group_size) + ")");
  }
  Routing r{std::vector<int32_t>(size_t(tokens * cfg.top_k)),
            std::vector<float>(size_t(tokens * cfg.top_k))};
  std::vector<float> score(static_cast<size_t>(num_experts)),
      choice(static_cast<size_t>(num_experts)), group_score(size_t(cfg.num_groups));
  std::vector<int32_t> groups(size_t(cfg.topk_groups)), best2(2);
  std::vector<bool> allowed_v(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * num_experts;
    for (int e = 0; e < num_experts; ++e) {
      score[size_t(e)] = float(1.0 / (1.0 + std::exp(-double(l[e]))));
      choice[size_t(e)] = score[size_t(e)] + (expert_bias ? expert_bias[e] : 0.0f);
    }
    for (int gi = 0; gi < cfg.num_groups; ++gi) {
      const float* c = &choice[size_t(gi * group_size)];
      const int n2 = group_size < 2 ? group_size : 2;
      select_top(c, nullptr, group_size, n2, best2.data());
      group_score[size_t(gi)] = n2 == 2 ? c[best2[0]] + c[best2[1]] : c[best2[0]];
    }
    select_top(group_score.data(), nullptr, cfg.num_groups, cfg.topk_groups, groups.data());
    std::fill(allowed_v.begin(), allowed_v.end(), false);
    for (int32_t gi : groups)
      for (int e = gi * group_size; e < (gi + 1) * group_size; ++e) allowed_v[size_t(e)] = true;
    int32_t* ids = &r.topk_ids[size_t(t * cfg.top_k)];
    float* w = &r.topk_weights[size_t(t * cfg.top_k)];
    select_top(choice.data(), &allowed_v, num_experts, cfg.top_k, ids);
    float sum = 0.0f;
    for (int k = 0; k < cfg.top_k; ++k) sum += score[size_t(ids[k])];
    for (int k = 0; k < cfg.top_k; ++k) {
      const float s = score[size_t(ids[k])];
      w[k] = (cfg.normalize ? s / (sum + 1e-20f) : s) * cfg.scaling_factor;
    }
  }
  return r;
}

}  // namespace mok
