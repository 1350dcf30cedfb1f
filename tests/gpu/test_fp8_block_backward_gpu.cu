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

#include "backward_test_util.hpp"
#include "mok/gpu/emulated_ep_backward.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/fp8_block_experts.hpp"
#include "one_gpu_backward.hpp"

namespace {

using namespace one_gpu;
using mok::gpu::Fp8BlockExperts;

mok::Config fp8_config(int H, int I, int E, int K, int shared, int shared_intermediate,
                       int max_tokens) {
  mok::Config c;
  c.hidden = H;
  c.intermediate = I;
  c.num_experts = E;
  c.top_k = K;
  c.num_shared_experts = shared;
  c.shared_intermediate = shared > 0 ? shared_intermediate : 0;
  c.max_tokens_per_rank = max_tokens;
  c.precision = mok::Precision::fp8_block;
  return c;
}

// Rank r's (of `ranks`) routed experts quantized from `layer`'s BF16 weights, with the backward's
// transposed copies when `backward`, and the rank's weights pointing at them.
struct QuantizedExperts {
  std::unique_ptr<Fp8BlockExperts> experts;
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
    experts = std::make_unique<Fp8BlockExperts>(rc, backward);
    experts->quantize(w, nullptr);
    w = experts->with(w);
  }
};

mok::Config ue8m0(mok::Config c) {  // every fp8_block scale a power of two
  c.fp8_ue8m0 = true;
  return c;
}

