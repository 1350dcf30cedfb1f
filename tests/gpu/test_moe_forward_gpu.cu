// The forward megakernel beyond what every GPU forward is tested for (test_forward_gpu.cu): it
// equals the staged pipeline bit for bit under every grid and tile option, its bits do not move
// when dispatch is delayed at random, a dispatch that stops ends in an error instead of a hang,
// and on every standard shape of design.md it agrees with the cuBLAS pipeline and, on sampled
// tokens, with the CPU reference.
#include <algorithm>
#include <chrono>
#include <map>

#include "baseline/unfused_forward.hpp"
#include "forward_test_util.hpp"
#include "kernels/moe_forward/forward_probes.hpp"
#include "layer/layer_runner.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#include "mok/gpu/staged_forward.hpp"
#include "mok/schedule/routing_layout.hpp"

using namespace fwd_test;
using mok::gpu::ForwardOptions;
using mok::gpu::MoeForward;
using mok::gpu::RowPath;
using mok::gpu::detail::ForwardHooks;

namespace {

mok::Config odd_config(int shared) {
  mok::Config c;
  c.hidden = 320;        // the down GEMMs' last tile is partly outside H
  c.intermediate = 192;  // not a multiple of 128: 128-wide tiles only
  c.num_experts = 12;
  c.top_k = 3;
  c.num_shared_experts = shared;
  c.shared_intermediate = 128;
  c.max_tokens_per_rank = 333;
  return c;
}

// The largest expert count and top-k the forward takes (E = 512, K = 16), on small matrices.
mok::Config widest_routing_config() {
  mok::Config c;
  c.hidden = 128;
  c.intermediate = 128;
  c.num_experts = 512;
  c.top_k = 16;
  c.num_shared_experts = 1;
  c.shared_intermediate = 128;
  c.max_tokens_per_rank = 300;
  return c;
}

}  // namespace

TEST(MoeForwardGpu, EqualsTheStagedForwardBitForBitUnderEveryOption) {
  MOK_REQUIRE_GPU();
  // 0-7: dispatch CTAs copy rows first; 8-11: the producers gather them (the default).
  struct Variant {
    ForwardOptions o;
    ForwardHooks h;
  };
  std::vector<Variant> options(12);
  for (size_t i = 0; i < options.size(); ++i)
    options[i].o.row_path = i < 8 ? RowPath::dispatch_copy : RowPath::producer_gather;
  options[0].h.wait_times = true;  // profiling changes no bit
  options[1].o.block_n = 128;
  options[2].o.dispatch_ctas = 1;
  options[2].o.overlap_rows = 128;                            // tile groups of one row block ...
  options[3].o.max_ctas = 3, options[3].o.dispatch_ctas = 1;  // two GEMM CTAs: every tile waits
  options[4].o.dispatch_ctas = 40;
  options[5].o.max_ctas = 17, options[5].o.dispatch_ctas = 16;           // one GEMM CTA
  options[5].o.overlap_rows = 2 * 128;                                   // ... two
  options[6].h.dispatch_delay_ns = 20'000, options[6].h.delay_seed = 6;  // blocks published late
  options[7].o.dispatch_ctas = 1, options[7].o.max_ctas = 4;
  options[8].h.wait_times = true;
  options[9].o.max_ctas = 1;            // one CTA: every tile in turn, then the combine
  options[9].o.overlap_rows = 3 * 128;  // ... three, gathering
  options[10].o.block_n = 128;
  options[11].o.max_ctas = 2;  // two GEMM CTAs, no dispatch role
  for (const mok::Config& c :
       {mok::preset("tiny"), odd_config(1), odd_config(0), widest_routing_config()}) {
    const mok::LayerParams p = mok::tools::random_params(c, 31);
    const GpuLayer layer(p);
    mok::gpu::StagedForward staged(c);
    std::vector<mok::Batch> batches;
    for (int64_t T : {int64_t(c.max_tokens_per_rank), int64_t(37), int64_t(1)})
      batches.push_back(mok::tools::random_batch(c, T, uint64_t(T) + 40));
    batches.push_back(mok::tools::random_batch(c, 200, 41));
    for (int32_t& id : batches.back().topk_ids) id = c.num_experts - 1;  // one expert
    for (size_t o = 0; o < options.size(); ++o) {
      ForwardOptions fo = options[o].o;
      if (c.intermediate % 128 != 0 && fo.block_n == 0) fo.block_n = 128;
      MoeForward mega(c, fo, options[o].h);
      for (size_t i = 0; i < batches.size(); ++i) {
        SCOPED_TRACE("H = " + std::to_string(c.hidden) + ", option set " + std::to_string(o) +
                     ", batch " + std::to_string(i) + ", block_n " +
                     std::to_string(mega.block_n()) + ", grid " + std::to_string(mega.grid()) +
                     ", dispatch CTAs " + std::to_string(mega.dispatch_ctas()));
        const std::vector<double> want = gpu_forward(staged, c, layer, batches[i]);
        const std::vector<double> got = gpu_forward(mega, c, layer, batches[i]);
        expect_matches_reference(c, p, batches[i], got);
        EXPECT_TRUE(same_bits(want, got));
      }
    }
  }
}

