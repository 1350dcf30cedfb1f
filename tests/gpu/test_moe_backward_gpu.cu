// The backward megakernel (MoeBackward) against the CPU reference backward, on fresh random inputs
// and the odd cases, outputs poisoned (NaN) first; its bits across runs with injected dispatch
// delays, across weight-gradient modes, staged (one launch per tile kind), recomputing g | u
// (GateUpMode::recompute: the same bits as keeping them) and under graph replay; and its refusals.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_layer.hpp"
#include "kernels/moe_backward/backward_trace.hpp"
#include "layer/backward_runner.hpp"
#include "mok/gpu/random_fill.hpp"
#include "one_gpu_backward.hpp"

namespace {

using namespace one_gpu;

// 256-wide tiles (H, I and S multiples of 256).
mok::Config wide_config() {
  mok::Config c;
  c.hidden = 512;
  c.intermediate = 256;
  c.num_experts = 8;
  c.top_k = 3;
  c.num_shared_experts = 1;
  c.shared_intermediate = 256;
  c.max_tokens_per_rank = 700;
  return c;
}

mok::Config small_config(int shared) {
  mok::Config c;
  c.hidden = 384;  // three 128-wide n-tiles of H
  c.intermediate = 256;
  c.num_experts = 8;
  c.top_k = 2;
  c.num_shared_experts = shared;
  c.shared_intermediate = 128;
  c.max_tokens_per_rank = 600;
  return c;
}

TEST(MoeBackwardGpu, MatchesTheReferenceOnRandomInputsAndOddBatches) {
  MOK_REQUIRE_GPU();
  struct Case {
    mok::Config c;
    int64_t tokens;
    const char* name;
  };
  for (const Case& k : {Case{mok::preset("tiny"), 333, "tiny, T = 333"},
                        Case{mok::preset("tiny"), 1, "tiny, T = 1"},
                        Case{small_config(1), 600, "H 384, I 256, T = 600"},
                        Case{small_config(0), 77, "no shared experts, T = 77"},
                        Case{wide_config(), 700, "256-wide tiles, T = 700"}}) {
    SCOPED_TRACE(k.name);
    const mok::LayerParams p = mok::tools::random_params(k.c, 71);
    const mok::Batch b = mok::tools::random_batch(k.c, k.tokens, 72);
    const std::vector<double> d_out =
        mok::tools::random_vector(size_t(k.tokens * k.c.hidden), 73, 0.5);
    const HostGrads kept = run_backward(k.c, p, b, d_out, WeightGrads::write_fp32);
    expect_matches_reference(k.c, p, b, d_out, kept);
    // Recomputing g | u: the forward's gate/up tiles again, the same K order: the same bits.
    const HostGrads recomputed =
        run_backward(k.c, p, b, d_out, WeightGrads::write_fp32, {}, GateUpMode::recompute);
    for (int i = 0; i < 7; ++i) ASSERT_EQ(recomputed.bits[i], kept.bits[i]) << "output " << i;
  }
}

// Every token to one expert (the others get no rows: exact zeros), a top-k weight of exactly 0,
// and an empty batch (only zero weight gradients).
TEST(MoeBackwardGpu, SkewedRoutingZeroWeightsAndAnEmptyBatch) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  c.top_k = 2;
  const mok::LayerParams p = mok::tools::random_params(c, 81);
  mok::Batch b = mok::tools::random_batch(c, 300, 82);
  for (int64_t t = 0; t < b.tokens; ++t) {
    b.topk_ids[size_t(2 * t)] = 5;
    b.topk_ids[size_t(2 * t + 1)] = 9;
    if (t % 7 == 0) b.topk_weights[size_t(2 * t + 1)] = 0.0;
  }
  const std::vector<double> d_out = mok::tools::random_vector(size_t(b.tokens * c.hidden), 83);
  const HostGrads kept = run_backward(c, p, b, d_out, WeightGrads::write_fp32);
  expect_matches_reference(c, p, b, d_out, kept);
  const HostGrads recomputed =
      run_backward(c, p, b, d_out, WeightGrads::write_fp32, {}, GateUpMode::recompute);
  for (int i = 0; i < 7; ++i) ASSERT_EQ(recomputed.bits[i], kept.bits[i]) << "output " << i;

