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
// With CTA pairs (ForwardParams::cta_pairs) a cluster of two CTAs claims tiles 2q and 2q + 1 of the
// sequence at once (its CTA of rank r takes 2q + r), and the pair's tiles share B loads where they
// read the same weights. Each phase is padded to an even length with empty tiles, so the two tiles
// of a pair are of one phase and neither waits on the other; both CTAs of a cluster are resident
// together, so the argument above holds for the sequence of pairs.
// Shared tiles come first: they need no dispatch, so they run while dispatch is in flight.
#pragma once
#include <cstdint>

#include "kernels/gemm/bf16_pipeline.cuh"
#include "kernels/moe_forward/forward_params.hpp"
#include "mok/device/cluster.cuh"
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
  bool none;  // an empty tile that pads a phase to pairs: no loads, no MMAs, nothing published
};

// True when the two tiles of a pair read the same B (weights): each CTA then loads half of it and
// multicasts it to both.
__device__ __forceinline__ bool same_b(const TileWork& a, const TileWork& b) {
  return !a.none && !b.none && a.kind == b.kind && a.expert == b.expert && a.n_tile == b.n_tile;
}

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
    slot = p.peer_sorted[src][p.peer_offsets[src][global_expert] + r.index_in_source_group];
  }
  return sched::RowDestination::pack(src, slot);
}

template <int kBlockN>
struct ForwardTiles {
  int64_t shared_blocks, routed_row_blocks;
  int gate_up_tiles, shared_gate_up_tiles, down_tiles;                      // n-tiles per row block
  int64_t routed_gate_up_begin, shared_down_begin, routed_down_begin, end;  // kinds' first tiles

  __device__ static ForwardTiles make(const ForwardParams& p) {
    ForwardTiles t;
    const bool shared = p.shared_width > 0 && batch_ok(p);
    t.shared_blocks = shared ? (p.tokens + kBlockM - 1) / kBlockM : 0;
    t.routed_row_blocks = routed_blocks(p);
    t.gate_up_tiles = 2 * p.intermediate / kBlockN;
    t.shared_gate_up_tiles = 2 * p.shared_width / kBlockN;
    t.down_tiles = (p.hidden + kBlockN - 1) / kBlockN;
    const int64_t pad = p.cta_pairs ? 1 : 0;  // phases of an even length for pairs
    auto phase = [&](int64_t tiles) { return (tiles + pad) & ~pad; };
    t.routed_gate_up_begin = phase(t.shared_blocks * t.shared_gate_up_tiles);
    t.shared_down_begin = t.routed_gate_up_begin + phase(t.routed_row_blocks * t.gate_up_tiles);
    t.routed_down_begin = t.shared_down_begin + phase(t.shared_blocks * t.down_tiles);
    t.end = t.routed_down_begin + phase(t.routed_row_blocks * t.down_tiles);
    return t;
  }
  __device__ int64_t count() const { return end; }

  __device__ TileWork at(int64_t t, const ForwardParams& p) const {
    auto none = [](TileKind kind, int k_blocks) { return TileWork{kind, 0, 0, 0, k_blocks, true}; };
    if (t < routed_gate_up_begin) {
      if (t >= shared_blocks * shared_gate_up_tiles)
        return none(TileKind::shared_gate_up, p.hidden / kBlockK);
      const sched::TileCoord c = sched::grouped_tile(t, shared_blocks, shared_gate_up_tiles);
      return {TileKind::shared_gate_up, c.block, c.n_tile, 0, p.hidden / kBlockK, false};
    }
    if (t < shared_down_begin) {
      if (t - routed_gate_up_begin >= routed_row_blocks * gate_up_tiles)
        return none(TileKind::routed_gate_up, p.hidden / kBlockK);
      const TileWork w = routed(t - routed_gate_up_begin, gate_up_tiles, p);
      return {TileKind::routed_gate_up, w.m_block, w.n_tile, w.expert, p.hidden / kBlockK, false};
    }
    if (t < routed_down_begin) {
      if (t - shared_down_begin >= shared_blocks * down_tiles)
        return none(TileKind::shared_down, p.shared_width / kBlockK);
      const sched::TileCoord c =
          sched::grouped_tile(t - shared_down_begin, shared_blocks, down_tiles);
      return {TileKind::shared_down, c.block, c.n_tile, 0, p.shared_width / kBlockK, false};
    }
    if (t - routed_down_begin >= routed_row_blocks * down_tiles)
      return none(TileKind::routed_down, p.intermediate / kBlockK);
    const TileWork w = routed(t - routed_down_begin, down_tiles, p);
    return {TileKind::routed_down, w.m_block, w.n_tile, w.expert, p.intermediate / kBlockK, false};
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
    return {TileKind::routed_gate_up, first + c.block, c.n_tile, expert, 0, false};
  }
};

