// The backward of an expert-parallel group emulated on one GPU (EmulatedEpBackward: ep_size
// logical ranks in one launch) against the single-GPU backward on the same global batch, bit for
// bit: d_x, d_topk_weights and every routed expert's weight gradients (the ranks' local experts,
// side by side, form the single GPU's tensors), for random, uneven (an empty rank), all-to-one-
// rank and all-to-one-expert routings and with injected dispatch delays (also recomputing g | u);
// the shared experts' gradients equal the single-GPU backward of each rank's own tokens (per-rank
// partials). A rank whose dispatch stops ends in an error naming it; bad calls are refused. The
// timeline (`mok trace --ep --direction backward`) records every rank and changes no bit.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backward_test_util.hpp"
#include "kernels/moe_backward/backward_trace.hpp"
#include "layer/backward_runner.hpp"
#include "mok/gpu/emulated_ep_backward.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/moe_backward.hpp"

using namespace ep_test;
using namespace bwd_test;
using mok::gpu::WeightGrads;

namespace {

// The group's forward and backward on one global batch, every rank reaching its slices.
struct Group {
  mok::Config c;
  int ranks, El;
  GpuLayer layer;
  std::vector<mok::gpu::DeviceBatch> batches;
  std::vector<mok::gpu::DeviceLayerWeights> weights;
  std::vector<__nv_bfloat16*> outs;
  std::vector<const __nv_bfloat16*> d_outs;
  std::vector<std::unique_ptr<mok::gpu::Schedule>> owned_s;
  std::vector<std::unique_ptr<mok::gpu::ForwardContext>> owned_ctx;
  std::vector<mok::gpu::Schedule*> s;
  std::vector<const mok::gpu::ForwardContext*> ctx;

  Group(const GlobalBatch& g, int ranks_, const EpCase& k, const DeviceBuffer<uint16_t>& x,
        const DeviceBuffer<int32_t>& ids, const DeviceBuffer<float>& w,
        const DeviceBuffer<uint16_t>& d_out, DeviceBuffer<uint16_t>& out,
        mok::gpu::GateUpMode gate_up = mok::gpu::GateUpMode::keep)
      : c(rank_config(g, ranks_, k)), ranks(ranks_), El(c.num_experts / ranks_), layer(g.params) {
    const int64_t H = c.hidden, I = c.intermediate, K = c.top_k;
    const mok::gpu::DeviceLayerWeights all = layer.weights();
    for (int r = 0; r < ranks; ++r) {
      const int64_t first = g.first[size_t(r)], t = k.tokens[size_t(r)];
      batches.push_back({t, reinterpret_cast<const __nv_bfloat16*>(x.ptr) + first * H,
                         ids.ptr + first * K, w.ptr + first * K});
      mok::gpu::DeviceLayerWeights lw = all;
      lw.gate = all.gate + int64_t(r) * El * I * H;
      lw.up = all.up + int64_t(r) * El * I * H;
      lw.down = all.down + int64_t(r) * El * H * I;
      weights.push_back(lw);
      outs.push_back(reinterpret_cast<__nv_bfloat16*>(out.ptr) + first * H);
      d_outs.push_back(reinterpret_cast<const __nv_bfloat16*>(d_out.ptr) + first * H);
      owned_s.push_back(std::make_unique<mok::gpu::Schedule>(c));
      owned_ctx.push_back(std::make_unique<mok::gpu::ForwardContext>(c, gate_up));
      s.push_back(owned_s.back().get());
      ctx.push_back(owned_ctx.back().get());
    }
  }
  void forward(mok::gpu::EmulatedEpForward& f) {
    f.schedule(batches, s, nullptr);
    f.forward(s, batches, weights, outs, ctx, nullptr);
  }
};

// The group's timeline: each rank's GEMM roles, dispatch and combine under its own rank, its
// combine warps' tokens adding up to its batch.
void expect_timeline_of_every_rank(const mok::gpu::EmulatedEpBackward& bw, const EpCase& k) {
  const int ranks = int(k.tokens.size());
  int64_t claimed = 0;
  const auto events = bw.runner().trace(nullptr, &claimed);
  ASSERT_EQ(int64_t(events.size()), claimed);
  const size_t n = static_cast<size_t>(ranks);
  std::vector<std::vector<int64_t>> per_role(n, std::vector<int64_t>(mok::kern::kTraceRoles));
  std::vector<int64_t> tokens(n);
  for (const auto& e : events) {
    ASSERT_GE(e.rank, 0);
    ASSERT_LT(e.rank, ranks);
    ASSERT_GE(e.role, 0);
    ASSERT_LT(e.role, int(mok::kern::kTraceRoles));
    ASSERT_LE(e.start_ns, e.end_ns);
    ++per_role[size_t(e.rank)][size_t(e.role)];
    if (e.role == mok::kern::kTraceCombine) tokens[size_t(e.rank)] += e.what;
  }
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (int role : {int(mok::kern::kTraceProducer), int(mok::kern::kTraceConsumer0),
                     int(mok::kern::kTraceDispatch), int(mok::kern::kTraceStore)})
      EXPECT_GT(per_role[size_t(r)][size_t(role)], 0) << "role " << role;
    EXPECT_EQ(tokens[size_t(r)], k.tokens[size_t(r)]);
  }
}

