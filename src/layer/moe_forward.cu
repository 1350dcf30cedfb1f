// The single-GPU front of the forward: the schedule kernels of one rank, then the shared runner.
#include "mok/gpu/moe_forward.hpp"

#include <string>

#include "layer/forward_schedule.hpp"
#include "layer/layer_runner.hpp"
#include "mok/error.hpp"

namespace mok::gpu {

const char* row_path_name(RowPath p) {
  switch (p) {
    case RowPath::automatic:
      return "automatic";
    case RowPath::dispatch_copy:
      return "dispatch copy";
    case RowPath::producer_gather:
      return "producer gather";
  }
  return "?";
}

MoeForward::MoeForward(const Config& c, const ForwardOptions& options)
    : MoeForward(c, options, detail::ForwardHooks{}) {}

MoeForward::MoeForward(const Config& c, const ForwardOptions& options,
                       const detail::ForwardHooks& hooks) {
  c.validate();
  detail::require(
      c.ep_size == 1, ErrorCode::unsupported,
      "MoeForward runs one GPU (ep_size = 1), got ep_size = " + std::to_string(c.ep_size));
  runner_ = std::make_unique<detail::LayerRunner>(c, options, hooks, detail::Transport::local,
                                                  "MoeForward");
}

MoeForward::~MoeForward() = default;

namespace {
void schedule_rank(const Config& c, const DeviceBatch& b, detail::RankSchedule& s,
                   cudaStream_t stream) {
  detail::require_batch_operands(c, b);
  s.require_config(c, "MoeForward::schedule");
  detail::build_forward_schedule(b, c.top_k, c.num_experts, s.sched, stream);
  s.owner_built = false;
  s.tokens = b.tokens;
  ++s.generation;
}

// After the operands' checks: the counters' reset and the launch.
void launch_rank(detail::LayerRunner& r, const detail::LayerRunner::RankCall& call,
                 cudaStream_t stream) {
  r.rank(0).reset(stream);
  r.launch(r.make_launch({call}), stream, "the forward megakernel");
}
}  // namespace

void MoeForward::schedule(const DeviceBatch& b, Schedule& s, cudaStream_t stream) {
  schedule_rank(runner_->config(), b, s.state(), stream);
}

void MoeForward::forward(const Schedule& s, const DeviceBatch& b, const DeviceLayerWeights& wt,
                         __nv_bfloat16* out, const ForwardContext* context, cudaStream_t stream) {
  detail::require_forward_operands(runner_->config(), b, wt, out);
  launch_rank(*runner_, {b, wt, out, &s.state(), context}, stream);
}

void MoeForward::forward(const DeviceBatch& b, const DeviceLayerWeights& wt, __nv_bfloat16* out,
                         cudaStream_t stream) {
  detail::LayerRunner& r = *runner_;
  detail::require_forward_operands(r.config(), b, wt, out);  // before any work is enqueued
  detail::RankSchedule& own = r.rank(0).schedule;
  schedule_rank(r.config(), b, own, stream);
  launch_rank(r, {b, wt, out, &own, nullptr}, stream);
}

void MoeForward::check(cudaStream_t stream) { runner_->check(stream); }

RowPath MoeForward::row_path() const { return runner_->plan().row_path; }
int MoeForward::block_n() const { return runner_->plan().kernel.block_n; }
int MoeForward::dispatch_ctas() const { return runner_->plan().dispatch_ctas; }
int MoeForward::grid() const { return runner_->plan().grid; }

}  // namespace mok::gpu
