// Expert parallelism with every rank of the group on one GPU: ep_size logical ranks, each with its
// own batch, its own local experts' weights and its own output, run by ONE launch of the forward
// megakernel whose grid is split between the ranks. The kernel reaches the other ranks' buffers
// through the same peer tables a real EP group fills from NCCL's LSA pointers, so this is how the
// dispatch/combine protocol is developed and tested when only one GPU is lent.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu {

class EmulatedEpForward {
 public:
  // c.ep_size in {2, 4, 8}; every rank gets c.max_tokens_per_rank, c's capacity and ring
  // (c.ring_rows: 0 holds the whole batch; smaller rings are reused in turn). Options as for
  // MoeForward; dispatch_ctas is per rank.
  explicit EmulatedEpForward(const Config& c, const ForwardOptions& options = {});
  EmulatedEpForward(const Config& c, const ForwardOptions& options,
                    const detail::ForwardHooks& hooks);
  ~EmulatedEpForward();
  EmulatedEpForward(const EmulatedEpForward&) = delete;
  EmulatedEpForward& operator=(const EmulatedEpForward&) = delete;

  // Every rank's schedule (schedules[r] for batches[r]), as MoeForward::schedule.
  void schedule(const std::vector<DeviceBatch>& batches, const std::vector<Schedule*>& schedules,
                cudaStream_t stream);
  // batches[r], weights[r] (rank r's local experts: gate/up [E/ep, I, H], down [E/ep, H, I], and
  // the shared experts) and outs[r] for every rank r, with the schedules built for the batches;
  // contexts: one per rank (training) or none (inference). Asynchronous; no host synchronisation.
  void forward(const std::vector<Schedule*>& schedules, const std::vector<DeviceBatch>& batches,
               const std::vector<DeviceLayerWeights>& weights,
               const std::vector<__nv_bfloat16*>& outs,
               const std::vector<const ForwardContext*>& contexts, cudaStream_t stream);
  // Inference with schedules of its own.
  void forward(const std::vector<DeviceBatch>& batches,
               const std::vector<DeviceLayerWeights>& weights,
               const std::vector<__nv_bfloat16*>& outs, cudaStream_t stream);
  // As MoeForward::check, for the whole group; errors name the rank.
  void check(cudaStream_t stream);

  int ranks() const;
  int ctas_per_rank() const;
  RowPath row_path() const;                                       // never automatic
  const detail::LayerRunner& runner() const { return *runner_; }  // tests and benchmarks

 private:
  void schedule_ranks(const std::vector<DeviceBatch>& batches,
                      const std::vector<detail::RankSchedule*>& schedules, cudaStream_t stream);
  void forward_ranks(const std::vector<const detail::RankSchedule*>& schedules,
                     const std::vector<DeviceBatch>& batches,
                     const std::vector<DeviceLayerWeights>& weights,
                     const std::vector<__nv_bfloat16*>& outs,
                     const std::vector<const ForwardContext*>& contexts, cudaStream_t stream);
  std::unique_ptr<detail::LayerRunner> runner_;
};

}  // namespace mok::gpu
