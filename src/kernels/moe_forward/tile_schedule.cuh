// The forward megakernel's tile order. The GEMM CTAs take tiles t = cta, cta + ctas, ... of one
// fixed sequence (n fastest inside each row block):
//
//   [shared gate/up] [routed gate/up] [shared down] [routed down]
//
// Deadlock freedom: a tile waits only on work that comes earlier in this sequence (a down tile on
// the gate/up tiles of its row block) or on the dispatch CTAs, which wait on nothing. Every CTA is
// resident (one per SM, grid <= SMs) and takes its tiles in increasing order, so the earliest
// unfinished tile always belongs to a CTA that is working on it with all its inputs done: the
// sequence drains. The combine waits on down tiles only, and no GEMM tile waits on the combine.
// Shared tiles come first: they need no dispatch, so they run while dispatch is in flight.
#pragma once
#include <cstdint>

#include "kernels/gemm/bf16_pipeline.cuh"
#include "kernels/moe_forward/forward_params.hpp"

namespace mok::kern {

enum class TileKind : int {
  shared_gate_up = 0,
  routed_gate_up = 1,
  shared_down = 2,
  routed_down = 3
};

struct TileWork {
  TileKind kind;
  int64_t m_block;  // row block of the routed layout (routed) or of the tokens (shared)
  int n_tile;
  int expert;  // 0 for the shared experts (one MLP of width S)
  int k_blocks;
};

__device__ __forceinline__ bool batch_ok(const ForwardParams& p) { return *p.status == 0; }

// Routed row blocks in use: the padded segments of this batch (none once the batch failed).
__device__ __forceinline__ int64_t routed_blocks(const ForwardParams& p) {
  return batch_ok(p) ? p.seg_begin[p.experts] / kBlockM : 0;
}

template <int kBlockN>
struct ForwardTiles {
  int64_t shared_blocks, routed_blocks_;
  int gate_up_tiles, shared_gate_up_tiles, down_tiles;                      // n-tiles per row block
  int64_t routed_gate_up_begin, shared_down_begin, routed_down_begin, end;  // kinds' first tiles

  __device__ static ForwardTiles make(const ForwardParams& p) {
    ForwardTiles t;
    const bool shared = p.shared_width > 0 && batch_ok(p);
    t.shared_blocks = shared ? (p.tokens + kBlockM - 1) / kBlockM : 0;
    t.routed_blocks_ = routed_blocks(p);
    t.gate_up_tiles = 2 * p.intermediate / kBlockN;
    t.shared_gate_up_tiles = 2 * p.shared_width / kBlockN;
    t.down_tiles = (p.hidden + kBlockN - 1) / kBlockN;
    t.routed_gate_up_begin = t.shared_blocks * t.shared_gate_up_tiles;
    t.shared_down_begin = t.routed_gate_up_begin + t.routed_blocks_ * t.gate_up_tiles;
    t.routed_down_begin = t.shared_down_begin + t.shared_blocks * t.down_tiles;
    t.end = t.routed_down_begin + t.routed_blocks_ * t.down_tiles;
    return t;
  }
  __device__ int64_t count() const { return end; }

  __device__ TileWork at(int64_t t, const ForwardParams& p) const {
    if (t < routed_gate_up_begin)
      return {TileKind::shared_gate_up, t / shared_gate_up_tiles, int(t % shared_gate_up_tiles), 0,
              p.hidden / kBlockK};
    if (t < shared_down_begin) {
      const int64_t i = t - routed_gate_up_begin;
      return {TileKind::routed_gate_up, i / gate_up_tiles, int(i % gate_up_tiles),
              p.tile_expert[i / gate_up_tiles], p.hidden / kBlockK};
    }
    if (t < routed_down_begin) {
      const int64_t i = t - shared_down_begin;
      return {TileKind::shared_down, i / down_tiles, int(i % down_tiles), 0,
              p.shared_width / kBlockK};
    }
    const int64_t i = t - routed_down_begin;
    return {TileKind::routed_down, i / down_tiles, int(i % down_tiles),
            p.tile_expert[i / down_tiles], p.intermediate / kBlockK};
  }
};

// Per token, the down tiles that write one of its rows: each of its K slots and its shared row,
// times the n-tiles of H. The combine starts on a token once its counter reaches this.
template <int kBlockN>
__device__ __forceinline__ uint32_t token_contributions(const ForwardParams& p) {
  return uint32_t((p.top_k + (p.shared_width > 0 ? 1 : 0)) * ((p.hidden + kBlockN - 1) / kBlockN));
}

// A bounded wait that also gives up as soon as another wait has expired.
template <class Ready>
__device__ __forceinline__ bool wait_unless_aborted(const ForwardParams& p, Ready ready) {
  const volatile int* aborted = &p.fault->aborted;
  return dev::spin_until([&] { return ready() || *aborted != 0; }, p.wait_cycles) && ready();
}

// A wait of `role` gave up (its own bound expired, or another one's did): keep the first record of
// each role, and stop every other wait.
__device__ __forceinline__ void record_fault(const ForwardParams& p, ForwardRole role,
                                             long long what) {
  ForwardFault::Record& r = p.fault->records[role];
  if (atomicCAS(&r.seen, 0, 1) == 0) {
    r.cta = int(blockIdx.x);
    r.what = what;
  }
  atomicExch(&p.fault->aborted, 1);
}

}  // namespace mok::kern