  mok::Batch empty;
  empty.tokens = 0;
  for (const GateUpMode mode : {GateUpMode::keep, GateUpMode::recompute}) {
    const HostGrads g = run_backward(c, p, empty, {}, WeightGrads::write_fp32, {}, mode);
    for (int i = 0; i < 6; ++i)
      for (double v : g.w[i]) ASSERT_EQ(v, 0.0) << kGradNames[i];
  }
}

// The same bits in 20 runs with injected dispatch delays; BF16 weight gradients are the FP32 ones
// rounded to nearest even; accumulating adds to the caller's buffers (2W from W) and leaves the
// experts without rows untouched.
void expect_bitwise_across_runs_and_modes(const mok::Config& c, int64_t tokens) {
  const mok::LayerParams p = mok::tools::random_params(c, 91);
  mok::Batch b = mok::tools::random_batch(c, tokens, 92);
  for (int64_t t = 0; t < b.tokens; ++t) {  // expert 6 gets no rows
    int32_t* ids = &b.topk_ids[size_t(t * c.top_k)];
    for (int k = 0; k < c.top_k; ++k) {
      if (ids[k] != 6) continue;
      for (int32_t e = 0;; ++e)  // an expert the token does not use yet
        if (e != 6 && std::find(ids, ids + c.top_k, e) == ids + c.top_k) {
          ids[k] = e;
          break;
        }
    }
  }
  const std::vector<double> d_out = mok::tools::random_vector(size_t(b.tokens * c.hidden), 93);
  const HostGrads first = run_backward(c, p, b, d_out, WeightGrads::write_fp32);
  mok::gpu::detail::ForwardHooks delays;
  delays.dispatch_delay_ns = 20000;
  for (int run = 0; run < 20; ++run) {
    delays.delay_seed = uint32_t(run);
    const HostGrads again = run_backward(c, p, b, d_out, WeightGrads::write_fp32,
                                         run % 2 ? delays : mok::gpu::detail::ForwardHooks{});
    for (int i = 0; i < 7; ++i)
      ASSERT_EQ(again.bits[i], first.bits[i]) << "run " << run << ", output " << i;
  }

  // The staged backward (one launch per tile kind, the benchmark's baseline): the same tiles, so
  // the same bits, in both weight-gradient modes it is timed in.
  mok::gpu::detail::ForwardHooks staged;
  staged.staged_backward = 3;
  const HostGrads staged_run = run_backward(c, p, b, d_out, WeightGrads::write_fp32, staged);
  for (int i = 0; i < 7; ++i)
    ASSERT_EQ(staged_run.bits[i], first.bits[i]) << "staged, output " << i;

  const HostGrads half = run_backward(c, p, b, d_out, WeightGrads::write_bf16);
  const HostGrads staged_half = run_backward(c, p, b, d_out, WeightGrads::write_bf16, staged);
  for (int i = 0; i < 7; ++i)
    ASSERT_EQ(staged_half.bits[i], half.bits[i]) << "staged, BF16, output " << i;

  // Recomputing g | u: the same bits, with delays, staged and with BF16 gradients.
  for (int run = 0; run < 4; ++run) {
    delays.delay_seed = uint32_t(100 + run);
    mok::gpu::detail::ForwardHooks h = run == 1  ? staged
                                       : run > 1 ? delays
                                                 : mok::gpu::detail::ForwardHooks{};
    const HostGrads again =
        run_backward(c, p, b, d_out, WeightGrads::write_fp32, h, GateUpMode::recompute);
    for (int i = 0; i < 7; ++i)
      ASSERT_EQ(again.bits[i], first.bits[i]) << "recomputing, run " << run << ", output " << i;
  }
  const HostGrads half_recomputed =
      run_backward(c, p, b, d_out, WeightGrads::write_bf16, {}, GateUpMode::recompute);
  for (int i = 0; i < 7; ++i)
    ASSERT_EQ(half_recomputed.bits[i], half.bits[i]) << "recomputing, BF16, output " << i;
  EXPECT_EQ(half.bits[6], first.bits[6]);
  for (int i = 0; i < 6; ++i)
    for (size_t j = 0; j < first.w[i].size(); ++j)
      ASSERT_EQ(half.w[i][j], double(mok::fmt::round_to_bf16(float(first.w[i][j]))))
          << kGradNames[i];

  // Accumulate into buffers holding W (experts without rows: a marker), twice the result.
  Step step(c, p, b, d_out, WeightGrads::accumulate_fp32);
  const float marker = 12.5f;
  const size_t per_expert = size_t(c.intermediate) * size_t(c.hidden);
  for (int i = 0; i < 6; ++i) {
    std::vector<uint8_t> init = first.bits[i];
    if (i >= 3)
      for (size_t j = 0; j < per_expert; ++j)
        std::memcpy(&init[4 * (6 * per_expert + j)], &marker, 4);
    MOK_CUDA_OK(
        cudaMemcpy(step.grads[size_t(i)].ptr, init.data(), init.size(), cudaMemcpyHostToDevice));
  }
  mok::gpu::MoeForward f(c);
  mok::gpu::BackwardOptions o;
  o.block_n = widest_tiles(c);
  o.weight_grads = WeightGrads::accumulate_fp32;
  mok::gpu::MoeBackward bw(c, o);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  step.run(f, bw, s, ctx);
  bw.check(nullptr);
  const HostGrads acc = step.host(WeightGrads::accumulate_fp32);
  for (int i = 0; i < 6; ++i)
    for (size_t j = 0; j < first.w[i].size(); ++j) {
      const bool untouched = i >= 3 && j / per_expert == 6;
      ASSERT_EQ(acc.w[i][j], untouched ? double(marker) : 2.0 * first.w[i][j])
          << kGradNames[i] << " at " << j;
    }
}