// Reroutes every slot of `expert` to an expert its token does not use yet: `expert` gets no rows.
void drop_expert(mok::Batch& b, int K, int32_t expert) {
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

// One fp8_block forward (into a context) and backward on one GPU, every output poisoned first
// (Step: 0xFF bytes, NaN in BF16 and FP32), or the weight gradients' buffers holding `init`
// (accumulate_fp32).
HostGrads run_fp8(const mok::Config& c, const mok::LayerParams& p, const mok::Batch& b,
                  const std::vector<double>& d_out, int block_n,
                  const mok::gpu::detail::ForwardHooks& hooks = {},
                  WeightGrads mode = WeightGrads::write_fp32,
                  const std::vector<std::vector<uint8_t>>& init = {}) {
  Step step(c, p, b, d_out, mode);
  for (size_t i = 0; i < init.size(); ++i)
    EXPECT_EQ(cudaMemcpy(step.grads[i].ptr, init[i].data(), init[i].size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  const QuantizedExperts q(c, step.layer);
  mok::gpu::MoeForward f(c, {}, hooks);
  mok::gpu::BackwardOptions o;
  o.block_n = block_n;
  o.weight_grads = mode;
  mok::gpu::MoeBackward bw(c, o, hooks);
  EXPECT_EQ(bw.block_n(), block_n);
  mok::gpu::Schedule s(c);
  mok::gpu::ForwardContext ctx(c);
  EXPECT_EQ(ctx.precision(), mok::Precision::fp8_block);
  EXPECT_EQ(ctx.act(), nullptr);
  EXPECT_NE(ctx.act_e4m3(), nullptr);
  EXPECT_NE(ctx.act_scales(), nullptr);
  f.schedule(step.batch(), s, nullptr);
  f.forward(s, step.batch(), q.w, reinterpret_cast<__nv_bfloat16*>(step.out.ptr), &ctx, nullptr);
  bw.backward(s, ctx, step.batch(), q.w, bf(step.d_out), step.gradients(), nullptr);
  f.check(nullptr);
  bw.check(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> out = from_bf16(step.out.to_host());
  EXPECT_EQ(std::count_if(out.begin(), out.end(), [](double v) { return std::isnan(v); }), 0)
      << "the training forward left outputs unwritten";
  return step.host(mode);
}

// Every output written (no NaN poison left), experts without rows exact zeros, and each gradient
// within 1e-2 (relative L2) of the fp8_block quantized reference. The bound: both sides multiply
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
  mok::ReferenceOptions o;
  o.numerics = mok::Numerics::fp32;
  o.quant = mok::OperandQuant::fp8_block;
  o.fp8_ue8m0 = c.fp8_ue8m0;
  const mok::ReferenceForward fwd = mok::reference_forward(c, p, b, o);
  const mok::LayerGradients want = mok::reference_backward(fwd.context, d_out);
  const double bound = 1e-2;
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
  std::printf("[ fp8_block backward ] %s:%s\n", label.c_str(), errors.c_str());
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
  std::vector<std::unique_ptr<QuantizedExperts>> experts;
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
    experts.push_back(std::make_unique<QuantizedExperts>(global, layer, r, ranks));
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
    mok::Batch b = mok::tools::random_batch(k.c, k.tokens, 310 + i);
    const int K = k.c.top_k;
    if (k.routing == 1) drop_expert(b, K, 3);
    if (k.routing == 2)
      for (int64_t t = 0; t < b.tokens; ++t) {
        b.topk_ids[size_t(t * K)] = 1;
        b.topk_ids[size_t(t * K + 1)] = 4;
      }
    if (k.zero_weights)
      for (int64_t t = 0; t < b.tokens; t += 7) b.topk_weights[size_t(t * K + 1)] = 0.0;
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
      expect_ep_equals_ep1(global, p, b, d_out, block_n, ranks, want);
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
  const QuantizedExperts full(c, step.layer), forward_only(c, step.layer, 0, 1, false);
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

// The weight-gradient modes and the staged backward on the fp8_block kernels: BF16 gradients are
// the FP32 ones rounded (the same tiles, staged through shared memory and stored by TMA, the
// mainloop holding its last stages); the staged backward (one launch per tile kind) gives the
// same bits; accumulating adds to the caller's buffers and leaves an expert without rows as it was.
TEST(Fp8BlockBackwardGpu, WeightGradientModesAndTheStagedBackward) {
  MOK_REQUIRE_GPU();
  const mok::Config c = fp8_config(256, 512, 8, 2, 1, 256, 300);
  const mok::LayerParams p = mok::tools::random_params(c, 601);
  mok::Batch b = mok::tools::random_batch(c, 300, 602);
  drop_expert(b, c.top_k, 6);
  const std::vector<double> d_out = mok::tools::random_vector(size_t(300 * c.hidden), 603, 0.5);
  for (int block_n : {128, 256}) {
    SCOPED_TRACE("block_n " + std::to_string(block_n));
    const HostGrads first = run_fp8(c, p, b, d_out, block_n);
    mok::gpu::detail::ForwardHooks staged;
    staged.staged_backward = 3;
    const HostGrads staged_run = run_fp8(c, p, b, d_out, block_n, staged);
    for (int i = 0; i < 7; ++i)
      ASSERT_EQ(staged_run.bits[i], first.bits[i]) << "staged, output " << i;

    const HostGrads half = run_fp8(c, p, b, d_out, block_n, {}, WeightGrads::write_bf16);
    EXPECT_EQ(half.bits[6], first.bits[6]) << "d_x and d_topk_weights";
    for (int i = 0; i < 6; ++i)
      for (size_t j = 0; j < first.w[i].size(); ++j)
        ASSERT_EQ(half.w[i][j], double(mok::fmt::round_to_bf16(float(first.w[i][j]))))
            << kGradNames[i] << " at " << j;

    // Accumulating into buffers that hold the gradients (expert 6, without rows: a marker).
    const float marker = 12.5f;
    const size_t per_expert = size_t(c.intermediate) * size_t(c.hidden);
    std::vector<std::vector<uint8_t>> init;
    for (int i = 0; i < 6; ++i) {
      init.push_back(first.bits[i]);
      if (i >= 3)
        for (size_t j = 0; j < per_expert; ++j)
          std::memcpy(&init.back()[4 * (6 * per_expert + j)], &marker, 4);
    }
    const HostGrads acc = run_fp8(c, p, b, d_out, block_n, {}, WeightGrads::accumulate_fp32, init);
    EXPECT_EQ(acc.bits[6], first.bits[6]) << "d_x and d_topk_weights";
    for (int i = 0; i < 6; ++i)
      for (size_t j = 0; j < first.w[i].size(); ++j) {
        const bool untouched = i >= 3 && j / per_expert == 6;
        ASSERT_EQ(acc.w[i][j], untouched ? double(marker) : 2.0 * first.w[i][j])
            << kGradNames[i] << " at " << j;
      }
  }
}
