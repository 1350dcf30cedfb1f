// The forward megakernel's tile order. The GEMM CTAs claim tiles from one global counter, so
// tiles start in the order of one fixed sequence (and CTAs that run together work on neighbouring
// tiles, which share weights; with a static round-robin ncu saw the weights read ~3x from HBM):
//
//   [shared gate/up] [routed gate/up] [shared down] [routed down]
//
// inside each phase the experts in order, and each expert's row blocks in the weight-sharing order
// of mok/schedule/tile_order.hpp (groups of 8 row blocks, n-tile outer).
//
// Deadlock freedom: a tile waits only on work that comes earlier in this sequence (a down tile on
// the gate/up tiles of its row block) or on the dispatch CTAs, which wait on nothing. Tiles are
// claimed in sequence order and only by running CTAs (one per SM, grid <= SMs, all resident), and a
// producer claims its next tile only after issuing every load of the current one, whose consumers
// then finish it without the producer. So the earliest unfinished tile is claimed, its inputs are
// earlier tiles (finished, by minimality) or dispatched rows, and it finishes: the sequence drains.
// The combine waits on down tiles only, and no GEMM tile waits on the combine.
// Shared tiles come first: they need no dispatch, so they run while dispatch is in flight.
#pragma once
#include <cstdint>

#include "kernels/gemm/tile_geometry.cuh"
#include "kernels/megakernel/waits.cuh"
#include "kernels/moe_forward/forward_params.hpp"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/schedule/routing_layout.hpp"
#include "mok/schedule/tile_order.hpp"

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

// True when the producer warpgroup gathers this tile's A rows (cp.async) instead of TMA-loading
// them: routed gate/up tiles under RowPath::producer_gather.
__device__ __forceinline__ bool gathers_rows(const ForwardParams& p, const TileWork& w) {
  return p.gather_rows && w.kind == TileKind::routed_gate_up;
}

__device__ __forceinline__ bool batch_ok(const ForwardParams& p) { return *p.status == 0; }

// Routed row blocks in use: the padded segments of this batch (none once the batch failed).
__device__ __forceinline__ int64_t routed_blocks(const ForwardParams& p) {
  return batch_ok(p) ? p.seg_begin[p.experts] / kBlockM : 0;
}

// The token ring of routed_x (mok/schedule/routing_layout.hpp's protocol: x_ready is each block's
// filled count, act_ready its released count).
__device__ __forceinline__ sched::RingLayout token_ring(const ForwardParams& p) {
  return {kBlockM, p.ring_blocks};
}

// Routed row blocks per tile group (ForwardOptions::overlap_rows): at most the token ring's size
// (tile_order.hpp).
__device__ __forceinline__ int routed_group_rows(const ForwardParams& p) {
  return p.ring_blocks < p.group_blocks ? int(p.ring_blocks) : p.group_blocks;
}

// Where routed row `row` of local expert `expert` goes back to: sched::RowDestination of its
// source rank and its (token, k) slot there, -1 for a padding row. Rows of a segment are in
// (source rank, slot) order. Reads the source's schedule (over NVLink for a peer): only
// row_destination_kernel calls it, the roles read its table.
__device__ __forceinline__ int64_t routed_row_destination(const ForwardParams& p, int64_t row,
                                                          int expert) {
  const sched::SourceIndex r = sched::source_of_segment_row(
      row, expert, p.seg_begin, p.segment_rows, p.source_begin, p.ep_size);
  int src = -1;
  int64_t slot = -1;
  if (r.source_rank >= 0) {
    src = r.source_rank;
    const int global_expert = sched::global_expert(p.ep_rank, expert, p.experts);
    slot = sched::source_slot(p.peer_offsets[src], p.peer_sorted[src], global_expert,
                              r.index_in_source_group);
  }
  return sched::RowDestination::pack(src, slot);
}

template <int kBlockN>
struct ForwardTiles {
  int64_t shared_blocks;
  int gate_up_tiles, shared_gate_up_tiles, down_tiles;                      // n-tiles per row block
  int64_t routed_gate_up_begin, shared_down_begin, routed_down_begin, end;  // kinds' first tiles

  __device__ static ForwardTiles make(const ForwardParams& p) {
    ForwardTiles t;
    const bool shared = p.shared_width > 0 && batch_ok(p);
    t.shared_blocks = shared ? (p.tokens + kBlockM - 1) / kBlockM : 0;
    const int64_t routed = routed_blocks(p);
    // kBlockN / 2 gate and as many up columns per tile; the last may be half padding.
    t.gate_up_tiles = int((p.intermediate + kBlockN / 2 - 1) / (kBlockN / 2));
    t.shared_gate_up_tiles = int((p.shared_width + kBlockN / 2 - 1) / (kBlockN / 2));
    t.down_tiles = (p.hidden + kBlockN - 1) / kBlockN;
    t.routed_gate_up_begin = t.shared_blocks * t.shared_gate_up_tiles;
    t.shared_down_begin = t.routed_gate_up_begin + routed * t.gate_up_tiles;
    t.routed_down_begin = t.shared_down_begin + t.shared_blocks * t.down_tiles;
    t.end = t.routed_down_begin + routed * t.down_tiles;
    return t;
  }
  __device__ int64_t count() const { return end; }

  __device__ TileWork at(int64_t t, const ForwardParams& p) const {
    if (t < routed_gate_up_begin) {
      const sched::TileCoord c = sched::grouped_tile(t, shared_blocks, shared_gate_up_tiles);
      return {TileKind::shared_gate_up, c.block, c.n_tile, 0, p.hidden / kBlockK};
    }
    if (t < shared_down_begin) {
      const TileWork w = routed(t - routed_gate_up_begin, gate_up_tiles, p);
      return {TileKind::routed_gate_up, w.m_block, w.n_tile, w.expert, p.hidden / p.routed_block_k};
    }
    if (t < routed_down_begin) {
      const sched::TileCoord c =
          sched::grouped_tile(t - shared_down_begin, shared_blocks, down_tiles);
      return {TileKind::shared_down, c.block, c.n_tile, 0, p.shared_width / kBlockK};
    }
    const TileWork w = routed(t - routed_down_begin, down_tiles, p);
    return {TileKind::routed_down, w.m_block, w.n_tile, w.expert,
            p.intermediate / p.routed_block_k};
  }

  // Routed tile i of a phase with n_tiles per row block: experts in order, each expert's row
  // blocks in the grouped order of tile_order.hpp. Expert e's tiles are [B_e n, B_e+1 n) with B_e
  // its first row block, so the row block i / n belongs to e: no search.
  __device__ static TileWork routed(int64_t i, int n_tiles, const ForwardParams& p) {
    const int expert = p.tile_expert[i / n_tiles];
    const int64_t first = p.seg_begin[expert] / kBlockM;
    const int64_t blocks = p.seg_begin[expert + 1] / kBlockM - first;
    const sched::TileCoord c =
        sched::grouped_tile(i - first * n_tiles, blocks, n_tiles, routed_group_rows(p));
    return {TileKind::routed_gate_up, first + c.block, c.n_tile, expert, 0};
  }
};

// Per token, the down tiles that write one of its rows: each of its K slots and its shared row,
// times the n-tiles of H. The combine starts on a token once its counter reaches this.
template <int kBlockN>
__device__ __forceinline__ uint32_t token_contributions(const ForwardParams& p) {
  return uint32_t((p.top_k + (p.shared_width > 0 ? 1 : 0)) * ((p.hidden + kBlockN - 1) / kBlockN));
}

}  // namespace mok::kern
