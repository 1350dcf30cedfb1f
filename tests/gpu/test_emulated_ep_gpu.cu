// Expert parallelism emulated on one GPU (ep_size logical ranks in one megakernel launch): every
// rank's output equals the EP = 1 megakernel's rows for its tokens on the same global batch, bit
// for bit, for random, skewed and empty routings, rings smaller than the batch and random dispatch
// delays; capacity overflow on one owner fails every rank; a rank that stops in dispatch or
// before the combine ends in an error naming it, not a hang, and a group rebuilt after it
// computes the healthy bits; the timeline (`mok trace --ep`) records every rank and changes no bit.
#include <algorithm>

#include "ep_test_util.hpp"
#include "kernels/moe_forward/forward_probes.hpp"
#include "layer/layer_runner.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/moe_forward.hpp"

using namespace ep_test;

namespace {

// Runs the global batch at EP = 1 and split over the ranks; expects every rank's rows bitwise
// equal (the EP = 1 output itself is checked against the CPU reference). training: through
// caller-owned schedules, with a ForwardContext per rank. trace: on the timeline's kernels, whose
// events are then checked per rank (each rank's roles under its own rank, its tokens combined).
void expect_ep_equals_ep1(int ranks, const EpCase& k, bool training = false, bool trace = false) {
  const GlobalBatch g = make_global_batch(ranks, k);
  const std::vector<double> want = ep1_output(g);
  const mok::Config c = rank_config(g, ranks, k);
  const mok::Batch& b = g.batch;
  const int64_t total = g.total;
  const int El = c.num_experts / ranks;
  const GpuLayer layer(g.params);
  const mok::gpu::ForwardOptions o = case_options(k);
  mok::gpu::detail::ForwardHooks hooks = case_hooks(k);
  if (trace) {
    hooks.trace_events = 1 << 16;
    hooks.kernels = &mok::kern::probe_forward_kernels();
  }
  mok::gpu::EmulatedEpForward ep(c, o, hooks);
  const int64_t H = c.hidden, I = c.intermediate;
  const mok::gpu::DeviceLayerWeights all = layer.weights();
  DeviceBuffer<uint16_t> x(to_bf16(b.x));
  DeviceBuffer<int32_t> ids(b.topk_ids);
  std::vector<float> wf(b.topk_weights.begin(), b.topk_weights.end());
  DeviceBuffer<float> w(wf);
  DeviceBuffer<uint16_t> out(size_t(std::max<int64_t>(total * H, 1)), 0xFF);
  std::vector<mok::gpu::DeviceBatch> batches;
  std::vector<mok::gpu::DeviceLayerWeights> weights;
  std::vector<__nv_bfloat16*> outs;
  int64_t first = 0;
  auto* xb = reinterpret_cast<const __nv_bfloat16*>(x.ptr);
  for (int r = 0; r < ranks; ++r) {
    const int64_t t = k.tokens[size_t(r)];
    batches.push_back({t, xb + first * H, ids.ptr + first * c.top_k, w.ptr + first * c.top_k});
    mok::gpu::DeviceLayerWeights lw = all;
    lw.gate = all.gate + int64_t(r) * El * I * H;
    lw.up = all.up + int64_t(r) * El * I * H;
    lw.down = all.down + int64_t(r) * El * H * I;
    weights.push_back(lw);
    outs.push_back(reinterpret_cast<__nv_bfloat16*>(out.ptr) + first * H);
    first += t;
  }
  std::vector<std::unique_ptr<mok::gpu::Schedule>> schedules;
  std::vector<std::unique_ptr<mok::gpu::ForwardContext>> contexts;
  std::vector<mok::gpu::Schedule*> s;
  std::vector<const mok::gpu::ForwardContext*> ctx;
  if (training) {
    for (int r = 0; r < ranks; ++r) {
      schedules.push_back(std::make_unique<mok::gpu::Schedule>(c));
      contexts.push_back(std::make_unique<mok::gpu::ForwardContext>(c));
      s.push_back(schedules.back().get());
      ctx.push_back(contexts.back().get());
    }
    ep.schedule(batches, s, nullptr);
    ep.forward(s, batches, weights, outs, ctx, nullptr);
  } else {
    ep.forward(batches, weights, outs, nullptr);
  }
  ep.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> got;
  for (uint16_t v : out.to_host()) got.push_back(mok::fmt::bf16_to_float(v));
  got.resize(size_t(total * H));
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)), 0);
  if (!trace) return;
  int64_t claimed = 0;
  const auto events = ep.runner().trace(nullptr, &claimed);
  ASSERT_EQ(int64_t(events.size()), claimed);
  const size_t n = static_cast<size_t>(ranks);
  std::vector<int64_t> producers(n), consumers(n), tokens(n);
  for (const auto& e : events) {
    ASSERT_GE(e.rank, 0);
    ASSERT_LT(e.rank, ranks);
    ASSERT_LE(e.start_ns, e.end_ns);
    if (e.role == mok::kern::kTraceProducer) ++producers[size_t(e.rank)];
    if (e.role == mok::kern::kTraceConsumer0 || e.role == mok::kern::kTraceConsumer1)
      ++consumers[size_t(e.rank)];
    if (e.role == mok::kern::kTraceCombine) tokens[size_t(e.rank)] += e.what;
  }
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_GT(producers[size_t(r)], 0);  // every rank owns experts: its shared tiles at least
    EXPECT_GT(consumers[size_t(r)], 0);
    EXPECT_EQ(tokens[size_t(r)], k.tokens[size_t(r)]);
  }
}

}  // namespace

