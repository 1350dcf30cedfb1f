// Expert parallelism over NCCL's device API (EpForward): every rank's output equals the EP = 1
// megakernel's rows for its tokens on the same global batch, bit for bit, across repeated
// forwards (both halves of the double-buffered exchange), for random, uneven (an empty rank),
// skewed (all tokens to rank 0, all to one expert) routings, rings smaller than the batch and
// random dispatch delays. A group of one rank runs on any GPU machine (the whole NCCL path: window,
// device communicator, LSA pointers, exchange with itself); groups of 2, 4 and 8 need that many
// GPUs, in one process (ncclCommInitAll) or, for EpNcclProcess.*, one process per GPU started by
// scripts/ep_processes.sh (MOK_EP_RANK, MOK_EP_RANKS, MOK_EP_ID_FILE).
#include <nccl.h>

#include <cstdlib>
#include <memory>

#include "ep_test_util.hpp"
#include "nccl_test_util.hpp"
#include "mok/gpu/ep_forward.hpp"
#include "mok/transport/bootstrap.hpp"

using namespace ep_test;

namespace {

std::vector<double> rank_rows(const std::vector<double>& all, const GlobalBatch& g, int r,
                              int64_t tokens) {
  return RankInputs::slice(all, g.first[size_t(r)], tokens, g.global.hidden);
}

// One forward of every rank of `group` on its inputs (outputs poisoned first): each rank's rows of
// the single GPU's output `want`, bit for bit.
template <class Group>
void expect_forward_gives_rows(Group& group, std::vector<std::unique_ptr<RankInputs>>& in,
                               const GlobalBatch& g, const std::vector<double>& want,
                               const std::vector<int64_t>& tokens) {
  const int ranks = int(in.size());
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    ASSERT_EQ(cudaMemset(in[size_t(r)]->out.ptr, 0xFF, in[size_t(r)]->out.n * 2), cudaSuccess);
  }
  for (int r = 0; r < ranks; ++r)
    group[size_t(r)]->forward(in[size_t(r)]->batch, in[size_t(r)]->weights,
                              in[size_t(r)]->out_ptr(), nullptr);
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    group[size_t(r)]->check(nullptr);
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    EXPECT_TRUE(same_bits(in[size_t(r)]->output(), rank_rows(want, g, r, tokens[size_t(r)])));
  }
}

// One process drives `ranks` GPUs; `rounds` forwards of the same batch.
void expect_group_equals_ep1(int ranks, const EpCase& k, int rounds) {
  const GlobalBatch g = make_global_batch(ranks, k);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::vector<double> want = ep1_output(g);
  const mok::Config c = rank_config(g, ranks, k);
  const mok::gpu::ForwardOptions o = case_options(k);
  Comms comms(ranks);
  std::vector<std::unique_ptr<RankInputs>> in;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    in.push_back(std::make_unique<RankInputs>(g, ranks, r, k.tokens[size_t(r)]));
  }
  {
    auto group = mok::gpu::EpForward::create_group(c, comms.comms, o, case_hooks(k));
    for (int round = 0; round < rounds; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      expect_forward_gives_rows(group, in, g, want, k.tokens);
    }
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

}  // namespace

TEST(EpNcclGpu, OneRankGroupEqualsTheMegakernelBitForBit) {
  MOK_REQUIRE_GPU();
  mok::transport::require_matching_nccl();
  const auto cases = standard_cases(1);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    expect_group_equals_ep1(1, cases[i], 3);
  }
  // With the producer gather a one-rank group has nothing to dispatch: no dispatch CTAs, as in
  // MoeForward; the copy path and the dispatch options keep them.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  Comms comms(1);
  const mok::Config c = mok::preset("tiny");
  for (int variant = 0; variant < 3; ++variant) {
    mok::gpu::ForwardOptions o;
    if (variant == 1) o.row_path = mok::gpu::RowPath::dispatch_copy;
    if (variant == 2) o.dispatch_ctas = 3;
    auto group = mok::gpu::EpForward::create_group(c, comms.comms, o);
    EXPECT_EQ(group[0]->row_path(),
              variant == 1 ? mok::gpu::RowPath::dispatch_copy : mok::gpu::RowPath::producer_gather);
    if (variant == 0)
      EXPECT_EQ(group[0]->dispatch_ctas(), 0);
    else
      EXPECT_GT(group[0]->dispatch_ctas(), 0);
  }
}

TEST(EpNcclGpu, GroupsOfTwoFourEightGpusEqualTheSingleGpuForward) {
  MOK_REQUIRE_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count();
  for (int ranks : {2, 4, 8}) {
    if (ranks > gpu_count()) break;
    const auto cases = standard_cases(ranks);
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", case " + std::to_string(i));
      expect_group_equals_ep1(ranks, cases[i], 2);
    }
  }
}

