// What tests and benchmarks may do to a forward that users may not: test hooks (injected delays,
// a row block that is never published), stage probes, and the wait-time profile. Reached through
// the internal constructors of MoeForward, EmulatedEpForward and EpForward; never in the public
// options.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/moe_forward/forward_params.hpp"

namespace mok::kern {
struct BackwardKernels;  // backward_params.hpp
}  // namespace mok::kern

namespace mok::gpu::detail {

struct ForwardHooks {
  // Tests. Each dispatched row block is published after a pseudo-random delay below
  // dispatch_delay_ns (the bits must not change); block never_publish_block >= 0 is never published
  // (a stopped dispatch: the forward must end in an error within wait_seconds), on rank stuck_rank
  // of an emulated group (-1: on every rank).
  uint32_t dispatch_delay_ns = 0, delay_seed = 0;
  int64_t never_publish_block = -1;
  // ... or that rank's down tiles never count their rows on the tokens' source ranks (a rank that
  // stopped before the combine: the combine waiting for its rows must end in an error).
  bool never_count_tokens = false;
  int stuck_rank = -1;
  // Benchmarks: drop a stage to measure what it costs (the output is then wrong).
  bool without_dispatch_copy = false, without_combine = false;
  // Benchmarks (MoeBackward): the weight-gradient tiles load, multiply and store nothing, or are
  // not in the tile order at all.
  bool without_wgrad = false, without_wgrad_tiles = false;
  // Benchmarks (the backward): the staged backward, a baseline from mok's own kernels: one launch
  // per tile kind in dependency order (dispatch and dgrad-down; dgrad-gate/up; the weight
  // gradients and the dispatch-backward). The same tiles, so the same bits. n > 0: its first n
  // launches (3: the whole backward; 1 or 2: the breakdown's partial stages, output incomplete).
  int staged_backward = 0;
  // Benchmarks: the stage probes, the GEMM tiles without their loads (TMA and gather; the
  // consumers multiply what the ring holds) or without their MMAs (the consumers store zeros).
  // Every wait stays. They run the probe set (kern::probe_forward_kernels, given in `kernels`).
  bool without_gemm_loads = false, without_mma = false;
  // Benchmarks: run the schedule kernels and memsets (under EP also the copies into the window and
  // the counts exchange), not the megakernel nor the row-destination kernel.
  bool schedule_only = false;
  // Benchmarks: time every role's waits (same output; a few clock reads per tile).
  bool wait_times = false;
  // mok trace: the timeline of each forward (kern::trace_event), up to this many events (0: off;
  // the same output). Its kernels are a probe set's (kernels = &kern::probe_forward_kernels()).
  int64_t trace_events = 0;
  // The instantiations to run; nullptr: kern::production_forward_kernels().
  const kern::ForwardKernels* kernels = nullptr;
  // The backward's (BackwardRunner; built for the layer's precision; with trace_events:
  // kern::trace_backward_kernels(), or for one rank trace_fp8_block_backward_kernels()); nullptr:
  // the library's set of the layer's precision.
  const kern::BackwardKernels* backward_kernels = nullptr;

  // Hooks that only the dispatch role takes (the EP = 1 forward then keeps the dispatch copy).
  bool needs_dispatch_role() const {
    return dispatch_delay_ns != 0 || never_publish_block >= 0 || without_dispatch_copy;
  }
  int probe() const {
    return (without_gemm_loads ? kern::kProbeNoGemmLoads : 0) |
           (without_mma ? kern::kProbeNoMma : 0) | (trace_events > 0 ? kern::kProbeTrace : 0);
  }
};

// Where each role's time went in the last forward with wait_times, in ms per participant
// (averaged over the CTAs, warpgroups or warps that play the role).
struct ForwardProfile {
  double gate_up_waits_dispatch = 0;  // per GEMM CTA's producer: waiting for dispatched rows
  double down_waits_gate_up = 0;      //   ... waiting for a row block's activations
  double producer_waits_ring = 0;     //   ... waiting for a free stage (consumers busy)
  double consumer_starved = 0;        // per consumer warpgroup: waiting for stages to land
  double consumer_starved_first = 0;  //   ... of which on tiles' first stages
  double consumer_epilogue = 0;       //   ... storing and publishing tiles
  double consumer_epilogue_down = 0;  //     ... of which on down tiles
  double consumer_publish = 0;        //     ... of which releasing gate/up tiles' act counters
  double consumer_waits_tile = 0;     //   ... waiting for the next tile's index
  double consumer_total = 0;          //   ... first tile to last
  double consumer_sm_mhz = 0;         //   ... the SM clock over that span (clock64 / globaltimer)
  double dispatch_copying = 0;        // per dispatch CTA: gathering rows
  double dispatch_total = 0;          //   ... start to the last published block
  double combine_waits = 0;           // per combine warp: waiting for a token's outputs
  double combine_total = 0;           //   ... first token to the empty queue
  int dispatch_ctas_joined = 0;       // dispatch CTAs that ran the GEMM roles after dispatch
  // Widened B tiles (nvfp4, mxfp8), per GEMM CTA (its TMA leader; its first converter warp):
  double leader_waits_staging = 0;   // the leader waiting for a free staging slot
  double converter_waits_ring = 0;   // a converter warp waiting for a free ring stage
  double converter_waits_codes = 0;  //   ... for a staging slot's codes to land
  double converter_widening = 0;     //   ... widening
};

// The wait profile of the last backward of a MoeBackward built with wait_times (its roles read
// as the backward's: dgrad-down producers wait for dispatch, dgrad-gate/up and wgrad producers
// for dgrad-down tiles; the epilogue's parts are dgrad-gate/up stores and dgrad-down publishing,
// the rest is wgrad). Synchronises `stream`.
class BackwardRunner;
ForwardProfile backward_profile(const BackwardRunner& runner, cudaStream_t stream);

}  // namespace mok::gpu::detail
