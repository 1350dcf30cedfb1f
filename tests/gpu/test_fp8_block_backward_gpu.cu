// The fp8_block backward on the GPU (routed dgrad GEMMs in E4M3 with block scales, weight
// gradients from BF16 operands, the shared experts BF16) against the fp8_block quantized CPU
// reference (the same recipe, FP64 sums stored as FP32), on odd shapes and routings (an expert
// without rows, every token to the same experts, router weights of exactly 0), both tile widths,
// outputs poisoned first; its bits under dispatch delays and at EP 2 and 4 (emulated groups)
// against EP 1, in every weight-gradient mode and staged; and the configurations and calls it
// refuses.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/moe_backward/backward_trace.hpp"
#include "mok/gpu/fp8_block_experts.hpp"
#include "quantized_backward_util.hpp"

namespace {

using namespace quant_bwd;
using mok::gpu::Fp8BlockExperts;

mok::Config fp8_config(int H, int I, int E, int K, int shared, int shared_intermediate,
                       int max_tokens) {
  return quantized_config(mok::Precision::fp8_block, H, I, E, K, shared, shared_intermediate,
                          max_tokens);
}
using QuantizedFp8 = QuantizedExperts<Fp8BlockExperts>;

mok::Config ue8m0(mok::Config c) {  // every fp8_block scale a power of two
  c.fp8_ue8m0 = true;
  return c;
}

HostGrads run_fp8(const mok::Config& c, const mok::LayerParams& p, const mok::Batch& b,
                  const std::vector<double>& d_out, int block_n,
                  const mok::gpu::detail::ForwardHooks& hooks = {},
                  WeightGrads mode = WeightGrads::write_fp32,
                  const std::vector<std::vector<uint8_t>>& init = {}) {
  return run_quantized<Fp8BlockExperts>(c, p, b, d_out, block_n, hooks, mode, init);
}

// Within 1e-2 (relative L2) of the fp8_block quantized reference. The bound: both sides multiply
// the same quantized operands (x in 1x128 blocks, the weights' 128x128 blocks, the act the
// forward's down GEMM read, d_out quantized unweighted in 1x128 blocks, dg | du in 1x128 blocks,
// the BF16 weight-gradient operands; g | u in BF16, as the context keeps them). What differs: FP32
// sums in another order (the GPU promotes each 128 of K into an FP32 tile, the reference sums in
// FP64 and stores FP32), the hardware's approximate exp in the SwiGLU backward (~1e-6 relative),
// and so an E4M3 code of dg | du that rounds the other way when its input or its block's amax
// differs in the last place: one E4M3 step (2^-3 relative) on a tiny fraction of the elements.
// Together well under 1e-2 (the forward measured 2.7e-3 to 4.0e-3); a BF16 dgrad, a wrong scale
// or a lost block would be off by the recipe's own error (~7e-2) or more. (A weighted d_out
// quantization would hardly show in d_x, FP32 block scales being linear, but in d_topk_weights.)
void expect_matches_fp8_reference(const mok::Config& c, const mok::LayerParams& p,
                                  const mok::Batch& b, const std::vector<double>& d_out,
                                  const HostGrads& got, const std::string& label) {
  expect_matches_quantized_reference(c, p, b, d_out, got, label, mok::OperandQuant::fp8_block,
                                     1e-2);
}

}  // namespace