// A CTA's producer claims tiles and hands their indices to its consumers through a small queue in
// shared memory (an index < 0 ends the sequence). Every warp that reads an entry (each consumer
// warp, and the producer warps that follow the claiming one) releases it with one arrival of its
// lane 0 after a __syncwarp.
// With CTA pairs, rank 0's producer claims for both CTAs: it writes the other CTA's entry (tile
// 2q + 1) into that CTA's queue and arrives on its full barrier, and the other CTA's readers
// release entries on rank 0's empty barrier, which therefore counts both CTAs' reader warps.
// Nobody releases the end entry: no claim follows it, and a producer thread that exits right
// after reading it must not leave an arrival in flight to the other CTA, which may have exited.
constexpr int kTileQueueDepth = 4;
// An entry: the tile index (< 0: the end), and with pairs kShareB when the pair's tiles read the
// same B (decided once, by the claimer).
constexpr int64_t kShareB = int64_t(1) << 62;
struct TileQueue {
  int64_t* index;
  uint64_t* full;   // the claimer's arrival (release) after writing the index
  uint64_t* empty;  // one arrival per reader warp (of both CTAs of a pair, on rank 0)

  // This CTA's rank in its pair, -1 without pairs (from special registers: nothing kept live).
  __device__ static int pair_rank() {
    return dev::cluster_nctarank() > 1 ? int(dev::cluster_ctarank()) : -1;
  }
  __device__ static uint32_t other(const void* p) {
    return dev::cluster_smem_addr(p, dev::cluster_ctarank() ^ 1u);
  }
  // reader_warps: this CTA's; with pairs, rank 0 also counts the other CTA's other_reader_warps.
  __device__ void init(uint32_t reader_warps, uint32_t other_reader_warps) const {
    for (int s = 0; s < kTileQueueDepth; ++s) {
      dev::mbar_init(&full[s], 1);
      dev::mbar_init(&empty[s], reader_warps + (pair_rank() == 0 ? other_reader_warps : 0u));
    }
  }
  __device__ static bool claims() { return pair_rank() <= 0; }  // this CTA's leader claims tiles
  // The claimer's wait for entry `stage` to be free (with pairs, the other CTA's readers too).
  __device__ bool wait_empty(uint32_t stage, uint32_t phase, uint64_t cycles) const {
    return pair_rank() == 0 ? dev::mbar_wait_cluster(&empty[stage], phase, cycles)
                            : dev::mbar_wait(&empty[stage], phase, cycles);
  }
  // A reader's wait for entry `stage` (on rank 1 the other CTA's claimer wrote it: acquire at
  // cluster scope).
  __device__ bool wait_full(uint32_t stage, uint32_t phase, uint64_t cycles) const {
    return pair_rank() == 1 ? dev::mbar_wait_cluster(&full[stage], phase, cycles)
                            : dev::mbar_wait(&full[stage], phase, cycles);
  }
  // A reader warp's lane 0, after its lanes read entry `stage`.
  __device__ void release(uint32_t stage) const {
    if (pair_rank() == 1)
      dev::mbar_arrive_cluster(other(&empty[stage]));
    else
      dev::mbar_arrive(&empty[stage]);
  }
  // The claimer: publishes entry e here and, with pairs, the other CTA's (tile + 1; the end as is).
  __device__ void publish(uint32_t stage, int64_t e) const {
    index[stage] = e;
    if (pair_rank() == 0) {
      dev::st_cluster_u64(other(&index[stage]), uint64_t(e < 0 ? e : e + 1));
      dev::mbar_arrive_cluster(other(&full[stage]));
    }
    dev::mbar_arrive(&full[stage]);
  }
};

// Profiling (ForwardParams::timings): a participant's sums, added to the totals once at its end.
struct RoleTimer {
  bool on;
  uint64_t sums[kForwardTimes] = {};
  __device__ explicit RoleTimer(const ForwardParams& p) : on(p.timings != nullptr) {}
  __device__ uint64_t now() const { return on ? dev::global_ns() : 0; }
  __device__ void add(ForwardTiming what, uint64_t since) {
    if (on) sums[what] += dev::global_ns() - since;
  }
  __device__ void flush(const ForwardParams& p) const {
    if (!on) return;
#pragma unroll
    for (int i = 0; i < kForwardTimes; ++i)
      if (sums[i]) atomicAdd(p.timings + i, static_cast<unsigned long long>(sums[i]));
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
  const volatile int* aborted = p.aborted;
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
  atomicExch(p.aborted, 1);
}

}  // namespace mok::kern
