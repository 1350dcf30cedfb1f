// The one host path of the backward: every rank's workspace, the tensor maps and parameters of
// the launch, and the errors. MoeBackward (Transport::local, one rank), EmulatedEpBackward
// (Transport::emulated: ep_size logical ranks on one GPU, one launch whose grid is split between
// them) and EpBackward (Transport::nccl: this process's rank of a group; the peer tables and the
// buffers peers write into are its window's) are fronts over it. The megakernel is
// src/kernels/moe_backward/.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/moe_backward/backward_params.hpp"
#include "layer/forward_hooks.hpp"
#include "layer/forward_plan.hpp"
#include "layer/rank_forward.hpp"
#include "layer/trace_buffer.hpp"
#include "mok/gpu/moe_backward.hpp"

namespace mok::gpu::detail {

// One rank's workspace (sizes from the configuration: the rank's capacity and tokens).
struct RankBackward {
  __nv_bfloat16 *dy_routed = nullptr, *x_routed = nullptr, *dgu = nullptr, *act_scaled = nullptr,
                *dgu_shared = nullptr, *act_shared_copy = nullptr, *dx_slots = nullptr,
                *dx_shared = nullptr;
  // GateUpMode::recompute: the recomputed activations (a ForwardContext's layout).
  __nv_bfloat16 *act = nullptr, *gate_up = nullptr, *act_shared = nullptr,
                *gate_up_shared = nullptr;
  // fp8_block: the routed dgrad GEMMs' E4M3 operands and their scales per 128 columns.
  uint8_t *dy_e4m3 = nullptr, *dgu_e4m3 = nullptr;
  float *dy_scales = nullptr, *dgu_scales = nullptr;
  // mxfp8: the routed dgrad GEMMs' A rows rounded to MX values (BF16).
  __nv_bfloat16 *dy_mx = nullptr, *dgu_mx = nullptr;
  // fp8_block and mxfp8: this rank's d_out quantized before the launch (one row per token,
  // kern::source_row_layout), which the dispatch copies; a group over NCCL keeps it in its window.
  uint8_t* dy_rows = nullptr;
  float* dw_partial = nullptr;
  int64_t* step_begin = nullptr;
  uint32_t* counters = nullptr;  // x_ready | act_ready | act_shared_ready | token_done |
                                 // combine_next | tile_next | unit_done | gu_ready |
                                 // gu_shared_ready, then the fault record
  kern::ForwardFault* fault = nullptr;
  int* aborted = nullptr;                 // an emulated group uses rank 0's
  unsigned long long* timings = nullptr;  // hooks.wait_times: [kForwardTimings] ns
  size_t zeroed_bytes = 0;
};

class BackwardRunner {
 public:
  // Validates c and the options (throws mok::Error naming them) and allocates every rank's
  // workspace: one rank (local, ep_size 1) or ep_size (emulated, 2, 4 or 8).
  BackwardRunner(const Config& c, const BackwardOptions& o, const ForwardHooks& h,
                 Transport transport, const char* who);
  ~BackwardRunner() { release(); }
  BackwardRunner(const BackwardRunner&) = delete;
  BackwardRunner& operator=(const BackwardRunner&) = delete;

  // One rank's part of a backward.
  struct RankCall {
    const RankSchedule* schedule = nullptr;
    const ForwardContext* context = nullptr;
    DeviceBatch batch;
    DeviceLayerWeights weights;
    const __nv_bfloat16* d_out = nullptr;
    DeviceGradients grads;
  };
  // Every rank's call (one per rank held), checked, then the launch. `transport` (EpBackward)
  // runs after the counters are zeroed and before the launch, on the same stream: it fills the
  // peer tables and the buffers peers write into (dx slots, router-weight partials, token
  // counters) and enqueues what the group needs first.
  using TransportStep = std::function<void(kern::BackwardParams&, cudaStream_t)>;
  void backward(const std::vector<RankCall>& calls, cudaStream_t stream,
                const TransportStep& transport = {});
  // After the stream: throws for a failed batch or an expired wait (naming the rank under EP).
  void check(cudaStream_t stream) const;
  // After the stream has finished; one rank, built with ForwardHooks::wait_times.
  ForwardProfile profile(cudaStream_t stream) const;
  // The last backward's timeline (ForwardHooks::trace_events; synchronises `stream`).
  std::vector<kern::TraceEvent> trace(cudaStream_t stream, int64_t* claimed = nullptr) const {
    return trace_.read(stream, claimed);
  }

  Config config;
  BackwardOptions options;
  ForwardHooks hooks;
  std::string who;
  Transport transport = Transport::local;
  int ranks = 1, grid = 0, share = 0, dispatch_ctas = 0, block_n = 128, lag = 1;
  double wait_seconds = 0;
  uint64_t wait_cycles = 0;
  size_t bytes = 0;

 private:
  template <class T>
  T* alloc(size_t count) {
    bytes += (count ? count : 1) * sizeof(T);
    return device_alloc<T>(count, "cudaMalloc (backward workspace)");
  }
  void allocate(RankBackward& r);
  void release();
  void require_call(const RankCall& call, int r) const;
  kern::BackwardShare make_share(const std::vector<RankCall>& calls, int r) const;

  int64_t capacity = 0, capacity_blocks = 0, token_rows = 0, token_blocks = 0;
  std::vector<RankBackward> ranks_;
  kern::BackwardShare* group = nullptr;         // an emulated group's shares in device memory
  const RankSchedule* last_schedule = nullptr;  // rank 0's, of the last backward
  const kern::BackwardKernels* kernels = nullptr;
  TraceBuffer trace_;  // ForwardHooks::trace_events
};

}  // namespace mok::gpu::detail
