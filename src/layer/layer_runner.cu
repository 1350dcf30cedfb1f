#include "layer/layer_runner.hpp"

#include <type_traits>

#include "mok/error.hpp"

namespace mok::gpu::detail {

LayerRunner::LayerRunner(const Config& c, const ForwardOptions& o, const ForwardHooks& h,
                         Transport transport, const char* who, bool y_slots)
    : who_(who), config_(c), hooks_(h) {
  c.validate();
  plan_ = plan_forward(c, o, h, transport, who);
  ranks_.resize(size_t(plan_.ranks_in_launch));
  for (auto& r : ranks_)
    r.allocate(c, {.timings = h.wait_times,
                   .owner_tables = transport != Transport::local,
                   .y_slots = y_slots,
                   .random_ring = h.without_dispatch_copy});
}

LayerRunner::~LayerRunner() {
  for (auto& r : ranks_) r.release();
}

int LayerRunner::ep_rank(int r) const {
  return plan_.transport == Transport::emulated ? r : config_.ep_rank;
}

kern::ForwardLaunch LayerRunner::make_launch(const std::vector<DeviceBatch>& batches,
                                             const std::vector<DeviceLayerWeights>& weights,
                                             const std::vector<__nv_bfloat16*>& outs) const {
  const int n = ranks();
  require(
      int(batches.size()) == n && int(weights.size()) == n && int(outs.size()) == n,
      ErrorCode::invalid_argument,
      who_ + ": one batch, one set of weights and one output per rank (" + std::to_string(n) + ")");
  kern::ForwardLaunch launch{};
  launch.ranks = n;
  for (int r = 0; r < n; ++r) {
    const size_t i = size_t(r);
    launch.maps[r] = rank_maps(ranks_[i], config_, batches[i], weights[i], plan_.kernel.block_n);
    launch.params[r] = rank_params(ranks_[i], config_, batches[i], outs[i], plan_, hooks_,
                                   ep_rank(r), ranks_[0].aborted);
  }
  for (int r = 0; r < n; ++r)  // every rank reaches every other rank's buffers
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const kern::ForwardParams& other = launch.params[q];
      kern::ForwardParams& p = launch.params[r];
      const int e = ep_rank(q);
      p.peer_x[e] = other.peer_x[e];
      p.peer_offsets[e] = other.peer_offsets[e];
      p.peer_sorted[e] = other.peer_sorted[e];
      p.peer_y_slots[e] = other.peer_y_slots[e];
      p.peer_token_done[e] = other.peer_token_done[e];
    }
  return launch;
}

void LayerRunner::launch(const kern::ForwardLaunch& launch, cudaStream_t stream,
                         const char* what) const {
  if (hooks_.schedule_only) return;
  check_cuda(kern::launch_row_destinations(launch, plan_.grid, stream),
             "the row-destination kernel");
  check_cuda(plan_.kernels->launch(launch, plan_.kernel, plan_.grid, stream), what);
}

void LayerRunner::check(cudaStream_t stream,
                        const std::function<void(const Status&)>& on_status) const {
  const int n = ranks();
  const RankBuffers& first = ranks_[0];
  Status st{};
  std::vector<kern::ForwardFault> faults(static_cast<size_t>(n));
  static_assert(std::is_trivially_copyable_v<kern::ForwardFault>);
  const Status* status = first.group_status ? first.group_status : first.sched.status;
  check_cuda(cudaMemcpyAsync(&st, status, sizeof st, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  for (int r = 0; r < n; ++r)
    check_cuda(cudaMemcpyAsync(&faults[size_t(r)], ranks_[size_t(r)].fault,
                               sizeof(kern::ForwardFault), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  if (on_status) on_status(st);
  throw_on_status(st, config_.num_experts, first.sched.capacity, config_.ep_size);
  // The rank whose most upstream stopped role is the furthest upstream is the cause.
  for (int role = 0; role < kern::kForwardRoles; ++role)
    for (int r = 0; r < n; ++r)
      if (faults[size_t(r)].records[role].seen)
        throw_on_fault(faults[size_t(r)], plan_.wait_seconds,
                       config_.ep_size > 1 ? "rank " + std::to_string(ep_rank(r)) + ": " : "");
}

ForwardProfile LayerRunner::profile(cudaStream_t stream) const {
  require(ranks_[0].timings != nullptr, ErrorCode::invalid_argument,
          who_ + ": the profile needs a forward constructed with ForwardHooks::wait_times");
  return read_profile(ranks_[0].timings, plan_.grid / plan_.ranks_in_launch, plan_.dispatch_ctas,
                      stream);
}

}  // namespace mok::gpu::detail
