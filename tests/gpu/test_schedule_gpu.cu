// The device schedule equals the host schedule (mok::sched) bit for bit.
#include <random>

#include "gpu_test_util.hpp"
#include "mok/gpu/schedule_gpu.hpp"
#include "mok/schedule/routing_layout.hpp"

TEST(ScheduleGpu, SourceScheduleMatchesHost) {
  MOK_REQUIRE_GPU();
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 44; ++trial) {
    int E = 1 + int(rng() % 512), K = 1 + int(rng() % 16);
    int64_t T = trial == 0 ? 0 : int64_t(rng() % 3000);
    if (trial >= 40) {  // the standard shapes' sizes: many 1024-slot chunks, E up to 512
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
