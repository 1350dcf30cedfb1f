// An owner's schedule under expert parallelism, from every source rank's per-expert counts: its
// local experts' padded segments, where each source's rows start inside them, the expert of each
// routed row block, and the group's verdict (any source's bad id, or any owner's overflow, fails
// every rank alike, since every rank computes it from the same counts). Used by the emulated group
// (one block per owner, counts read straight from each rank) and by a real EP rank after the
// counts exchange (ep_forward.cu). The segment math is sched::build_segments, shared with the
// host simulation.
#pragma once
#include <cstdint>

#include "layer/forward_schedule.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu::detail {

constexpr int kMaxEpExperts = 512;  // Config::validate's bound: counts fit in shared memory

struct OwnerTables {
  int64_t* seg_begin;     // [local experts + 1]
  int64_t* segment_rows;  // [local experts]
  int64_t* source_begin;  // [local experts][ranks + 1]
  int32_t* tile_expert;   // [capacity_blocks]
  Status* group_status;
};

// One block. `counts` is [ranks][experts] in shared memory and visible to every thread;
// source_status(src) is that source's schedule status; `missing` >= 0 names a rank whose counts
// never arrived (the tables then say "no work" and the status says why).
template <class SourceStatus>
__device__ void build_owner_tables(const int32_t* counts, int ranks, int experts, int owner,
                                   int64_t capacity, int64_t capacity_blocks,
                                   SourceStatus source_status, int missing, uint32_t epoch,
                                   const OwnerTables& out) {
  __shared__ int failed;
  if (threadIdx.x == 0) {
    Status st{};
    if (missing >= 0) {
      st.code = kPeerMissing;
      st.rank = missing;
      st.needed_rows = epoch;
    }
    for (int src = 0; src < ranks && st.code == kOk; ++src)
      if (source_status(src).code != kOk) {
        st = source_status(src);
        st.rank = src;
      }
    for (int o = 0; o < ranks && st.code == kOk; ++o) {
      const int64_t need = sched::padded_rows_of_rank(counts, ranks, experts, o, kTileRows);
      if (need > capacity) {
        st.code = kCapacityExceeded;
        st.needed_rows = need;
        st.rank = o;
      }
    }
    *out.group_status = st;
    failed = st.code != kOk;
    if (missing < 0)
      sched::build_segments(counts, ranks, experts, owner, kTileRows, out.seg_begin,
                            out.segment_rows, out.source_begin);
    else
      out.seg_begin[experts / ranks] = 0;  // no routed rows: only seg_begin[local] is read
  }
  __syncthreads();
  const int local = experts / ranks;
  for (int64_t m = threadIdx.x; m < capacity_blocks; m += blockDim.x)
    out.tile_expert[m] = failed ? -1 : sched::segment_of_row(m * kTileRows, out.seg_begin, local);
}

}  // namespace mok::gpu::detail
