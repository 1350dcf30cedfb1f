// The backward of an expert-parallel group over NCCL (EpBackward after EpForward's training
// forward) against the single-GPU backward on the same global batch, bit for bit: every rank's
// d_x and d_topk_weights rows, its local experts' weight gradients (FP32 and BF16), and its shared
// experts' per-rank partials (the single GPU's on the rank's own tokens); over repeated steps
// (both halves of the double-buffered barrier), for random, uneven (an empty rank), all-to-one-
// rank and all-to-one-expert routings and with injected dispatch delays; and a step captured in a
// CUDA graph replays to the direct run's bits. A group of one rank runs on any GPU machine (the
// whole NCCL path: window, LSA pointers, copies, barrier with itself); groups of 2, 4 and 8 need
// that many GPUs (one process driving them, or one process per GPU: EpNcclProcess.*), as does a
// rank that never reaches the backward. Each low precision's training step (fp8_block and mxfp8:
// x quantized into the window on its source rank) on a one-rank group equals the single GPU's.
#include <cuda_bf16.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "backward_test_util.hpp"
#include "mok/gpu/ep_backward.hpp"
#include "mok/gpu/ep_forward.hpp"
#include "mok/gpu/fp8_block_experts.hpp"
#include "mok/gpu/mxfp8_experts.hpp"
#include "mok/gpu/nvfp4_experts.hpp"
#include "nccl_test_util.hpp"
#include "quantized_backward_util.hpp"

using namespace ep_test;
using namespace bwd_test;

