// The backward megakernel's tiles and their order. A unit is the shared experts (unit 0, over token
// blocks; no tiles without them) or one local expert (unit 1 + e, over its routed row blocks).
// Every tile is 128 x N (N = block_n, 128 or 256). Per unit, with W its width (S or I), nW = W / N
// and nH = H / N n-tiles, and mH = H / 128, mW = 2W / 128 m-tiles:
//   recompute      blocks x 2nW  g | u = x [W_gate | W_up] of a row block, the forward's gate/up
//                                tile and SwiGLU epilogue into act and gate_up
//                                (GateUpMode::recompute)
//   dgrad-down     blocks x nW   dA' = d_out W_down of a row block; SwiGLU backward -> dg | du
//   dgrad-gate/up  blocks x nH   dx = [dg | du] [W_gate; W_up] of a row block
//   wgrad          mH x nW       dW_down = sum over the unit's rows of d_out^T (w act)
//                  mW x nH       dW_gate | dW_up = sum over its rows of [dg | du]^T x
// The GEMM CTAs claim tiles from one counter in the order of a pipeline of steps with a lag L
// (BackwardParams::lag): step j holds unit j's dgrad-down tiles, unit j-L's dgrad-gate/up tiles and
// unit j-2L's wgrad tiles, so every kind runs at once and the gradient stores overlap arithmetic
// instead of forming a tail. Recomputing, every kind moves one lag later behind unit j's recompute
// tiles (a dgrad-down tile then finds its block's g | u done, as it finds its rows dispatched). L
// is the host's: enough units that the tiles a wave of CTAs claims rarely wait on tiles still in
// flight (units with few tiles need a longer lag). Inside a kind the row blocks go in the forward's
// weight-sharing groups (tile_order.hpp).
//
// Deadlock freedom (the forward's argument, tile_schedule.cuh): a dgrad-down tile waits only on
// dispatch (which waits on nothing: the ring holds the whole batch) or on its block's recompute
// tiles (an earlier step; they wait on dispatch), a dgrad-gate/up tile on its
// block's dgrad-down tiles (an earlier step), a wgrad tile on every dgrad-down tile of its unit
// (an earlier step), the combine on dgrad-gate/up tiles. Tiles are claimed in sequence order by
// resident CTAs, so the earliest unfinished tile always has what it waits for.
// Each wgrad tile's K loop runs over all of its unit's rows in the schedule's (source rank, token,
// k) order, with no split: one owner, one store, the same bits whatever the timing.
#pragma once
#include <cstdint>

#include "kernels/gemm/tile_geometry.cuh"
#include "kernels/moe_backward/backward_params.hpp"
#include "kernels/moe_forward/tile_schedule.cuh"
#include "mok/schedule/tile_order.hpp"

