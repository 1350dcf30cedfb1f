// Expert parallelism over NCCL: one EpForward per rank of an EP group of 1, 2, 4 or 8 GPUs in one
// NVLink domain. Each rank's forward is the same megakernel as MoeForward's; what changes is where
// routed rows come from and where expert outputs go. Every buffer a peer touches (a copy of x, the
// source schedule, the (token, k) output slots, their counters, the counts exchange) lives in one
// symmetric NCCL window per rank; the kernel reaches peers through plain pointers from NCCL's LSA
// mapping. Per forward, with no host involvement:
//   1. the rank copies x into its window and builds its source schedule (counts, sorted slots);
//   2. an exchange kernel writes its per-expert counts and status into every peer's window and
//      releases an epoch flag there (system scope), then waits (bounded) for every peer's flag and
//      builds its owner schedule from all sources' counts: rows of each local expert in (source
//      rank, token) order, so the result does not depend on arrival order;
//   3. the megakernel: dispatch CTAs pull routed rows from the sources' windows into the token
//      ring; the down epilogue writes each output row into the source's (token, k) slot and
//      releases the source's token counter; every rank combines its own tokens in fixed k order.
// A peer that never arrives ends in mok::Error(peer_timeout) naming it, within wait_seconds; any
// rank's bad expert id or any owner's capacity overflow is an error on every rank. After a peer
// timeout the group is out of step: destroy it (on every rank) and build a new one.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/schedule.hpp"

namespace mok::gpu {

class EpForward {
 public:
  // One process per GPU: `comm` has c.ep_size ranks and this rank is c.ep_rank; the current device
  // must be the communicator's. Collective: every rank constructs its EpForward at the same time
  // (the window registration is a barrier). Throws when NCCL's library and headers differ, when
  // the communicator lacks symmetric memory, or when the ranks are not all NVLink peers.
  EpForward(const Config& c, ncclComm_t comm, const ForwardOptions& options = {});
  EpForward(const Config& c, ncclComm_t comm, const ForwardOptions& options,
            const detail::ForwardHooks& hooks);
  // One process driving every GPU of the group: comms[r] (ncclCommInitAll) drives rank r; the
  // collective set-up calls are grouped. c.ep_rank is ignored.
  static std::vector<std::unique_ptr<EpForward>> create_group(const Config& c,
                                                              const std::vector<ncclComm_t>& comms,
                                                              const ForwardOptions& options = {});
  static std::vector<std::unique_ptr<EpForward>> create_group(const Config& c,
                                                              const std::vector<ncclComm_t>& comms,
                                                              const ForwardOptions& options,
                                                              const detail::ForwardHooks& hooks);
  // Waits for this rank's device; one process per GPU also holds a barrier over the communicator
  // (every rank destroys its EpForward together) before the window is freed.
  ~EpForward();
  EpForward(const EpForward&) = delete;
  EpForward& operator=(const EpForward&) = delete;

  // This rank's schedule for its batch b (T <= c.max_tokens_per_rank): copies x, its slots and
  // counts into the window and exchanges the counts with every peer (a collective: every rank
  // calls it, once per step). s: a Schedule of this rank's configuration.
  void schedule(const DeviceBatch& b, Schedule& s, cudaStream_t stream);
  // The forward of the batch scheduled into s, once per schedule() (a collective): its local
  // experts' weights (gate/up [E/ep, I, H], down [E/ep, H, I], and the shared experts), its output
  // [T, H], and a context for a training forward (nullptr: inference). Asynchronous on `stream`
  // (on this rank's device).
  void forward(const Schedule& s, const DeviceBatch& b, const DeviceLayerWeights& local_weights,
               __nv_bfloat16* out, const ForwardContext* context, cudaStream_t stream);
  // Inference with a schedule of its own: schedule(), then forward().
  void forward(const DeviceBatch& b, const DeviceLayerWeights& local_weights, __nv_bfloat16* out,
               cudaStream_t stream);
  // Synchronises `stream`; throws mok::Error for a failed batch of any rank (naming it), a peer
  // that did not arrive, or a wait that expired (naming this rank and the role).
  void check(cudaStream_t stream);

  int rank() const { return rank_; }
  int dispatch_ctas() const;
  int device() const { return device_; }
  RowPath row_path() const;                   // never automatic
  const detail::LayerRunner& runner() const;  // tests and benchmarks

 private:
  struct Workspace;
  EpForward(const Config& c, const ForwardOptions& options, const detail::ForwardHooks& hooks,
            int rank, int device);
  void schedule_rank(const DeviceBatch& b, detail::RankSchedule& s, cudaStream_t stream);
  // After the operands' checks.
  void forward_rank(const detail::RankSchedule& s, const DeviceBatch& b,
                    const DeviceLayerWeights& local_weights, __nv_bfloat16* out,
                    const ForwardContext* context, cudaStream_t stream);
  int rank_ = 0, device_ = 0;
  std::vector<int> group_devices_;  // one process driving the group: every rank's device
  Workspace* ws_ = nullptr;
};

}  // namespace mok::gpu