// Widths that are odd multiples of 64 from 1024 on take 256-wide tiles: the last gate/up
// tile of I and of S holds 64 gate and 64 up columns and 128 of padding (TMA's zeros, not stored).
// Its outputs equal the staged forward's bit for bit, whichever row path.
TEST(MoeForwardGpu, WideTilesOverPaddedWidthsEqualTheStagedForward) {
  MOK_REQUIRE_GPU();
  for (int shared : {0, 1}) {
    mok::Config c;
    c.hidden = 320;
    c.intermediate = 1088;
    c.num_experts = 12;
    c.top_k = 3;
    c.num_shared_experts = shared;
    c.shared_intermediate = 1088;
    c.max_tokens_per_rank = 333;
    const mok::LayerParams p = mok::tools::random_params(c, 51);
    const GpuLayer layer(p);
    mok::gpu::StagedForward staged(c);
    for (RowPath path : {RowPath::dispatch_copy, RowPath::producer_gather}) {
      ForwardOptions o;
      o.block_n = 256;
      o.row_path = path;
      MoeForward mega(c, o);
      ASSERT_EQ(mega.block_n(), 256);
      for (int64_t T : {int64_t(333), int64_t(37), int64_t(1)}) {
        SCOPED_TRACE("shared " + std::to_string(shared) + ", row path " +
                     std::to_string(int(path)) + ", T " + std::to_string(T));
        const mok::Batch b = mok::tools::random_batch(c, T, uint64_t(T) + 52);
        const std::vector<double> want = gpu_forward(staged, c, layer, b);
        const std::vector<double> got = gpu_forward(mega, c, layer, b);
        expect_matches_reference(c, p, b, got);
        EXPECT_TRUE(same_bits(want, got));
      }
    }
  }
}

// Determinism under timing noise: each published row block waits a pseudo-random time (up to
// 200 us, a new pattern each run), so GEMM tiles start in a different order every run.
TEST(MoeForwardGpu, BitwiseIdenticalAcross20RunsWithInjectedDispatchDelays) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 32);
  const GpuLayer layer(p);
  const mok::Batch b = mok::tools::random_batch(c, 512, 33);
  MoeForward plain(c);
  const std::vector<double> want = gpu_forward(plain, c, layer, b);
  expect_matches_reference(c, p, b, want);
  for (uint32_t run = 0; run < 20; ++run) {
    ForwardOptions o;
    o.row_path = RowPath::dispatch_copy;
    o.dispatch_ctas = 1 + int(run % 4);
    o.max_ctas = run % 2 ? 8 : 0;
    o.overlap_rows = run % 3 == 0 ? 128 : 0;
    ForwardHooks h;
    h.dispatch_delay_ns = 200'000;
    h.delay_seed = run + 1;
    MoeForward delayed(c, o, h);
    EXPECT_TRUE(same_bits(want, gpu_forward(delayed, c, layer, b))) << "run " << run;
  }
}

TEST(MoeForwardGpu, AStoppedDispatchEndsInAnErrorNotAHang) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 34);
  const GpuLayer layer(p);
  const mok::Batch b = mok::tools::random_batch(c, 512, 35);
  ForwardOptions o;
  o.row_path = RowPath::dispatch_copy;
  o.wait_seconds = 0.25;
  ForwardHooks h;
  h.never_publish_block = 2;
  MoeForward stuck(c, o, h);
  const auto start = std::chrono::steady_clock::now();
  gpu_forward(stuck, c, layer, b, false);
  expect_check_error(stuck, mok::ErrorCode::peer_timeout, "waiting for dispatched row block 2");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("the stopped forward ended after %.2f s (bound 0.25 s per wait)\n", seconds);
  // The GPU is left usable: a healthy forward right after gives the right answer.
  MoeForward healthy(c);
  expect_matches_reference(c, p, b, gpu_forward(healthy, c, layer, b));
}