TEST(MoeBackwardGpu, BitwiseAcrossRunsDelaysAndWeightGradientModes) {
  MOK_REQUIRE_GPU();
  // 500 tokens: about 125 rows per expert; 150: about 37 (one k-block per weight-gradient tile).
  for (const mok::Config& c : {small_config(1), wide_config()})
    for (const int64_t tokens : {500, 150}) {
      SCOPED_TRACE("H = " + std::to_string(c.hidden) + ", T = " + std::to_string(tokens));
      expect_bitwise_across_runs_and_modes(c, tokens);
    }
}

// The backward's timeline (`mok trace --direction backward`): its own instantiations give the
// library kernel's bits, and record every role: each kind of GEMM tile (dgrad down and gate/up,
// wgrad down and gate/up), the store warp's staged weight-gradient tiles, the dispatch CTAs
// (d_out and x rows) and the combine warps, which reduce each token's d_x once. A timeline too
// small for the run keeps what fits and counts the rest; the fused backward on one rank only.
TEST(MoeBackwardGpu, TimelineRecordsEveryRoleAndKindAndChangesNoBit) {
  MOK_REQUIRE_GPU();
  for (const mok::Config& c : {small_config(1), wide_config()}) {
    SCOPED_TRACE("H = " + std::to_string(c.hidden));
    const mok::LayerParams p = mok::tools::random_params(c, 61);
    const mok::Batch b = mok::tools::random_batch(c, 500, 62);
    const std::vector<double> d_out = mok::tools::random_vector(size_t(b.tokens * c.hidden), 63);
    const HostGrads plain = run_backward(c, p, b, d_out, WeightGrads::write_bf16);
    Step step(c, p, b, d_out, WeightGrads::write_bf16);
    mok::gpu::BackwardOptions o;
    o.block_n = widest_tiles(c);
    o.weight_grads = WeightGrads::write_bf16;
    mok::gpu::detail::ForwardHooks h;
    h.trace_events = 1 << 16;
    h.backward_kernels = &mok::kern::trace_backward_kernels();
    mok::gpu::MoeForward f(c);
    mok::gpu::MoeBackward traced(c, o, h);
    mok::gpu::Schedule s(c);
    mok::gpu::ForwardContext ctx(c);
    step.run(f, traced, s, ctx);
    traced.check(nullptr);
    const HostGrads again = step.host(WeightGrads::write_bf16);
    for (int i = 0; i < 7; ++i) ASSERT_EQ(again.bits[i], plain.bits[i]) << "output " << i;
    int64_t claimed = 0;
    const auto events = traced.runner().trace(nullptr, &claimed);
    ASSERT_EQ(int64_t(events.size()), claimed);
    int64_t per_role[mok::kern::kTraceRoles] = {}, consumer_kinds[5] = {}, tokens = 0;
    for (const auto& e : events) {
      ASSERT_GE(e.role, 0);
      ASSERT_LT(e.role, int(mok::kern::kTraceRoles));
      ASSERT_LE(e.start_ns, e.end_ns);
      ASSERT_EQ(e.rank, 0);
      ++per_role[e.role];
      if (e.role == mok::kern::kTraceConsumer0 || e.role == mok::kern::kTraceConsumer1) {
        ASSERT_GE(e.kind, 0);
        ASSERT_LT(e.kind, 4);  // no recompute tiles when the context keeps g | u
        ++consumer_kinds[e.kind];
      }
      if (e.role == mok::kern::kTraceStore) {
        ASSERT_TRUE(e.kind == int(mok::kern::BackwardKind::wgrad_down) ||
                    e.kind == int(mok::kern::BackwardKind::wgrad_gate_up));
      }
      if (e.role == mok::kern::kTraceCombine) tokens += e.what;
    }
    for (int role = 0; role < int(mok::kern::kTraceRoles); ++role)
      EXPECT_GT(per_role[role], 0) << "role " << role;
    for (int kind = 0; kind < 4; ++kind) EXPECT_GT(consumer_kinds[kind], 0) << "kind " << kind;
    EXPECT_EQ(tokens, b.tokens);
  }
  const mok::Config c = small_config(1);
  const mok::LayerParams p = mok::tools::random_params(c, 64);
  const mok::Batch b = mok::tools::random_batch(c, 300, 65);
  Step step(c, p, b, mok::tools::random_vector(size_t(b.tokens * c.hidden), 66),
            WeightGrads::write_bf16);
  mok::gpu::detail::ForwardHooks small;
  small.trace_events = 5;
  small.backward_kernels = &mok::kern::trace_backward_kernels();
  mok::gpu::BackwardOptions bf16;
  bf16.weight_grads = WeightGrads::write_bf16;  // the Step's gradient buffers
  mok::gpu::MoeForward f(c);
  mok::gpu::MoeBackward traced(c, bf16, small);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  step.run(f, traced, s, ctx);
  traced.check(nullptr);
  int64_t claimed = 0;
  EXPECT_EQ(traced.runner().trace(nullptr, &claimed).size(), 5u);
  EXPECT_GT(claimed, 5);
  mok::gpu::detail::ForwardHooks without_kernels;
  without_kernels.trace_events = 16;
  EXPECT_THROW(mok::gpu::MoeBackward(c, {}, without_kernels), mok::Error);
  mok::gpu::MoeBackward untraced(c);
  EXPECT_THROW(untraced.runner().trace(nullptr), mok::Error);
}

