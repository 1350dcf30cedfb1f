// One rank's share of the forward megakernel on the host: its device buffers, and the tensor maps
// and parameters of its part of a launch (layer_runner.hpp puts the ranks of a launch together).
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_plan.hpp"
#include "layer/forward_schedule.hpp"
#include "mok/gpu/moe_forward.hpp"

namespace mok::gpu::detail {

// gpu::Schedule's device buffers: the rank's source schedule (at EP = 1 with its own owner
// tables), the owner tables built from every source's counts (EP groups, and EpForward even at
// ep_size 1), and each routed row's destination.
struct RankSchedule {
  Config config;
  ScheduleBuffers sched;
  int64_t *owner_seg_begin = nullptr, *owner_segment_rows = nullptr, *owner_source_begin = nullptr;
  int32_t* owner_tile_expert = nullptr;
  Status* group_status = nullptr;      // the group's outcome: any rank's failure fails every rank
  int64_t* row_destination = nullptr;  // [capacity]: kern::ForwardParams::row_destination
  int64_t capacity_blocks = 0, token_blocks = 0;
  int64_t tokens = -1;       // of the batch last scheduled (host side: a forward checks its batch)
  uint64_t generation = 0;   // +1 per batch scheduled (a ForwardContext records its forward's)
  bool owner_built = false;  // the owner tables (not sched's) hold this batch's segments
  // EpForward: the counts exchange of this schedule ran and no forward has used it yet.
  mutable bool exchanged = false;

  void allocate(const Config& c);
  void release();
  const Status* status() const { return owner_built ? group_status : sched.status; }
  // Throws unless the buffers were made for `c` (the forward's configuration) ...
  void require_config(const Config& c, const char* who) const;
  // ... and they hold the schedule of a batch of `tokens` tokens.
  void require_matches(const Config& c, int64_t tokens, const char* who) const;
};

// Where a forward's activations go: the workspace's own (inference), or a ForwardContext's, which
// also takes the SwiGLU inputs (a training forward).
struct Activations {
  __nv_bfloat16 *act = nullptr, *act_shared = nullptr;
  __nv_bfloat16 *gate_up = nullptr, *gate_up_shared = nullptr;  // nullptr: inference
  uint8_t* act_e4m3 = nullptr;  // fp8_block: the routed act (nullptr: the workspace's)
  float* act_scales = nullptr;
};

struct RankBuffers {
  RankSchedule schedule;  // used when the caller passes none
  __nv_bfloat16 *routed_x = nullptr, *act = nullptr, *act_shared = nullptr, *y_slots = nullptr,
                *y_shared = nullptr;
  // fp8_block: the routed rows' E4M3 token ring and activations with their scales (routed_x and
  // act are then not allocated).
  uint8_t *routed_x_e4m3 = nullptr, *act_e4m3 = nullptr;
  float *routed_x_scales = nullptr, *act_scales = nullptr;
  // fp8_block and mxfp8: this rank's x quantized before the launch (kern::quantize_source_rows),
  // the rows dispatch pulls (EpForward keeps them in its window instead).
  uint8_t* x_rows = nullptr;
  uint32_t* counters = nullptr;  // x_ready | act_ready | act_shared_ready | token_done |
  size_t counter_words = 0;      // combine_next | tile_next
  // In the counters' allocation, after them: the fault record, kern::ForwardParams::aborted (an
  // emulated group uses its first rank's) and the timings.
  kern::ForwardFault* fault = nullptr;
  int* aborted = nullptr;
  unsigned long long* timings = nullptr;
  size_t zeroed_bytes = 0;  // counters, fault record, aborted and timings together
  int64_t capacity_blocks = 0, ring_blocks = 0, token_blocks = 0;
  CUtensorMap routed_x_map[2]{};  // boxes of 128, 64 rows (fp8_block: of the E4M3 ring)