// The wait-time profile (mok bench --breakdown) has a figure for every role that ran, and none
// without the option.
TEST(MoeForwardGpu, ProfileTimesEveryRole) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 36);
  const GpuLayer layer(p);
  const mok::Batch b = mok::tools::random_batch(c, 512, 37);
  ForwardOptions o;
  o.row_path = RowPath::dispatch_copy;  // the dispatch role's times too
  ForwardHooks timing;
  timing.wait_times = true;
  MoeForward timed(c, o, timing);
  expect_matches_reference(c, p, b, gpu_forward(timed, c, layer, b));
  const mok::gpu::detail::ForwardProfile f = timed.runner().profile(nullptr);
  EXPECT_GT(f.consumer_total, 0.0);
  EXPECT_GT(f.dispatch_copying, 0.0);
  EXPECT_GE(f.dispatch_total, f.dispatch_copying);
  EXPECT_GT(f.combine_total, 0.0);
  EXPECT_GE(f.combine_total, f.combine_waits);
  EXPECT_GE(f.consumer_total, f.consumer_starved + f.consumer_epilogue + f.consumer_waits_tile);
  EXPECT_GE(f.consumer_starved, f.consumer_starved_first);
  EXPECT_GT(f.consumer_epilogue, 0.0);
  EXPECT_GE(f.consumer_epilogue, f.consumer_epilogue_down);
  EXPECT_GE(f.consumer_epilogue, f.consumer_publish);
  EXPECT_GT(f.consumer_epilogue_down, 0.0);
  EXPECT_GT(f.consumer_publish, 0.0);
  EXPECT_GT(f.consumer_waits_tile, 0.0);  // at least the wait for the end of the sequence
  EXPECT_EQ(f.dispatch_ctas_joined, timed.dispatch_ctas());  // every one went on to the GEMMs
  EXPECT_GT(f.dispatch_ctas_joined, 0);
  int max_khz = 0;  // the SM clock over the consumers' span: positive, at most the boost clock
  MOK_CUDA_OK(cudaDeviceGetAttribute(&max_khz, cudaDevAttrClockRate, 0));
  EXPECT_GT(f.consumer_sm_mhz, 100.0);
  EXPECT_LE(f.consumer_sm_mhz, 1.02 * max_khz / 1e3);
  o.row_path = RowPath::producer_gather;  // no dispatch role: its times are zero
  MoeForward gathering(c, o, timing);
  expect_matches_reference(c, p, b, gpu_forward(gathering, c, layer, b));
  const mok::gpu::detail::ForwardProfile g = gathering.runner().profile(nullptr);
  EXPECT_GT(g.consumer_total, 0.0);
  EXPECT_EQ(g.dispatch_total, 0.0);
  EXPECT_GT(g.combine_total, 0.0);
  MoeForward plain(c);
  EXPECT_THROW(plain.runner().profile(nullptr), mok::Error);
}

// mok bench --stage-probes: the megakernel without its GEMM loads, without its MMAs, or without
// both, on either row path, runs to its end with every wait and hand-off intact (no fault, no
// hang), and without the MMAs every output element is written and zero (SwiGLU(0, 0) = 0, every
// expert output 0, the combine's sum 0), so the probe cannot silently skip an epilogue or the
// combine. A probe needs the probe set, and 256-wide tiles.
TEST(MoeForwardGpu, StageProbesKeepEveryHandOff) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 38);
  const GpuLayer layer(p);
  const mok::Batch b = mok::tools::random_batch(c, 500, 39);
  for (RowPath path : {RowPath::dispatch_copy, RowPath::producer_gather}) {
    for (int probe = 1; probe < 4; ++probe) {
      ForwardOptions o;
      o.row_path = path;
      ForwardHooks h;
      h.without_gemm_loads = probe & 1;
      h.without_mma = probe & 2;
      h.kernels = &mok::kern::probe_forward_kernels();
      MoeForward f(c, o, h);
      const std::vector<double> out = gpu_forward(f, c, layer, b);  // check(): no fault
      if (!h.without_mma) continue;
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_EQ(out[i], 0.0) << "element " << i << ", probe " << probe << ", "
                               << mok::gpu::row_path_name(path);
    }
  }
  MoeForward healthy(c);  // and the GPU is left as it was
  expect_matches_reference(c, p, b, gpu_forward(healthy, c, layer, b));
  ForwardHooks without_kernels;
  without_kernels.without_mma = true;  // no probe set given
  EXPECT_THROW(MoeForward(c, {}, without_kernels), mok::Error);
  ForwardHooks probe = without_kernels;
  probe.kernels = &mok::kern::probe_forward_kernels();
  ForwardOptions narrow_tiles;
  narrow_tiles.block_n = 128;  // the probes are 256 wide only
  EXPECT_THROW(MoeForward(c, narrow_tiles, probe), mok::Error);
}