// The timeline of an emulated group (`mok trace --ep N`), on both row paths and with an empty
// rank: the same bits as the single GPU's forward, every rank's events under its own rank.
TEST(EmulatedEpGpu, TimelineRecordsEveryRankAndChangesNoBit) {
  MOK_REQUIRE_GPU();
  for (int ranks : {2, 4}) {
    const std::vector<EpCase> all = standard_cases(ranks);
    for (size_t i : {size_t(0), size_t(1), size_t(7)}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", case " + std::to_string(i));
      expect_ep_equals_ep1(ranks, all[i], false, true);
    }
  }
}

TEST(EmulatedEpGpu, EveryRankEqualsTheSingleGpuForwardBitForBit) {
  MOK_REQUIRE_GPU();
  for (int ranks : {2, 4, 8}) {
    const std::vector<EpCase> cases = standard_cases(ranks);
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", case " + std::to_string(i));
      expect_ep_equals_ep1(ranks, cases[i]);
      if (ranks == 2) expect_ep_equals_ep1(ranks, cases[i], /*training=*/true);
    }
  }
}

TEST(EmulatedEpGpu, CapacityOverflowAndAStoppedRankAreErrorsOnEveryRank) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  c.ep_size = 4;
  c.max_tokens_per_rank = 100;
  mok::Config whole = c;  // every rank's experts (random_params draws one rank's)
  whole.ep_size = 1;
  const mok::LayerParams p = mok::tools::random_params(whole, 61);
  const GpuLayer layer(p);
  const int El = c.num_experts / c.ep_size;
  const int64_t H = c.hidden, I = c.intermediate;
  mok::Batch b = mok::tools::random_batch(c, 400, 62);
  DeviceBuffer<uint16_t> x(to_bf16(b.x));
  DeviceBuffer<int32_t> ids(b.topk_ids);
  std::vector<float> wf(b.topk_weights.begin(), b.topk_weights.end());
  DeviceBuffer<float> w(wf);
  DeviceBuffer<uint16_t> out(size_t(400 * H), 0xFF);
  auto run = [&](mok::gpu::EmulatedEpForward& ep) {
    std::vector<mok::gpu::DeviceBatch> batches;
    std::vector<mok::gpu::DeviceLayerWeights> weights;
    std::vector<__nv_bfloat16*> outs;
    const mok::gpu::DeviceLayerWeights all = layer.weights();
    for (int r = 0; r < 4; ++r) {
      batches.push_back({100, reinterpret_cast<const __nv_bfloat16*>(x.ptr) + r * 100 * H,
                         ids.ptr + r * 100 * c.top_k, w.ptr + r * 100 * c.top_k});
      mok::gpu::DeviceLayerWeights lw = all;
      lw.gate = all.gate + int64_t(r) * El * I * H;
      lw.up = all.up + int64_t(r) * El * I * H;
      lw.down = all.down + int64_t(r) * El * H * I;
      weights.push_back(lw);
      outs.push_back(reinterpret_cast<__nv_bfloat16*>(out.ptr) + r * 100 * H);
    }
    ep.forward(batches, weights, outs, nullptr);
  };
  {
    mok::Config small = c;
    small.routed_capacity_rows = 256;
    std::vector<int32_t> skewed = b.topk_ids;
    for (int32_t& id : skewed) id = 2 * El;  // 1600 rows, all owned by rank 2
    MOK_CUDA_OK(cudaMemcpy(ids.ptr, skewed.data(), skewed.size() * 4, cudaMemcpyHostToDevice));
    mok::gpu::EmulatedEpForward ep(small);
    run(ep);
    try {
      ep.check(nullptr);
      FAIL() << "no error";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::capacity_exceeded);
      EXPECT_NE(std::string(e.what()).find("rank 2: the batch needs 1664 padded routed rows"),
                std::string::npos)
          << e.what();
    }
    for (uint16_t v : out.to_host()) ASSERT_TRUE(std::isnan(mok::fmt::bf16_to_float(v)));
    MOK_CUDA_OK(
        cudaMemcpy(ids.ptr, b.topk_ids.data(), b.topk_ids.size() * 4, cudaMemcpyHostToDevice));
  }
  for (const mok::gpu::RowPath path :
       {mok::gpu::RowPath::producer_gather, mok::gpu::RowPath::dispatch_copy}) {
    SCOPED_TRACE(mok::gpu::row_path_name(path));
    mok::gpu::ForwardOptions o;
    o.row_path = path;
    o.wait_seconds = 0.25;
    std::vector<uint16_t> healthy;
    {
      mok::gpu::EmulatedEpForward ep(c, o);
      run(ep);
      ep.check(nullptr);
      healthy = out.to_host();
    }
    auto nans = [](const std::vector<uint16_t>& v) {
      return std::count_if(v.begin(), v.end(), [](uint16_t b) { return (b & 0x7FFF) > 0x7F80; });
    };
    ASSERT_EQ(nans(healthy), 0) << "of " << healthy.size() << " outputs";
    // Rank 1 stops mid-dispatch (never publishes its first routed row block), then mid-combine
    // (its down tiles never count their rows on the tokens' source ranks).
    for (const bool in_combine : {false, true}) {
      mok::gpu::detail::ForwardHooks stuck;
      stuck.stuck_rank = 1;
      if (in_combine)
        stuck.never_count_tokens = true;
      else
        stuck.never_publish_block = 0;
      mok::gpu::EmulatedEpForward ep(c, o, stuck);
      EXPECT_EQ(ep.row_path(), path);
      run(ep);
      try {
        ep.check(nullptr);
        ADD_FAILURE() << "no error";
      } catch (const mok::Error& e) {
        EXPECT_EQ(e.code(), mok::ErrorCode::peer_timeout);
        EXPECT_NE(std::string(e.what()).find(
                      in_combine ? "the forward stopped: the combine waiting for the "
                                   "expert outputs of token"
                                 : "rank 1: the forward stopped: a gate/up producer "
                                   "waiting for dispatched row block 0"),
                  std::string::npos)
            << e.what();
      }
    }
    // The group torn down after the fault and rebuilt in the same process: the next forward is
    // the healthy one's, bit for bit (the output poisoned first).
    MOK_CUDA_OK(cudaMemset(out.ptr, 0xFF, out.n * sizeof(uint16_t)));
    mok::gpu::EmulatedEpForward rebuilt(c, o);
    run(rebuilt);
    rebuilt.check(nullptr);
    const std::vector<uint16_t> again = out.to_host();
    const auto diff = std::mismatch(again.begin(), again.end(), healthy.begin());
    EXPECT_TRUE(diff.first == again.end())
        << "the rebuilt group's output differs first at " << (diff.first - again.begin()) << " of "
        << again.size() << " (" << nans(again) << " NaN)";
  }
  // Under EP the automatic row path is the producer gather, whatever dispatch options are set
  // (the dispatch CTAs run either way), unless detail::copy_rows_pays_off: two or more full row
  // blocks per local expert and I >= 2048.
  for (const int dispatch_ctas : {0, 3}) {
    mok::gpu::ForwardOptions o;
    o.dispatch_ctas = dispatch_ctas;
    const mok::gpu::EmulatedEpForward ep(c, o);
    EXPECT_EQ(ep.row_path(), mok::gpu::RowPath::producer_gather);
  }
  mok::Config wide = c;
  wide.intermediate = 2048;
  wide.max_tokens_per_rank = 2 * 128 * c.num_experts / (c.ep_size * c.top_k);
  EXPECT_EQ(mok::gpu::EmulatedEpForward(wide).row_path(), mok::gpu::RowPath::dispatch_copy);
  wide.intermediate = 1024;
  EXPECT_EQ(mok::gpu::EmulatedEpForward(wide).row_path(), mok::gpu::RowPath::producer_gather);
  wide.intermediate = 2048;
  wide.max_tokens_per_rank -= 1;
  EXPECT_EQ(mok::gpu::EmulatedEpForward(wide).row_path(), mok::gpu::RowPath::producer_gather);
}
