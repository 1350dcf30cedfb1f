// The backward of an expert-parallel group with every rank on one GPU (EmulatedEpForward's
// group): ep_size logical ranks, each with its own schedule, context, batch, local experts, output
// gradients and gradient buffers, run by ONE launch of the backward megakernel whose grid is split
// between the ranks. Each routed row's output gradient is pulled from its source rank, its input
// gradient and router-weight partials go back there, through the same peer tables a real group
// fills from NCCL's LSA pointers. Every rank's d_x, d_topk_weights and local experts' gradients
// equal, bit for bit, the single-GPU backward's on the same global batch; the shared experts'
// gradients are per-rank partials (the sum over the rank's own tokens).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu {

class EmulatedEpBackward {
 public:
  // c.ep_size in {2, 4, 8} (the EmulatedEpForward's configuration); options as for MoeBackward,
  // dispatch_ctas per rank. Throws mok::Error as MoeBackward's constructor.
  explicit EmulatedEpBackward(const Config& c, const BackwardOptions& options = {});
  EmulatedEpBackward(const Config& c, const BackwardOptions& options,
                     const detail::ForwardHooks& hooks);
  ~EmulatedEpBackward();
  EmulatedEpBackward(const EmulatedEpBackward&) = delete;
  EmulatedEpBackward& operator=(const EmulatedEpBackward&) = delete;

  // Rank r's gradients (grads[r]: its own buffers, none shared between ranks) after the emulated
  // training forward that filled contexts[r] from schedules[r] with batches[r] and weights[r];
  // d_outs[r]: [T_r, H] BF16. Asynchronous; capturable in a CUDA graph. Throws mok::Error as
  // MoeBackward::backward, naming the rank, and for vectors that are not one per rank.
  void backward(const std::vector<Schedule*>& schedules,
                const std::vector<const ForwardContext*>& contexts,
                const std::vector<DeviceBatch>& batches,
                const std::vector<DeviceLayerWeights>& weights,
                const std::vector<const __nv_bfloat16*>& d_outs,
                const std::vector<DeviceGradients>& grads, cudaStream_t stream);
  // As MoeBackward::check, for the whole group; errors name the rank.
  void check(cudaStream_t stream);

  int ranks() const;
  int ctas_per_rank() const;
  int block_n() const;
  size_t workspace_bytes() const;                                    // every rank's
  const detail::BackwardRunner& runner() const { return *runner_; }  // tests and tools

 private:
  std::unique_ptr<detail::BackwardRunner> runner_;
};

}  // namespace mok::gpu
