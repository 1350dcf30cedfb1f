// The layout math shared with the kernel, against brute-force enumerations.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "mok/schedule/routing_layout.hpp"
#include "mok/schedule/tile_order.hpp"

using namespace mok::sched;

TEST(Schedule, CountingSortGroupsSlotsByExpertInSlotOrder) {
  std::mt19937 rng(1);
  const int E = 13, K = 3;
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t T = rng() % 40;
    std::vector<int32_t> ids(size_t(T * K));
    for (int32_t& id : ids) id = int32_t(rng() % E);
    std::vector<int32_t> counts(E), offsets(E + 1), cursor(E), sorted(ids.size());
    count_rows_per_expert(ids.data(), T, K, E, counts.data());
    exclusive_prefix(counts.data(), E, offsets.data());
    sort_slots_by_expert(ids.data(), T, K, E, offsets.data(), cursor.data(), sorted.data());
    std::vector<int32_t> expect;
    for (int e = 0; e < E; ++e)
      for (int64_t s = 0; s < T * K; ++s)
        if (ids[size_t(s)] == e) expect.push_back(int32_t(s));
    EXPECT_EQ(sorted, expect);
  }
}

TEST(Schedule, SegmentsArePaddedAndLocateFindsEveryRow) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 100; ++trial) {
    const int N = 1 << (rng() % 4), L = 1 + int(rng() % 4), E = N * L, tile = 64;
    const int owner = int(rng() % N);
    std::vector<int32_t> counts(size_t(N * E));
    for (int32_t& c : counts) c = (rng() % 3 == 0) ? 0 : int32_t(rng() % 150);
    std::vector<int64_t> seg_begin(L + 1), seg_rows(L), src_begin(size_t(L * (N + 1)));
    build_segments(counts.data(), N, E, owner, tile, seg_begin.data(), seg_rows.data(),
                   src_begin.data());
    EXPECT_EQ(seg_begin[size_t(L)], padded_rows_of_rank(counts.data(), N, E, owner, tile));
    // Brute force: expert by expert, source by source, index within the source's group.
    int64_t row = 0;
    for (int l = 0; l < L; ++l) {
      EXPECT_EQ(seg_begin[size_t(l)] % tile, 0);
      EXPECT_EQ(seg_begin[size_t(l)], row);
      const int e = global_expert(owner, l, L);
      int64_t real = 0;
      for (int src = 0; src < N; ++src) {
        for (int64_t i = 0; i < counts[size_t(src * E + e)]; ++i, ++row, ++real) {
          const RoutedRow r =
              locate_routed_row(row, seg_begin.data(), seg_rows.data(), src_begin.data(), L, N);
          ASSERT_EQ(std::tie(r.local_expert, r.source_rank, r.index_in_source_group),
                    std::tie(l, src, i));
        }
      }
      for (; row < seg_begin[size_t(l)] + pad_to_tile(real, tile); ++row) {
        const RoutedRow r =
            locate_routed_row(row, seg_begin.data(), seg_rows.data(), src_begin.data(), L, N);
        ASSERT_EQ(r.local_expert, l);
        ASSERT_EQ(r.source_rank, -1);  // padding
      }
    }
    EXPECT_EQ(locate_routed_row(row, seg_begin.data(), seg_rows.data(), src_begin.data(), L, N)
                  .local_expert,
              -1);
  }
}

TEST(Schedule, OwnershipAndSlots) {
  EXPECT_EQ(expert_owner(37, 16), 2);
  EXPECT_EQ(local_expert(37, 16), 5);
  EXPECT_EQ(global_expert(2, 5, 16), 37);
  EXPECT_EQ(combine_slot(10, 3, 8), 83);
  EXPECT_EQ(slot_token(83, 8), 10);
  EXPECT_EQ(slot_k(83, 8), 3);
  EXPECT_EQ(pad_to_tile(0, 128), 0);
  EXPECT_EQ(pad_to_tile(129, 128), 256);
}