// The timeline's kernels (ForwardHooks::trace_events, `mok trace`) give the production kernels'
// bits, and record every role: a producer event per GEMM tile, a consumer event per warpgroup and
// tile it multiplies, a combine event per warp that reduced tokens (their counts add up to T), a
// dispatch event per dispatch CTA on the copy path; too small a buffer keeps its capacity's events
// and counts the rest.
TEST(MoeForwardGpu, TimelineRecordsEveryRoleAndChangesNoBit) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const mok::LayerParams p = mok::tools::random_params(c, 40);
  const GpuLayer layer(p);
  const mok::Batch b = mok::tools::random_batch(c, 500, 41);
  for (const int block_n : {128, 256})
    for (RowPath path : {RowPath::dispatch_copy, RowPath::producer_gather}) {
      SCOPED_TRACE(std::to_string(block_n) + " wide, " + mok::gpu::row_path_name(path));
      ForwardOptions o;
      o.row_path = path;
      o.block_n = block_n;
      MoeForward plain(c, o);
      ForwardHooks h;
      h.trace_events = 1 << 16;
      h.kernels = &mok::kern::probe_forward_kernels();
      MoeForward traced(c, o, h);
      EXPECT_TRUE(same_bits(gpu_forward(traced, c, layer, b), gpu_forward(plain, c, layer, b)));
      int64_t claimed = 0;
      const auto events = traced.runner().trace(nullptr, &claimed);
      ASSERT_EQ(int64_t(events.size()), claimed);
      int64_t per_role[mok::kern::kTraceRoles] = {}, tokens = 0;
      for (const auto& e : events) {
        ASSERT_GE(e.role, 0);
        ASSERT_LT(e.role, int(mok::kern::kTraceStore));  // the forward has no store warp
        ASSERT_LT(e.kind, 4);                            // TileKind
        ASSERT_LE(e.start_ns, e.end_ns);
        ASSERT_EQ(e.rank, 0);
        ++per_role[e.role];
        if (e.role == mok::kern::kTraceCombine) tokens += e.what;
      }
      EXPECT_GT(per_role[mok::kern::kTraceProducer], 0);
      // Consumers skip their half of a tile that holds no row there (all padding).
      EXPECT_GT(per_role[mok::kern::kTraceConsumer0], 0);
      EXPECT_LE(per_role[mok::kern::kTraceConsumer0], per_role[mok::kern::kTraceProducer]);
      EXPECT_GT(per_role[mok::kern::kTraceConsumer1], 0);
      EXPECT_EQ(tokens, b.tokens);
      EXPECT_EQ(per_role[mok::kern::kTraceDispatch] > 0, path == RowPath::dispatch_copy);
    }
  ForwardHooks small;
  small.trace_events = 5;
  small.kernels = &mok::kern::probe_forward_kernels();
  MoeForward f(c, {}, small);
  gpu_forward(f, c, layer, b);
  int64_t claimed = 0;
  EXPECT_EQ(f.runner().trace(nullptr, &claimed).size(), 5u);
  EXPECT_GT(claimed, 5);
  ForwardHooks without_kernels;
  without_kernels.trace_events = 16;  // no probe set given
  EXPECT_THROW(MoeForward(c, {}, without_kernels), mok::Error);
}

