// The backward of an expert-parallel group over NCCL: one EpBackward per rank, after EpForward's
// training forward on every rank. The same megakernel as MoeBackward's; what changes is where the
// routed rows' output gradients come from and where their input gradients go. What peers touch
// (copies of this rank's x, d_out and router weights; the dx slots, router-weight partials and
// token counters the owners write back; a barrier's flags) lives in one symmetric NCCL window per
// rank, reached through NCCL's LSA pointers. Per backward, with no host involvement:
//   1. the rank copies x, d_out and its router weights into its window and zeroes its counters;
//   2. a barrier kernel releases an epoch flag in every peer's window (system scope) and waits,
//      bounded, for every peer's: after it, every peer's copies are in place and no peer still
//      reads this rank's window for the previous backward;
//   3. the megakernel: dispatch CTAs pull each routed row's d_out and x rows from its source's
//      window; the dgrad-down epilogue reads the source's router weight and writes its
//      router-weight partials there; the dgrad-gate/up epilogue writes the dx row into the
//      source's (token, k) slot and releases its token counter; every rank sums its own tokens'
//      d_x and d_topk_weights in fixed k order.
// Gradients are those of the single-GPU backward on the same global batch, bit for bit; the
// shared experts' are per-rank partials (the sum over the rank's own tokens). A peer that never
// arrives ends in mok::Error(peer_timeout) naming it within wait_seconds; after it the group is
// out of step: destroy it (on every rank) and build a new one.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu {

class EpBackward {
 public:
  // One process per GPU: `comm` has c.ep_size ranks and this rank is c.ep_rank (the EpForward's
  // configuration); the current device must be the communicator's. Collective: every rank
  // constructs its EpBackward at the same time (the window registration is a barrier). Throws as
  // MoeBackward's constructor and as EpForward's (NCCL versions, symmetric memory, NVLink peers).
  EpBackward(const Config& c, ncclComm_t comm, const BackwardOptions& options = {});
  EpBackward(const Config& c, ncclComm_t comm, const BackwardOptions& options,
             const detail::ForwardHooks& hooks);
  // One process driving every GPU of the group: comms[r] (ncclCommInitAll) drives rank r.
  static std::vector<std::unique_ptr<EpBackward>> create_group(const Config& c,
                                                               const std::vector<ncclComm_t>& comms,
                                                               const BackwardOptions& options = {});
  static std::vector<std::unique_ptr<EpBackward>> create_group(const Config& c,
                                                               const std::vector<ncclComm_t>& comms,
                                                               const BackwardOptions& options,
                                                               const detail::ForwardHooks& hooks);
  // As EpForward's: waits for the devices (and, one process per GPU, a barrier over the
  // communicator) before the window is freed.
  ~EpBackward();
  EpBackward(const EpBackward&) = delete;
  EpBackward& operator=(const EpBackward&) = delete;

  // This rank's gradients after EpForward's training forward filled `context` from schedule `s`
  // with batch b and local_weights (its experts, as EpForward::forward); d_out [T, H] BF16. A
  // collective: every rank calls it, once per forward. Asynchronous on `stream` (this rank's
  // device); capturable in a CUDA graph with the forward. Throws mok::Error as
  // MoeBackward::backward.
  void backward(const Schedule& s, const ForwardContext& context, const DeviceBatch& b,
                const DeviceLayerWeights& local_weights, const __nv_bfloat16* d_out,
                const DeviceGradients& grads, cudaStream_t stream);
  // Synchronises `stream`; throws mok::Error for a failed batch, a peer that did not reach the
  // backward (naming it), or a wait that expired (naming this rank and the role).
  void check(cudaStream_t stream);

  int rank() const { return rank_; }
  int device() const { return device_; }
  int block_n() const;
  size_t workspace_bytes() const;  // this rank's workspace and window

 private:
  struct Workspace;
  EpBackward(const Config& c, const BackwardOptions& options, const detail::ForwardHooks& hooks,
             int rank, int device);
  int rank_ = 0, device_ = 0;
  std::vector<int> group_devices_;  // one process driving the group: every rank's device
  Workspace* ws_ = nullptr;
};

}  // namespace mok::gpu