// One case: the group's outputs against the single GPU's, bit for bit. trace: the backward on the
// timeline's kernels, whose events are then checked per rank.
void expect_group_equals_ep1(int ranks, const EpCase& k, WeightGrads mode = WeightGrads::write_fp32,
                             mok::gpu::GateUpMode gate_up = mok::gpu::GateUpMode::keep,
                             bool trace = false) {
  const GlobalBatch g = make_global_batch(ranks, k);
  const mok::Batch& b = g.batch;
  const int64_t total = g.total, H = g.global.hidden;
  DeviceBuffer<uint16_t> x(to_bf16(b.x)), out(size_t(std::max<int64_t>(total * H, 1)), 0xFF),
      d_out(to_bf16(mok::tools::random_vector(size_t(std::max<int64_t>(total * H, 1)), 81, 0.5)));
  DeviceBuffer<int32_t> ids(b.topk_ids);
  DeviceBuffer<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
  const std::vector<std::vector<uint8_t>> want = ep1_backward(g, x, ids, w, d_out, 0, total, mode);

  Group group(g, ranks, k, x, ids, w, d_out, out, gate_up);
  const mok::Config& c = group.c;
  mok::gpu::EmulatedEpForward f(c, case_options(k), case_hooks(k));
  mok::gpu::BackwardOptions o;
  o.weight_grads = mode;
  o.gate_up = gate_up;
  mok::gpu::detail::ForwardHooks hooks = case_hooks(k);
  if (trace) {
    hooks.trace_events = 1 << 16;
    hooks.backward_kernels = &mok::kern::trace_backward_kernels();
  }
  mok::gpu::EmulatedEpBackward bw(c, o, hooks);
  EXPECT_EQ(bw.ranks(), ranks);
  // Routed gradients and d_x / d_w: slices of global buffers; shared ones: each rank its own.
  Grads global(c, total, c.num_experts);
  std::vector<std::unique_ptr<Grads>> own;
  std::vector<mok::gpu::DeviceGradients> grads;
  for (int r = 0; r < ranks; ++r) {
    own.push_back(std::make_unique<Grads>(c, 0, 0));
    mok::gpu::DeviceGradients gr = global.at(c, g.first[size_t(r)], int64_t(r) * group.El, mode);
    gr.shared_gate = own.back()->sg.ptr;
    gr.shared_up = own.back()->su.ptr;
    gr.shared_down = own.back()->sd.ptr;
    grads.push_back(gr);
  }
  group.forward(f);
  bw.backward(group.s, group.ctx, group.batches, group.weights, group.d_outs, grads, nullptr);
  f.check(nullptr);
  bw.check(nullptr);
  const std::vector<uint8_t> got[] = {bytes_of(global.d_x, 0, size_t(total * H)),
                                      bytes_of(global.d_w, 0, size_t(total * c.top_k)),
                                      {},
                                      {},
                                      {},
                                      bytes_of(global.g),
                                      bytes_of(global.u),
                                      bytes_of(global.d)};
  for (int i : {0, 1, 5, 6, 7}) {
    ASSERT_EQ(got[i].size(), want[size_t(i)].size()) << kNames[i];
    EXPECT_EQ(std::memcmp(got[i].data(), want[size_t(i)].data(), got[i].size()), 0)
        << kNames[i] << ": bits differ from the single-GPU backward";
  }
  if (trace) expect_timeline_of_every_rank(bw, k);
  // The shared experts' gradients: rank r's partial = the single GPU's on rank r's tokens.
  if (c.shared_width() == 0) return;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<std::vector<uint8_t>> mine =
        ep1_backward(g, x, ids, w, d_out, g.first[size_t(r)], k.tokens[size_t(r)], mode);
    const DeviceBuffer<float>* parts[3] = {&own[size_t(r)]->sg, &own[size_t(r)]->su,
                                           &own[size_t(r)]->sd};
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(bytes_of(*parts[i]), mine[size_t(2 + i)])
          << "rank " << r << ", " << kNames[2 + i] << ": bits differ from its tokens' backward";
  }
}