// A forward and backward captured in one CUDA graph replay to the direct run's bits, and again
// with new d_out values written into the captured buffer.
TEST(MoeBackwardGpu, GraphReplayEqualsDirectRuns) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 101);
  const mok::Batch b = mok::tools::random_batch(c, 400, 102);
  const std::vector<double> d_out1 = mok::tools::random_vector(size_t(b.tokens * c.hidden), 103);
  const std::vector<double> d_out2 = mok::tools::random_vector(size_t(b.tokens * c.hidden), 104);
  const HostGrads direct1 = run_backward(c, p, b, d_out1, WeightGrads::write_fp32);
  const HostGrads direct2 = run_backward(c, p, b, d_out2, WeightGrads::write_fp32);

  for (const GateUpMode mode : {GateUpMode::keep, GateUpMode::recompute}) {
    SCOPED_TRACE(mok::gpu::gate_up_mode_name(mode));
    Step step(c, p, b, d_out1, WeightGrads::write_fp32);
    mok::gpu::MoeForward f(c);
    mok::gpu::BackwardOptions o;
    o.gate_up = mode;
    mok::gpu::MoeBackward bw(c, o);
    mok::gpu::Schedule s(c);
    mok::gpu::ForwardContext ctx(c, mode);
    cudaStream_t stream;
    MOK_CUDA_OK(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    MOK_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    f.schedule(step.batch(), s, stream);
    f.forward(s, step.batch(), step.layer.weights(), reinterpret_cast<__nv_bfloat16*>(step.out.ptr),
              &ctx, stream);
    bw.backward(s, ctx, step.batch(), step.layer.weights(), bf(step.d_out), step.gradients(),
                stream);
    MOK_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    MOK_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    MOK_CUDA_OK(cudaGraphLaunch(exec, stream));
    bw.check(stream);
    const HostGrads replay1 = step.host(WeightGrads::write_fp32);
    const std::vector<uint16_t> second = to_bf16(d_out2);
    MOK_CUDA_OK(
        cudaMemcpy(step.d_out.ptr, second.data(), second.size() * 2, cudaMemcpyHostToDevice));
    MOK_CUDA_OK(cudaGraphLaunch(exec, stream));
    bw.check(stream);
    const HostGrads replay2 = step.host(WeightGrads::write_fp32);
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(replay1.bits[i], direct1.bits[i]) << "output " << i;
      EXPECT_EQ(replay2.bits[i], direct2.bits[i]) << "output " << i;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// One forward and backward on one GPU (FP32 weight gradients).
HostGrads run_step(const mok::Config& c, const mok::LayerParams& p, const mok::Batch& b,
                   const std::vector<double>& d_out) {
  Step step(c, p, b, d_out, WeightGrads::write_fp32);
  mok::gpu::MoeForward f(c);
  mok::gpu::MoeBackward bw(c);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  step.run(f, bw, s, ctx);
  f.check(nullptr);
  bw.check(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return step.host(WeightGrads::write_fp32);
}

// NaN or Inf in x, in one expert's weights or in d_out: out, d_x and d_topk_weights are not
// finite in the tokens the value reaches and bitwise the clean run's in every other token; the
// weight gradients likewise per expert (the shared expert's: reached by x and d_out, not by a
// routed expert's weights).
TEST(MoeBackwardGpu, NonFiniteInputsStayInTheTokensAndExpertsTheyReach) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 111);
  const mok::Batch b = mok::tools::random_batch(c, 200, 112);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(b.tokens * c.hidden), 113);
  expect_non_finite_inputs_stay_in_their_tokens(c, p, b, d_out, run_step);
}

