// The one host path of the forward: the plan, every rank's buffers, the launch and the errors.
// MoeForward (Transport::local), EmulatedEpForward (Transport::emulated) and EpForward
// (Transport::nccl) are fronts over it that differ only in their transport: how the owner
// tables are built (locally, by one kernel over the emulated ranks, by the counts exchange over
// NCCL's window) and where the peer tables point.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "layer/forward_hooks.hpp"
#include "layer/forward_plan.hpp"
#include "layer/rank_forward.hpp"
#include "layer/trace_buffer.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu::detail {

class LayerRunner {
 public:
  // Validates c and plans the forward (throws mok::Error naming the option or field); allocates
  // one RankBuffers per rank held (ep_size when emulated, else 1). `y_slots`: whether the ranks'
  // (token, k) output slots are allocated here (EpForward keeps them in its window).
  LayerRunner(const Config& c, const ForwardOptions& o, const ForwardHooks& h, Transport transport,
              const char* who, bool y_slots = true);
  ~LayerRunner();
  LayerRunner(const LayerRunner&) = delete;
  LayerRunner& operator=(const LayerRunner&) = delete;

  const Config& config() const { return config_; }
  const ForwardPlan& plan() const { return plan_; }
  int ranks() const { return int(ranks_.size()); }
  RankBuffers& rank(int r) { return ranks_[size_t(r)]; }
  const RankBuffers& rank(int r) const { return ranks_[size_t(r)]; }

  // One rank's part of a forward: its batch, weights and output, the schedule built for the batch
  // (nullptr: the rank's own) and the context a training forward fills (nullptr: inference).
  struct RankCall {
    DeviceBatch batch;
    DeviceLayerWeights weights;
    __nv_bfloat16* out = nullptr;
    const RankSchedule* schedule = nullptr;
    const ForwardContext* context = nullptr;
  };
  struct Launch {
    std::vector<kern::RankLaunch> ranks;  // every rank's share (maps and parameters)
    kern::ForwardKernel kernel;
  };
  // Maps and parameters of every rank held (one call per rank), with the peer tables filled across
  // them (emulated: each rank reaches every other's buffers); checks each schedule and context
  // against the configuration and the batch.
  Launch make_launch(const std::vector<RankCall>& calls);
  // The row destinations, then the megakernel (neither with ForwardHooks::schedule_only).
  void launch(const Launch& launch, cudaStream_t stream, const char* what) const;

  // After the stream: throws for a failed batch (of the last forward's schedule) or an expired
  // wait, naming the rank under EP. `on_status` sees the status first (EpForward's missing peer).
  void check(cudaStream_t stream,
             const std::function<void(const Status&)>& on_status = nullptr) const;
  // After the stream has finished; throws unless planned with ForwardHooks::wait_times.
  ForwardProfile profile(cudaStream_t stream) const;
  // The last forward's timeline (ForwardHooks::trace_events; synchronises `stream`). `claimed`:
  // the events the kernel tried to record (more than returned when the buffer was too small).
  std::vector<kern::TraceEvent> trace(cudaStream_t stream, int64_t* claimed = nullptr) const;

 private:
  int ep_rank(int r) const;
  std::string who_;
  Config config_;
  ForwardHooks hooks_;
  ForwardPlan plan_;
  std::vector<RankBuffers> ranks_;            // an emulated group's aborted flag: ranks_[0].aborted
  kern::RankLaunch* group_shares_ = nullptr;  // an emulated group: the shares in device memory
  const RankSchedule* last_schedule_ = nullptr;  // rank 0's, of the last forward
  TraceBuffer trace_;                            // ForwardHooks::trace_events: every rank's
};

}  // namespace mok::gpu::detail