TEST(Fp8BlockBackwardGpu, MatchesTheQuantizedReference) {
  MOK_REQUIRE_GPU();
  struct Case {
    mok::Config c;
    int64_t tokens;
    int routing;        // 0 random, 1 expert 3 gets no rows, 2 every token to experts 1 and 4
    bool zero_weights;  // every 7th token's second router weight exactly 0
    std::vector<int> block_ns;
    const char* name;
  };
  const std::vector<Case> cases = {
      {fp8_config(256, 384, 6, 2, 1, 128, 300),
       300,
       1,
       true,
       {128},
       "H 256, I 384, S 128, T = 300, expert 3 empty, zero router weights"},
      {fp8_config(256, 384, 6, 2, 0, 0, 77),
       77,
       2,
       false,
       {128},
       "no shared experts, T = 77, every token to experts 1 and 4"},
      {fp8_config(512, 256, 6, 2, 1, 256, 200),
       200,
       0,
       false,
       {128, 256},
       "H 512, I 256, S 256, T = 200"},
      {fp8_config(256, 256, 6, 3, 2, 128, 129),
       129,
       0,
       true,
       {256},
       "H 256, I 256, two shared (S 256), top-3, T = 129, zero router weights"},
      {ue8m0(fp8_config(256, 384, 6, 2, 1, 128, 300)),
       300,
       1,
       true,
       {128},
       "UE8M0 scales, H 256, I 384, S 128, T = 300, expert 3 empty"},
      // Two 256-wide dgrad-down n-tiles: the second's act and weight scales at block 2 and 3.
      {fp8_config(256, 512, 6, 2, 1, 256, 260),
       260,
       1,
       false,
       {128, 256},
       "H 256, I 512, S 256, T = 260, expert 3 empty"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    const mok::LayerParams p = mok::tools::random_params(k.c, 300 + i);
    const mok::Batch b = case_batch(k.c, k.tokens, 310 + i, k.routing, k.zero_weights);
    const std::vector<double> d_out =
        mok::tools::random_vector(size_t(k.tokens * k.c.hidden), 320 + i, 0.5);
    for (int block_n : k.block_ns) {
      const std::string label = std::string(k.name) + ", block_n " + std::to_string(block_n);
      SCOPED_TRACE(label);
      const HostGrads got = run_fp8(k.c, p, b, d_out, block_n);
      expect_matches_fp8_reference(k.c, p, b, d_out, got, label);
    }
  }
}

TEST(Fp8BlockBackwardGpu, BitsRepeatUnderDelaysAndAcrossEpSizes) {
  MOK_REQUIRE_GPU();
  const int64_t total = 4 * 150;
  const mok::Config global = fp8_config(512, 256, 8, 3, 1, 256, int(total));
  const mok::LayerParams p = mok::tools::random_params(global, 401);
  mok::Batch b = mok::tools::random_batch(global, total, 402);
  drop_expert(b, global.top_k, 5);  // an expert without rows (rank 2's of four)
  for (int64_t t = 3; t < b.tokens; t += 11) b.topk_weights[size_t(t * global.top_k)] = 0.0;
  const std::vector<double> d_out =
      mok::tools::random_vector(size_t(total * global.hidden), 403, 0.5);
  for (int block_n : {128, 256}) {
    SCOPED_TRACE("block_n " + std::to_string(block_n));
    const HostGrads want = run_fp8(global, p, b, d_out, block_n);
    for (const double v : want.d_x) ASSERT_FALSE(std::isnan(v)) << "d_x unwritten";
    mok::gpu::detail::ForwardHooks delays;
    delays.dispatch_delay_ns = 20'000;
    for (int run = 0; run < 5; ++run) {
      delays.delay_seed = uint32_t(run + 1);
      const HostGrads again = run_fp8(global, p, b, d_out, block_n, delays);
      for (int i = 0; i < 7; ++i)
        ASSERT_EQ(again.bits[i], want.bits[i]) << "delayed run " << run << ", output " << i;
    }
    for (int ranks : {2, 4}) {
      SCOPED_TRACE("EP " + std::to_string(ranks));
      expect_ep_equals_ep1<Fp8BlockExperts>(global, p, b, d_out, block_n, ranks, want);
    }
  }
}

TEST(Fp8BlockBackwardGpu, RefusesWhatItCannotUse) {
  MOK_REQUIRE_GPU();
  const mok::Config c = fp8_config(256, 256, 8, 2, 1, 128, 100);
  mok::gpu::BackwardOptions recompute;
  recompute.gate_up = GateUpMode::recompute;
  const char* keep = "BackwardOptions::gate_up must be GateUpMode::keep";
  expect_error([&] { mok::gpu::MoeBackward bw(c, recompute); }, mok::ErrorCode::unsupported, keep);
  mok::Config ep = c;
  ep.ep_size = 2;
  expect_error([&] { mok::gpu::EmulatedEpBackward bw(ep, recompute); }, mok::ErrorCode::unsupported,
               keep);

  const mok::LayerParams p = mok::tools::random_params(c, 501);
  const mok::Batch b = mok::tools::random_batch(c, 100, 502);
  Step step(c, p, b, mok::tools::random_vector(size_t(100 * c.hidden), 503),
            WeightGrads::write_fp32);
  const QuantizedFp8 full(c, step.layer), forward_only(c, step.layer, 0, 1, false);
  mok::gpu::MoeForward f(c);
  mok::gpu::MoeBackward bw(c);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  mok::Config bf16 = c;
  bf16.precision = mok::Precision::bf16;
  mok::gpu::ForwardContext bf16_ctx(bf16);
  EXPECT_EQ(bf16_ctx.precision(), mok::Precision::bf16);
  f.schedule(step.batch(), s, nullptr);
  // The forward reads no transposed copy: weights without them run it.
  f.forward(s, step.batch(), forward_only.w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr), &ctx,
            nullptr);
  f.check(nullptr);
  EXPECT_TRUE(forward_only.w.fp8_block.gate_t == nullptr);
  expect_error(
      [&] {
        bw.backward(s, ctx, step.batch(), forward_only.w, bf(step.d_out), step.gradients(),
                    nullptr);
      },
      mok::ErrorCode::invalid_argument, "the transposed fp8_block gate weights");
  expect_error(
      [&] {
        bw.backward(s, bf16_ctx, step.batch(), full.w, bf(step.d_out), step.gradients(), nullptr);
      },
      mok::ErrorCode::invalid_argument,
      "the ForwardContext was made for precision bf16, this backward runs fp8_block");
  // Nothing above reached the device: the valid call still runs and writes every output.
  bw.backward(s, ctx, step.batch(), full.w, bf(step.d_out), step.gradients(), nullptr);
  bw.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  const HostGrads g = step.host(WeightGrads::write_fp32);
  for (const double v : g.d_x) ASSERT_FALSE(std::isnan(v)) << "d_x unwritten";
  for (const double v : g.d_w) ASSERT_FALSE(std::isnan(v)) << "d_topk_weights unwritten";
  for (int i = 0; i < 6; ++i)
    for (const double v : g.w[i]) ASSERT_FALSE(std::isnan(v)) << kGradNames[i] << " unwritten";
}