namespace {

// Rank r's inputs, output gradients and gradient buffers on its own device.
struct RankStep {
  RankInputs in;
  DeviceBuffer<uint16_t> d_out;
  Grads grads;
  mok::gpu::Schedule s;
  mok::gpu::ForwardContext ctx;
  RankStep(const GlobalBatch& g, const mok::Config& c, int ranks, int r, int64_t tokens,
           const std::vector<double>& d_out_all,
           mok::gpu::GateUpMode gate_up = mok::gpu::GateUpMode::keep)
      : in(g, ranks, r, tokens),
        d_out(to_bf16(tokens > 0
                          ? RankInputs::slice(d_out_all, g.first[size_t(r)], tokens, c.hidden)
                          : std::vector<double>(size_t(c.hidden), 0.0))),
        grads(c, tokens, c.num_experts / ranks),
        s(c),
        ctx(c, gate_up) {}
  const __nv_bfloat16* dy() const { return reinterpret_cast<const __nv_bfloat16*>(d_out.ptr); }
  void poison() {
    for (DeviceBuffer<float>* b :
         {&grads.d_w, &grads.sg, &grads.su, &grads.sd, &grads.g, &grads.u, &grads.d})
      ASSERT_EQ(cudaMemset(b->ptr, 0xFF, b->n * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(grads.d_x.ptr, 0xFF, grads.d_x.n * 2), cudaSuccess);
  }
};

// Rank r's outputs against the single GPU's: its token rows, its experts' slices, and its shared
// partials against the single-GPU backward of its own tokens.
void expect_rank_equals_ep1(const RankStep& rs, const std::vector<std::vector<uint8_t>>& all,
                            const std::vector<std::vector<uint8_t>>& own_tokens,
                            const mok::Config& c, int64_t first, int64_t tokens, int r, int El,
                            WeightGrads mode) {
  const size_t H = size_t(c.hidden), K = size_t(c.top_k),
               esize = mode == WeightGrads::write_bf16 ? 2 : 4,
               per_rank = size_t(El) * size_t(c.intermediate) * H * esize;
  auto slice = [](const std::vector<uint8_t>& v, size_t begin, size_t n) {
    return std::vector<uint8_t>(v.begin() + long(begin), v.begin() + long(begin + n));
  };
  EXPECT_EQ(bytes_of(rs.grads.d_x, 0, size_t(tokens) * H),
            slice(all[0], size_t(first) * H * 2, size_t(tokens) * H * 2))
      << "d_x";
  EXPECT_EQ(bytes_of(rs.grads.d_w, 0, size_t(tokens) * K),
            slice(all[1], size_t(first) * K * 4, size_t(tokens) * K * 4))
      << "d_topk_weights";
  const DeviceBuffer<float>* routed[3] = {&rs.grads.g, &rs.grads.u, &rs.grads.d};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(slice(bytes_of(*routed[i]), 0, per_rank),
              slice(all[size_t(5 + i)], size_t(r) * per_rank, per_rank))
        << kNames[5 + i];
  const DeviceBuffer<float>* shared[3] = {&rs.grads.sg, &rs.grads.su, &rs.grads.sd};
  for (int i = 0; c.shared_width() > 0 && i < 3; ++i)
    EXPECT_EQ(bytes_of(*shared[i]), own_tokens[size_t(2 + i)])
        << kNames[2 + i] << ": bits differ from the rank's tokens' backward";
}

std::vector<double> global_d_out(const GlobalBatch& g) {
  return mok::tools::random_vector(size_t(std::max<int64_t>(g.total * g.global.hidden, 1)), 81,
                                   0.5);
}

// The single-GPU backward (current device) of the whole batch, and of each rank's tokens.
struct Expected {
  std::vector<std::vector<uint8_t>> all;
  std::vector<std::vector<std::vector<uint8_t>>> own_tokens;
};
Expected expected(const GlobalBatch& g, const EpCase& k, const std::vector<double>& d_out_all,
                  WeightGrads mode) {
  DeviceBuffer<uint16_t> x(to_bf16(g.batch.x)), d_out(to_bf16(d_out_all));
  DeviceBuffer<int32_t> ids(g.batch.topk_ids);
  DeviceBuffer<float> w(
      std::vector<float>(g.batch.topk_weights.begin(), g.batch.topk_weights.end()));
  Expected e;
  e.all = ep1_backward(g, x, ids, w, d_out, 0, g.total, mode);
  for (size_t r = 0; r < k.tokens.size(); ++r)
    e.own_tokens.push_back(ep1_backward(g, x, ids, w, d_out, g.first[r], k.tokens[r], mode));
  return e;
}

// One process drives `ranks` GPUs: `rounds` training steps (schedule, forward, backward) of one
// global batch; every rank's gradients against the single GPU's after each (which keeps g | u:
// recomputing them must give the same bits).
void expect_group_equals_ep1(int ranks, const EpCase& k, int rounds,
                             WeightGrads mode = WeightGrads::write_fp32,
                             mok::gpu::GateUpMode gate_up = mok::gpu::GateUpMode::keep) {
  const GlobalBatch g = make_global_batch(ranks, k);
  const std::vector<double> d_out_all = global_d_out(g);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const Expected want = expected(g, k, d_out_all, mode);
  const mok::Config c = rank_config(g, ranks, k);
  const int El = c.num_experts / ranks;
  mok::gpu::BackwardOptions o;
  o.weight_grads = mode;
  o.gate_up = gate_up;
  Comms comms(ranks);
  std::vector<std::unique_ptr<RankStep>> steps;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    steps.push_back(
        std::make_unique<RankStep>(g, c, ranks, r, k.tokens[size_t(r)], d_out_all, gate_up));
  }
  {
    auto forwards =
        mok::gpu::EpForward::create_group(c, comms.comms, case_options(k), case_hooks(k));
    auto backwards = mok::gpu::EpBackward::create_group(c, comms.comms, o, case_hooks(k));
    for (int round = 0; round < rounds; ++round) {
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        steps[size_t(r)]->poison();
      }
      for (int r = 0; r < ranks; ++r) {
        RankStep& rs = *steps[size_t(r)];
        forwards[size_t(r)]->schedule(rs.in.batch, rs.s, nullptr);
      }
      for (int r = 0; r < ranks; ++r) {
        RankStep& rs = *steps[size_t(r)];
        forwards[size_t(r)]->forward(rs.s, rs.in.batch, rs.in.weights, rs.in.out_ptr(), &rs.ctx,
                                     nullptr);
      }
      for (int r = 0; r < ranks; ++r) {
        RankStep& rs = *steps[size_t(r)];
        backwards[size_t(r)]->backward(rs.s, rs.ctx, rs.in.batch, rs.in.weights, rs.dy(),
                                       rs.grads.at(c, 0, 0, mode), nullptr);
      }
      for (int r = 0; r < ranks; ++r) {
        SCOPED_TRACE("round " + std::to_string(round) + ", rank " + std::to_string(r));
        forwards[size_t(r)]->check(nullptr);
        backwards[size_t(r)]->check(nullptr);
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        expect_rank_equals_ep1(*steps[size_t(r)], want.all, want.own_tokens[size_t(r)], c,
                               g.first[size_t(r)], k.tokens[size_t(r)], r, El, mode);
      }
    }
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// Random, uneven with an empty rank, all to rank 0, all to one expert, dispatch delays; then BF16
// weight gradients.
void expect_every_case(int ranks) {
  const std::vector<EpCase> all = standard_cases(ranks);
  for (size_t i : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5)}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks) + ", case " + std::to_string(i));
    expect_group_equals_ep1(ranks, all[i], 3);
  }
  SCOPED_TRACE("ranks " + std::to_string(ranks) + ", BF16 weight gradients");
  expect_group_equals_ep1(ranks, all[0], 2, WeightGrads::write_bf16);
  SCOPED_TRACE("ranks " + std::to_string(ranks) + ", recomputing g | u, delays");
  expect_group_equals_ep1(ranks, all[5], 2, WeightGrads::write_fp32,
                          mok::gpu::GateUpMode::recompute);
}

}  // namespace