// automatic: the producers gather, unless an option or hook needs the dispatch role, rows per
// expert x I reach 128 x 2048, or the tiles are 128 wide (detail::copy_rows_pays_off).
TEST(MoeForwardGpu, AutomaticRowPathFollowsDispatchOptionsAndRowsPerExpert) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset("tiny");
  const MoeForward plain(c);
  EXPECT_EQ(plain.row_path(), RowPath::producer_gather);
  EXPECT_EQ(plain.dispatch_ctas(), 0);
  ForwardOptions o;
  o.dispatch_ctas = 3;
  const MoeForward three(c, o);
  EXPECT_EQ(three.row_path(), RowPath::dispatch_copy);
  EXPECT_EQ(three.dispatch_ctas(), 3);
  o = {};
  ForwardHooks delayed;
  delayed.dispatch_delay_ns = 1000;
  const MoeForward hooked(c, o, delayed);
  EXPECT_EQ(hooked.row_path(), RowPath::dispatch_copy);
  EXPECT_GT(hooked.dispatch_ctas(), 0);
  o = {};
  o.row_path = RowPath::dispatch_copy;
  EXPECT_GT(MoeForward(c, o).dispatch_ctas(), 0);
  mok::Config big = c;  // rows per expert x I = 128 x 2048 at the largest batch
  big.max_tokens_per_rank = 128 * 2048 / c.intermediate * c.num_experts / c.top_k;
  ASSERT_EQ(big.max_tokens_per_rank * c.top_k % c.num_experts, 0);
  const MoeForward copying(big);
  EXPECT_EQ(copying.row_path(), RowPath::dispatch_copy);
  EXPECT_GT(copying.dispatch_ctas(), 0);
  o = {};
  o.row_path = RowPath::producer_gather;
  EXPECT_EQ(MoeForward(big, o).row_path(), RowPath::producer_gather);
  big.max_tokens_per_rank -= 1;
  EXPECT_EQ(MoeForward(big).row_path(), RowPath::producer_gather);
  o = {};
  o.block_n = 128;  // tiny's rows, 128-wide tiles
  EXPECT_EQ(MoeForward(c, o).row_path(), RowPath::dispatch_copy);
  mok::Config narrow = c;  // I not a multiple of 128: 128-wide tiles on their own
  narrow.intermediate = narrow.shared_intermediate = 192;
  const MoeForward narrow_forward(narrow);
  EXPECT_EQ(narrow_forward.block_n(), 128);
  EXPECT_EQ(narrow_forward.row_path(), RowPath::dispatch_copy);
  EXPECT_GT(narrow_forward.dispatch_ctas(), 0);
  mok::Config long_tail = c;  // I and S odd multiples of 64 from 1024 on: 256-wide, padded
  long_tail.intermediate = long_tail.shared_intermediate = 1088;
  EXPECT_EQ(MoeForward(long_tail).block_n(), 256);
}

TEST(MoeForwardGpu, RejectsShapesAndOptionsItDoesNotTake) {
  MOK_REQUIRE_GPU();
  mok::Config c = odd_config(1);
  c.hidden = 352;  // not a multiple of 64
  EXPECT_THROW(MoeForward{c}, mok::Error);
  ForwardOptions wide;
  wide.block_n = 256;  // I = 192 is not a multiple of 128
  EXPECT_THROW(MoeForward(odd_config(1), wide), mok::Error);
  ForwardOptions all_dispatch;
  all_dispatch.row_path = RowPath::dispatch_copy;
  all_dispatch.max_ctas = 4, all_dispatch.dispatch_ctas = 4;
  EXPECT_THROW(MoeForward(mok::preset("tiny"), all_dispatch), mok::Error);
  ForwardOptions dispatch_with_gather;
  dispatch_with_gather.row_path = RowPath::producer_gather;
  dispatch_with_gather.dispatch_ctas = 4;  // there is no dispatch role while producers gather
  EXPECT_THROW(MoeForward(mok::preset("tiny"), dispatch_with_gather), mok::Error);
  ForwardOptions narrow_tiles;
  narrow_tiles.block_n = 64;  // 128 or 256
  EXPECT_THROW(MoeForward(mok::preset("tiny"), narrow_tiles), mok::Error);
  ForwardOptions ragged_groups;
  ragged_groups.overlap_rows = 100;  // not a multiple of 128
  EXPECT_THROW(MoeForward(mok::preset("tiny"), ragged_groups), mok::Error);
  ForwardOptions gathering;
  gathering.row_path = RowPath::producer_gather;
  ForwardHooks stop;
  stop.never_publish_block = 0;  // a dispatch hook, while there is no dispatch role
  EXPECT_THROW(MoeForward(mok::preset("tiny"), gathering, stop), mok::Error);
  // The GPU pads every expert's rows to its 128-row tiles: a configuration whose dropless bound
  // was computed for another tile height is refused, not run into a capacity overflow.
  mok::Config short_tiles = mok::preset("tiny");
  short_tiles.tile_rows = 64;
  try {
    MoeForward f(short_tiles);
    ADD_FAILURE() << "tile_rows = 64 accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile_rows = 64"), std::string::npos) << e.what();
  }
}

// Every standard shape, full size, random weights on the device. Three opinions: the staged
// pipeline (bit for bit), the unfused cuBLAS pipeline (BF16 rounding), and the CPU reference on
// sampled tokens (each token's experts copied to the host).
class StandardShape : public ::testing::TestWithParam<const char*> {};

