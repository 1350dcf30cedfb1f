// The low-precision backward tests' common steps (fp8_block's, nvfp4's, mxfp8's): a layer's routed
// experts quantized by Experts (Fp8BlockExperts and Mxfp8Experts with their transposed copies,
// Nvfp4Experts), one forward (into a context) and backward on one GPU with every output poisoned
// first, the comparison with the quantized CPU reference backward, and an emulated group against
// EP 1.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backward_test_util.hpp"
#include "layer/backward_runner.hpp"
#include "mok/gpu/emulated_ep_backward.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "one_gpu_backward.hpp"

namespace quant_bwd {

using namespace one_gpu;

inline mok::Config quantized_config(mok::Precision precision, int H, int I, int E, int K,
                                    int shared, int shared_intermediate, int max_tokens) {
  mok::Config c;
  c.hidden = H;
  c.intermediate = I;
  c.num_experts = E;
  c.top_k = K;
  c.num_shared_experts = shared;
  c.shared_intermediate = shared > 0 ? shared_intermediate : 0;
  c.max_tokens_per_rank = max_tokens;
  c.precision = precision;
  return c;
}

// Rank r's (of `ranks`) routed experts quantized from `layer`'s BF16 weights (Fp8BlockExperts:
// with the backward's transposed copies when `backward`), and the rank's weights pointing at them.
template <class Experts>
struct QuantizedExperts {
  std::unique_ptr<Experts> experts;
  mok::gpu::DeviceLayerWeights w;
  QuantizedExperts(const mok::Config& c, const GpuLayer& layer, int r = 0, int ranks = 1,
                   bool backward = true) {
    mok::Config rc = c;
    rc.ep_size = ranks;
    const int64_t H = c.hidden, I = c.intermediate, El = rc.experts_per_rank();
    w = layer.weights();
    w.gate += r * El * I * H;
    w.up += r * El * I * H;
    w.down += r * El * H * I;
    if constexpr (std::is_constructible_v<Experts, const mok::Config&, bool>)
      experts = std::make_unique<Experts>(rc, backward);
    else
      experts = std::make_unique<Experts>(rc);
    experts->quantize(w, nullptr);
    w = experts->with(w);
  }
};

// Reroutes every slot of `expert` to an expert its token does not use yet: `expert` gets no rows.
inline void drop_expert(mok::Batch& b, int K, int32_t expert) {
  for (int64_t t = 0; t < b.tokens; ++t) {
    int32_t* ids = &b.topk_ids[size_t(t * K)];
    for (int k = 0; k < K; ++k) {
      if (ids[k] != expert) continue;
      for (int32_t e = 0;; ++e)
        if (e != expert && std::find(ids, ids + K, e) == ids + K) {
          ids[k] = e;
          break;
        }
    }
  }
}

// The odd routings of the backward cases: `routing` 1 leaves expert 3 without rows, 2 sends every
// token to experts 1 and 4; `zero_weights` sets every seventh token's second routing weight to 0.
inline mok::Batch case_batch(const mok::Config& c, int64_t tokens, uint64_t seed, int routing,
                             bool zero_weights) {
  mok::Batch b = mok::tools::random_batch(c, tokens, seed);
  const int K = c.top_k;
  if (routing == 1) drop_expert(b, K, 3);
  if (routing == 2)
    for (int64_t t = 0; t < b.tokens; ++t) {
      b.topk_ids[size_t(t * K)] = 1;
      b.topk_ids[size_t(t * K + 1)] = 4;
    }
  if (zero_weights)
    for (int64_t t = 0; t < b.tokens; t += 7) b.topk_weights[size_t(t * K + 1)] = 0.0;
  return b;
}

// The forward and backward a step runs on: one GPU's (a one-rank NCCL group's in
// test_ep_nccl_backward_gpu.cu).
struct OneGpuFronts {
  mok::gpu::MoeForward f;
  mok::gpu::MoeBackward bw;
  OneGpuFronts(const mok::Config& c, const mok::gpu::BackwardOptions& o,
               const mok::gpu::detail::ForwardHooks& hooks)
      : f(c, {}, hooks), bw(c, o, hooks) {}
};

// One forward (into a context) and backward on Fronts, every output poisoned first (Step: 0xFF
// bytes, NaN in BF16 and FP32), or the weight gradients' buffers holding `init` (accumulate_fp32).
// timeline: the backward's events (hooks with trace_events; Fronts whose bw is a MoeBackward).
template <class Experts, class Fronts = OneGpuFronts>
HostGrads run_quantized(const mok::Config& c, const mok::LayerParams& p, const mok::Batch& b,
                        const std::vector<double>& d_out, int block_n,
                        const mok::gpu::detail::ForwardHooks& hooks = {},
                        WeightGrads mode = WeightGrads::write_fp32,
                        const std::vector<std::vector<uint8_t>>& init = {},
                        std::vector<mok::kern::TraceEvent>* timeline = nullptr) {
  Step step(c, p, b, d_out, mode);
  for (size_t i = 0; i < init.size(); ++i)
    EXPECT_EQ(cudaMemcpy(step.grads[i].ptr, init[i].data(), init[i].size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  const QuantizedExperts<Experts> q(c, step.layer);
  mok::gpu::BackwardOptions o;
  o.block_n = block_n;
  o.weight_grads = mode;
  Fronts fronts(c, o, hooks);
  auto& f = fronts.f;
  auto& bw = fronts.bw;
  EXPECT_EQ(bw.block_n(), block_n);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  EXPECT_EQ(ctx.precision(), c.precision);
  const bool fp8 = c.precision == mok::Precision::fp8_block;
  EXPECT_EQ(ctx.act() == nullptr, fp8) << "fp8_block keeps the E4M3 act, the others BF16";
  EXPECT_EQ(ctx.act_e4m3() != nullptr, fp8);
  f.schedule(step.batch(), s, nullptr);
  f.forward(s, step.batch(), q.w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr), &ctx, nullptr);
  bw.backward(s, ctx, step.batch(), q.w, bf(step.d_out), step.gradients(), nullptr);
  f.check(nullptr);
  bw.check(nullptr);
  if constexpr (std::is_same_v<decltype(fronts.bw), mok::gpu::MoeBackward>)
    if (timeline) *timeline = bw.runner().trace(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The poison's bits (0xFFFF), not any NaN: a non-finite input's NaN comes out as 0x7FFF.
  const std::vector<uint16_t> out = step.out.to_host();
  EXPECT_EQ(std::count(out.begin(), out.end(), uint16_t(0xFFFF)), 0)
      << "the training forward left outputs unwritten";
  return step.host(mode);
}

// Every output written (no NaN poison left), experts without rows exact zeros, and each gradient
// within `bound` (relative L2) of the `quant` quantized reference (the callers derive their bound).
inline void expect_matches_quantized_reference(const mok::Config& c, const mok::LayerParams& p,
                                               const mok::Batch& b,
                                               const std::vector<double>& d_out,
                                               const HostGrads& got, const std::string& label,
                                               mok::OperandQuant quant, double bound) {
  mok::ReferenceOptions o;
  o.numerics = mok::Numerics::fp32;
  o.quant = quant;
  o.fp8_ue8m0 = c.fp8_ue8m0;
  const mok::ReferenceForward fwd = mok::reference_forward(c, p, b, o);
  const mok::LayerGradients want = mok::reference_backward(fwd.context, d_out);
  std::string errors;
  auto check = [&](const char* name, const std::vector<double>& g, const std::vector<double>& r) {
    ASSERT_EQ(g.size(), r.size()) << name;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_FALSE(std::isnan(g[i])) << name << " at " << i;
    const double err = mok::relative_l2_error(g, r);
    EXPECT_LT(err, bound) << name << ": relative L2 error " << err;
    char line[64];
    std::snprintf(line, sizeof(line), " %s %.2e", name, err);
    errors += line;
  };
  check("d_x", got.d_x, want.d_x);
  check("d_topk_weights", got.d_w, want.d_topk_weights);
  const std::vector<double>* ref[6] = {&want.d_params.shared_gate, &want.d_params.shared_up,
                                       &want.d_params.shared_down, &want.d_params.gate,
                                       &want.d_params.up,          &want.d_params.down};
  for (int i = 0; i < 6; ++i) {
    if (c.shared_width() == 0 && i < 3) {  // no shared experts: nothing to write or compare
      ASSERT_TRUE(got.w[i].empty()) << kGradNames[i];
      continue;
    }
    check(kGradNames[i], got.w[i], *ref[i]);
  }
  std::printf("[ %s backward ] %s:%s\n", mok::precision_name(c.precision), label.c_str(),
              errors.c_str());
  // Experts that received no rows: exact zeros (write_fp32 overwrites them).
  std::vector<int64_t> rows(size_t(c.num_experts), 0);
  for (int32_t e : b.topk_ids) ++rows[size_t(e)];
  const size_t per_expert = size_t(c.intermediate) * size_t(c.hidden);
  for (int e = 0; e < c.num_experts; ++e) {
    if (rows[size_t(e)] > 0) continue;
    for (int i = 3; i < 6; ++i)
      for (size_t j = 0; j < per_expert; ++j)
        ASSERT_EQ(got.w[i][size_t(e) * per_expert + j], 0.0) << kGradNames[i] << " expert " << e;
  }
}

template <class Call>
void expect_error(Call&& call, mok::ErrorCode code, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "no error for: " << text;
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// The emulated group of `ranks` on the global batch (tokens split evenly, each rank its own
// quantized experts, schedule and context): d_x, d_topk_weights and the routed weight gradients
// bitwise `want` (EP 1); the shared experts' per-rank partials sum to EP 1's within FP32 rounding.
template <class Experts>
void expect_ep_equals_ep1(const mok::Config& global, const mok::LayerParams& p, const mok::Batch& b,
                          const std::vector<double>& d_out, int block_n, int ranks,
                          const HostGrads& want) {
  const int64_t H = global.hidden, K = global.top_k, total = b.tokens, t = total / ranks;
  ASSERT_EQ(t * ranks, total);
  mok::Config rc = global;
  rc.ep_size = ranks;
  rc.max_tokens_per_rank = int(t);
  const int64_t El = rc.experts_per_rank();
  const GpuLayer layer(p);
  DeviceBuffer<uint16_t> x(to_bf16(b.x)), dy(to_bf16(d_out)), out(size_t(total * H), 0xFF);
  DeviceBuffer<int32_t> ids(b.topk_ids);
  DeviceBuffer<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
  bwd_test::Grads all(rc, total, rc.num_experts);     // d_x, d_w and the routed gradients: slices
  std::vector<std::unique_ptr<bwd_test::Grads>> own;  // the shared experts': per rank
  std::vector<std::unique_ptr<QuantizedExperts<Experts>>> experts;
  std::vector<std::unique_ptr<mok::gpu::Schedule>> owned_s;
  std::vector<std::unique_ptr<mok::gpu::ForwardContext>> owned_ctx;
  std::vector<mok::gpu::Schedule*> s;
  std::vector<const mok::gpu::ForwardContext*> ctx;
  std::vector<mok::gpu::DeviceBatch> batches;
  std::vector<mok::gpu::DeviceLayerWeights> weights;
  std::vector<__nv_bfloat16*> outs;
  std::vector<const __nv_bfloat16*> d_outs;
  std::vector<mok::gpu::DeviceGradients> grads;
  for (int r = 0; r < ranks; ++r) {
    const int64_t first = r * t;
    batches.push_back({t, bf(x) + first * H, ids.ptr + first * K, w.ptr + first * K});
    experts.push_back(std::make_unique<QuantizedExperts<Experts>>(global, layer, r, ranks));
    weights.push_back(experts.back()->w);
    outs.push_back(reinterpret_cast<__nv_bfloat16*>(out.ptr) + first * H);
    d_outs.push_back(bf(dy) + first * H);
    owned_s.push_back(std::make_unique<mok::gpu::Schedule>(rc));
    owned_ctx.push_back(std::make_unique<mok::gpu::ForwardContext>(rc));
    s.push_back(owned_s.back().get());
    ctx.push_back(owned_ctx.back().get());
    own.push_back(std::make_unique<bwd_test::Grads>(rc, 0, 0));
    mok::gpu::DeviceGradients g = all.at(rc, first, r * El);
    g.shared_gate = own.back()->sg.ptr;
    g.shared_up = own.back()->su.ptr;
    g.shared_down = own.back()->sd.ptr;
    grads.push_back(g);
  }
  mok::gpu::EmulatedEpForward f(rc);
  mok::gpu::BackwardOptions o;
  o.block_n = block_n;
  o.weight_grads = WeightGrads::write_fp32;
  mok::gpu::EmulatedEpBackward bw(rc, o);
  ASSERT_EQ(bw.ranks(), ranks);
  f.schedule(batches, s, nullptr);
  f.forward(s, batches, weights, outs, ctx, nullptr);
  bw.backward(s, ctx, batches, weights, d_outs, grads, nullptr);
  f.check(nullptr);
  bw.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());

  EXPECT_TRUE(fwd_test::same_bits(from_bf16(out.to_host()), want.out))
      << "the forward's output: bits differ from EP 1";
  std::vector<double> d_x = from_bf16(all.d_x.to_host()), d_w;
  d_x.resize(size_t(total * H));
  const std::vector<float> dw = all.d_w.to_host();
  d_w.assign(dw.begin(), dw.begin() + total * K);
  EXPECT_TRUE(fwd_test::same_bits(d_x, want.d_x)) << "d_x: bits differ from EP 1";
  EXPECT_TRUE(fwd_test::same_bits(d_w, want.d_w)) << "d_topk_weights: bits differ from EP 1";
  const DeviceBuffer<float>* routed[3] = {&all.g, &all.u, &all.d};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(bwd_test::bytes_of(*routed[i]), want.bits[3 + i])
        << kGradNames[3 + i] << ": bits differ from EP 1";
  // The shared experts' gradients: per-rank partials, summed here (another FP32 summation order
  // than EP 1's single sum: rounding apart, ~1e-7).
  if (rc.shared_width() == 0) return;
  for (int i = 0; i < 3; ++i) {
    std::vector<double> sum(want.w[i].size(), 0.0);
    for (int r = 0; r < ranks; ++r) {
      const DeviceBuffer<float>* parts[3] = {&own[size_t(r)]->sg, &own[size_t(r)]->su,
                                             &own[size_t(r)]->sd};
      const std::vector<float> part = parts[i]->to_host();
      ASSERT_EQ(part.size(), sum.size());
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += double(part[j]);
    }
    const double err = mok::relative_l2_error(sum, want.w[i]);
    EXPECT_LT(err, 1e-5) << kGradNames[i] << ": the ranks' partials sum to " << err
                         << " (relative L2) from EP 1";
  }
}

// The weight-gradient modes and the staged backward: BF16 gradients are the FP32 ones rounded (the
// same tiles, staged through shared memory and stored by TMA, the mainloop holding its last
// stages); the staged backward (one launch per tile kind) gives the same bits; accumulating adds
// to the caller's buffers and leaves `empty_expert` (which must have no rows) as it was.
template <class Experts>
void expect_weight_gradient_modes(const mok::Config& c, const mok::LayerParams& p,
                                  const mok::Batch& b, const std::vector<double>& d_out,
                                  int block_n, int empty_expert) {
  const HostGrads first = run_quantized<Experts>(c, p, b, d_out, block_n);
  mok::gpu::detail::ForwardHooks staged;
  staged.staged_backward = 3;
  const HostGrads staged_run = run_quantized<Experts>(c, p, b, d_out, block_n, staged);
  for (int i = 0; i < 7; ++i)
    ASSERT_EQ(staged_run.bits[i], first.bits[i]) << "staged, output " << i;

  const HostGrads half =
      run_quantized<Experts>(c, p, b, d_out, block_n, {}, WeightGrads::write_bf16);
  EXPECT_EQ(half.bits[6], first.bits[6]) << "d_x and d_topk_weights";
  for (int i = 0; i < 6; ++i)
    for (size_t j = 0; j < first.w[i].size(); ++j)
      ASSERT_EQ(half.w[i][j], double(mok::fmt::round_to_bf16(float(first.w[i][j]))))
          << kGradNames[i] << " at " << j;

  // Accumulating into buffers that hold the gradients (the empty expert's: a marker).
  const float marker = 12.5f;
  const size_t per_expert = size_t(c.intermediate) * size_t(c.hidden), empty = size_t(empty_expert);
  std::vector<std::vector<uint8_t>> init;
  for (int i = 0; i < 6; ++i) {
    init.push_back(first.bits[i]);
    if (i >= 3)
      for (size_t j = 0; j < per_expert; ++j)
        std::memcpy(&init.back()[4 * (empty * per_expert + j)], &marker, 4);
  }
  const HostGrads acc =
      run_quantized<Experts>(c, p, b, d_out, block_n, {}, WeightGrads::accumulate_fp32, init);
  EXPECT_EQ(acc.bits[6], first.bits[6]) << "d_x and d_topk_weights";
  for (int i = 0; i < 6; ++i)
    for (size_t j = 0; j < first.w[i].size(); ++j) {
      const bool untouched = i >= 3 && j / per_expert == empty;
      ASSERT_EQ(acc.w[i][j], untouched ? double(marker) : 2.0 * first.w[i][j])
          << kGradNames[i] << " at " << j;
    }
}

// A backward case on odd shapes and routings (case_batch's `routing` and `zero_weights`).
struct BackwardCase {
  mok::Config c;
  int64_t tokens;
  int routing;        // 0 random, 1 expert 3 gets no rows, 2 every token to experts 1 and 4
  bool zero_weights;  // every 7th token's second router weight exactly 0
  const char* name;
};

// Each case's backward (128-wide tiles; its inputs drawn from seed + i, + 10 + i, + 20 + i)
// within `bound` of the `quant` reference, and its d_x further than `far` from the BF16 layer's
// reference: the operands really are quantized (the callers derive both bounds).
template <class Experts>
void expect_cases_match_quantized_reference(const std::vector<BackwardCase>& cases, uint64_t seed,
                                            mok::OperandQuant quant, double bound, double far) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const BackwardCase& k = cases[i];
    SCOPED_TRACE(k.name);
    const mok::LayerParams p = mok::tools::random_params(k.c, seed + i);
    const mok::Batch b = case_batch(k.c, k.tokens, seed + 10 + i, k.routing, k.zero_weights);
    const std::vector<double> d_out =
        mok::tools::random_vector(size_t(k.tokens * k.c.hidden), seed + 20 + i, 0.5);
    const HostGrads got = run_quantized<Experts>(k.c, p, b, d_out, 128);
    expect_matches_quantized_reference(k.c, p, b, d_out, got, k.name, quant, bound);
    mok::ReferenceOptions o;
    o.quant = mok::OperandQuant::bf16;
    const mok::ReferenceForward bf16 = mok::reference_forward(k.c, p, b, o);
    const double distance =
        mok::relative_l2_error(got.d_x, mok::reference_backward(bf16.context, d_out).d_x);
    std::printf("[ %s backward ] %s: d_x against the BF16 layer %.2e\n",
                mok::precision_name(k.c.precision), k.name, distance);
    EXPECT_GT(distance, far) << "d_x is as close to the BF16 layer's as to the quantized one's";
  }
}

// The backward of `global` (128-wide tiles; an expert without rows, some router weights 0; its
// inputs drawn from seed + 1 to + 3): its bits again under dispatch delays (5 runs) and at
// emulated EP 2 and 4.
template <class Experts>
void expect_bits_repeat_under_delays_and_across_ep_sizes(const mok::Config& global, uint64_t seed) {
  const int64_t total = global.max_tokens_per_rank;
  const mok::LayerParams p = mok::tools::random_params(global, seed + 1);
  mok::Batch b = mok::tools::random_batch(global, total, seed + 2);
  drop_expert(b, global.top_k, 5);  // an expert without rows (rank 2's of four)
  for (int64_t t = 3; t < b.tokens; t += 11) b.topk_weights[size_t(t * global.top_k)] = 0.0;
  const std::vector<double> d_out =
      mok::tools::random_vector(size_t(total * global.hidden), seed + 3, 0.5);
  const HostGrads want = run_quantized<Experts>(global, p, b, d_out, 128);
  for (const double v : want.d_x) ASSERT_FALSE(std::isnan(v)) << "d_x unwritten";
  mok::gpu::detail::ForwardHooks delays;
  delays.dispatch_delay_ns = 20'000;
  for (int run = 0; run < 5; ++run) {
    delays.delay_seed = uint32_t(run + 1);
    const HostGrads again = run_quantized<Experts>(global, p, b, d_out, 128, delays);
    ASSERT_TRUE(fwd_test::same_bits(again.out, want.out)) << "delayed run " << run << ", forward";
    for (int i = 0; i < 7; ++i)
      ASSERT_EQ(again.bits[i], want.bits[i]) << "delayed run " << run << ", output " << i;
  }
  for (int ranks : {2, 4}) {
    SCOPED_TRACE("EP " + std::to_string(ranks));
    expect_ep_equals_ep1<Experts>(global, p, b, d_out, 128, ranks, want);
  }
}

// expect_weight_gradient_modes on inputs drawn from seed, + 1, + 2 (c.max_tokens_per_rank
// tokens), `empty_expert` rerouted to have no rows, 128-wide tiles.
template <class Experts>
void expect_weight_gradient_modes(const mok::Config& c, uint64_t seed, int empty_expert) {
  const int64_t T = c.max_tokens_per_rank;
  const mok::LayerParams p = mok::tools::random_params(c, seed);
  mok::Batch b = mok::tools::random_batch(c, T, seed + 1);
  drop_expert(b, c.top_k, empty_expert);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(T * c.hidden), seed + 2, 0.5);
  expect_weight_gradient_modes<Experts>(c, p, b, d_out, 128, empty_expert);
}

