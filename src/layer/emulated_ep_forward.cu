// Expert parallelism on one GPU: see mok/gpu/emulated_ep_forward.hpp. Every rank builds its source
// schedule; one small kernel builds every owner's tables from all sources' counts (and the group's
// status: any rank's bad id or any owner's overflow fails every rank); one megakernel launch runs
// all ranks, each on its share of the grid, reaching the others through the peer tables.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_schedule.hpp"
#include "layer/owner_schedule.cuh"
#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
using detail::kTileRows;
using detail::require;
using detail::Status;

struct OwnerScheduleArgs {
  int ranks, experts;
  int64_t capacity, capacity_blocks;
  const int32_t* counts[kern::kMaxRanks];  // each source's [E]
  const Status* source_status[kern::kMaxRanks];
  int64_t* seg_begin[kern::kMaxRanks];
  int64_t* segment_rows[kern::kMaxRanks];
  int64_t* source_begin[kern::kMaxRanks];
  int32_t* tile_expert[kern::kMaxRanks];
  Status* group_status[kern::kMaxRanks];
};

// Block r builds owner r's tables and the group's status; every block reaches the same verdict.
__global__ void __launch_bounds__(detail::kOwnerTableThreads)
    owner_schedule_kernel(const __grid_constant__ OwnerScheduleArgs a) {
  __shared__ int32_t counts[kern::kMaxRanks * detail::kMaxEpExperts];  // [source][expert]
  const int owner = int(blockIdx.x), n = a.ranks, e_all = a.experts;
  for (int i = int(threadIdx.x); i < n * e_all; i += int(blockDim.x))
    counts[i] = a.counts[i / e_all][i % e_all];
  __syncthreads();
  detail::build_owner_tables(counts, n, e_all, owner, a.capacity, a.capacity_blocks,
                             [&](int src) { return *a.source_status[src]; }, /*missing=*/-1, 0,
                             {a.seg_begin[owner], a.segment_rows[owner], a.source_begin[owner],
                              a.tile_expert[owner], a.group_status[owner]});
}

}  // namespace

struct EmulatedEpForward::Workspace {
  std::vector<detail::RankBuffers> ranks;  // the group's aborted flag: ranks[0].aborted
};

EmulatedEpForward::EmulatedEpForward(const Config& c, const ForwardOptions& options, int stuck_rank)
    : config_(c), options_(options), stuck_rank_(stuck_rank), ws_(nullptr) {
  c.validate();
  const int n = c.ep_size;
  require(n == 2 || n == 4 || n == 8, ErrorCode::unsupported,
          "EmulatedEpForward runs ep_size 2, 4 or 8 logical ranks, got " + std::to_string(n));
  require(c.num_experts <= detail::kMaxEpExperts, ErrorCode::unsupported, "at most 512 experts");
  row_path_ = detail::resolve_row_path(c, options, /*expert_parallel=*/true);
  const detail::LaunchPlan plan =
      detail::plan_forward_launch(c, options, n, "EmulatedEpForward", row_path_);
  block_n_ = plan.block_n;
  grid_ = plan.grid;
  dispatch_ctas_ = plan.dispatch_ctas;
  options_.wait_seconds = plan.wait_seconds;
  wait_cycles_ = plan.wait_cycles;
  require(options.dispatch_lookahead <= 0, ErrorCode::unsupported,
          "dispatch_lookahead is not supported with emulated ranks");
  auto* w = new Workspace{};
  ws_ = w;
  w->ranks.resize(size_t(n));
  for (auto& r : w->ranks)
    r.allocate(c, {.timings = options.profile_wait_times,
                   .owner_tables = true,
                   .random_ring = options.profile_without_dispatch_copy});
}

EmulatedEpForward::~EmulatedEpForward() {
  if (!ws_) return;
  for (auto& r : ws_->ranks) r.release();
  delete ws_;
}

