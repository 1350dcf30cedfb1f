// Fuzzing the megakernels on the device: random layers, batch sizes, routings (uniform, balanced,
// skewed, every token to the same experts, zero weights), options and dispatch delays. The
// forward megakernel must equal the staged forward (one launch per GEMM) and the fused backward
// the staged backward (one launch per tile kind) bit for bit, the forward's output wholly
// written; every eighth case is also checked against the FP64 CPU reference (the backward where
// its weight gradients are FP32). MOK_GPU_FUZZ_CASES cases (default
// 200) from a fixed seed; a failure names its case, so it can be replayed alone with
// MOK_GPU_FUZZ_FIRST.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "mok/gpu/staged_forward.hpp"
#include "one_gpu_backward.hpp"

namespace {

using namespace one_gpu;
using mok::gpu::RowPath;
using mok::gpu::detail::ForwardHooks;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

struct FuzzCase {
  mok::Config c;
  mok::Batch b;
  mok::gpu::ForwardOptions fo;
  mok::gpu::BackwardOptions bo;
  ForwardHooks forward_hooks, backward_hooks;
  std::string text;
};

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return values.begin()[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
}
int uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

FuzzCase make_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  FuzzCase k;
  mok::Config& c = k.c;
  c.hidden = 128 * uniform(rng, 1, 5);  // the backward takes multiples of 128
  c.intermediate = 128 * uniform(rng, 1, 3);
  c.num_experts = uniform(rng, 1, 40);
  c.top_k = uniform(rng, 1, std::min(8, c.num_experts));
  c.num_shared_experts = uniform(rng, 0, 1);
  c.shared_intermediate = pick(rng, {128, 256});
  c.max_tokens_per_rank = uniform(rng, 1, 400);
  const int t_kind = uniform(rng, 0, 9);
  const int64_t T = t_kind == 0   ? 0
                    : t_kind == 1 ? c.max_tokens_per_rank
                                  : uniform(rng, 1, int(c.max_tokens_per_rank));
  mok::tools::RoutingChoice routing;
  const int r_kind = uniform(rng, 0, 4);
  routing.kind = r_kind == 1   ? mok::tools::RoutingKind::balanced
                 : r_kind == 2 ? mok::tools::RoutingKind::skewed
                               : mok::tools::RoutingKind::random;
  routing.zipf = std::uniform_real_distribution<double>(0.5, 3.0)(rng);
  k.b = mok::tools::random_batch(c, T, seed + 1, routing);
  if (r_kind == 3)  // every token to the same K experts
    for (size_t i = 0; i < k.b.topk_ids.size(); ++i) k.b.topk_ids[i] = int32_t(i % size_t(c.top_k));
  const bool zero_weights = uniform(rng, 0, 3) == 0;
  if (zero_weights)
    for (size_t i = 0; i < k.b.topk_weights.size(); i += 3) k.b.topk_weights[i] = 0.0;

  const bool wide_ok = c.hidden % 256 == 0 && c.intermediate % 256 == 0 &&
                       (c.num_shared_experts == 0 || c.shared_intermediate % 256 == 0);
  k.fo.row_path = pick(rng, {RowPath::automatic, RowPath::dispatch_copy, RowPath::producer_gather});
  k.fo.block_n = pick(rng, {0, 128});
  k.fo.max_ctas = pick(rng, {0, 0, 2, 5, 17});
  // The producers gather rows themselves on that path: no dispatch CTAs to size or delay.
  const bool gather = k.fo.row_path == RowPath::producer_gather;
  k.fo.dispatch_ctas = gather || k.fo.max_ctas == 2 ? 0 : pick(rng, {0, 1, 3});
  k.fo.overlap_rows = 128 * pick(rng, {0, 1, 2, 8});
  k.bo.block_n = wide_ok ? pick(rng, {0, 128, 256}) : 128;
  k.bo.max_ctas = pick(rng, {0, 0, 3, 9});
  k.bo.dispatch_ctas = k.bo.max_ctas == 3 ? 1 : pick(rng, {0, 2});
  k.bo.weight_grads = pick(rng, {WeightGrads::write_fp32, WeightGrads::write_bf16});
  k.bo.gate_up = pick(rng, {GateUpMode::keep, GateUpMode::keep, GateUpMode::recompute});
  for (ForwardHooks* h : {&k.forward_hooks, &k.backward_hooks})
    if (uniform(rng, 0, 3) == 0 && !(gather && h == &k.forward_hooks))
      h->dispatch_delay_ns = 20'000, h->delay_seed = uint32_t(seed);
  k.text = "H " + std::to_string(c.hidden) + " I " + std::to_string(c.intermediate) + " E " +
           std::to_string(c.num_experts) + " K " + std::to_string(c.top_k) + " shared " +
           std::to_string(c.num_shared_experts * c.shared_intermediate) + " T " +
           std::to_string(T) + " of " + std::to_string(c.max_tokens_per_rank) + " routing " +
           std::to_string(r_kind) + (zero_weights ? " (zero weights)" : "") + ", forward block_n " +
           std::to_string(k.fo.block_n) + " ctas " + std::to_string(k.fo.max_ctas) + "/" +
           std::to_string(k.fo.dispatch_ctas) + ", backward block_n " +
           std::to_string(k.bo.block_n) + " ctas " + std::to_string(k.bo.max_ctas) + "/" +
           std::to_string(k.bo.dispatch_ctas) +
           (k.bo.gate_up == GateUpMode::recompute ? " recompute" : "") +
           (k.bo.weight_grads == WeightGrads::write_bf16 ? " bf16 dW" : " fp32 dW");
  return k;
}