// A producer and `readers` consumer parts stepping in every interleaving a random scheduler picks
// (the GPU's gate/up warpgroups read a block in any order): the counters never let a tile be
// overwritten before every part has read it, and all reach the end.
TEST(Schedule, RingCountersNeverOverwriteAndNeverDeadlock) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const RingLayout ring{64, 1 + int64_t(rng() % 4)};
    const int64_t blocks = rng() % 20;
    const uint32_t readers = 1 + uint32_t(rng() % 3);
    std::vector<uint32_t> filled(size_t(blocks), 0), released(size_t(blocks), 0);
    std::vector<int64_t> content(size_t(ring.num_tiles), -1);  // the block a ring tile holds
    std::vector<int64_t> next_read(readers, 0);                // each part's next block
    int64_t produced = 0;
    for (;;) {
      bool done = produced == blocks;
      for (int64_t n : next_read) done = done && n == blocks;
      if (done) break;
      const int64_t previous = ring_previous_block(produced, ring);
      const bool can_fill =
          produced < blocks && (previous < 0 || ring_may_fill(released[size_t(previous)], readers));
      std::vector<uint32_t> can_read;
      for (uint32_t part = 0; part < readers; ++part) {
        const int64_t b = next_read[part];
        if (b < blocks && ring_may_read(filled[size_t(b)])) can_read.push_back(part);
      }
      ASSERT_TRUE(can_fill || !can_read.empty()) << "deadlock";
      if (can_fill && (can_read.empty() || rng() % 2)) {
        const int64_t tile = ring_tile(produced, ring);
        ASSERT_TRUE(content[size_t(tile)] == -1 ||
                    released[size_t(content[size_t(tile)])] == readers)
            << "overwrote a block not every part has read";
        content[size_t(tile)] = produced;
        filled[size_t(produced)] = kRingFilled;
        ++produced;
      } else {
        const uint32_t part = can_read[rng() % can_read.size()];
        const int64_t b = next_read[part]++;
        ASSERT_EQ(content[size_t(ring_tile(b, ring))], b) << "read a block that was overwritten";
        ++released[size_t(b)];
      }
    }
    EXPECT_EQ(ring_row(ring.num_tiles * 64 + 5, ring), 5);
  }
}

// The GEMM tile order visits every (row block, n-tile) of a group exactly once, whatever the sizes,
// and keeps the row blocks of one group together.
TEST(Schedule, GroupedTileOrderIsABijection) {
  for (int group : {1, 3, mok::sched::kTileGroupRows})
    for (int64_t blocks : {1, 2, 7, 8, 9, 16, 17, 100}) {
      for (int n_tiles : {1, 3, 16, 28}) {
        std::vector<int> seen(size_t(blocks * n_tiles), 0);
        for (int64_t i = 0; i < blocks * n_tiles; ++i) {
          const mok::sched::TileCoord t = mok::sched::grouped_tile(i, blocks, n_tiles, group);
          ASSERT_GE(t.block, 0);
          ASSERT_LT(t.block, blocks);
          ASSERT_GE(t.n_tile, 0);
          ASSERT_LT(t.n_tile, n_tiles);
          ++seen[size_t(t.block * n_tiles + t.n_tile)];
          // Consecutive tiles inside a full group share the n-tile (the weight slice).
          EXPECT_EQ(t.block / group, i / (int64_t(group) * n_tiles));
        }
        for (int s : seen) ASSERT_EQ(s, 1) << blocks << " blocks, " << n_tiles << " n-tiles";
      }
    }
}

// The dispatch copy's walk over a block's vectors lands where a division would, for row lengths
// shorter and longer than the stride.
TEST(Schedule, VectorWalkMatchesDivision) {
  for (uint32_t row_vecs : {8u, 32u, 48u, 256u, 384u, 896u, 3000u})
    for (uint32_t stride : {1u, 32u, 384u, 1000u}) {
      const mok::sched::VectorWalk walk = mok::sched::VectorWalk::make(stride, row_vecs);
      for (uint32_t start : {0u, 5u, stride - 1}) {
        mok::sched::VectorWalk::Position p = walk.at(start);
        for (uint32_t i = start; i < 128 * row_vecs + 3 * stride; i += stride, walk.advance(p)) {
          ASSERT_EQ(p.row, i / row_vecs) << row_vecs << " " << stride << " " << i;
          ASSERT_EQ(p.col, i % row_vecs) << row_vecs << " " << stride << " " << i;
        }
      }
    }
}

TEST(Schedule, RowDestinationRoundTrips) {
  using mok::sched::RowDestination;
  for (int rank : {0, 1, 7, 255})
    for (int64_t slot : {int64_t(0), int64_t(1), int64_t(8191 * 16 + 15), (int64_t(1) << 40) + 3,
                         RowDestination::kSlotMask}) {
      const int64_t packed = RowDestination::pack(rank, slot);
      EXPECT_GE(packed, 0);
      EXPECT_EQ(RowDestination::rank(packed), rank);
      EXPECT_EQ(RowDestination::slot(packed), slot);
    }
  EXPECT_EQ(RowDestination::pack(-1, 5), -1);  // padding
  EXPECT_EQ(RowDestination::rank(-1), -1);
  EXPECT_EQ(RowDestination::slot(-1), -1);
}