void EmulatedEpForward::forward(const std::vector<DeviceBatch>& batches,
                                const std::vector<DeviceLayerWeights>& weights,
                                const std::vector<__nv_bfloat16*>& outs, cudaStream_t stream) {
  const Config& c = config_;
  const int n = c.ep_size;
  require(int(batches.size()) == n && int(weights.size()) == n && int(outs.size()) == n,
          ErrorCode::invalid_argument,
          "one batch, one set of weights and one output per rank (" + std::to_string(n) + ")");
  for (int r = 0; r < n; ++r)
    require(batches[size_t(r)].tokens >= 0 && batches[size_t(r)].tokens <= c.max_tokens_per_rank,
            ErrorCode::invalid_argument,
            "rank " + std::to_string(r) + ": tokens = " +
                std::to_string(batches[size_t(r)].tokens) + " is outside [0, max_tokens_per_rank]");
  auto& ranks = ws_->ranks;
  for (int r = 0; r < n; ++r)
    detail::build_forward_schedule(batches[size_t(r)], c.top_k, c.num_experts,
                                   ranks[size_t(r)].sched, stream, /*owner_tables=*/false);
  OwnerScheduleArgs a{};
  a.ranks = n;
  a.experts = c.num_experts;
  a.capacity = ranks[0].sched.capacity;
  a.capacity_blocks = ranks[0].capacity_blocks;
  for (int r = 0; r < n; ++r) {
    const detail::RankBuffers& w = ranks[size_t(r)];
    a.counts[r] = w.sched.counts;
    a.source_status[r] = w.sched.status;
    a.seg_begin[r] = w.owner_seg_begin;
    a.segment_rows[r] = w.owner_segment_rows;
    a.source_begin[r] = w.owner_source_begin;
    a.tile_expert[r] = w.owner_tile_expert;
    a.group_status[r] = w.group_status;
  }
  owner_schedule_kernel<<<n, detail::kOwnerTableThreads, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "the owner schedule kernel");
  for (const auto& w : ranks) w.reset(stream);

  kern::ForwardLaunch launch{};
  launch.ranks = n;
  for (int r = 0; r < n; ++r) {
    detail::RankLaunchOptions o;
    o.ep_rank = r;
    o.dispatch_ctas = dispatch_ctas_;
    o.gather_rows = row_path_ == RowPath::producer_gather;
    o.wait_cycles = wait_cycles_;
    o.aborted = ranks[0].aborted;
    ForwardOptions rank_options = options_;
    if (r != stuck_rank_) rank_options.never_publish_block = -1;
    o.options = &rank_options;
    launch.maps[r] =
        detail::rank_maps(ranks[size_t(r)], c, batches[size_t(r)], weights[size_t(r)], block_n_);
    launch.params[r] =
        detail::rank_params(ranks[size_t(r)], c, batches[size_t(r)], outs[size_t(r)], o);
  }
  for (int r = 0; r < n; ++r)  // every rank reaches every other rank's buffers
    for (int q = 0; q < n; ++q) {
      const kern::ForwardParams& other = launch.params[q];
      kern::ForwardParams& p = launch.params[r];
      p.peer_x[q] = other.peer_x[q];
      p.peer_offsets[q] = other.peer_offsets[q];
      p.peer_sorted[q] = other.peer_sorted[q];
      p.peer_y_slots[q] = other.peer_y_slots[q];
      p.peer_token_done[q] = other.peer_token_done[q];
    }
  check_cuda(kern::launch_moe_forward(launch, detail::forward_kernel(block_n_, options_, row_path_),
                                      grid_, stream),
             "the forward megakernel (emulated EP)");
}

void EmulatedEpForward::check(cudaStream_t stream) {
  const int n = config_.ep_size;
  Status st{};
  std::vector<kern::ForwardFault> faults(static_cast<size_t>(n));
  check_cuda(
      cudaMemcpyAsync(&st, ws_->ranks[0].group_status, sizeof st, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  for (int r = 0; r < n; ++r)
    check_cuda(cudaMemcpyAsync(&faults[size_t(r)], ws_->ranks[size_t(r)].fault,
                               sizeof(kern::ForwardFault), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  detail::throw_on_status(st, config_.num_experts, ws_->ranks[0].sched.capacity, n);
  // The rank whose most upstream stopped role is the furthest upstream is the cause.
  for (int role = 0; role < kern::kForwardRoles; ++role)
    for (int r = 0; r < n; ++r)
      if (faults[size_t(r)].records[role].seen)
        detail::throw_on_fault(faults[size_t(r)], options_.wait_seconds,
                               "rank " + std::to_string(r) + ": ");
}

}  // namespace mok::gpu