TEST(EpNcclGpu, CapacityOverflowAndAMissingRankAreErrorsOnEveryRankThenTheGroupIsRebuilt) {
  MOK_REQUIRE_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count();
  const int ranks = 2;
  EpCase k{{100, 100}};
  GlobalBatch g = make_global_batch(ranks, k);
  const int El = g.global.num_experts / ranks;
  for (int32_t& id : g.batch.topk_ids) id = El;  // every row to rank 1's first expert
  mok::Config c = rank_config(g, ranks, k);
  c.routed_capacity_rows = 256;  // rank 1 needs 2 * 100 * K rows
  Comms comms(ranks);
  std::vector<std::unique_ptr<RankInputs>> in;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    in.push_back(std::make_unique<RankInputs>(g, ranks, r, 100));
  }
  {
    auto group = mok::gpu::EpForward::create_group(c, comms.comms);
    for (int r = 0; r < ranks; ++r)
      group[size_t(r)]->forward(in[size_t(r)]->batch, in[size_t(r)]->weights,
                                in[size_t(r)]->out_ptr(), nullptr);
    for (int r = 0; r < ranks; ++r) {
      expect_check_error(*group[size_t(r)], mok::ErrorCode::capacity_exceeded,
                         "rank 1: the batch needs");
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      for (double v : in[size_t(r)]->output()) ASSERT_TRUE(std::isnan(v));
    }
  }
  {
    mok::gpu::ForwardOptions o;
    o.wait_seconds = 0.25;
    mok::Config ok = c;
    ok.routed_capacity_rows = 0;
    auto group = mok::gpu::EpForward::create_group(ok, comms.comms, o);
    group[0]->forward(in[0]->batch, in[0]->weights, in[0]->out_ptr(), nullptr);  // rank 1 never
    expect_check_error(*group[0], mok::ErrorCode::peer_timeout,
                       "rank 0: rank 1 did not publish its routing counts for forward 1");
  }
  {  // The group rebuilt on the same communicators: every rank's rows of the single GPU's output.
    const std::vector<double> want = ep1_output(g);
    mok::Config ok = c;
    ok.routed_capacity_rows = 0;
    auto group = mok::gpu::EpForward::create_group(ok, comms.comms);
    expect_forward_gives_rows(group, in, g, want, k.tokens);
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// One process per GPU (scripts/ep_processes.sh starts one per rank).
TEST(EpNcclProcess, EveryRankEqualsTheSingleGpuForwardAndErrorsReachEveryRank) {
  if (!started_by_ep_processes())
    GTEST_SKIP()
        << "started by scripts/ep_processes.sh (MOK_EP_RANK, MOK_EP_RANKS, MOK_EP_ID_FILE)";
  int rank = 0, ranks = 0;
  ncclComm_t comm = process_comm(&rank, &ranks);
  ASSERT_NE(comm, nullptr);
  const auto cases = standard_cases(ranks);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ", case " + std::to_string(i));
    const EpCase& k = cases[i];
    const GlobalBatch g = make_global_batch(ranks, k);
    const std::vector<double> want = ep1_output(g);
    mok::Config c = rank_config(g, ranks, k);
    c.ep_rank = rank;
    const mok::gpu::ForwardOptions o = case_options(k);
    RankInputs in(g, ranks, rank, k.tokens[size_t(rank)]);
    mok::gpu::EpForward ep(c, comm, o, case_hooks(k));
    for (int round = 0; round < 3; ++round) {
      ASSERT_EQ(cudaMemset(in.out.ptr, 0xFF, in.out.n * 2), cudaSuccess);
      ep.forward(in.batch, in.weights, in.out_ptr(), nullptr);
      ep.check(nullptr);
      EXPECT_TRUE(same_bits(in.output(), rank_rows(want, g, rank, k.tokens[size_t(rank)])));
    }
  }
  if (ranks >= 2) {  // capacity overflow on rank 1: an error on every rank (a group of two or more)
    EpCase k{std::vector<int64_t>(size_t(ranks), 100)};
    GlobalBatch g = make_global_batch(ranks, k);
    for (int32_t& id_ : g.batch.topk_ids) id_ = g.global.num_experts / ranks;
    mok::Config c = rank_config(g, ranks, k);
    c.ep_rank = rank;
    c.routed_capacity_rows = 256;
    RankInputs in(g, ranks, rank, 100);
    mok::gpu::EpForward ep(c, comm);
    ep.forward(in.batch, in.weights, in.out_ptr(), nullptr);
    expect_check_error(ep, mok::ErrorCode::capacity_exceeded, "rank 1: the batch needs");
    // a missing rank: the last rank skips its forward; every other rank gets a bounded error
    mok::Config ok = c;
    ok.routed_capacity_rows = 0;
    mok::gpu::ForwardOptions o;
    o.wait_seconds = 0.25;
    mok::gpu::EpForward late(ok, comm, o);
    if (rank != ranks - 1) {
      late.forward(in.batch, in.weights, in.out_ptr(), nullptr);
      expect_check_error(late, mok::ErrorCode::peer_timeout,
                         "rank " + std::to_string(ranks - 1) +
                             " did not publish its routing counts for forward 1");
    }
  }
  ncclCommDestroy(comm);
}
