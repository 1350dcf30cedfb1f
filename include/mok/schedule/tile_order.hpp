// The order in which a persistent GEMM grid walks the tiles of one operand group (one expert's row
// blocks, or the shared experts' token blocks), shared by the kernels and their CPU tests.
//
// Row blocks are taken in groups (kTileGroupRows, or ForwardOptions::overlap_rows / 128 for routed
// rows, at most the token ring); inside a group the n-tile is the outer
// index and the row block the inner one. CTAs that run at the same time therefore share the weight
// slice of one n-tile (it is read from HBM once, not once per row block: an expert's gate|up
// weights, 58 MB at dsv3's shape, do not fit in L2), while a group's activation rows (8 blocks of
// 128 rows, 14.7 MB at H = 7168) stay in L2 across the n-tiles.
#pragma once
#include <cstdint>

#include "mok/common/host_device.hpp"

namespace mok::sched {

constexpr int kTileGroupRows = 8;  // row blocks per group, by default

struct TileCoord {
  int64_t block;  // row block inside the operand group, in [0, blocks)
  int n_tile;     // in [0, n_tiles)
};

// Tile `index` in [0, blocks * n_tiles) of a group of `blocks` row blocks: a bijection onto
// [0, blocks) x [0, n_tiles). group_rows: row blocks per group (a token ring of R blocks needs
// group_rows <= R: a group's first n-tile reads all of its blocks before any of them is freed).
MOK_HD TileCoord grouped_tile(int64_t index, int64_t blocks, int n_tiles,
                              int group_rows = kTileGroupRows) {
  const int64_t group = index / (int64_t(group_rows) * n_tiles);
  const int64_t first = group * group_rows;
  const int64_t size = blocks - first < group_rows ? blocks - first : group_rows;
  const int64_t within = index - first * n_tiles;
  return {first + within % size, int(within / size)};
}

}  // namespace mok::sched
