// An owner's schedule under expert parallelism, from every source rank's per-expert counts: its
// local experts' padded segments, where each source's rows start inside them, the expert of each
// routed row block, and the group's verdict (any source's bad id, or any owner's overflow, fails
// every rank alike, since every rank computes it from the same counts). Used by the emulated group
// (one block per owner, counts read straight from each rank), by a real EP rank after the counts
// exchange (ep_forward.cu), and at EP = 1 (one source, forward_schedule.cu). The tables are
// sched::build_segments', which the host simulation and the tests use.
#pragma once
#include <cstdint>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_schedule.hpp"
#include "mok/device/block_scan.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu::detail {

constexpr int kMaxEpExperts = 512;  // Config::validate's bound: counts fit in shared memory
// The kernels that build owner tables run one block of this many threads: one per local expert.
constexpr int kOwnerTableThreads = kMaxEpExperts;
static_assert(kOwnerTableThreads % 32 == 0 && kOwnerTableThreads <= 32 * dev::kMaxBlockWarps);

// build_segments_block's shared memory.
struct SegmentScratch {
  int64_t seg_begin[kMaxEpExperts + 1];      // the owner's segments, for row lookups after the call
  int64_t owner_begin[kern::kMaxRanks + 1];  // every owner's padded rows: [o, o + 1)
  int64_t warp_sums[dev::kMaxBlockWarps];
  __device__ int64_t need(int owner) const { return owner_begin[owner + 1] - owner_begin[owner]; }
};

// The tables of sched::build_segments for `owner` (into global memory and s.seg_begin), and every
// owner's padded rows in s.need(o) (the capacity verdict), by a whole block of kOwnerTableThreads
// threads, thread l for local expert l. Block-wide prefix sums replace one thread's loop over
// the experts, each step of which waited for the previous step's global stores, and the owners'
// totals come from a prefix over all experts (an owner's experts are consecutive), not from
// shared-memory atomics on one address per owner, which queue one behind the other.
__device__ __forceinline__ void build_segments_block(const int32_t* counts, int ranks, int experts,
                                                     int owner, SegmentScratch& s,
                                                     int64_t* seg_begin, int64_t* segment_rows,
                                                     int64_t* source_begin) {
  const int local = experts / ranks, l = int(threadIdx.x);
  int64_t rows = 0;
  if (l < local) {
    int64_t sb[kern::kMaxRanks + 1];  // loads first, then the stores
    rows = sched::source_begins(counts, ranks, experts, sched::global_expert(owner, l, local), sb);
    int64_t* out = source_begin + int64_t(l) * (ranks + 1);
    for (int src = 0; src <= ranks; ++src) out[src] = sb[src];
    segment_rows[l] = rows;
  }
  int64_t total = 0;
  const int64_t begin =
      dev::block_exclusive_sum(sched::pad_to_tile(rows, kTileRows), s.warp_sums, &total);
  if (l < local) s.seg_begin[l] = seg_begin[l] = begin;
  if (l == 0) s.seg_begin[local] = seg_begin[local] = total;
  if (ranks == 1) {  // the prefix above is the only owner's
    if (l == 0) s.owner_begin[0] = 0, s.owner_begin[1] = total;
  } else {  // thread e: global expert e; the first expert of owner o notes where o's rows begin
    static_assert(kOwnerTableThreads >= kMaxEpExperts, "one thread per global expert");
    const int64_t padded =
        l < experts ? sched::pad_to_tile(sched::expert_rows(counts, ranks, experts, l), kTileRows)
                    : 0;
    int64_t all = 0;
    const int64_t before = dev::block_exclusive_sum(padded, s.warp_sums, &all);
    if (l < experts && l % local == 0) s.owner_begin[l / local] = before;
    if (l == 0) s.owner_begin[ranks] = all;
  }
  __syncthreads();
}

struct OwnerTables {
  int64_t* seg_begin;     // [local experts + 1]
  int64_t* segment_rows;  // [local experts]
  int64_t* source_begin;  // [local experts][ranks + 1]
  int32_t* tile_expert;   // [capacity_blocks]
  Status* group_status;
};

// One block of kOwnerTableThreads. `counts` is [ranks][experts] (shared memory, visible to every
// thread); source_status(src) is that source's schedule status; `missing` >= 0 names a rank whose
// counts never arrived (the tables then say "no work" and the status says why).
template <class SourceStatus>
__device__ void build_owner_tables(const int32_t* counts, int ranks, int experts, int owner,
                                   int64_t capacity, int64_t capacity_blocks,
                                   SourceStatus source_status, int missing, uint32_t epoch,
                                   const OwnerTables& out) {
  __shared__ SegmentScratch s;
  __shared__ int failed;
  const int local = experts / ranks;
  if (missing < 0)
    build_segments_block(counts, ranks, experts, owner, s, out.seg_begin, out.segment_rows,
                         out.source_begin);
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
    for (int o = 0; o < ranks && st.code == kOk; ++o)
      if (s.need(o) > capacity) {
        st.code = kCapacityExceeded;
        st.needed_rows = s.need(o);
        st.rank = o;
      }
    *out.group_status = st;
    failed = st.code != kOk;
    if (missing >= 0) out.seg_begin[local] = 0;  // no routed rows: only seg_begin[local] is read
  }
  __syncthreads();
  for (int64_t m = threadIdx.x; m < capacity_blocks; m += blockDim.x)
    out.tile_expert[m] = failed ? -1 : sched::segment_of_row(m * kTileRows, s.seg_begin, local);
}

}  // namespace mok::gpu::detail
