// The device schedule equals the host schedule (mok::sched) bit for bit.
#include <random>

#include "gpu_test_util.hpp"
#include "layer/owner_schedule.cuh"
#include "mok/gpu/schedule_gpu.hpp"
#include "mok/schedule/routing_layout.hpp"

TEST(ScheduleGpu, SourceScheduleMatchesHost) {
  MOK_REQUIRE_GPU();
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 44; ++trial) {
    int E = 1 + int(rng() % 512), K = 1 + int(rng() % 16);
    int64_t T = trial == 0 ? 0 : int64_t(rng() % 3000);
    if (trial >= 40) {  // the standard shapes' sizes: many chunks, E up to 512
      const int shapes[4][3] = {{8192, 8, 256}, {8192, 8, 128}, {4096, 8, 512}, {8191, 16, 512}};
      T = shapes[trial - 40][0], K = shapes[trial - 40][1], E = shapes[trial - 40][2];
    }
    std::vector<int32_t> ids(size_t(T * K));
    const bool skew = trial % 3 == 0;
    for (int32_t& id : ids) id = skew ? int32_t(rng() % 3) : int32_t(rng() % uint64_t(E));
    std::vector<int32_t> counts(static_cast<size_t>(E)), offsets(size_t(E) + 1),
        cursor(static_cast<size_t>(E)), sorted(ids.size());
    mok::sched::count_rows_per_expert(ids.data(), T, K, E, counts.data());
    mok::sched::exclusive_prefix(counts.data(), E, offsets.data());
    mok::sched::sort_slots_by_expert(ids.data(), T, K, E, offsets.data(), cursor.data(),
                                     sorted.data());

    DeviceBuffer<int32_t> d_ids(ids), d_counts(static_cast<size_t>(E)), d_offsets(size_t(E) + 1),
        d_sorted(ids.size()), d_scratch(size_t(mok::gpu::source_schedule_workspace(T * K, E)));
    MOK_CUDA_OK(mok::gpu::build_source_schedule(d_ids.ptr, T, K, E, d_counts.ptr, d_offsets.ptr,
                                                d_sorted.ptr, d_scratch.ptr, nullptr));
    MOK_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(d_counts.to_host(), counts) << trial;
    EXPECT_EQ(d_offsets.to_host(), offsets) << trial;
    EXPECT_EQ(d_sorted.to_host(), sorted) << trial;
  }
}

TEST(ScheduleGpu, RoutedRowTableMatchesHost) {
  MOK_REQUIRE_GPU();
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 20; ++trial) {
    const int N = 1 << (rng() % 4), L = 1 + int(rng() % 8), E = N * L, tile = 128;
    std::vector<int32_t> counts(size_t(N * E));
    for (int32_t& c : counts) c = (rng() % 4 == 0) ? 0 : int32_t(rng() % 300);
    const int owner = int(rng() % N);
    std::vector<int64_t> seg_begin(size_t(L) + 1), seg_rows(static_cast<size_t>(L)),
        src_begin(size_t(L * (N + 1)));
    mok::sched::build_segments(counts.data(), N, E, owner, tile, seg_begin.data(), seg_rows.data(),
                               src_begin.data());
    const int64_t rows = seg_begin[size_t(L)];
    DeviceBuffer<int64_t> d_begin(seg_begin), d_rows(seg_rows), d_src(src_begin),
        d_index(static_cast<size_t>(rows));
    DeviceBuffer<int32_t> d_rank(static_cast<size_t>(rows));
    MOK_CUDA_OK(mok::gpu::locate_routed_rows(d_begin.ptr, d_rows.ptr, d_src.ptr, L, N, rows,
                                             d_rank.ptr, d_index.ptr, nullptr));
    MOK_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<int32_t> rank = d_rank.to_host();
    const std::vector<int64_t> index = d_index.to_host();
    for (int64_t r = 0; r < rows; ++r) {
      const mok::sched::RoutedRow want = mok::sched::locate_routed_row(
          r, seg_begin.data(), seg_rows.data(), src_begin.data(), L, N);
      ASSERT_EQ(rank[size_t(r)], want.source_rank) << r;
      if (want.source_rank >= 0) ASSERT_EQ(index[size_t(r)], want.index_in_source_group) << r;
    }
  }
}