// expect_non_finite_inputs_stay_in_their_tokens (one_gpu_backward.hpp) on c's quantized step
// (inputs drawn from seed, + 1, + 2; 128-wide tiles): an Inf in a routed expert's BF16 weights
// reaches its tokens through the quantizer, which makes its block NaN.
template <class Experts>
void expect_non_finite_inputs_stay_in_their_tokens(const mok::Config& c, uint64_t seed) {
  const int64_t T = c.max_tokens_per_rank;
  const mok::LayerParams p = mok::tools::random_params(c, seed);
  const mok::Batch b = mok::tools::random_batch(c, T, seed + 1);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(T * c.hidden), seed + 2, 0.5);
  one_gpu::expect_non_finite_inputs_stay_in_their_tokens(
      c, p, b, d_out,
      [](const mok::Config& c2, const mok::LayerParams& p2, const mok::Batch& b2,
         const std::vector<double>& d2) { return run_quantized<Experts>(c2, p2, b2, d2, 128); });
}

// After a step's forward and backward have finished: every output written (the poison gone).
inline void expect_every_gradient_written(const Step& step) {
  const HostGrads g = step.host(WeightGrads::write_fp32);
  for (const double v : g.d_x) ASSERT_FALSE(std::isnan(v)) << "d_x unwritten";
  for (const double v : g.d_w) ASSERT_FALSE(std::isnan(v)) << "d_topk_weights unwritten";
  for (int i = 0; i < 6; ++i)
    for (const double v : g.w[i]) ASSERT_FALSE(std::isnan(v)) << kGradNames[i] << " unwritten";
}

}  // namespace quant_bwd