TEST(MoeBackwardGpu, RefusesWhatItCannotUseAndEndsAStoppedDispatchInAnError) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 121);
  const mok::Batch b = mok::tools::random_batch(c, 100, 122);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(b.tokens * c.hidden), 123);
  Step step(c, p, b, d_out, WeightGrads::write_fp32);
  mok::gpu::MoeForward f(c);
  mok::gpu::MoeBackward bw(c);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c), unfilled(c);
  step.run(f, bw, s, ctx);
  bw.check(nullptr);
  auto expect_error = [&](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error for: " << text;
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const auto w = step.layer.weights();
  const auto g = step.gradients();
  expect_error([&] { bw.backward(s, unfilled, step.batch(), w, bf(step.d_out), g, nullptr); },
               "no training forward of this schedule");
  expect_error([&] { bw.backward(s, ctx, step.batch(), w, nullptr, g, nullptr); }, "d_out is null");
  expect_error([&] { bw.backward(s, ctx, step.batch(), w, bf(step.d_out) + 1, g, nullptr); },
               "d_out is not 16-byte aligned");
  const std::vector<__nv_bfloat16> pageable_d_out(size_t(100 * c.hidden));
  expect_error([&] { bw.backward(s, ctx, step.batch(), w, pageable_d_out.data(), g, nullptr); },
               "d_out is host memory (pageable");
  mok::gpu::DeviceGradients no_down = g;
  no_down.down = nullptr;
  expect_error([&] { bw.backward(s, ctx, step.batch(), w, bf(step.d_out), no_down, nullptr); },
               "the down gradient is null");
  mok::gpu::DeviceBatch shorter = step.batch();
  shorter.tokens = 99;
  expect_error([&] { bw.backward(s, ctx, shorter, w, bf(step.d_out), g, nullptr); },
               "the schedule was built for a batch of 100 tokens");
  mok::Config other = c;
  other.intermediate = 256;
  mok::gpu::ForwardContext wrong(other);
  expect_error([&] { bw.backward(s, wrong, step.batch(), w, bf(step.d_out), g, nullptr); },
               "another configuration");
  mok::gpu::ForwardContext keeps_nothing(c, GateUpMode::recompute);
  f.forward(s, step.batch(), w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr), &keeps_nothing,
            nullptr);
  expect_error(
      [&] { bw.backward(s, keeps_nothing, step.batch(), w, bf(step.d_out), g, nullptr); },
      "the ForwardContext keeps no activations (GateUpMode::recompute) and this backward reads "
      "them");
  f.schedule(step.batch(), s, nullptr);  // rebuilt after the forward that filled ctx
  expect_error([&] { bw.backward(s, ctx, step.batch(), w, bf(step.d_out), g, nullptr); },
               "the schedule was rebuilt");
  mok::Config wide = c;
  wide.intermediate = 192;
  try {
    mok::gpu::MoeBackward unsupported(wide);
    ADD_FAILURE() << "I = 192 taken";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), mok::ErrorCode::unsupported);
  }

  // A dispatch that never publishes its first block: an error naming the waiting role, no hang.
  mok::gpu::detail::ForwardHooks stuck;
  stuck.never_publish_block = 0;
  mok::gpu::BackwardOptions o;
  o.wait_seconds = 0.5;
  mok::gpu::MoeBackward stopped(c, o, stuck);
  f.forward(s, step.batch(), w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr), &ctx, nullptr);
  stopped.backward(s, ctx, step.batch(), w, bf(step.d_out), g, nullptr);
  try {
    stopped.check(nullptr);
    ADD_FAILURE() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), mok::ErrorCode::peer_timeout);
    EXPECT_NE(std::string(e.what()).find("a dgrad-down producer (or a recompute one) waiting for "
                                         "the dispatched d_out and x rows"),
              std::string::npos)
        << e.what();
  }
}