namespace {

struct OwnerArgs {
  const int32_t* counts;  // [ranks][experts]
  int ranks, experts, owner, bad_source;
  int64_t capacity, capacity_blocks;
  mok::gpu::detail::OwnerTables out;
};

__global__ void owner_tables_kernel(OwnerArgs a) {
  __shared__ int32_t counts[mok::kern::kMaxRanks * mok::gpu::detail::kMaxEpExperts];
  for (int i = int(threadIdx.x); i < a.ranks * a.experts; i += int(blockDim.x))
    counts[i] = a.counts[i];
  __syncthreads();
  mok::gpu::detail::build_owner_tables(
      counts, a.ranks, a.experts, a.owner, a.capacity, a.capacity_blocks,
      [&](int src) {
        mok::gpu::detail::Status st{};
        if (src == a.bad_source) st.code = mok::gpu::detail::kBadExpertId, st.id = -7;
        return st;
      },
      /*missing=*/-1, 0, a.out);
}

}  // namespace

// The block-parallel owner tables (one thread per local expert, a block-wide prefix sum) equal the
// host's sched::build_segments, its capacity verdict and its row -> expert lookup.
TEST(ScheduleGpu, OwnerTablesMatchHost) {
  MOK_REQUIRE_GPU();
  using mok::gpu::detail::kOk;
  std::mt19937_64 rng(3);
  const int tile = int(mok::gpu::detail::kTileRows);
  for (int trial = 0; trial < 40; ++trial) {
    const int N = 1 << (rng() % 4);
    const int L = trial < 4 ? mok::gpu::detail::kMaxEpExperts / N : 1 + int(rng() % (512 / N));
    const int E = N * L, owner = int(rng() % N);
    std::vector<int32_t> counts(size_t(N) * size_t(E));
    const bool skew = trial % 5 == 1;  // every row to a few experts
    for (size_t i = 0; i < counts.size(); ++i)
      counts[i] = skew ? (i % size_t(E) < 2 ? int32_t(rng() % 20000) : 0)
                       : (rng() % 4 == 0 ? 0 : int32_t(rng() % 300));
    std::vector<int64_t> seg_begin(size_t(L) + 1), seg_rows(static_cast<size_t>(L)),
        src_begin(size_t(L) * size_t(N + 1));
    mok::sched::build_segments(counts.data(), N, E, owner, tile, seg_begin.data(), seg_rows.data(),
                               src_begin.data());
    int64_t most = 0;
    for (int o = 0; o < N; ++o)
      most = std::max(most, mok::sched::padded_rows_of_rank(counts.data(), N, E, o, tile));
    // Some trials lack capacity (the verdict names the first owner over it), some have a source
    // with a bad id (its status wins and no row block gets an expert).
    const int64_t capacity = trial % 4 == 3 ? std::max<int64_t>(0, most - tile) : most + 2 * tile;
    const int bad_source = trial % 7 == 5 ? int(rng() % N) : -1;
    const int64_t blocks = capacity / tile + 3;
    DeviceBuffer<int32_t> d_counts(counts), d_tile_expert(static_cast<size_t>(blocks));
    DeviceBuffer<int64_t> d_begin(seg_begin.size()), d_rows(seg_rows.size()),
        d_src(src_begin.size());
    DeviceBuffer<mok::gpu::detail::Status> d_status(1);
    OwnerArgs a{d_counts.ptr,
                N,
                E,
                owner,
                bad_source,
                capacity,
                blocks,
                {d_begin.ptr, d_rows.ptr, d_src.ptr, d_tile_expert.ptr, d_status.ptr}};
    owner_tables_kernel<<<1, mok::gpu::detail::kOwnerTableThreads>>>(a);
    MOK_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(d_begin.to_host(), seg_begin) << trial;
    EXPECT_EQ(d_rows.to_host(), seg_rows) << trial;
    EXPECT_EQ(d_src.to_host(), src_begin) << trial;
    const mok::gpu::detail::Status st = d_status.to_host()[0];
    int want_code = kOk, want_rank = 0;
    int64_t want_rows = 0;
    if (bad_source >= 0) {
      want_code = mok::gpu::detail::kBadExpertId, want_rank = bad_source;
    } else {
      for (int o = 0; o < N && want_code == kOk; ++o) {
        const int64_t need = mok::sched::padded_rows_of_rank(counts.data(), N, E, o, tile);
        if (need > capacity)
          want_code = mok::gpu::detail::kCapacityExceeded, want_rank = o, want_rows = need;
      }
    }
    ASSERT_EQ(st.code, want_code) << trial;
    if (want_code != kOk) EXPECT_EQ(st.rank, want_rank) << trial;
    if (want_code == mok::gpu::detail::kCapacityExceeded) EXPECT_EQ(st.needed_rows, want_rows);
    const std::vector<int32_t> tile_expert = d_tile_expert.to_host();
    for (int64_t m = 0; m < blocks; ++m) {
      const int want =
          want_code != kOk ? -1 : mok::sched::segment_of_row(m * tile, seg_begin.data(), L);
      ASSERT_EQ(tile_expert[size_t(m)], want) << trial << " block " << m;
    }
  }
}