// The weight-gradient modes and the staged backward on the fp8_block kernels
// (expect_weight_gradient_modes).
TEST(Fp8BlockBackwardGpu, WeightGradientModesAndTheStagedBackward) {
  MOK_REQUIRE_GPU();
  const mok::Config c = fp8_config(256, 512, 8, 2, 1, 256, 300);
  const mok::LayerParams p = mok::tools::random_params(c, 601);
  mok::Batch b = mok::tools::random_batch(c, 300, 602);
  drop_expert(b, c.top_k, 6);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(300 * c.hidden), 603, 0.5);
  for (int block_n : {128, 256}) {
    SCOPED_TRACE("block_n " + std::to_string(block_n));
    expect_weight_gradient_modes<Fp8BlockExperts>(c, p, b, d_out, block_n, 6);
  }
}

// The timeline's instantiations (`mok trace --direction backward --precision fp8_block`): the
// library kernel's bits, and every role and kind of GEMM tile recorded; the BF16 timeline set is
// refused for an fp8_block layer.
struct UntracedForward {  // the timeline hooks reach the backward only
  mok::gpu::MoeForward f;
  mok::gpu::MoeBackward bw;
  UntracedForward(const mok::Config& c, const mok::gpu::BackwardOptions& o,
                  const mok::gpu::detail::ForwardHooks& hooks)
      : f(c), bw(c, o, hooks) {}
};

TEST(Fp8BlockBackwardGpu, TimelineRecordsEveryRoleAndKindAndChangesNoBit) {
  MOK_REQUIRE_GPU();
  const mok::Config c = fp8_config(256, 512, 8, 2, 1, 256, 300);
  const mok::LayerParams p = mok::tools::random_params(c, 611);
  const mok::Batch b = mok::tools::random_batch(c, 300, 612);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(300 * c.hidden), 613, 0.5);
  for (int block_n : {128, 256}) {
    SCOPED_TRACE("block_n " + std::to_string(block_n));
    const HostGrads plain = run_fp8(c, p, b, d_out, block_n, {}, WeightGrads::write_bf16);
    mok::gpu::detail::ForwardHooks h;
    h.trace_events = 1 << 16;
    h.backward_kernels = &mok::kern::trace_fp8_block_backward_kernels();
    std::vector<mok::kern::TraceEvent> events;
    const HostGrads traced = run_quantized<Fp8BlockExperts, UntracedForward>(
        c, p, b, d_out, block_n, h, WeightGrads::write_bf16, {}, &events);
    for (int i = 0; i < 7; ++i) ASSERT_EQ(traced.bits[i], plain.bits[i]) << "output " << i;
    int64_t per_role[mok::kern::kTraceRoles] = {}, consumer_kinds[4] = {};
    for (const auto& e : events) {
      ASSERT_GE(e.role, 0);
      ASSERT_LT(e.role, int(mok::kern::kTraceRoles));
      ASSERT_LE(e.start_ns, e.end_ns);
      ++per_role[e.role];
      if (e.role == mok::kern::kTraceConsumer0 || e.role == mok::kern::kTraceConsumer1) {
        ASSERT_GE(e.kind, 0);
        ASSERT_LT(e.kind, 4);
        ++consumer_kinds[e.kind];
      }
    }
    for (int role = 0; role < int(mok::kern::kTraceRoles); ++role)
      EXPECT_GT(per_role[role], 0) << "role " << role;
    for (int kind = 0; kind < 4; ++kind) EXPECT_GT(consumer_kinds[kind], 0) << "kind " << kind;
  }
  mok::gpu::detail::ForwardHooks bf16_set;
  bf16_set.trace_events = 16;
  bf16_set.backward_kernels = &mok::kern::trace_backward_kernels();
  EXPECT_THROW(mok::gpu::MoeBackward(c, {}, bf16_set), mok::Error);
}

TEST(Fp8BlockBackwardGpu, NonFiniteInputsStayInTheTokensAndExpertsTheyReach) {
  MOK_REQUIRE_GPU();
  expect_non_finite_inputs_stay_in_their_tokens<Fp8BlockExperts>(
      fp8_config(256, 256, 8, 2, 1, 128, 200), 1970);
}
