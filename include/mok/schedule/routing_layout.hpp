// Where every routed row lives: expert ownership, per-rank counts and counting-sort order, padded
// expert segments on the owner, combine slots on the source, and the token ring's index math.
// Shared by the GPU kernels, the CPU reference and the EP simulation (design.md, invariant 6).
//
// Order rule (invariants 1 and 2): inside a local expert's segment, rows are sorted by
// (source rank, token, k). With global token = (rank, token), that is the global order, so the
// same global batch gives the same rows in the same order at every EP size.
#pragma once
#include "mok/common/host_device.hpp"

namespace mok::sched {

MOK_HD int expert_owner(int expert, int experts_per_rank) { return expert / experts_per_rank; }
MOK_HD int local_expert(int expert, int experts_per_rank) { return expert % experts_per_rank; }
MOK_HD int global_expert(int rank, int local, int experts_per_rank) {
  return rank * experts_per_rank + local;
}

// The (token, k) slot on the source rank: where the expert output row comes back to (combine)
// and where the input-gradient row of the backward goes.
MOK_HD int64_t combine_slot(int64_t token, int k, int top_k) { return token * top_k + k; }
MOK_HD int64_t slot_token(int64_t slot, int top_k) { return slot / top_k; }
MOK_HD int slot_k(int64_t slot, int top_k) { return int(slot % top_k); }

// The GPU kernels' tile height: routed rows per m-tile (the GEMMs' block M, one m64 wgmma row
// block per consumer warpgroup), to which every expert's segment is padded. Config::tile_rows
// defaults to it, and the GPU forwards refuse any other value.
constexpr int kGpuTileRows = 128;

MOK_HD int64_t pad_to_tile(int64_t rows, int tile_rows) {
  return (rows + tile_rows - 1) / tile_rows * tile_rows;
}

// ---- Source side: counting sort of a rank's (token, k) slots by expert --------------------------
// counts[E] = rows per expert; offsets[E+1] = exclusive prefix; sorted[T*K] = slots grouped by
// expert, ascending slot order inside each group (a stable counting sort, so no atomics decide it).
MOK_HD void count_rows_per_expert(const int32_t* topk_ids, int64_t tokens, int top_k,
                                  int num_experts, int32_t* counts) {
  for (int e = 0; e < num_experts; ++e) counts[e] = 0;
  for (int64_t s = 0; s < tokens * top_k; ++s) ++counts[topk_ids[s]];
}

MOK_HD void exclusive_prefix(const int32_t* counts, int n, int32_t* offsets) {
  offsets[0] = 0;
  for (int i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + counts[i];
}

// cursor[E] is scratch. Slot s goes to sorted[offsets[e] + (rank of s among slots of expert e)].
MOK_HD void sort_slots_by_expert(const int32_t* topk_ids, int64_t tokens, int top_k,
                                 int num_experts, const int32_t* offsets, int32_t* cursor,
                                 int32_t* sorted) {
  for (int e = 0; e < num_experts; ++e) cursor[e] = offsets[e];
  for (int64_t s = 0; s < tokens * top_k; ++s) sorted[cursor[topk_ids[s]]++] = int32_t(s);
}

// ---- Owner side: padded segments of the local experts -------------------------------------------
// counts_by_source is [ep_size][num_experts] (every rank's counts, exchanged). For local expert l:
//   rows(l)                 = sum over sources of counts[src][e]
//   segment_begin[l]        = sum over l' < l of pad_to_tile(rows(l'))      (segment_begin[L] =
//   total) source_begin[l][src]    = sum over src' < src of counts[src'][e]      (offset inside the
//   segment)
MOK_HD int64_t expert_rows(const int32_t* counts_by_source, int ep_size, int num_experts,
                           int expert) {
  int64_t rows = 0;
  for (int src = 0; src < ep_size; ++src) rows += counts_by_source[src * num_experts + expert];
  return rows;
}

// Padded routed rows rank `owner` needs: the capacity check of every rank uses this.
MOK_HD int64_t padded_rows_of_rank(const int32_t* counts_by_source, int ep_size, int num_experts,
                                   int owner, int tile_rows) {
  const int per_rank = num_experts / ep_size;
  int64_t total = 0;
  for (int l = 0; l < per_rank; ++l)
    total += pad_to_tile(
        expert_rows(counts_by_source, ep_size, num_experts, global_expert(owner, l, per_rank)),
        tile_rows);
  return total;
}

// One expert's source_begin row (sb[0 .. ep_size]); returns its rows.
MOK_HD int64_t source_begins(const int32_t* counts_by_source, int ep_size, int num_experts,
                             int expert, int64_t* sb /*[ep+1]*/) {
  int64_t rows = 0;
  sb[0] = 0;
  for (int src = 0; src < ep_size; ++src)
    sb[src + 1] = rows += counts_by_source[src * num_experts + expert];
  return rows;
}

// The host's (and the tests') reference; the device builds the same tables with one thread per
// expert and a block-wide prefix sum (layer/owner_schedule.cuh).
MOK_HD void build_segments(const int32_t* counts_by_source, int ep_size, int num_experts, int owner,
                           int tile_rows, int64_t* segment_begin /*[L+1]*/,
                           int64_t* segment_rows /*[L]*/, int64_t* source_begin /*[L][ep+1]*/) {
  const int per_rank = num_experts / ep_size;
  int64_t begin = 0;
  segment_begin[0] = 0;
  for (int l = 0; l < per_rank; ++l) {
    const int64_t rows =
        source_begins(counts_by_source, ep_size, num_experts, global_expert(owner, l, per_rank),
                      source_begin + int64_t(l) * (ep_size + 1));
    segment_rows[l] = rows;
    segment_begin[l + 1] = begin += pad_to_tile(rows, tile_rows);
  }
}

// What padded routed row `row` of the owner holds.
struct RoutedRow {
  int local_expert;               // -1 only past the last segment
  int source_rank;                // -1 for a padding row
  int64_t index_in_source_group;  // position among the source's rows for this expert
};

// The segment l with segment_begin[l] <= row < segment_begin[l + 1], or -1 past the last one.
MOK_HD int segment_of_row(int64_t row, const int64_t* segment_begin, int segments) {
  if (row < 0 || row >= segment_begin[segments]) return -1;
  int lo = 0, hi = segments;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (segment_begin[mid] <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Row `row` of segment l (known): its source rank and index among that source's rows, or source
// -1 for a padding row.
struct SourceIndex {
  int source_rank;
  int64_t index_in_source_group;
};
MOK_HD SourceIndex source_of_segment_row(int64_t row, int l, const int64_t* segment_begin,
                                         const int64_t* segment_rows, const int64_t* source_begin,
                                         int ep_size) {
  const int64_t offset = row - segment_begin[l];
  if (offset >= segment_rows[l]) return {-1, 0};
  const int64_t* sb = source_begin + int64_t(l) * (ep_size + 1);
  int src = 0;
  while (sb[src + 1] <= offset) ++src;
  return {src, offset - sb[src]};
}

// The (token, k) slot of a routed row on its source rank: entry index_in_source_group of that
// source's sorted slots for the row's (global) expert. offsets / sorted: the source's schedule.
MOK_HD int32_t source_slot(const int32_t* offsets, const int32_t* sorted, int global_expert,
                           int64_t index_in_source_group) {
  return sorted[offsets[global_expert] + index_in_source_group];
}

MOK_HD RoutedRow locate_routed_row(int64_t row, const int64_t* segment_begin,
                                   const int64_t* segment_rows, const int64_t* source_begin,
                                   int experts_per_rank, int ep_size) {
  const int lo = segment_of_row(row, segment_begin, experts_per_rank);
  if (lo < 0) return {-1, -1, 0};
  const SourceIndex s =
      source_of_segment_row(row, lo, segment_begin, segment_rows, source_begin, ep_size);
  return {lo, s.source_rank, s.index_in_source_group};
}

// EP = 1: the (token, k) slot that padded routed row `row` of `expert`'s segment holds, or -1 for a
// padding row. counts / offsets / sorted are build_source_schedule's; segment_begin the padded
// segments. Rows keep slot order inside each expert (the counting sort is stable).
MOK_HD int64_t routed_row_slot(int64_t row, int expert, const int64_t* segment_begin,
                               const int32_t* counts, const int32_t* offsets,
                               const int32_t* sorted) {
  const int64_t offset = row - segment_begin[expert];
  return offset < counts[expert] ? sorted[offsets[expert] + offset] : -1;
}

// ---- Token ring: the protocol the GPU kernels and the CPU simulation both run.
// Routed row block b (tile_rows rows of the padded layout) lives in ring tile b % num_tiles. Two
// monotone counters per routed block (not per ring tile, so no generations to compare):
//   filled[b]    set to kRingFilled by the producer once b's rows are written    (release)
//   released[b]  +1 by each of the `readers` parts that read b, once done        (release)
// The producer may fill b once b is the tile's first use (ring_previous_block < 0) or
// ring_may_fill(released[ring_previous_block(b)], readers); a reader may read b once
// ring_may_read(filled[b]). On the GPU the readers are the warpgroups of b's gate/up tiles
// (kConsumers per n-tile), whose released count is also what b's down tiles wait for.
// No tile is filled before its previous block is read, and blocks are filled and read in
// increasing order, so the pair cannot deadlock whatever the ring size.
struct RingLayout {
  int tile_rows;
  int64_t num_tiles;
};
constexpr uint32_t kRingFilled = 1;

MOK_HD int64_t ring_tile(int64_t block, RingLayout r) { return block % r.num_tiles; }
MOK_HD int64_t ring_row(int64_t routed_row, RingLayout r) {
  return ring_tile(routed_row / r.tile_rows, r) * r.tile_rows + routed_row % r.tile_rows;
}
// The block whose rows block b overwrites in the ring; < 0 when b is its tile's first use.
MOK_HD int64_t ring_previous_block(int64_t block, RingLayout r) { return block - r.num_tiles; }
MOK_HD bool ring_may_fill(uint32_t released_previous, uint32_t readers) {
  return released_previous >= readers;
}
MOK_HD bool ring_may_read(uint32_t filled) { return filled >= kRingFilled; }

// Walks a row block's 16-byte vectors i, i + s, i + 2s, ... as (row, column) pairs of rows of
// row_vecs vectors, by adding only (the dispatch copy: an integer division per vector, ~20
// instructions, made its loop instruction-bound rather than memory-bound).
struct VectorWalk {
  uint32_t rows, cols, row_vecs;  // s = rows * row_vecs + cols
  struct Position {
    uint32_t row, col;
  };
  MOK_HD static VectorWalk make(uint32_t s, uint32_t row_vecs) {
    return {s / row_vecs, s % row_vecs, row_vecs};
  }
  MOK_HD Position at(uint32_t i) const { return {i / row_vecs, i % row_vecs}; }
  MOK_HD void advance(Position& p) const {
    p.row += rows, p.col += cols;
    if (p.col >= row_vecs) p.col -= row_vecs, ++p.row;
  }
};

// Where a routed row's expert output goes, packed in one int64 so that the down epilogue finds it
// with one load (the lookup through the owner and source schedules is 3-4 dependent loads, some
// over NVLink): the source rank in bits 48-55 and its (token, k) slot below; -1 for padding.
struct RowDestination {
  static constexpr int kRankShift = 48;
  static constexpr int64_t kSlotMask = (int64_t(1) << kRankShift) - 1;
  MOK_HD static int64_t pack(int source_rank, int64_t slot) {
    return source_rank < 0 ? -1 : (int64_t(source_rank) << kRankShift) | slot;
  }
  MOK_HD static int rank(int64_t packed) { return packed < 0 ? -1 : int(packed >> kRankShift); }
  MOK_HD static int64_t slot(int64_t packed) { return packed < 0 ? -1 : packed & kSlotMask; }
};

}  // namespace mok::sched
