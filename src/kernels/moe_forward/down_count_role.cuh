// Down-count role: the token counts of a down tile's rows, released by an otherwise idle warp of
// the producer warpgroup instead of by the consumers. Only in the dispatch-copy instantiations
// (kMmaInFlight), whose producer has the gather compiled out; with the gather every producer warp
// gathers, and there (and with ping-pong consumers) the consumers release their own counts
// (DownRowCounts).
//
// A release needs a fence that waits until the tile's stores have landed (under EP, across
// NVLink); on a consumer warp it holds back the warpgroup's next wgmma, whether issued after the
// next mainloop or inside it (docs/benchmarks.md). Here the consumers only arrive on an mbarrier
// once their rows are stored (release, CTA scope); the count warp waits for it (acquire), fences
// at GPU scope (system scope under EP), cumulative over the stores it observed through the
// barrier, and adds +1 per stored row to its token's counter, which the combine acquires.
// Deadlock freedom: the count warp waits only for the consumers' next hand-over, and a consumer
// only for the count warp to take the entry kDownCountDepth tiles back, which needs nothing but
// that earlier hand-over; no GEMM tile waits on a token counter.
#pragma once
#include <cstdint>

#include "kernels/moe_forward/tile_schedule.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

// +1 on the token counter of a stored down row on its source rank (padding: nothing), which the
// combine waits for. Relaxed: the caller has fenced (DownRowCounts::release, or the count warp).
__device__ __forceinline__ void count_down_row(const ForwardParams& p, bool routed,
                                               int64_t destination) {
  const int src = sched::RowDestination::rank(destination);
  if (src < 0) return;
  const int64_t slot = sched::RowDestination::slot(destination);
  uint32_t* done = p.peer_token_done[src] + (routed ? slot / p.top_k : slot);
  if (p.ep_size > 1)
    dev::add_relaxed_sys(done, 1);  // the source may be another GPU
  else
    dev::add_relaxed_gpu(done, 1);
}

constexpr int kDownCountDepth = 4;  // down tiles the count warp may lag behind

// In shared memory (one object per CTA, addressed directly: no pointers held in registers).
struct DownCountQueue {
  int64_t block[kDownCountDepth];    // the down tile's row block; -1: the sequence ended
  int routed[kDownCountDepth];       // 1: a routed down tile, 0: a shared one
  uint64_t stored[kDownCountDepth];  // every consumer thread arrives once its rows are stored
  uint64_t taken[kDownCountDepth];   // the count warp's lane 0 arrives once it read the index
  __device__ void init() {
    for (int s = 0; s < kDownCountDepth; ++s) {
      dev::mbar_init(&stored[s], kConsumers * 128);
      dev::mbar_init(&taken[s], 1);
    }
  }
};

// Consumer side, every consumer thread once per down tile (stored or skipped, so both warpgroups
// stay in step) and once with w = nullptr at the end of the sequence. Thread 0 writes the entry
// after the count warp has taken the slot's previous one.
struct DownCountCursor {
  dev::RingCursor<kDownCountDepth> c;
  __device__ void push(const ForwardParams& p, DownCountQueue& q, const TileWork* w) {
    if (threadIdx.x == 0) {
      // Bounded; gives up at once if another wait has expired (the count warp has then stopped and
      // the output is invalid anyway). Either way the consumers go on, converged.
      const volatile int* aborted = p.aborted;
      if (!wait_unless_aborted(
              p, [&] { return dev::mbar_try_wait(&q.taken[c.stage], c.phase ^ 1u); }) &&
          *aborted == 0)
        record_fault(p, kRoleDownCounts, w ? w->m_block : -1);
      q.block[c.stage] = w ? w->m_block : -1;
      q.routed[c.stage] = w && w->kind == TileKind::routed_down;
    }
    dev::mbar_arrive(&q.stored[c.stage]);
    c.advance();
  }
};

// The count warp (one warp of the producer warpgroup, which holds 96 registers: kept small).
__device__ __forceinline__ void down_count_role(const ForwardParams& p, DownCountQueue& q) {
  const int lane = int(threadIdx.x % 32);
  const volatile int* aborted = p.aborted;
  for (dev::RingCursor<kDownCountDepth> c;; c.advance()) {
    // Not bounded by a clock of its own: the next hand-over may be a whole gate/up phase away.
    // It comes, or the consumers stop at one of their bounded waits, which sets `aborted`.
    while (!dev::mbar_try_wait(&q.stored[c.stage], c.phase)) {
      if (*aborted != 0) return;
      __nanosleep(256);
    }
    const int64_t block = q.block[c.stage];
    const bool routed = q.routed[c.stage] != 0;
    __syncwarp();
    if (lane == 0) dev::mbar_arrive(&q.taken[c.stage]);
    if (block < 0) return;
    if (p.ep_size > 1)
      dev::fence_acq_rel_sys();
    else
      dev::fence_acq_rel_gpu();
    for (int r = lane; r < kBlockM; r += 32) {
      const int64_t row = block * kBlockM + r;
      const int64_t destination =
          routed ? p.row_destination[row]
                 : (row < p.tokens ? sched::RowDestination::pack(p.ep_rank, row) : -1);
      count_down_row(p, routed, destination);
    }
  }
}

}  // namespace mok::kern