// Words of two BF16 buffers that differ, and BF16 elements of `a` that are NaN or Inf.
__global__ void compare_bf16(const uint16_t* a, const uint16_t* b, size_t n,
                             unsigned long long* counts) {
  unsigned long long differ = 0, non_finite = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    differ += a[i] != b[i];
    non_finite += (a[i] & 0x7F80u) == 0x7F80u;
  }
  atomicAdd(counts, differ);
  atomicAdd(counts + 1, non_finite);
}

// The standard shapes at scale, where the reference is too slow: the 128- and 256-wide backward
// kernels tile N differently but run every K loop in the same order, so d_x and every weight
// gradient must agree bit for bit (only the router-weight gradients' partial sums, per n-tile,
// are grouped differently: FP32 rounding apart), with nothing left unwritten or non-finite.
// Recomputing g | u (256 wide, after a forward into a context that keeps nothing) equals keeping
// them at the same width in every bit, the router-weight gradients included.
TEST(MoeBackwardGpu, StandardShapesAgreeAcrossTileWidths) {
  MOK_REQUIRE_GPU();
  struct Shape {
    const char* name;
    int64_t tokens;
  };
  for (const Shape& shape : {Shape{"dsv3", 2048}, Shape{"qwen3-30b", 4096}, Shape{"fine", 4096}}) {
    SCOPED_TRACE(shape.name);
    mok::Config c = mok::preset(shape.name);
    c.max_tokens_per_rank = int(shape.tokens);
    const int64_t T = shape.tokens, H = c.hidden, K = c.top_k;
    const mok::tools::BenchLayer data(c, c.num_experts, T, 0);
    // The three variants' outputs side by side (d_x and six BF16 gradients each), with a quarter
    // more for the contexts and workspaces: dsv3's need ~70 GB beside its weights, more than an
    // H100's 80 GB hold (a failed allocation would read as a null gradient).
    const double needed =
        1.25 * 3 * 2 *
        double(T * H + 3 * c.shared_width() * H + 3 * int64_t(c.num_experts) * c.intermediate * H);
    const double free_bytes = gpu_free_bytes();
    if (needed > free_bytes) {
      std::printf("[ skipped ] %s: its three backwards' outputs need %.0f GB, %.0f GB are free\n",
                  shape.name, needed * 1e-9, free_bytes * 1e-9);
      continue;
    }
    DeviceBuffer<uint16_t> d_out(size_t(T * H));
    MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(reinterpret_cast<__nv_bfloat16*>(d_out.ptr), T * H, 5,
                                            1.0f, nullptr));
    mok::gpu::MoeForward f(c);
    mok::gpu::Schedule s(c);
    mok::gpu::ForwardContext ctx(c), keeps_nothing(c, GateUpMode::recompute);
    f.schedule(data.batch(), s, nullptr);
    f.forward(s, data.batch(), data.weights(), data.out.ptr, &ctx, nullptr);
    f.forward(s, data.batch(), data.weights(), data.out.ptr, &keeps_nothing, nullptr);
    f.check(nullptr);
    const size_t sizes[6] = {size_t(c.shared_width() * H),
                             size_t(c.shared_width() * H),
                             size_t(c.shared_width() * H),
                             data.g.n,
                             data.g.n,
                             data.g.n};
    // 128 wide, 256 wide, 256 wide recomputing g | u.
    std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> out[3];  // d_x, then the six gradients
    std::vector<float> d_w[3];
    for (int v = 0; v < 3; ++v) {
      mok::gpu::BackwardOptions o;
      o.weight_grads = WeightGrads::write_bf16;
      o.block_n = v == 0 ? 128 : 256;
      if (v == 2) o.gate_up = GateUpMode::recompute;
      mok::gpu::MoeBackward b(c, o);
      out[v].push_back(std::make_unique<DeviceBuffer<uint16_t>>(size_t(T * H), 0xFF));
      for (size_t n : sizes) out[v].push_back(std::make_unique<DeviceBuffer<uint16_t>>(n, 0xFF));
      DeviceBuffer<float> dw(size_t(T * K), 0xFF);
      auto ptr = [&](int i) { return static_cast<void*>(out[v][size_t(i)]->ptr); };
      const mok::gpu::DeviceGradients g{reinterpret_cast<__nv_bfloat16*>(out[v][0]->ptr),
                                        dw.ptr,
                                        ptr(1),
                                        ptr(2),
                                        ptr(3),
                                        ptr(4),
                                        ptr(5),
                                        ptr(6)};
      b.backward(s, v == 2 ? keeps_nothing : ctx, data.batch(), data.weights(), bf(d_out), g,
                 nullptr);
      b.check(nullptr);
      d_w[v] = dw.to_host();
    }
    DeviceBuffer<unsigned long long> counts(2, 0);
    for (size_t i = 0; i < out[0].size(); ++i) {
      MOK_CUDA_OK(cudaMemset(counts.ptr, 0, 2 * sizeof(unsigned long long)));
      compare_bf16<<<264, 256>>>(out[0][i]->ptr, out[1][i]->ptr, out[0][i]->n, counts.ptr);
      const std::vector<unsigned long long> n = counts.to_host();
      EXPECT_EQ(n[0], 0u) << "output " << i << ": words that differ between the widths";
      EXPECT_EQ(n[1], 0u) << "output " << i << ": NaN, Inf or unwritten elements";
    }
    std::vector<double> a(d_w[0].begin(), d_w[0].end()), b(d_w[1].begin(), d_w[1].end());
    EXPECT_LT(mok::relative_l2_error(a, b), 1e-5) << "router-weight gradients";
    for (size_t i = 0; i < out[1].size(); ++i) {
      MOK_CUDA_OK(cudaMemset(counts.ptr, 0, 2 * sizeof(unsigned long long)));
      compare_bf16<<<264, 256>>>(out[2][i]->ptr, out[1][i]->ptr, out[1][i]->n, counts.ptr);
      EXPECT_EQ(counts.to_host()[0], 0u) << "output " << i << ": recomputing changed bits";
    }
    EXPECT_EQ(std::memcmp(d_w[2].data(), d_w[1].data(), d_w[1].size() * sizeof(float)), 0)
        << "router-weight gradients: recomputing changed bits";
  }
}

}  // namespace