  // Without y_slots the caller provides them (EpForward: in its symmetric window).
  struct Parts {
    bool timings = false, y_slots = true;
    bool x_rows = true;  // fp8_block and mxfp8: RankBuffers::x_rows (EpForward: its window's)
    // profile_without_dispatch_copy: the GEMMs then read whatever the ring holds, so it holds
    // random values like x's, not the zeros of fresh memory (zero operands draw less power and
    // the GPU is power-capped: the variant could look faster than skipping the copy makes it).
    bool random_ring = false;
  };
  void allocate(const Config& c, const Parts& parts);
  void release();
  // Zeroes the counters, the fault record, aborted and the timings (asynchronous, one memset).
  void reset(cudaStream_t stream) const;
};

// fp8_block and mxfp8 quantize x (and the backward d_out) on its source rank
// (kern/moe_forward/source_rows.hpp): the bytes of one token's row, and the quantizer for c's
// recipe (from [tokens, H] into rows; throws mok::Error naming `what` on a launch failure).
bool source_quantized(Precision p);
int64_t source_row_bytes(const Config& c);
void quantize_source_rows(const Config& c, const __nv_bfloat16* from, int64_t tokens, uint8_t* rows,
                          cudaStream_t stream, const char* what);

// Tensor maps of rank `w` for this batch, its activations and its local experts' weights.
kern::ForwardMaps rank_maps(const RankBuffers& w, const Config& c, const DeviceBatch& b,
                            const DeviceLayerWeights& wt, const Activations& a, int block_n);

// Throws mok::Error(invalid_argument) "<name> is null" or "<name> is not <alignment>-byte aligned".
void require_operand(const void* p, const std::string& name, size_t alignment = 16);

// Checks a batch's operands (token count, null or misaligned x, null ids or weights) with clear
// errors; `prefix` goes first ("rank 1: "). Every schedule step starts with it.
void require_batch_operands(const Config& c, const DeviceBatch& b, const std::string& prefix = "");
// ... and a forward's: the batch's, the weights and the output.
void require_forward_operands(const Config& c, const DeviceBatch& b, const DeviceLayerWeights& wt,
                              const __nv_bfloat16* out);

// The fields of kern::ForwardParams that come from the schedule, the configuration and the batch
// (every program on the engine: the forward's rank_params and the backward's), with the rank's
// own entries of the peer tables for x and the source schedule.
void set_batch_params(kern::ForwardParams& p, const RankSchedule& s, const Config& c,
                      const DeviceBatch& b, int ep_rank, int* aborted);

// Parameters of rank `ep_rank` (buffers `w`) with its own buffers in every peer-table entry of its
// rank; the caller fills the other ranks' entries. `aborted`: the group's flag.
kern::ForwardParams rank_params(const RankBuffers& w, const RankSchedule& s, const Activations& a,
                                const Config& c, const DeviceBatch& b, const DeviceLayerWeights& wt,
                                __nv_bfloat16* out, const ForwardPlan& plan,
                                const ForwardHooks& hooks, int ep_rank, int* aborted);

// Turns the fault records of a forward into mok::Error(peer_timeout): the most upstream wait is
// the cause, the others gave up because of it. `prefix` goes first ("rank 1: "). Nothing if no
// role gave up.
void throw_on_fault(const kern::ForwardFault& fault, double wait_seconds,
                    const std::string& prefix);
// The same for another program on the engine: its roles' names and its name ("the backward").
void throw_on_fault(const kern::ForwardFault& fault, double wait_seconds, const std::string& prefix,
                    const char* (*role_name)(int), const char* program);

// The wait-time profile of the last forward from its timings buffer (kern::ForwardTiming), per
// participant, for a rank with `ctas` CTAs of which `dispatch_ctas` dispatch. Synchronises.
ForwardProfile read_profile(const unsigned long long* timings, int ctas, int dispatch_ctas,
                            cudaStream_t stream);

// What a role of kern::ForwardRole was waiting for, for error messages ("... row block 2").
const char* fault_role_name(int role);

}  // namespace mok::gpu::detail