namespace mok::kern {

struct BackwardWork {
  BackwardKind kind;
  int unit;         // 0: the shared experts, 1 + e: local expert e
  int64_t m_block;  // dgrad: the row block (routed layout, or tokens); wgrad: the m-tile
  int n_tile;
  int k_blocks;    // ring stages the tile takes
  int k_loaded;    // of which loaded and multiplied (wgrad: a staged one-block tile takes two)
  int64_t k_row0;  // wgrad: the unit's first row (its K range starts there)
  __device__ bool shared() const { return unit == 0; }
  __device__ int expert() const { return unit - 1; }
  __device__ bool dgrad() const {
    return kind == BackwardKind::dgrad_down || kind == BackwardKind::dgrad_gate_up;
  }
  __device__ bool row_block() const { return dgrad() || kind == BackwardKind::recompute; }
};

// A unit's shape for this batch.
struct BackwardUnit {
  int64_t first_block, blocks, rows;  // row blocks (routed layout or tokens) and real rows
  int width;                          // S or I (0: no shared experts)
};

__device__ __forceinline__ int backward_units(const ForwardParams& p) { return 1 + p.experts; }

__device__ __forceinline__ BackwardUnit backward_unit(const ForwardParams& p, int u) {
  if (!batch_ok(p)) return {0, 0, 0, 0};
  if (u == 0) {
    if (p.shared_width == 0) return {0, 0, 0, 0};
    return {0, (p.tokens + kBlockM - 1) / kBlockM, p.tokens, p.shared_width};
  }
  const int e = u - 1;
  const int64_t first = p.seg_begin[e] / kBlockM;
  return {first, p.seg_begin[e + 1] / kBlockM - first, p.segment_rows[e], p.intermediate};
}

struct BackwardTileCounts {
  int64_t dgrad_down, dgrad_gate_up, wgrad, recompute;
};
__device__ __forceinline__ BackwardTileCounts backward_tile_counts(const BackwardParams& p,
                                                                   const BackwardUnit& u) {
  const int64_t n_w = u.width / p.block_n, n_h = p.hidden / p.block_n;
  const int64_t m_h = p.hidden / kBlockM, m_w = 2 * u.width / kBlockM;
  return {u.blocks * n_w, u.blocks * n_h, m_h * n_w + m_w * n_h, u.blocks * 2 * n_w};
}

// The kinds in pipeline order (kKind of backward_step_unit), and the lags before each one's step:
// 0, 1, 2, 3 when recomputing, else the last three from 0.
constexpr int kKindRecompute = 0, kKindDgradDown = 1, kKindDgradGateUp = 2, kKindWgrad = 3;
__device__ __forceinline__ int backward_kind_shift(bool recompute, int kind) {
  return kind - (recompute ? 0 : 1);
}
__device__ __forceinline__ int backward_steps(const BackwardParams& p, int lag) {
  return backward_units(p) + backward_kind_shift(p.recompute != 0, kKindWgrad) * lag;
}

// Whether this launch's tile order holds the tiles of `stage` (kStage*).
__device__ __forceinline__ bool backward_runs(const ForwardParams& p, int stage) {
  const int stages = p.profile_flags & kStageMask;
  return stages == 0 || (stages & stage) != 0;
}

// The unit whose tiles of kind kKind step j holds, or -1 (recompute: p.recompute, or the
// instantiation's constant).
template <int kKind>
__device__ __forceinline__ int backward_step_unit(const BackwardParams& p, int j, bool recompute) {
  constexpr int kStage = kKind == kKindRecompute     ? kStageRecompute
                         : kKind == kKindDgradDown   ? kStageDgradDown
                         : kKind == kKindDgradGateUp ? kStageDgradGateUp
                                                     : kStageWgrad;
  if (kKind == kKindRecompute && !recompute) return -1;
  if (kKind == kKindWgrad && (p.profile_flags & kProfileNoWgradTiles)) return -1;
  const int u = j - backward_kind_shift(recompute, kKind) * p.lag;
  return u >= 0 && u < backward_units(p) && backward_runs(p, kStage) ? u : -1;
}

// Tiles of step j (units j, j - L, j - 2L, j - 3L as above), 0 <= j < backward_steps.
__device__ __forceinline__ int64_t backward_step_tiles(const BackwardParams& p, int j) {
  const bool recompute = p.recompute != 0;
  int64_t n = 0;
  if (const int u = backward_step_unit<kKindRecompute>(p, j, recompute); u >= 0)
    n += backward_tile_counts(p, backward_unit(p, u)).recompute;
  if (const int u = backward_step_unit<kKindDgradDown>(p, j, recompute); u >= 0)
    n += backward_tile_counts(p, backward_unit(p, u)).dgrad_down;
  if (const int u = backward_step_unit<kKindDgradGateUp>(p, j, recompute); u >= 0)
    n += backward_tile_counts(p, backward_unit(p, u)).dgrad_gate_up;
  if (const int u = backward_step_unit<kKindWgrad>(p, j, recompute); u >= 0)
    n += backward_tile_counts(p, backward_unit(p, u)).wgrad;
  return n;
}

// The units and the steps' first tiles, copied into shared memory by every CTA before its GEMM
// roles start (BackwardProgram::prepare_cta): every tile's lookup then reads shared memory only
// (from global memory, after the producer's acquires had emptied L1, the binary search over the
// steps was a chain of L2 round trips per tile).
constexpr int kMaxBackwardUnits = 1 + 512;                // Config::validate: at most 512 experts
constexpr int kMaxBackwardSteps = 4 * kMaxBackwardUnits;  // units + 3L with L < units
// 32-bit: the host keeps every backward's tile count below 2^31 (BackwardRunner), and with the
// staging slots of mxfp8 the table must fit in 16 KB beside the ring.
struct BackwardUnitRow {
  int32_t first_block, blocks, rows;  // the width: unit_width
};
struct BackwardTable {
  int32_t step_begin[kMaxBackwardSteps + 1];
  BackwardUnitRow units[kMaxBackwardUnits];
};
static_assert(sizeof(BackwardTable) <= 16 * 1024, "the tile table beside the ring");
__device__ __forceinline__ int unit_width(const ForwardParams& p, int u) {
  return u == 0 ? p.shared_width : p.intermediate;
}
__device__ __forceinline__ BackwardTable& backward_table() {
  __shared__ BackwardTable table;
  return table;
}
__device__ __forceinline__ void fill_backward_table(const BackwardParams& p) {
  BackwardTable& t = backward_table();
  const int units = backward_units(p);
  for (int i = int(threadIdx.x); i <= backward_steps(p, p.lag); i += int(blockDim.x))
    t.step_begin[i] = int32_t(p.step_begin[i]);
  for (int u = int(threadIdx.x); u < units; u += int(blockDim.x)) {
    const BackwardUnit b = backward_unit(p, u);
    t.units[u] = {int32_t(b.first_block), int32_t(b.blocks), int32_t(b.rows)};
  }
}

// kRecompute: the instantiation's GateUpMode (BackwardParams::recompute); kFp8Block: its
// precision (BackwardParams::fp8_block).
template <bool kRecompute, bool kFp8Block = false>
struct BackwardTiles {
  const BackwardTable* table;
  int steps;