TEST(EpNcclBackwardGpu, OneRankGroupEqualsTheSingleGpuBackwardBitForBit) {
  MOK_REQUIRE_GPU();
  expect_every_case(1);
}

// Schedule, forward and backward of a one-rank group captured in one CUDA graph: two replays, the
// second with new d_out values in the captured buffer, equal the direct runs.
TEST(EpNcclBackwardGpu, GraphReplayEqualsDirectRuns) {
  MOK_REQUIRE_GPU();
  const EpCase k{{400}};
  const GlobalBatch g = make_global_batch(1, k);
  const mok::Config c = rank_config(g, 1, k);
  const int64_t H = c.hidden;
  const std::vector<double> d_out1 = mok::tools::random_vector(size_t(400 * H), 91, 0.5),
                            d_out2 = mok::tools::random_vector(size_t(400 * H), 92, 0.5);
  Comms comms(1);
  RankStep rs(g, c, 1, 0, 400, d_out1);
  auto forwards = mok::gpu::EpForward::create_group(c, comms.comms);
  auto backwards = mok::gpu::EpBackward::create_group(c, comms.comms);
  mok::gpu::EpForward& f = *forwards[0];
  mok::gpu::EpBackward& bw = *backwards[0];
  auto all_bytes = [&] {
    return std::vector<std::vector<uint8_t>>{bytes_of(rs.grads.d_x), bytes_of(rs.grads.d_w),
                                             bytes_of(rs.grads.sg),  bytes_of(rs.grads.su),
                                             bytes_of(rs.grads.sd),  bytes_of(rs.grads.g),
                                             bytes_of(rs.grads.u),   bytes_of(rs.grads.d)};
  };
  cudaStream_t stream;
  MOK_CUDA_OK(cudaStreamCreate(&stream));
  auto step = [&] {
    f.schedule(rs.in.batch, rs.s, stream);
    f.forward(rs.s, rs.in.batch, rs.in.weights, rs.in.out_ptr(), &rs.ctx, stream);
    bw.backward(rs.s, rs.ctx, rs.in.batch, rs.in.weights, rs.dy(), rs.grads.at(c, 0, 0), stream);
  };
  auto set_d_out = [&](const std::vector<double>& v) {
    const std::vector<uint16_t> h = to_bf16(v);
    MOK_CUDA_OK(cudaMemcpy(rs.d_out.ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  };
  step();
  f.check(stream);
  bw.check(stream);
  const auto direct1 = all_bytes();
  set_d_out(d_out2);
  rs.poison();
  step();
  bw.check(stream);
  const auto direct2 = all_bytes();
  EXPECT_NE(direct1[0], direct2[0]) << "a new d_out must change d_x";

  set_d_out(d_out1);
  rs.poison();
  cudaGraph_t graph;
  MOK_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  MOK_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MOK_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  MOK_CUDA_OK(cudaGraphLaunch(exec, stream));
  f.check(stream);
  bw.check(stream);
  EXPECT_EQ(all_bytes(), direct1) << "first replay";
  set_d_out(d_out2);
  rs.poison();
  MOK_CUDA_OK(cudaGraphLaunch(exec, stream));
  bw.check(stream);
  EXPECT_EQ(all_bytes(), direct2) << "second replay, new d_out";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A one-rank group's forward and backward, for quant_bwd::run_quantized.
struct OneRankGroup {
  Comms comms{1};
  std::vector<std::unique_ptr<mok::gpu::EpForward>> forwards;
  std::vector<std::unique_ptr<mok::gpu::EpBackward>> backwards;
  mok::gpu::EpForward& f;
  mok::gpu::EpBackward& bw;
  OneRankGroup(const mok::Config& c, const mok::gpu::BackwardOptions& o,
               const mok::gpu::detail::ForwardHooks& hooks)
      : forwards(mok::gpu::EpForward::create_group(c, comms.comms, {}, hooks)),
        backwards(mok::gpu::EpBackward::create_group(c, comms.comms, o, hooks)),
        f(*forwards[0]),
        bw(*backwards[0]) {}
};

// One precision's step on a one-rank group against MoeForward + MoeBackward on the same inputs:
// the output, d_x, d_topk_weights and every weight gradient bit for bit, with and without
// dispatch delays; the odd cases of the precisions' own suites (an expert without rows, router
// weights of 0, T not a multiple of 128).
template <class Experts>
void expect_one_rank_group_equals_one_gpu(mok::Precision precision, uint64_t seed) {
  const mok::Config c = quant_bwd::quantized_config(precision, 512, 256, 8, 3, 1, 256, 300);
  const mok::LayerParams p = mok::tools::random_params(c, seed);
  mok::Batch b = quant_bwd::case_batch(c, 300, seed + 1, 1, true);
  const std::vector<double> d_out =
      mok::tools::random_vector(size_t(300 * c.hidden), seed + 2, 0.5);
  const one_gpu::HostGrads want = quant_bwd::run_quantized<Experts>(c, p, b, d_out, 128);
  mok::gpu::detail::ForwardHooks delays;
  delays.dispatch_delay_ns = 20'000, delays.delay_seed = 7;
  for (const auto& hooks : {mok::gpu::detail::ForwardHooks{}, delays}) {
    SCOPED_TRACE(hooks.dispatch_delay_ns ? "dispatch delays" : "no delays");
    const one_gpu::HostGrads got =
        quant_bwd::run_quantized<Experts, OneRankGroup>(c, p, b, d_out, 128, hooks);
    EXPECT_TRUE(fwd_test::same_bits(got.out, want.out)) << "the forward's output";
    for (int i = 0; i < 7; ++i) EXPECT_EQ(got.bits[i], want.bits[i]) << "gradient " << i;
  }
}

TEST(EpNcclBackwardGpu, LowPrecisionOneRankGroupEqualsTheSingleGpuBitForBit) {
  MOK_REQUIRE_GPU();
  {
    SCOPED_TRACE("fp8_block");
    expect_one_rank_group_equals_one_gpu<mok::gpu::Fp8BlockExperts>(mok::Precision::fp8_block, 510);
  }
  {
    SCOPED_TRACE("nvfp4");
    expect_one_rank_group_equals_one_gpu<mok::gpu::Nvfp4Experts>(mok::Precision::nvfp4, 520);
  }
  {
    SCOPED_TRACE("mxfp8");
    expect_one_rank_group_equals_one_gpu<mok::gpu::Mxfp8Experts>(mok::Precision::mxfp8, 530);
  }
}

TEST(EpNcclBackwardGpu, ACommunicatorOfAnotherGroupIsRefused) {
  MOK_REQUIRE_GPU();
  mok::Config c = mok::preset("tiny");
  c.ep_size = 2;
  Comms comms(1);
  try {
    mok::gpu::EpBackward bad(c, comms.comms[0]);
    ADD_FAILURE() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), mok::ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("EpBackward: the communicator has 1 ranks and this is "
                                         "rank 0, but the Config says ep_size = 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(EpNcclBackwardGpu, GroupsOfTwoFourEightGpusEqualTheSingleGpuBackward) {
  MOK_REQUIRE_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count();
  for (int ranks : {2, 4, 8})
    if (ranks <= gpu_count()) expect_every_case(ranks);
}

// Rank 1 never calls backward: rank 0's barrier gives up within wait_seconds and its check names
// rank 1; the destructors still return.
TEST(EpNcclBackwardGpu, ARankThatNeverArrivesIsAnErrorNamingIt) {
  MOK_REQUIRE_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count();
  const int ranks = 2;
  const EpCase k{{100, 100}};
  const GlobalBatch g = make_global_batch(ranks, k);
  const mok::Config c = rank_config(g, ranks, k);
  const std::vector<double> d_out_all =
      mok::tools::random_vector(size_t(g.total * g.global.hidden), 83, 0.5);
  Comms comms(ranks);
  std::vector<std::unique_ptr<RankStep>> steps;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    steps.push_back(std::make_unique<RankStep>(g, c, ranks, r, 100, d_out_all));
  }
  mok::gpu::BackwardOptions o;
  o.wait_seconds = 0.25;
  {
    auto forwards = mok::gpu::EpForward::create_group(c, comms.comms);
    auto backwards = mok::gpu::EpBackward::create_group(c, comms.comms, o);
    for (int r = 0; r < ranks; ++r)
      forwards[size_t(r)]->schedule(steps[size_t(r)]->in.batch, steps[size_t(r)]->s, nullptr);
    for (int r = 0; r < ranks; ++r) {
      RankStep& rs = *steps[size_t(r)];
      forwards[size_t(r)]->forward(rs.s, rs.in.batch, rs.in.weights, rs.in.out_ptr(), &rs.ctx,
                                   nullptr);
    }
    for (int r = 0; r < ranks; ++r) forwards[size_t(r)]->check(nullptr);
    RankStep& rs = *steps[0];
    backwards[0]->backward(rs.s, rs.ctx, rs.in.batch, rs.in.weights, rs.dy(), rs.grads.at(c, 0, 0),
                           nullptr);
    try {
      backwards[0]->check(nullptr);
      ADD_FAILURE() << "no error";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.code(), mok::ErrorCode::peer_timeout);
      EXPECT_NE(std::string(e.what()).find("rank 0: rank 1 did not reach the backward"),
                std::string::npos)
          << e.what();
    }
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// One process per GPU: `scripts/ep_processes.sh RANKS build-gpu/tests/test_ep_nccl_backward_gpu`.
// Every rank's gradients over two steps per case, then a rank that skips its backward.
TEST(EpNcclProcess, EveryRanksBackwardEqualsTheSingleGpuBackward) {
  if (!started_by_ep_processes())
    GTEST_SKIP()
        << "started by scripts/ep_processes.sh (MOK_EP_RANK, MOK_EP_RANKS, MOK_EP_ID_FILE)";
  int rank = 0, ranks = 0;
  ncclComm_t comm = process_comm(&rank, &ranks);
  ASSERT_NE(comm, nullptr);
  const std::vector<EpCase> cases = standard_cases(ranks);
  for (size_t i : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5)}) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ", case " + std::to_string(i));
    const EpCase& k = cases[i];
    const GlobalBatch g = make_global_batch(ranks, k);
    const std::vector<double> d_out_all = global_d_out(g);
    const Expected want = expected(g, k, d_out_all, WeightGrads::write_fp32);
    mok::Config c = rank_config(g, ranks, k);
    c.ep_rank = rank;
    const int64_t tokens = k.tokens[size_t(rank)];
    RankStep rs(g, c, ranks, rank, tokens, d_out_all);
    mok::gpu::EpForward f(c, comm, case_options(k), case_hooks(k));
    mok::gpu::EpBackward bw(c, comm, mok::gpu::BackwardOptions{}, case_hooks(k));
    for (int round = 0; round < 2; ++round) {
      rs.poison();
      f.schedule(rs.in.batch, rs.s, nullptr);
      f.forward(rs.s, rs.in.batch, rs.in.weights, rs.in.out_ptr(), &rs.ctx, nullptr);
      bw.backward(rs.s, rs.ctx, rs.in.batch, rs.in.weights, rs.dy(), rs.grads.at(c, 0, 0), nullptr);
      f.check(nullptr);
      bw.check(nullptr);
      expect_rank_equals_ep1(rs, want.all, want.own_tokens[size_t(rank)], c, g.first[size_t(rank)],
                             tokens, rank, c.num_experts / ranks, WeightGrads::write_fp32);
    }
  }
  {  // the last rank skips its backward: every other rank's check names it, within 0.25 s
    const EpCase k{std::vector<int64_t>(size_t(ranks), 100)};
    const GlobalBatch g = make_global_batch(ranks, k);
    mok::Config c = rank_config(g, ranks, k);
    c.ep_rank = rank;
    RankStep rs(g, c, ranks, rank, 100, global_d_out(g));
    mok::gpu::BackwardOptions o;
    o.wait_seconds = 0.25;
    mok::gpu::EpForward f(c, comm);
    mok::gpu::EpBackward late(c, comm, o);
    f.schedule(rs.in.batch, rs.s, nullptr);
    f.forward(rs.s, rs.in.batch, rs.in.weights, rs.in.out_ptr(), &rs.ctx, nullptr);
    f.check(nullptr);
    if (rank != ranks - 1) {
      late.backward(rs.s, rs.ctx, rs.in.batch, rs.in.weights, rs.dy(), rs.grads.at(c, 0, 0),
                    nullptr);
      try {
        late.check(nullptr);
        ADD_FAILURE() << "no error";
      } catch (const mok::Error& e) {
        EXPECT_EQ(e.code(), mok::ErrorCode::peer_timeout);
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(ranks - 1) +
                                             " did not reach the backward"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  ncclCommDestroy(comm);
}
