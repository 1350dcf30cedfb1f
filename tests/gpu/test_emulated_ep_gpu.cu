// Expert parallelism emulated on one GPU (ep_size logical ranks in one megakernel launch): every
// rank's output equals the EP = 1 megakernel's rows for its tokens on the same global batch, bit
// for bit, for random, skewed and empty routings, rings smaller than the batch and random dispatch
// delays; capacity overflow on one owner fails every rank; a rank whose dispatch stops ends in an
// error naming it, not a hang.
#include <numeric>

#include "forward_test_util.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/moe_forward.hpp"

using namespace fwd_test;

namespace {

struct EpCase {
  std::vector<int64_t> tokens;  // per rank
  int routing = 0;              // 0 random, 1 every token to rank 0's experts, 2 to one expert
  int64_t ring_rows = 0;
  uint32_t delay_ns = 0;
};

// Runs the global batch at EP = 1 and split over the ranks; returns whether every rank's rows are
// bitwise equal, after checking the EP = 1 output against the CPU reference.
void expect_ep_equals_ep1(int ranks, const EpCase& k) {
  mok::Config global = mok::preset("tiny");
  const int64_t total = std::accumulate(k.tokens.begin(), k.tokens.end(), int64_t(0));
  global.max_tokens_per_rank = int(std::max<int64_t>(total, 1));
  const mok::LayerParams p = mok::tools::random_params(global, 51);
  mok::Batch b = mok::tools::random_batch(global, total, 52 + uint64_t(ranks));
  const int El = global.num_experts / ranks;
  for (size_t i = 0; i < b.topk_ids.size(); ++i) {
    if (k.routing == 1) b.topk_ids[i] = int32_t(i % size_t(global.top_k)) % El;  // rank 0 only
    if (k.routing == 2) b.topk_ids[i] = global.num_experts - 1;
  }
  const GpuLayer layer(p);
  mok::gpu::MoeForward ep1(global);
  const std::vector<double> want = gpu_forward(ep1, global, layer, b);
  expect_matches_reference(global, p, b, want);

  mok::Config c = global;
  c.ep_size = ranks;
  c.max_tokens_per_rank = int(*std::max_element(k.tokens.begin(), k.tokens.end()));
  c.ring_rows = k.ring_rows;
  mok::gpu::ForwardOptions o;
  o.dispatch_delay_ns = k.delay_ns;
  o.delay_seed = 7;
  mok::gpu::EmulatedEpForward ep(c, o);
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
  ep.forward(batches, weights, outs, nullptr);
  ep.check(nullptr);
  MOK_CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> got;
  for (uint16_t v : out.to_host()) got.push_back(mok::fmt::bf16_to_float(v));
  got.resize(size_t(total * H));
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)), 0);
}

}  // namespace

TEST(EmulatedEpGpu, EveryRankEqualsTheSingleGpuForwardBitForBit) {
  MOK_REQUIRE_GPU();
  for (int ranks : {2, 4, 8}) {
    std::vector<EpCase> cases;
    cases.push_back({std::vector<int64_t>(size_t(ranks), 300)});
    std::vector<int64_t> uneven(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) uneven[size_t(r)] = r == 1 ? 0 : 37 * (r + 1);  // rank 1 empty
    cases.push_back({uneven});
    cases.push_back({std::vector<int64_t>(size_t(ranks), 200), 1});       // all to rank 0
    cases.push_back({std::vector<int64_t>(size_t(ranks), 200), 2});       // all to one expert
    cases.push_back({std::vector<int64_t>(size_t(ranks), 300), 0, 128});  // a one-block ring
    cases.push_back({std::vector<int64_t>(size_t(ranks), 300), 0, 3 * 128, 100'000});  // + delays
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", case " + std::to_string(i));
      expect_ep_equals_ep1(ranks, cases[i]);
    }
  }
}

TEST(EmulatedEpGpu, CapacityOverflowAndAStoppedRankAreErrorsOnEveryRank) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  c.ep_size = 4;
  c.max_tokens_per_rank = 100;
  const mok::LayerParams p = mok::tools::random_params(c, 61);
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
  {
    mok::gpu::ForwardOptions o;
    o.never_publish_block = 0;
    o.wait_seconds = 0.25;
    mok::gpu::EmulatedEpForward ep(c, o, /*stuck_rank=*/1);
    run(ep);
    try {
      ep.check(nullptr);
      FAIL() << "no error";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::peer_timeout);
      EXPECT_NE(std::string(e.what()).find("rank 1: the forward stopped: a gate/up producer "
                                           "waiting for dispatched row block 0"),
                std::string::npos)
          << e.what();
    }
  }
}
