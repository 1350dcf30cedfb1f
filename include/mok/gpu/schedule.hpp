// What one training step's forward shares with its backward, in device memory the caller owns:
// the routing schedule, and the activations the backward needs.
//   Schedule s(c);  ForwardContext ctx(c);
//   layer.schedule(batch, s, stream);                              // once per step, on the device
//   layer.forward(s, batch, weights, out, &ctx, stream);           // keeps what the backward needs
//   layer.forward(s, batch, weights, out, nullptr, stream);        // inference: keeps nothing
// (layer: MoeForward or EpForward; EmulatedEpForward takes one of each per rank.)
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>

#include "mok/config.hpp"

namespace mok::gpu {

namespace detail {
struct RankSchedule;
}  // namespace detail

// The routing of one batch on one rank, built on the device from the top-k ids (no host
// synchronisation): each expert's rows in (source rank, token, k) order, padded to 128-row tiles
// (the capacity of c), the tile tables, and where every routed row's output goes. Under EP it also
// holds the owner tables of this rank's local experts, built from every rank's counts.
class Schedule {
 public:
  explicit Schedule(const Config& c);  // sized for c's largest batch and its capacity
  ~Schedule();
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  int64_t capacity_rows() const;  // padded routed rows: the row count of a ForwardContext
  int64_t tokens() const;         // of the last batch scheduled into it (-1: none yet)
  detail::RankSchedule& state() const { return *state_; }  // the device buffers (internal)

 private:
  std::unique_ptr<detail::RankSchedule> state_;
};

// What a training forward keeps for its backward.
enum class GateUpMode {
  keep,       // the SwiGLU outputs and inputs (ForwardContext below): the backward reads them
  recompute,  // nothing: the backward runs the gate/up GEMMs again from x (2/3 of the routed and
              // shared forward FLOPs) into its own workspace, for memory
};
const char* gate_up_mode_name(GateUpMode m);

// What the backward needs from a training forward, per rank, in the schedule's padded row order.
// GateUpMode::keep keeps, BF16:
//   act       [capacity, I]    SwiGLU outputs of the routed rows (the down GEMM's A; dW_down)
//   gate_up   [capacity, 2I]   their gate, then up, pre-activations (the SwiGLU backward)
//   act_shared, gate_up_shared [token_rows, S], [token_rows, 2S] for the shared experts
// bytes_per_token: 6 K I + 6 S at the dropless capacity (dsv3: 110,592 B per token). Keeping g and
// u costs their stores in the gate/up epilogue (a kernel instantiation of its own).
// Precision fp8_block keeps the routed rows' act as the down GEMM read it instead, E4M3 with one
// FP32 scale per 128 columns (act_e4m3 [capacity, I], act_scales [capacity, I / 128]; act() is
// then nullptr): 5 K I + K I / 32 + 6 S bytes per token (dsv3: 94,720 B).
// GateUpMode::recompute keeps nothing (0 bytes per token; the context only records which forward
// ran): the backward, built with BackwardOptions::gate_up = recompute, recomputes them.
class ForwardContext {
 public:
  explicit ForwardContext(const Config& c, GateUpMode mode = GateUpMode::keep);
  ~ForwardContext();
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

  static int64_t bytes_per_token(const Config& c, GateUpMode mode = GateUpMode::keep);
  GateUpMode mode() const { return mode_; }
  bool keeps() const { return mode_ == GateUpMode::keep; }
  int64_t capacity_rows() const { return capacity_rows_; }
  int64_t token_rows() const { return token_rows_; }
  Precision precision() const { return precision_; }  // the configuration's
  // GateUpMode::recompute: all nullptr. fp8_block: act() nullptr, act_e4m3() and act_scales() set.
  __nv_bfloat16* act() const { return act_; }
  uint8_t* act_e4m3() const { return act_e4m3_; }
  float* act_scales() const { return act_scales_; }
  __nv_bfloat16* gate_up() const { return gate_up_; }
  __nv_bfloat16* act_shared() const { return act_shared_; }          // nullptr without S
  __nv_bfloat16* gate_up_shared() const { return gate_up_shared_; }  // nullptr without S
  int intermediate() const { return intermediate_; }
  int shared_width() const { return shared_width_; }

  // Internal (the forward sets it, the backward checks it): the schedule whose training forward
  // last filled this context, and that schedule's batch generation at the time.
  struct Origin {
    const void* schedule = nullptr;
    uint64_t generation = 0;
  };
  const Origin& origin() const { return origin_; }
  void set_origin(const Origin& o) const { origin_ = o; }

 private:
  void release();
  int64_t capacity_rows_ = 0, token_rows_ = 0;
  int intermediate_ = 0, shared_width_ = 0;
  GateUpMode mode_ = GateUpMode::keep;
  Precision precision_ = Precision::bf16;
  uint8_t* act_e4m3_ = nullptr;
  float* act_scales_ = nullptr;
  __nv_bfloat16 *act_ = nullptr, *gate_up_ = nullptr, *act_shared_ = nullptr,
                *gate_up_shared_ = nullptr;
  mutable Origin origin_;
};

}  // namespace mok::gpu