TEST_P(StandardShape, AgreesWithStagedCublasAndTheReference) {
  MOK_REQUIRE_GPU();
  const mok::Config c = mok::preset(GetParam());
  const int64_t T = c.max_tokens_per_rank, H = c.hidden, I = c.intermediate, E = c.num_experts,
                K = c.top_k, S = c.shared_width();
  DeviceBuffer<uint16_t> g(size_t(E * I * H), 0), u(size_t(E * I * H), 0), d(size_t(E * H * I), 0),
      sg(size_t(std::max<int64_t>(S * H, 1)), 0), su(size_t(std::max<int64_t>(S * H, 1)), 0),
      sd(size_t(std::max<int64_t>(S * H, 1)), 0), x(size_t(T * H), 0), out(size_t(T * H), 0xFF),
      staged_out(size_t(T * H), 0xFF), base(size_t(T * H), 0xFF);
  DeviceBuffer<int32_t> ids(size_t(T * K));
  DeviceBuffer<float> w(size_t(T * K));
  auto bf = [](const DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.ptr); };
  const float wh = 1.0f / std::sqrt(float(H)), wi = 1.0f / std::sqrt(float(I));
  MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(g), E * I * H, 1, wh, nullptr));
  MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(u), E * I * H, 2, wh, nullptr));
  MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(d), E * I * H, 3, wi, nullptr));
  if (S > 0) {
    MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(sg), S * H, 6, wh, nullptr));
    MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(su), S * H, 7, wh, nullptr));
    MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(sd), S * H, 8, 1.0f / std::sqrt(float(S)), nullptr));
  }
  MOK_CUDA_OK(mok::gpu::fill_uniform_bf16(bf(x), T * H, 4, 1.0f, nullptr));
  MOK_CUDA_OK(mok::gpu::random_topk(ids.ptr, w.ptr, T, int(E), int(K), 5, nullptr));
  const mok::gpu::DeviceLayerWeights weights{S ? bf(sg) : nullptr,
                                             S ? bf(su) : nullptr,
                                             S ? bf(sd) : nullptr,
                                             bf(g),
                                             bf(u),
                                             bf(d),
                                             {},
                                             {},
                                             {}};
  const mok::gpu::DeviceBatch batch{T, bf(x), ids.ptr, w.ptr};
  auto host = [](const DeviceBuffer<uint16_t>& b) { return from_bf16(b.to_host()); };
  std::vector<double> got;
  {
    MoeForward mega(c);
    mega.forward(batch, weights, bf(out), nullptr);
    mega.check(nullptr);
    got = host(out);
  }
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FALSE(std::isnan(got[i])) << "unwritten at " << i;
  {  // dispatch CTAs copying every row (at H = 2048 and 7168 the copy's walk over a block steps
     // past whole rows and within one row: both cases), then joining the GEMMs
    ForwardOptions copy;
    copy.row_path = RowPath::dispatch_copy;
    DeviceBuffer<uint16_t> copied(size_t(T * H), 0xFF);
    MoeForward mega(c, copy);
    mega.forward(batch, weights, bf(copied), nullptr);
    mega.check(nullptr);
    EXPECT_TRUE(same_bits(host(copied), got));
  }
  {
    mok::gpu::StagedForward staged(c);
    staged.forward(batch, weights, bf(staged_out), nullptr);
    staged.check(nullptr);
    EXPECT_TRUE(same_bits(host(staged_out), got));
  }
  {
    mok::bench::UnfusedForward baseline(c);
    baseline.forward(batch, weights, bf(base));
    MOK_CUDA_OK(cudaDeviceSynchronize());
    const double err = mok::relative_l2_error(got, host(base));
    std::printf("%s: relative L2 error against the cuBLAS pipeline %.2e\n", GetParam(), err);
    EXPECT_LT(err, 1e-2);
  }
  // The CPU reference on sampled tokens: a layer of just that token's experts (ids remapped).
  const std::vector<int32_t> all_ids = ids.to_host();
  const std::vector<float> all_w = w.to_host();
  auto download = [](const uint16_t* src, size_t n) {
    std::vector<uint16_t> h(n);
    cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost);
    return from_bf16(h);
  };
  for (int64_t t : {int64_t(0), T / 3, T - 1}) {
    mok::Config one = c;
    one.num_experts = int(K);
    one.max_tokens_per_rank = 1;
    one.routed_capacity_rows = 0;
    mok::LayerParams lp = mok::LayerParams::zeros(one);
    mok::Batch b1;
    b1.tokens = 1;
    b1.x = download(x.ptr + t * H, size_t(H));
    const size_t m = size_t(I * H);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = all_ids[size_t(t * K + k)];
      for (auto [dst, src] :
           {std::pair{&lp.gate, &g}, std::pair{&lp.up, &u}, std::pair{&lp.down, &d}}) {
        const std::vector<double> we = download(src->ptr + e * int64_t(m), m);
        std::copy(we.begin(), we.end(), dst->begin() + k * int64_t(m));
      }
      b1.topk_ids.push_back(int32_t(k));
      b1.topk_weights.push_back(all_w[size_t(t * K + k)]);
    }
    if (S > 0) {
      lp.shared_gate = download(sg.ptr, size_t(S * H));
      lp.shared_up = download(su.ptr, size_t(S * H));
      lp.shared_down = download(sd.ptr, size_t(S * H));
    }
    mok::ReferenceOptions ro;
    ro.quant = mok::OperandQuant::bf16;
    const std::vector<double> want = mok::reference_forward(one, lp, b1, ro).out;
    const std::vector<double> row(got.begin() + t * H, got.begin() + (t + 1) * H);
    const double err = mok::relative_l2_error(row, want);
    std::printf("%s: token %lld against the CPU reference: relative L2 error %.2e\n", GetParam(),
                static_cast<long long>(t), err);
    EXPECT_LT(err, 1e-2) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(DesignShapes, StandardShape,
                         ::testing::Values("dsv3", "mok-default", "qwen3-30b", "fine"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

namespace {

// Device pointers to host bytes (test-sized).
template <class T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> h(n);
  if (n) EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// |got - want| within BF16 rounding of the result plus FP32 accumulation over `terms` products of
// magnitude sum_abs.
void expect_close(double got, double want, double sum_abs, const std::string& where) {
  const double tol = std::ldexp(std::abs(want), -7) + 1e-5 * sum_abs + 1e-6;
  ASSERT_LE(std::abs(got - want), tol) << where << ": got " << got << ", want " << want;
}

}  // namespace

// A training forward (a Schedule built once, a ForwardContext given) writes the same output bits
// as inference, and keeps each routed row's gate and up pre-activations and SwiGLU output in the
// schedule's row order, and the shared experts' per token: checked against FP64 products of the
// BF16 inputs, row by row through the schedule's row destinations. The schedule serves several
// forwards; schedules, batches and contexts of another shape are refused.
TEST(MoeForwardGpu, TrainingForwardKeepsTheSwiGLUInputsAndChangesNoOutputBit) {
  MOK_REQUIRE_GPU();
  for (const mok::Config& c : {odd_config(1), mok::preset("tiny")}) {
    for (const RowPath path : {RowPath::dispatch_copy, RowPath::producer_gather}) {
      SCOPED_TRACE("H = " + std::to_string(c.hidden) + ", " + mok::gpu::row_path_name(path));
      const mok::LayerParams p = mok::tools::random_params(c, 61);
      const GpuLayer layer(p);
      const int64_t T = 200, H = c.hidden, I = c.intermediate, S = c.shared_width(), K = c.top_k;
      const mok::Batch b = mok::tools::random_batch(c, T, 62);
      DeviceBuffer<uint16_t> x(to_bf16(b.x));
      DeviceBuffer<int32_t> ids(b.topk_ids);
      DeviceBuffer<float> w(std::vector<float>(b.topk_weights.begin(), b.topk_weights.end()));
      const mok::gpu::DeviceBatch batch{T, reinterpret_cast<const __nv_bfloat16*>(x.ptr), ids.ptr,
                                        w.ptr};
      DeviceBuffer<uint16_t> trained(size_t(T * H), 0xFF), inferred(size_t(T * H), 0xFF);
      ForwardOptions o;
      o.row_path = path;
      if (c.intermediate % 128) o.block_n = 128;
      MoeForward f(c, o);
      mok::gpu::Schedule s(c);
      mok::gpu::ForwardContext ctx(c);
      MOK_CUDA_OK(cudaMemset(ctx.gate_up(), 0xFF, size_t(ctx.capacity_rows() * 2 * I) * 2));
      MOK_CUDA_OK(cudaMemset(ctx.act(), 0xFF, size_t(ctx.capacity_rows() * I) * 2));
      f.schedule(batch, s, nullptr);
      EXPECT_EQ(s.tokens(), T);
      f.forward(s, batch, layer.weights(), reinterpret_cast<__nv_bfloat16*>(trained.ptr), &ctx,
                nullptr);
      f.check(nullptr);
      f.forward(s, batch, layer.weights(), reinterpret_cast<__nv_bfloat16*>(inferred.ptr), nullptr,
                nullptr);
      f.check(nullptr);
      const std::vector<double> got = from_bf16(trained.to_host());
      expect_matches_reference(c, p, b, got);
      EXPECT_TRUE(same_bits(got, from_bf16(inferred.to_host())));
      MoeForward plain(c, o);
      EXPECT_TRUE(same_bits(got, gpu_forward(plain, c, layer, b)));

      // The kept activations, row by row.
      const std::vector<double> xb = from_bf16(to_bf16(b.x)), gate = from_bf16(to_bf16(p.gate)),
                                up = from_bf16(to_bf16(p.up)),
                                sgate = from_bf16(to_bf16(p.shared_gate)),
                                sup = from_bf16(to_bf16(p.shared_up));
      auto dot = [&](const double* a, const double* v, double* sum_abs) {
        double acc = 0, abs_sum = 0;
        for (int64_t h = 0; h < H; ++h) acc += a[h] * v[h], abs_sum += std::abs(a[h] * v[h]);
        *sum_abs = abs_sum;
        return acc;
      };
      auto check_row = [&](const std::vector<uint16_t>& gu, const std::vector<uint16_t>& act,
                           int64_t row, int64_t width, const double* xr, const double* g0,
                           const double* u0, const std::string& what) {
        for (int64_t i = 0; i < width; ++i) {
          double sg = 0, su = 0;
          const double g = dot(xr, g0 + i * H, &sg), u = dot(xr, u0 + i * H, &su);
          const std::string at =
              what + " row " + std::to_string(row) + " column " + std::to_string(i);
          expect_close(mok::fmt::bf16_to_float(gu[size_t(row * 2 * width + i)]), g, sg, at + " g");
          expect_close(mok::fmt::bf16_to_float(gu[size_t(row * 2 * width + width + i)]), u, su,
                       at + " u");
          const double silu = g / (1 + std::exp(-g));
          expect_close(mok::fmt::bf16_to_float(act[size_t(row * width + i)]), silu * u,
                       std::abs(silu) * su + std::abs(u) * sg, at + " act");
        }
      };
      const mok::gpu::detail::RankSchedule& st = s.state();
      const int64_t routed_rows =
          download(st.sched.seg_begin + c.num_experts, 1)[0];  // the padded segments' end
      const std::vector<int64_t> dest = download(st.row_destination, size_t(routed_rows));
      const std::vector<uint16_t> gu = download(reinterpret_cast<uint16_t*>(ctx.gate_up()),
                                                size_t(ctx.capacity_rows() * 2 * I)),
                                  act = download(reinterpret_cast<uint16_t*>(ctx.act()),
                                                 size_t(ctx.capacity_rows() * I));
      int64_t checked = 0;
      for (int64_t row = 0; row < routed_rows; ++row) {
        const int64_t slot = mok::sched::RowDestination::slot(dest[size_t(row)]);
        if (slot < 0) continue;
        const int64_t t = slot / K, e = b.topk_ids[size_t(slot)];
        check_row(gu, act, row, I, &xb[size_t(t * H)], &gate[size_t(e * I * H)],
                  &up[size_t(e * I * H)], "routed (token " + std::to_string(t) + ")");
        ++checked;
      }
      EXPECT_EQ(checked, T * K);  // every (token, k) slot has its row
      if (S > 0) {
        const std::vector<uint16_t> sgu =
                                        download(reinterpret_cast<uint16_t*>(ctx.gate_up_shared()),
                                                 size_t(ctx.token_rows() * 2 * S)),
                                    sact = download(reinterpret_cast<uint16_t*>(ctx.act_shared()),
                                                    size_t(ctx.token_rows() * S));
        for (int64_t t = 0; t < T; ++t)
          check_row(sgu, sact, t, S, &xb[size_t(t * H)], sgate.data(), sup.data(), "shared");
      }

      // Mismatches are errors, not wrong answers.
      const mok::gpu::DeviceBatch shorter{T - 1, batch.x, batch.topk_ids, batch.topk_weights};
      EXPECT_THROW(f.forward(s, shorter, layer.weights(),
                             reinterpret_cast<__nv_bfloat16*>(trained.ptr), nullptr, nullptr),
                   mok::Error);
      mok::Config other = c;
      other.max_tokens_per_rank += 128;
      mok::gpu::Schedule wrong_schedule(other);
      EXPECT_THROW(f.schedule(batch, wrong_schedule, nullptr), mok::Error);
      mok::gpu::ForwardContext wrong_context(other);
      EXPECT_THROW(
          f.forward(s, batch, layer.weights(), reinterpret_cast<__nv_bfloat16*>(trained.ptr),
                    &wrong_context, nullptr),
          mok::Error);
      mok::gpu::Schedule empty(c);
      EXPECT_THROW(f.forward(empty, batch, layer.weights(),
                             reinterpret_cast<__nv_bfloat16*>(trained.ptr), nullptr, nullptr),
                   mok::Error);
    }
  }
}