  __device__ static BackwardTiles make(const BackwardParams& p) {
    return {&backward_table(), backward_steps(p, p.lag)};
  }
  __device__ int64_t count() const { return table->step_begin[steps]; }
  __device__ const BackwardUnitRow& unit(int u) const { return table->units[u]; }

  __device__ BackwardWork at(int64_t t, const BackwardParams& p) const {
    int lo = 0, hi = steps;  // the last step j with step_begin[j] <= t
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (table->step_begin[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
    int64_t i = t - table->step_begin[lo];
    const int n_h = p.hidden / p.block_n;
    // The row-block kinds: unit ui's blocks x n-tiles, grouped; false (i past them) if t is not
    // one.
    BackwardWork w{};
    auto row_block_tile = [&](BackwardKind kind, int ui) {
      if (ui < 0) return false;
      const BackwardUnitRow& u = unit(ui);
      const int width = unit_width(p, ui);
      const int n_tiles = kind == BackwardKind::recompute    ? 2 * width / p.block_n
                          : kind == BackwardKind::dgrad_down ? width / p.block_n
                                                             : n_h;
      // fp8_block's routed dgrad tiles take 128 of K per stage (E4M3: the same bytes).
      const int k_block = kFp8Block && ui != 0 && kind != BackwardKind::recompute ? 128 : kBlockK;
      const int k_blocks =
          kind == BackwardKind::dgrad_gate_up ? 2 * width / k_block : p.hidden / k_block;
      if (i >= int64_t(u.blocks) * n_tiles) {
        i -= int64_t(u.blocks) * n_tiles;
        return false;
      }
      const sched::TileCoord c = sched::grouped_tile(i, u.blocks, n_tiles);
      w = {kind, ui, u.first_block + c.block, c.n_tile, k_blocks, k_blocks, 0};
      return true;
    };
    if (row_block_tile(BackwardKind::recompute,
                       backward_step_unit<kKindRecompute>(p, lo, kRecompute)) ||
        row_block_tile(BackwardKind::dgrad_down,
                       backward_step_unit<kKindDgradDown>(p, lo, kRecompute)) ||
        row_block_tile(BackwardKind::dgrad_gate_up,
                       backward_step_unit<kKindDgradGateUp>(p, lo, kRecompute)))
      return w;
    const int unit_index = backward_step_unit<kKindWgrad>(p, lo, kRecompute);
    const BackwardUnitRow& u = unit(unit_index);
    const int n_w = unit_width(p, unit_index) / p.block_n;
    // A benchmark's variant without the weight-gradient work: its tiles load and multiply nothing.
    const int k_loaded = p.profile_flags & kProfileNoWgrad ? 0 : (u.rows + kBlockK - 1) / kBlockK;
    // A staged tile (BF16) holds two stages for its output: one k-block takes an empty second.
    const int k_blocks = k_loaded == 1 && p.wgrad_mode == kWgradBf16 ? 2 : k_loaded;
    const int64_t row0 = int64_t(u.first_block) * kBlockM;
    const int m_h = p.hidden / kBlockM;  // wgrad m-tiles are 128 rows of the output
    if (i < int64_t(m_h) * n_w)
      return {
          BackwardKind::wgrad_down, unit_index, i / n_w, int(i % n_w), k_blocks, k_loaded, row0};
    i -= int64_t(m_h) * n_w;
    return {
        BackwardKind::wgrad_gate_up, unit_index, i / n_h, int(i % n_h), k_blocks, k_loaded, row0};
  }
};

}  // namespace mok::kern