// A forward (megakernel, the schedule's context kept) and the backward after it, by `bo` and
// `hooks` (staged_backward: the staged one).
HostGrads run_step(const FuzzCase& k, const mok::LayerParams& p, const std::vector<double>& d_out,
                   const mok::gpu::BackwardOptions& bo, const ForwardHooks& hooks) {
  Step step(k.c, p, k.b, d_out, bo.weight_grads);
  mok::gpu::MoeForward f(k.c);
  mok::gpu::MoeBackward bw(k.c, bo, hooks);
  mok::gpu::Schedule s(k.c);
  mok::gpu::ForwardContext ctx(k.c, bo.gate_up);
  step.run(f, bw, s, ctx);
  f.check(nullptr);
  bw.check(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return step.host(bo.weight_grads);
}

// One case; *rows: its routed rows.
void fuzz_one(uint64_t index, int64_t* rows) {
  const FuzzCase k = make_case(0x5EED0000u + index);
  SCOPED_TRACE("case " + std::to_string(index) + ": " + k.text);
  *rows = k.b.tokens * k.c.top_k;
  const mok::LayerParams p = mok::tools::random_params(k.c, 7 * index + 3);
  const GpuLayer layer(p);

  mok::gpu::StagedForward staged(k.c);
  mok::gpu::MoeForward mega(k.c, k.fo, k.forward_hooks);
  const std::vector<double> want = fwd_test::gpu_forward(staged, k.c, layer, k.b);
  const std::vector<double> got = fwd_test::gpu_forward(mega, k.c, layer, k.b);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FALSE(std::isnan(got[i])) << "unwritten at " << i;
  ASSERT_TRUE(fwd_test::same_bits(want, got)) << "forward: megakernel != staged";
  if (index % 8 == 0 && k.b.tokens > 0) fwd_test::expect_matches_reference(k.c, p, k.b, got);

  const std::vector<double> d_out =
      mok::tools::random_vector(size_t(k.b.tokens * k.c.hidden), 7 * index + 5);
  ForwardHooks staged_hooks;
  staged_hooks.staged_backward = 3;
  mok::gpu::BackwardOptions plain = k.bo;
  plain.max_ctas = plain.dispatch_ctas = 0;
  plain.gate_up = GateUpMode::keep;
  const HostGrads fused = run_step(k, p, d_out, k.bo, k.backward_hooks);
  const HostGrads reference = run_step(k, p, d_out, plain, staged_hooks);
  for (int i = 0; i < 7; ++i)
    ASSERT_EQ(fused.bits[i], reference.bits[i]) << "backward output " << i << ": fused != staged";
  if (index % 8 == 0 && k.b.tokens > 0 && k.bo.weight_grads == WeightGrads::write_fp32)
    expect_matches_reference(k.c, p, k.b, d_out, fused);
}

TEST(MegakernelFuzzGpu, RandomLayersRoutingsAndOptionsEqualTheStagedPaths) {
  MOK_REQUIRE_GPU();
  const int64_t first = env_int("MOK_GPU_FUZZ_FIRST", 0);
  const int64_t cases = env_int("MOK_GPU_FUZZ_CASES", 200);
  int64_t rows = 0;
  for (int64_t i = first; i < first + cases; ++i) {
    int64_t case_rows = 0;
    fuzz_one(uint64_t(i), &case_rows);
    rows += case_rows;
    if (testing::Test::HasFatalFailure() || testing::Test::HasNonfatalFailure()) return;
  }
  std::printf(
      "MegakernelFuzzGpu: cases %lld..%lld, %lld routed rows, forward and backward equal "
      "to the staged paths bit for bit\n",
      static_cast<long long>(first), static_cast<long long>(first + cases - 1),
      static_cast<long long>(rows));
}

}  // namespace
