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
#include "layer/layer_runner.hpp"
#include "mok/error.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
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

EmulatedEpForward::EmulatedEpForward(const Config& c, const ForwardOptions& options)
    : EmulatedEpForward(c, options, detail::ForwardHooks{}) {}

EmulatedEpForward::EmulatedEpForward(const Config& c, const ForwardOptions& options,
                                     const detail::ForwardHooks& hooks) {
  c.validate();
  const int n = c.ep_size;
  require(n == 2 || n == 4 || n == 8, ErrorCode::unsupported,
          "EmulatedEpForward runs ep_size 2, 4 or 8 logical ranks, got " + std::to_string(n));
  require(c.num_experts <= detail::kMaxEpExperts, ErrorCode::unsupported, "at most 512 experts");
  runner_ = std::make_unique<detail::LayerRunner>(c, options, hooks, detail::Transport::emulated,
                                                  "EmulatedEpForward");
}

EmulatedEpForward::~EmulatedEpForward() = default;

namespace {
template <class T>
void require_per_rank(const std::vector<T>& v, int n, const char* what) {
  require(int(v.size()) == n, ErrorCode::invalid_argument,
          std::string("EmulatedEpForward: ") + what + ": one per rank (" + std::to_string(n) +
              "), got " + std::to_string(v.size()));
}
}  // namespace

void EmulatedEpForward::schedule_ranks(const std::vector<DeviceBatch>& batches,
                                       const std::vector<detail::RankSchedule*>& schedules,
                                       cudaStream_t stream) {
  const Config& c = runner_->config();
  const int n = c.ep_size;
  require_per_rank(batches, n, "batches");
  for (int r = 0; r < n; ++r) {
    detail::require_batch_operands(c, batches[size_t(r)], "rank " + std::to_string(r) + ": ");
    schedules[size_t(r)]->require_config(c, "EmulatedEpForward::schedule");
  }
  for (int r = 0; r < n; ++r)
    detail::build_forward_schedule(batches[size_t(r)], c.top_k, c.num_experts,
                                   schedules[size_t(r)]->sched, stream, /*owner_tables=*/false);
  OwnerScheduleArgs a{};
  a.ranks = n;
  a.experts = c.num_experts;
  a.capacity = schedules[0]->sched.capacity;
  a.capacity_blocks = schedules[0]->capacity_blocks;
  for (int r = 0; r < n; ++r) {
    detail::RankSchedule& w = *schedules[size_t(r)];
    a.counts[r] = w.sched.counts;
    a.source_status[r] = w.sched.status;
    a.seg_begin[r] = w.owner_seg_begin;
    a.segment_rows[r] = w.owner_segment_rows;
    a.source_begin[r] = w.owner_source_begin;
    a.tile_expert[r] = w.owner_tile_expert;
    a.group_status[r] = w.group_status;
    w.owner_built = true;
    w.tokens = batches[size_t(r)].tokens;
    ++w.generation;
  }
  owner_schedule_kernel<<<n, detail::kOwnerTableThreads, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "the owner schedule kernel");
}

void EmulatedEpForward::forward_ranks(const std::vector<const detail::RankSchedule*>& schedules,
                                      const std::vector<DeviceBatch>& batches,
                                      const std::vector<DeviceLayerWeights>& weights,
                                      const std::vector<__nv_bfloat16*>& outs,
                                      const std::vector<const ForwardContext*>& contexts,
                                      cudaStream_t stream) {
  detail::LayerRunner& runner = *runner_;
  const int n = runner.config().ep_size;
  require_per_rank(batches, n, "batches");
  require_per_rank(weights, n, "weights");
  require_per_rank(outs, n, "outputs");
  require(
      contexts.empty() || int(contexts.size()) == n, ErrorCode::invalid_argument,
      "EmulatedEpForward: contexts: none (inference) or one per rank (" + std::to_string(n) + ")");
  std::vector<detail::LayerRunner::RankCall> calls;
  for (int r = 0; r < n; ++r) {
    const size_t i = size_t(r);
    detail::require_forward_operands(runner.config(), batches[i], weights[i], outs[i]);
    calls.push_back(
        {batches[i], weights[i], outs[i], schedules[i], contexts.empty() ? nullptr : contexts[i]});
  }
  for (int r = 0; r < n; ++r) runner.rank(r).reset(stream);
  runner.launch(runner.make_launch(calls), stream, "the forward megakernel (emulated EP)");
}

void EmulatedEpForward::schedule(const std::vector<DeviceBatch>& batches,
                                 const std::vector<Schedule*>& schedules, cudaStream_t stream) {
  require_per_rank(schedules, runner_->config().ep_size, "schedules");
  std::vector<detail::RankSchedule*> s;
  for (Schedule* x : schedules) s.push_back(&x->state());
  schedule_ranks(batches, s, stream);
}

void EmulatedEpForward::forward(const std::vector<Schedule*>& schedules,
                                const std::vector<DeviceBatch>& batches,
                                const std::vector<DeviceLayerWeights>& weights,
                                const std::vector<__nv_bfloat16*>& outs,
                                const std::vector<const ForwardContext*>& contexts,
                                cudaStream_t stream) {
  require_per_rank(schedules, runner_->config().ep_size, "schedules");
  std::vector<const detail::RankSchedule*> s;
  for (Schedule* x : schedules) s.push_back(&x->state());
  forward_ranks(s, batches, weights, outs, contexts, stream);
}

void EmulatedEpForward::forward(const std::vector<DeviceBatch>& batches,
                                const std::vector<DeviceLayerWeights>& weights,
                                const std::vector<__nv_bfloat16*>& outs, cudaStream_t stream) {
  const int n = runner_->config().ep_size;
  std::vector<detail::RankSchedule*> own;
  for (int r = 0; r < n; ++r) own.push_back(&runner_->rank(r).schedule);
  schedule_ranks(batches, own, stream);
  forward_ranks({own.begin(), own.end()}, batches, weights, outs, {}, stream);
}

void EmulatedEpForward::check(cudaStream_t stream) { runner_->check(stream); }

int EmulatedEpForward::ranks() const { return runner_->config().ep_size; }
int EmulatedEpForward::ctas_per_rank() const {
  return runner_->plan().grid / runner_->config().ep_size;
}
RowPath EmulatedEpForward::row_path() const { return runner_->plan().row_path; }

}  // namespace mok::gpu
