// Routers that frameworks call before the layer (routing stays outside the kernel, as in
// Mixture-of-Kittens). Scores in FP32; ties go to the lower expert id; NaN scores rank last.
#pragma once
#include <cstdint>
#include <vector>

namespace mok {

struct Routing {
  std::vector<int32_t> topk_ids;    // [T, K], in descending score order
  std::vector<float> topk_weights;  // [T, K]
};

// probs = softmax(logits); the K largest; weights = their probabilities (renormalised to sum 1
// when `renormalize`).
Routing route_softmax_topk(const float* logits, int64_t tokens, int num_experts, int top_k,
                           bool renormalize = false);

// DeepSeek-V3: s = sigmoid(logits); choice = s + expert_bias; experts in `num_groups` equal groups,
// a group scored by the sum of its two best choices; the `topk_groups` best groups stay; the K
// best choices among their experts; weights = s of those, divided by their sum when `normalize`,
// times `scaling_factor`.
struct DeepSeekRouter {
  int top_k = 8;
  int num_groups = 8;
  int topk_groups = 4;
  bool normalize = true;
  float scaling_factor = 2.5f;
};
Routing route_deepseek_v3(const float* logits, const float* expert_bias, int64_t tokens,
                          int num_experts, const DeepSeekRouter& r);

}  // namespace mok