// Random, uneven with an empty rank, all to rank 0, all to one expert, dispatch delays (the
// backward's ring holds the whole batch: ring sizes and row paths are the forward's).
void expect_every_case(int ranks) {
  const std::vector<EpCase> all = standard_cases(ranks);
  for (size_t i : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5)}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks) + ", case " + std::to_string(i));
    expect_group_equals_ep1(ranks, all[i]);
  }
  SCOPED_TRACE("ranks " + std::to_string(ranks) + ", BF16 weight gradients");
  expect_group_equals_ep1(ranks, all[0], WeightGrads::write_bf16);
  SCOPED_TRACE("ranks " + std::to_string(ranks) + ", recomputing g | u, uneven, delays");
  expect_group_equals_ep1(ranks, all[1], WeightGrads::write_fp32, mok::gpu::GateUpMode::recompute);
  expect_group_equals_ep1(ranks, all[5], WeightGrads::write_fp32, mok::gpu::GateUpMode::recompute);
}

}  // namespace

// One test per group size (the sanitizers run the two-rank one).
TEST(EmulatedEpBackwardGpu, TimelineRecordsEveryRankAndChangesNoBit) {
  MOK_REQUIRE_GPU();
  for (int ranks : {2, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    expect_group_equals_ep1(ranks, standard_cases(ranks)[0], WeightGrads::write_bf16,
                            mok::gpu::GateUpMode::keep, true);
  }
}

TEST(EmulatedEpBackwardGpu, TwoRanksEqualTheSingleGpuBackwardBitForBit) {
  MOK_REQUIRE_GPU();
  expect_every_case(2);
}
TEST(EmulatedEpBackwardGpu, FourRanksEqualTheSingleGpuBackwardBitForBit) {
  MOK_REQUIRE_GPU();
  expect_every_case(4);
}
TEST(EmulatedEpBackwardGpu, EightRanksEqualTheSingleGpuBackwardBitForBit) {
  MOK_REQUIRE_GPU();
  expect_every_case(8);
}

TEST(EmulatedEpBackwardGpu, AStoppedRankIsAnErrorNamingItAndBadCallsAreRefused) {
  MOK_REQUIRE_GPU();
  const int ranks = 4;
  const EpCase k{std::vector<int64_t>(size_t(ranks), 100)};
  const GlobalBatch g = make_global_batch(ranks, k);
  const int64_t H = g.global.hidden;
  DeviceBuffer<uint16_t> x(to_bf16(g.batch.x)), out(size_t(g.total * H), 0xFF),
      d_out(to_bf16(mok::tools::random_vector(size_t(g.total * H), 82, 0.5)));
  DeviceBuffer<int32_t> ids(g.batch.topk_ids);
  DeviceBuffer<float> w(
      std::vector<float>(g.batch.topk_weights.begin(), g.batch.topk_weights.end()));
  Group group(g, ranks, k, x, ids, w, d_out, out);
  const mok::Config& c = group.c;
  Grads global(c, g.total, c.num_experts);
  std::vector<std::unique_ptr<Grads>> own;
  std::vector<mok::gpu::DeviceGradients> grads;
  for (int r = 0; r < ranks; ++r) {
    own.push_back(std::make_unique<Grads>(c, 0, 0));
    mok::gpu::DeviceGradients gr = global.at(c, g.first[size_t(r)], int64_t(r) * group.El);
    gr.shared_gate = own.back()->sg.ptr;
    gr.shared_up = own.back()->su.ptr;
    gr.shared_down = own.back()->sd.ptr;
    grads.push_back(gr);
  }
  mok::gpu::EmulatedEpForward f(c);
  group.forward(f);
  f.check(nullptr);
  mok::gpu::BackwardOptions o;
  o.wait_seconds = 0.25;
  auto expect_error = [](auto&& call, mok::ErrorCode code, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  // The routed gradients and d_x / d_w of a backward of a group built now, poisoned first.
  auto backward_bits = [&]() -> std::vector<std::vector<uint8_t>> {
    for (DeviceBuffer<float>* b : {&global.d_w, &global.g, &global.u, &global.d})
      EXPECT_EQ(cudaMemset(b->ptr, 0xFF, b->n * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(global.d_x.ptr, 0xFF, global.d_x.n * sizeof(uint16_t)), cudaSuccess);
    mok::gpu::EmulatedEpBackward fresh(c, o);
    fresh.backward(group.s, group.ctx, group.batches, group.weights, group.d_outs, grads, nullptr);
    fresh.check(nullptr);
    return {bytes_of(global.d_x), bytes_of(global.d_w), bytes_of(global.g), bytes_of(global.u),
            bytes_of(global.d)};
  };
  const std::vector<std::vector<uint8_t>> healthy = backward_bits();
  for (size_t b = 0; b < healthy.size(); ++b) {  // every element written: no all-0xFF poison
    const size_t width = b == 0 ? 2 : 4;         // d_x is BF16, the rest FP32
    for (size_t i = 0; i + width <= healthy[b].size(); i += width)
      ASSERT_FALSE(std::all_of(healthy[b].begin() + std::ptrdiff_t(i),
                               healthy[b].begin() + std::ptrdiff_t(i + width),
                               [](uint8_t v) { return v == 0xFF; }))
          << "buffer " << b << " unwritten at byte " << i;
  }
  {
    mok::gpu::detail::ForwardHooks stuck;
    stuck.never_publish_block = 0;  // rank 2 never publishes its first routed row block
    stuck.stuck_rank = 2;
    mok::gpu::EmulatedEpBackward bw(c, o, stuck);
    bw.backward(group.s, group.ctx, group.batches, group.weights, group.d_outs, grads, nullptr);
    expect_error([&] { bw.check(nullptr); }, mok::ErrorCode::peer_timeout,
                 "rank 2: the backward stopped: a dgrad-down producer (or a recompute one) "
                 "waiting for the dispatched d_out and x rows (recomputing: for g | u; shared "
                 "experts: of token block) of row block 0");
  }
  // Torn down after the fault and rebuilt in the same process, from the same forward contexts:
  // the healthy bits.
  EXPECT_TRUE(backward_bits() == healthy) << "the rebuilt group's gradients differ";
  mok::gpu::EmulatedEpBackward bw(c, o);
  expect_error(
      [&] {
        bw.backward(group.s, group.ctx, group.batches, group.weights, {group.d_outs[0]}, grads,
                    nullptr);
      },
      mok::ErrorCode::invalid_argument, "d_outs: one per rank (4), got 1");
  std::vector<mok::gpu::DeviceGradients> same = grads;
  same[3].shared_up = same[1].shared_up;
  expect_error(
      [&] {
        bw.backward(group.s, group.ctx, group.batches, group.weights, group.d_outs, same, nullptr);
      },
      mok::ErrorCode::invalid_argument,
      "rank 3's shared up gradient overlaps rank 1's shared up gradient");
  std::vector<const mok::gpu::ForwardContext*> swapped = group.ctx;
  std::swap(swapped[0], swapped[1]);
  expect_error(
      [&] {
        bw.backward(group.s, swapped, group.batches, group.weights, group.d_outs, grads, nullptr);
      },
      mok::ErrorCode::invalid_argument,
      "EmulatedEpBackward::backward (rank 0): no training forward of this schedule");
  mok::Config one = c;
  one.ep_size = 1;
  expect_error([&] { mok::gpu::EmulatedEpBackward bad(one); }, mok::ErrorCode::unsupported,
               "EmulatedEpBackward runs ep_size 2, 4 or 8 logical ranks, got 1");
  expect_error([&] { mok::gpu::MoeBackward bad(c); }, mok::ErrorCode::unsupported,
               "MoeBackward runs one GPU (ep_size = 1), got ep_size = 4");
}
