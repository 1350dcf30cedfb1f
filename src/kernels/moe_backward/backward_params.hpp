// The backward megakernel's launch interface (host and device). Its parameters extend the
// forward's: the row movers (dispatch, combine) and the down-style store epilogue read the same
// fields with the backward's buffers behind them, so they run unchanged:
//   peer_x, routed_x, x_ready     x rows of each routed row into the x ring (wgrad of gate/up)
//   act, gate_up (+ shared)       the ForwardContext's SwiGLU outputs and inputs (read only)
//   y_slots, y_shared, out        dx per (token, k) slot, the shared experts' dx, and d_x
//   act_ready, act_shared_ready   +1 per warpgroup per dgrad-down tile of a row (token) block
//   token_done                    +1 per dgrad-gate/up tile that wrote one of the token's dx rows
// With GateUpMode::recompute, act and gate_up (+ shared) are the backward's own, written by its
// recompute tiles (the forward's gate/up tiles again), which count into gu_ready (+ shared).
// The token ring holds the whole batch (ring_blocks = the capacity in blocks).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/moe_forward/forward_params.hpp"

namespace mok::kern {

// The backward's fault roles: the forward's records, with the dispatch-ring role (the backward's
// ring never wraps) standing for the weight-gradient producers.
constexpr int kRoleDgradDownProducer = kRoleGateUpProducer;  // for dispatched rows or their g | u
constexpr int kRoleSharedDgradProducer = kRoleSharedDownProducer;  // for shared dgrad-down
constexpr int kRoleDgradGateUpProducer = kRoleDownProducer;        // for a block's dgrad-down
constexpr int kRoleWgradProducer = kRoleDispatchRing;              // for a unit's dgrad-down

// A benchmark's variant (ForwardParams::profile_flags): the weight-gradient tiles are claimed
// but load, multiply and store nothing (the gradients are then wrong).
constexpr int kProfileNoWgrad = 4;
// A benchmark's variant: no weight-gradient tiles in the tile order at all (nothing claimed).
constexpr int kProfileNoWgradTiles = 8;
// The benchmark's staged backward: one launch per tile kind, in dependency order, the tile order
// holding only the kinds flagged (none flagged: every kind). Each launch's waits are on counters
// an earlier launch filled.
constexpr int kStageDgradDown = 16, kStageDgradGateUp = 32, kStageWgrad = 64, kStageRecompute = 128;
constexpr int kStageMask = kStageDgradDown | kStageDgradGateUp | kStageWgrad | kStageRecompute;
// One word holds the forward's variants, these and the staged kinds, each its own bit (their sum
// is their union): a variant flag that is also a kind would run the wrong kinds and hang until
// the waits time out.
static_assert((kProfileNoDispatchCopy | kProfileNoCombine | kProfileNoWgrad | kProfileNoWgradTiles |
               kStageMask) == kProfileNoDispatchCopy + kProfileNoCombine + kProfileNoWgrad +
                                  kProfileNoWgradTiles + kStageDgradDown + kStageDgradGateUp +
                                  kStageWgrad + kStageRecompute,
              "profile_flags: two flags share a bit");

// Floats of a rank's router-weight partials ([T * K, I / block_n]) for any tile width: sized for
// the narrowest, 128.
constexpr int64_t dw_partial_floats(int64_t max_tokens, int64_t top_k, int64_t intermediate) {
  return max_tokens * top_k * (intermediate / 128);
}

// The named barrier of both consumer warpgroups (1 + wg: each warpgroup's own).
constexpr int kBackwardConsumersBarrier = 3;

// Where the weight gradients go: written as BF16 or FP32, or added to the caller's FP32 buffers.
enum WeightGradMode : int { kWgradBf16 = 0, kWgradFp32 = 1, kWgradAccumulateFp32 = 2 };

// Every operand map has boxes of 64 columns (one 128-byte swizzle span). K-major A maps (a GEMM's
// activation rows) have boxes of 128 rows; MN-major maps (dgrad's weights, wgrad's row-major
// operands) boxes of 64 rows, one k-block. Weights are 2D views of [E * rows, cols].
struct BackwardMaps {
  CUtensorMap dy_k, dgu_k;                  // [capacity, H], [capacity, 2I]: dgrad A
  CUtensorMap down_mn, gate_mn, up_mn;      // [E * H, I], [E * I, H] x 2: dgrad B
  CUtensorMap dy_mn, act_mn, dgu_mn, x_mn;  // [capacity, H | I | 2I | H]: wgrad A and B
  CUtensorMap shared_dy_k, shared_dgu_k;    // [T, H] (d_out), [token_rows, 2S]
  CUtensorMap shared_down_mn, shared_gate_mn, shared_up_mn;             // [H, S], [S, H] x 2
  CUtensorMap shared_dy_mn, shared_act_mn, shared_dgu_mn, shared_x_mn;  // [T | rows, H | S | 2S]
  // Recompute (K-major, the forward's gate/up operands): A = routed x [capacity, H] and x [T, H]
  // (boxes of 128 rows), B = gate and up [E * I, H] and shared [S, H] (boxes of block_n / 2 rows).
  CUtensorMap x_k, shared_x_k, gate_k, up_k, shared_gate_k, shared_up_k;
  // BF16 weight gradients, stored by TMA (boxes of 64 rows x 64 columns): routed [E * I, H] x 2
  // and [E * H, I], then shared [S, H] x 2 and [H, S] (BackwardOutput's order).
  CUtensorMap d_out_maps[6];
  // fp8_block's routed dgrad operands, E4M3, K-major, boxes of 128 columns
  // (backward_fp8_block.cuh): A = dy_e4m3 [capacity, H] and dgu_e4m3 [capacity, 2I] (boxes of 128
  // rows), B = down_t [E * I, H] and gate_t, up_t [E * H, I] (boxes of block_n rows).
  CUtensorMap dy_k8, dgu_k8, down_t_k8, gate_t_k8, up_t_k8;
  // The routed dgrad B of nvfp4 (Nvfp4MnStage, widened into MN-major tiles): the forward's packed
  // codes [E, H, I / 2] and [E, I, H / 2] x 2 (boxes of 64 rows x block_n / 2 bytes) and their
  // factors [E, I / 64, H / 2] and [E, H / 64, I / 2] x 2 (bytes; boxes of block_n / 64 rows x 32
  // bytes). Of mxfp8 (Mxfp8Stage, K-major as the forward's): the transposed copies' codes
  // [E, I, H] and [E, H, I] x 2 (boxes of block_n rows x 64 bytes) and factors [E, H / 64, 4 I]
  // and [E, I / 64, 4 H] x 2 (bytes; boxes of one row x 2 block_n bytes, half a tile's rows).
  // mxfp8's dgrad A maps (dy_k, dgu_k) read dy_mx and dgu_mx.
  CUtensorMap down_codes, gate_codes, up_codes, down_factors, gate_factors, up_factors;
};
enum BackwardOutput : int {
  kOutGate,
  kOutUp,
  kOutDown,
  kOutSharedGate,
  kOutSharedUp,
  kOutSharedDown
};

struct BackwardParams : ForwardParams {
  const __nv_bfloat16* peer_d_out[kMaxRanks];  // [T_r, H]: the output gradients
  // fp8_block and mxfp8: the output gradients quantized once on their source rank (one row per
  // token, kern::source_row_layout), which dispatch copies into dy_e4m3 and dy_scales or decodes
  // into dy_mx for the routed dgrad-down tiles.
  const uint8_t* peer_dy_rows[kMaxRanks];
  // Each source rank's router weights [T_r, K] and router-weight partials (dw_partial below): a
  // routed row's belong to its source rank.
  const float* peer_topk_weights[kMaxRanks];
  float* peer_dw_partial[kMaxRanks];
  __nv_bfloat16* dy_routed;        // [capacity, H]: d_out of each routed row (padding rows zero)
  __nv_bfloat16* dgu;              // [capacity, 2I]: dg, then du of each routed row
  __nv_bfloat16* act_scaled;       // [capacity, I]: w * act, dW_down's B (padding rows zero)
  __nv_bfloat16* dgu_shared;       // [token_rows, 2S]
  __nv_bfloat16* act_shared_copy;  // [token_rows, S]: act_shared, padding rows zero
  float* dw_partial;               // [T * K, I / block_n]: <dA', act> per dgrad-down n-tile
  float* d_topk_weights;           // [T, K]
  // Weight gradients (WeightGradMode says the element type): routed [E, I, H] x 2 and [E, H, I],
  // shared [S, H] x 2 and [H, S].
  void *d_gate, *d_up, *d_down, *d_shared_gate, *d_shared_up, *d_shared_down;
  int wgrad_mode;
  int block_n;    // every tile's width, 128 or 256 (dividing H, I and S)
  int lag;        // units between a unit's dgrad-down and dgrad-gate/up steps (tile order)
  int recompute;  // GateUpMode::recompute: recompute tiles fill act and gate_up (+ shared)
  uint32_t *gu_ready, *gu_shared_ready;  // +1 per warpgroup per recompute tile of a block
  uint32_t* unit_done;  // [1 + E]: the shared experts', then each expert's dgrad-down count
  int64_t* step_begin;  // [1 + E + 3 lag + 1]: first tile of each step (backward_tiles.cuh)
  // fp8_block (its own instantiation; ForwardParams::act_e4m3 and act_scales: the context's act):
  // the routed dgrad GEMMs' E4M3 operands with an FP32 scale per 128 columns of a row, and the
  // transposed weights' block scales.
  int fp8_block;
  uint8_t* dy_e4m3;            // [capacity, H]: each routed row's d_out, quantized
  float* dy_scales;            // [capacity, H / 128]
  uint8_t* dgu_e4m3;           // [capacity, 2I]: dg | du, quantized in the dgrad-down epilogue
  float* dgu_scales;           // [capacity, 2I / 128]
  const float* down_t_scales;  // [E, I / 128, H / 128]
  const float *gate_t_scales, *up_t_scales;  // [E, H / 128, I / 128]
  // nvfp4 (its own instantiation): the routed dgrad tiles widen the forward's NVFP4 weights
  // (BackwardMaps' codes and factors); ForwardParams' gate_up_s_dec and down_s_dec scale their
  // accumulators.
  int nvfp4;
  // mxfp8 (its own instantiation): the routed dgrad tiles widen the transposed MXFP8 weights, and
  // their A rows are MX values (BF16).
  int mxfp8;
  __nv_bfloat16* dy_mx;   // [capacity, H]: each routed row's d_out, rounded by dispatch
  __nv_bfloat16* dgu_mx;  // [capacity, 2I]: dg | du, rounded in the dgrad-down epilogue
};

// A backward GEMM tile's kind (BackwardWork; the timeline's TraceEvent::kind).
enum class BackwardKind : int {
  dgrad_down = 0,
  dgrad_gate_up = 1,
  wgrad_down = 2,
  wgrad_gate_up = 3,
  recompute = 4
};

// One rank's share, and a launch (the engine's shape): one rank's share by value, or an emulated
// group's shares in device memory (ranks > 1).
struct BackwardShare {
  BackwardMaps maps;
  BackwardParams params;
};
struct BackwardLaunch {
  BackwardShare local;
  BackwardShare* group;
  int ranks;
};
static_assert(sizeof(BackwardLaunch) <= 8192, "kernel parameters (limit 32764 B)");
static_assert(alignof(BackwardShare) >= 64, "tensor maps in device memory: 64-byte aligned");

// A set of backward megakernel instantiations (ForwardHooks::backward_kernels): prepare once per
// device (shared-memory opt-in and CTAs per SM), then per backward every rank's step table and the
// megakernel on `grid` CTAs (split evenly between the ranks). shares[ranks]: every rank's share
// (block_n alike); with ranks > 1 they are copied into `group` (device memory, ranks shares) first.
// routed: the precision of the routed experts' tiles the set is built for.
struct BackwardKernels {
  cudaError_t (*prepare)(int block_n, int* ctas_per_sm);
  cudaError_t (*launch)(const BackwardShare* shares, int ranks, BackwardShare* group, int grid,
                        cudaStream_t stream);
  RoutedWeights routed;
  bool groups;  // has the emulated groups' instantiations (ranks > 1)
};
// The library's set (moe_backward_bf16.cu): both widths, with and without recompute, one rank and
// emulated groups.
const BackwardKernels& production_backward_kernels();
// fp8_block's (moe_backward_fp8_block.cu): both widths, one rank and emulated groups, no recompute.
const BackwardKernels& fp8_block_backward_kernels();
// nvfp4's (moe_backward_nvfp4.cu): 128-wide tiles, one rank and emulated groups, no recompute.
const BackwardKernels& nvfp4_backward_kernels();
// mxfp8's (moe_backward_mxfp8.cu): likewise.
const BackwardKernels& mxfp8_backward_kernels();

}  // namespace mok::kern
