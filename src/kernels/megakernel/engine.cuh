// The megakernel engine, whatever tile program it runs (the forward's: moe_forward/
// forward_program.cuh): the CTA's roles and register split, the tile claim and its queue, the
// GEMM producer and consumers over the shared-memory stage ring, bounded waits and fault records,
// and the role timers. It knows nothing of which tiles exist: the Program says that, and what
// each tile waits on, which operands it loads and which epilogue stores it.
//
// A Program provides (all static, __device__ unless noted):
//   Params, Maps, Work, Tiles (Tiles::make(p), count(), at(t, p) -> Work; Work::k_blocks)
//   kBlockN, kMmaInFlight, kMultiply, kLoads, kTimings (its RoleTimer slots),
//   kDispatchJoinedSlot (its timings slot counting dispatch CTAs that joined the GEMMs),
//   kRoleRing, kRoleConsumer (its fault roles for the engine's waits)
//   inputs(maps, p, tiles, w) -> Inputs                what a tile loads and waits on (ready,
//                                                      needed, role, timing, gather, what)
//   stage_bytes(in, a_top_only, kb), load_stage(in, a, b, bar, kb, a_top_only)
//                                                      one k-block's TMA bytes and loads
//   mainloop(d, ring, cursor, w, wg, p, times, gathered) -> bool   the tile's wgmma (its traits)
//   gather_row(p, w, a_row, r) -> const bf16*          a gathered A row (nullptr: zeros)
//   gathering_warpgroup(p), inputs_gathered(p, w)      whether the CTA's / a tile's A is gathered
//   all_padding(p, w, row0)                            rows [row0, row0 + 64) hold nothing
//   prefetch(p, w, row0) -> Prefetch                   loaded before the mainloop
//   epilogue(p, w, d, row0, wg, prefetch, owed, timer, ring, cursor)
//                                                      stores the tile, publishes, may leave
//                                                      Owed (released after the next mainloop);
//                                                      ring, cursor: the stages a mainloop held
//   release(p, owed, timer, since)                     releases what an epilogue left owed
//   skipped(p, w, wg)                                  a warpgroup's all-padding rows' publish
//   dispatch(p, cta, ctas) -> bool, combine(p)         the row movers (engine's CTA split)
//   prepare_cta(p)                                     by every thread, before the GEMM roles
//                                                      (e.g. tables into shared memory)
//   kClaimAhead                                        the producer claims its next tile while
//                                                      loading the current one (short tiles)
//   kStoreWarp, store_role(maps, p, ring),             the producer warpgroup's second warp
//   end_stores(p, owed)                                stores what epilogues staged (TMA) until
//                                                      the consumers' end
//   kWidens, kWidenWarps, kWidenSlots,                 B tiles of narrow codes (Inputs::widen):
//   Staged (kBytes, kSlotBytes)                        staged in kWidenSlots slots,
//   load_staged(in, slot, bar, kb)                     TMA into a staging slot, widened to BF16
//   widen_stage(in, slot, b, warp, lane)               by the producer warpgroup's last
//                                                      kWidenWarps warps (widen_sm90.cuh)
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/mainloop_sm90.cuh"
#include "kernels/gemm/tile_geometry.cuh"
#include "kernels/gemm/widen_sm90.cuh"
#include "kernels/megakernel/engine_params.hpp"
#include "kernels/megakernel/waits.cuh"
#include "mok/device/cp_async.cuh"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/tma.cuh"

namespace mok::kern {

// ---- The tile claim: one global counter (Params: tile_next), a queue per CTA in shared memory

// A CTA's producer claims tiles and hands their indices to its consumers through a small queue in
// shared memory (an index < 0 ends the sequence).
constexpr int kTileQueueDepth = 4;
struct TileQueue {
  int64_t* index;
  uint64_t* full;   // the producer's arrival (release at CTA scope) after writing the index
  uint64_t* empty;  // every consumer thread arrives after reading it (and producer_readers more)
  __device__ void init(uint32_t producer_readers) const {
    for (int s = 0; s < kTileQueueDepth; ++s) {
      dev::mbar_init(&full[s], 1);
      dev::mbar_init(&empty[s], kConsumers * 128 + producer_readers);
    }
  }
};

// The next tile index for this producer warp: warp 0's lane 0 claims it from the global counter
// and publishes it in the queue (for the consumers and the other producer warps); the other warps'
// lane 0 read it there. -1 ends the sequence, -2: a bounded wait expired.
// kClaimAhead: the claim of the tile after this one is issued now (`ahead`, -1 before the first
// call) and read at the next call, so its round trip overlaps this tile's loads. A CTA then holds
// two claimed tiles and works them in order, which keeps the tile order's deadlock argument: the
// earliest unfinished tile's CTA has finished everything it claimed before it.
template <bool kClaimAhead, class P>
__device__ __forceinline__ int64_t next_producer_tile(const P& p, const TileQueue& queue,
                                                      const dev::RingCursor<kTileQueueDepth>& q,
                                                      int64_t tile_count, int warp, int ring_role,
                                                      int64_t& ahead) {
  int64_t t = 0;
  if (threadIdx.x % 32 == 0) {
    if (warp == 0) {
      if constexpr (kClaimAhead) {
        t = ahead >= 0 ? ahead : int64_t(atomicAdd(p.tile_next, 1u));
        ahead = int64_t(atomicAdd(p.tile_next, 1u));
      } else {
        t = atomicAdd(p.tile_next, 1u);
      }
      if (t >= tile_count) t = -1;
      if (!dev::mbar_wait(&queue.empty[q.stage], q.phase ^ 1u, p.wait_cycles)) {
        record_fault(p, ring_role, t);
        t = -2;
      } else {
        queue.index[q.stage] = t;
        dev::mbar_arrive(&queue.full[q.stage]);
      }
    } else if (!dev::mbar_wait(&queue.full[q.stage], q.phase, p.wait_cycles)) {
      record_fault(p, ring_role, -1);
      t = -2;
    } else {
      t = queue.index[q.stage];
      dev::mbar_arrive(&queue.empty[q.stage]);
    }
  }
  return __shfl_sync(0xFFFFFFFFu, t, 0);
}

// The next tile index from the producer's queue (every consumer thread reads every entry);
// false: the bounded wait expired (recorded).
template <class P>
__device__ __forceinline__ bool next_consumer_tile(const P& p, const TileQueue& queue,
                                                   const dev::RingCursor<kTileQueueDepth>& q,
                                                   int64_t* t, int consumer_role) {
  if (!dev::mbar_wait(&queue.full[q.stage], q.phase, p.wait_cycles)) {
    record_fault(p, consumer_role, -1);
    return false;
  }
  *t = queue.index[q.stage];
  dev::mbar_arrive(&queue.empty[q.stage]);
  return true;
}

// ---- The GEMM producer

// The staging ring of a Program that widens B tiles (Program::kWidens), and its shared memory
// after the BF16 ring.
template <class Program>
constexpr int widen_slot_bytes() {
  if constexpr (Program::kWidens)
    return int(Program::Staged::kSlotBytes);
  else
    return 128;
}
// The staging slots (at most kWidenSlots) and the converter warps (the producer warpgroup's last
// kWidenWarps) of a Program that widens; none without widening.
template <class Program>
constexpr int widen_slots() {
  if constexpr (Program::kWidens) {
    static_assert(Program::kWidenSlots >= 2 && Program::kWidenSlots <= kWidenSlots,
                  "the TMA a stage ahead of the converters, at most the barriers' slots");
    return Program::kWidenSlots;
  } else {
    return 1;
  }
}
template <class Program>
constexpr int widen_warps() {
  if constexpr (Program::kWidens) {
    static_assert(
        Program::kWidenWarps >= 1 && Program::kWidenWarps <= 3 - (Program::kStoreWarp ? 1 : 0),
        "converters beside the TMA leader's warp 0 (and the store warp 1)");
    return Program::kWidenWarps;
  } else {
    return 0;
  }
}
template <class Program>
using StagingRing =
    WidenRing<widen_slot_bytes<Program>(), widen_warps<Program>(), widen_slots<Program>()>;
// A Program's dynamic shared memory: the ring, and the staging slots if it widens.
template <class Program>
constexpr int program_smem_bytes() {
  return TileShape<Program::kBlockN>::kSmemBytes +
         (Program::kWidens ? widen_slots<Program>() * widen_slot_bytes<Program>() : 0);
}

// With gathered A the whole producer warpgroup runs: warp w gathers rows [32w, 32w + 32) of the
// tile into the stage's 128B-swizzled layout; a null source row is zero-filled. Per k-block a row
// is one 128-byte line: lane l copies 16-byte chunk l % 8 of rows 32w + 4i + l / 8, i = 0..7, so
// each warp instruction reads 4 whole lines (one lane per row would fetch a 32-byte sector per 16
// bytes). Without gathering only warp 0 runs and only its lane 0 arrives.
constexpr int kGatherWarps = 4;
// Every producer thread arrives once per stage, the leader once more with the TMA bytes.
constexpr uint32_t kGatherFullArrivals = kGatherWarps * 32 + 1;
constexpr int kGatherRowsPerThread = kBlockM / (kGatherWarps * 4);
static_assert(kBlockK * 2 == 8 * 16, "a k-block of a row: eight 16-byte chunks, one per lane");

struct GatherRows {
  const __nv_bfloat16* src[kGatherRowsPerThread];  // rows 32w + 4i + l / 8 (nullptr: padding)
  __device__ static int row(int i) {
    return int(threadIdx.x % 128) / 32 * 32 + 4 * i + int(threadIdx.x % 32) / 8;
  }
  __device__ void copy(uint8_t* tile_a, int kb) const {
    const uint32_t chunk = threadIdx.x % 8;
#pragma unroll
    for (int i = 0; i < kGatherRowsPerThread; ++i) {
      const __nv_bfloat16* from = src[i] ? src[i] + kb * kBlockK + chunk * 8 : nullptr;
      dev::cp_async_16(tile_a + dev::swizzle128_offset(uint32_t(row(i)), chunk * 16u),
                       from ? static_cast<const void*>(from) : static_cast<const void*>(tile_a),
                       from ? 16u : 0u);
    }
  }
};

// Warp 0's lane 0 (the leader) claims tiles, hands them on, waits for their inputs and issues the
// TMA loads. Gathering threads copy their A rows and arrive on every stage (kGatherFullArrivals):
// on the stages of other tiles they simply arrive. A gathering thread's arrival is made by
// cp.async (noinc) when its copies land, the leader's too (one uniform arrival per thread: an
// uncounted extra one in the leader's lane alone overflowed the barrier for compute-sanitizer's
// synccheck); the leader's arrive_expect_tx for B is the stage's one more arrival.
// gathering_warpgroup: the CTA's producer runs as a whole warpgroup (some tiles gather).
// A widened tile's B goes to a staging slot (its own full barrier), which the leader first waits
// to be free; the converter warps (converter_role) then arrive on the stage's full barrier.
template <class Program>
__device__ __forceinline__ void producer_role(const typename Program::Maps& maps,
                                              const typename Program::Params& p,
                                              const SmemRing<Program::kBlockN>& ring,
                                              const TileQueue& queue, bool gathering_warpgroup,
                                              const StagingRing<Program>& staging) {
  constexpr int kBlockN = Program::kBlockN;
  const typename Program::Tiles tiles = Program::Tiles::make(p);
  dev::RingCursor<TileShape<kBlockN>::kStages> cursor;
  const int lane = int(threadIdx.x % 32);
  const bool leader = threadIdx.x % 128 == 0;
  RoleTimer<Program::kTimings> timer(p);
  timer.on = timer.on && leader;
  int64_t ahead = -1;                              // kClaimAhead: the next tile's claim
  dev::RingCursor<widen_slots<Program>()> staged;  // kWidens: the next staging slot
  // The last counter this thread waited for and the count it reached (counters only grow): a
  // tile that waits for no more of the same counter skips the wait.
  const uint32_t* satisfied = nullptr;
  uint32_t satisfied_count = 0;
  for (dev::RingCursor<kTileQueueDepth> q;; q.advance()) {
    // The warp index read afresh: kept through the loop, ptxas spilled it (96 registers).
    const int64_t t = next_producer_tile<Program::kClaimAhead>(
        p, queue, q, tiles.count(), int(dev::thread_index_here() % 128 / 32), Program::kRoleRing,
        ahead);
    if (t == -2) return;
    if (t < 0) {
      timer.flush(p);
      return;
    }
    if (leader) trace_start<Program::kTrace>(kTraceProducer);
    const typename Program::Work w = tiles.at(t, p);
    const typename Program::Inputs in = Program::inputs(maps, p, tiles, w);
    bool ok = true;  // a failed wait ends the warp (lanes stay converged for the shuffles); the
                     // other producer warps and the consumers stop at their own bounded waits
    // The leader waits for its TMA loads; when gathering, every warp's lane 0 acquires for its
    // warp's copies (the warp's lanes are ordered after it by the __syncwarp below).
    if (in.ready && (leader || (in.gather && lane == 0)) &&
        !(in.ready == satisfied && in.needed <= satisfied_count)) {
      const uint64_t since = timer.now();
      ok = wait_unless_aborted(p, [&] { return dev::load_acquire_gpu(in.ready) >= in.needed; });
      if (!ok) record_fault(p, in.role, in.what);
      satisfied = in.ready, satisfied_count = in.needed;
      timer.add(in.timing, since);
      dev::fence_proxy_async_global();  // generic writes of other CTAs -> this thread's TMA reads
    }
    __syncwarp();  // memory order: lane 0's acquire before its lanes' cp.async reads of the rows
    if (!__all_sync(0xFFFFFFFFu, ok)) return;
    GatherRows rows{};
    if (in.gather)
#pragma unroll
      for (int i = 0; i < kGatherRowsPerThread; ++i)
        rows.src[i] = Program::gather_row(p, w, in.a_row, GatherRows::row(i));
    // Nothing multiplies rows 64-127 of a tile that holds no token there (the second consumer
    // warpgroup skips the tile), so their A rows are not loaded (the 64-row box): those
    // shared-memory rows keep stale data that nothing reads.
    const bool a_top_only = !in.gather && Program::all_padding(p, w, int(w.m_block * kBlockM) + 64);
    for (int kb = 0; kb < w.k_blocks; ++kb, cursor.advance()) {
      if (!leader && !gathering_warpgroup) continue;  // only the leader arrives
      const uint64_t since = timer.now();
      if (!dev::mbar_wait(&ring.empty[cursor.stage], cursor.phase ^ 1u, p.wait_cycles)) {
        record_fault(p, Program::kRoleRing, t);
        ok = false;
        break;
      }
      timer.add(kTimeProducerWaitsRing, since);
      uint64_t* bar = &ring.full[cursor.stage];
      if (in.gather) {
        if constexpr (Program::kLoads) rows.copy(ring.a(cursor.stage), kb);
        dev::cp_async_arrive_counted(bar);
      } else if (gathering_warpgroup) {
        dev::mbar_arrive(bar);
      }
      if (!leader) continue;
      if constexpr (!Program::kLoads) {  // a stage probe: arrive, load nothing
        dev::mbar_arrive(bar);
        continue;
      }
      if constexpr (Program::kWidens) {
        if (in.widen) {
          const uint64_t slot_since = timer.now();
          if (!dev::mbar_wait(&staging.empty[staged.stage], staged.phase ^ 1u, p.wait_cycles)) {
            record_fault(p, Program::kRoleRing, t);
            ok = false;
            break;
          }
          timer.add(kTimeLeaderWaitsStaging, slot_since);
          uint64_t* staged_full = &staging.full[staged.stage];
          dev::mbar_arrive_expect_tx(staged_full, Program::Staged::kBytes);
          Program::load_staged(in, staging.slot(staged.stage), staged_full, kb);
          staged.advance();
        }
      }
      dev::mbar_arrive_expect_tx(bar, Program::stage_bytes(in, a_top_only, kb));
      Program::load_stage(in, ring.a(cursor.stage), ring.b(cursor.stage), bar, kb, a_top_only);
    }
    if (leader && ok)
      trace_event<Program::kTrace>(p, kTraceProducer, t, kTraceProducer, int(w.kind));
    if (!__all_sync(0xFFFFFFFFu, ok)) return;
  }
}

// The converter warps of a Program that widens: they walk the leader's tile sequence (reading the
// tile queue) and, per stage, once it is free, widen a staged B tile into it, or only arrive for
// tiles loaded whole by TMA (the full barrier counts them on every stage). The staging slot's
// landing implies the stage is free: the leader waited for that before loading the slot.
template <class Program>
__device__ __forceinline__ void converter_role(const typename Program::Maps& maps,
                                               const typename Program::Params& p,
                                               const SmemRing<Program::kBlockN>& ring,
                                               const TileQueue& queue,
                                               const StagingRing<Program>& staging) {
  constexpr int kBlockN = Program::kBlockN;
  const typename Program::Tiles tiles = Program::Tiles::make(p);
  dev::RingCursor<TileShape<kBlockN>::kStages> cursor;
  dev::RingCursor<widen_slots<Program>()> staged;
  const int warp = int(threadIdx.x % 128 / 32), lane = int(threadIdx.x % 32);
  constexpr int kFirstConverter = 4 - widen_warps<Program>();
  RoleTimer<Program::kTimings> timer(p);  // the first converter warp's lane 0 speaks for them
  timer.on = timer.on && warp == kFirstConverter && lane == 0;
  int64_t ahead = -1;
  for (dev::RingCursor<kTileQueueDepth> q;; q.advance()) {
    const int64_t t = next_producer_tile<Program::kClaimAhead>(p, queue, q, tiles.count(), warp,
                                                               Program::kRoleRing, ahead);
    if (t < 0) break;
    const typename Program::Work w = tiles.at(t, p);
    const typename Program::Inputs in = Program::inputs(maps, p, tiles, w);
    for (int kb = 0; kb < w.k_blocks; ++kb, cursor.advance()) {
      uint64_t since = timer.now();
      bool ok = dev::mbar_wait(&ring.empty[cursor.stage], cursor.phase ^ 1u, p.wait_cycles);
      timer.add(kTimeConverterWaitsRing, since);
      if (ok && in.widen) {
        since = timer.now();
        ok = dev::mbar_wait(&staging.full[staged.stage], staged.phase, p.wait_cycles);
        timer.add(kTimeConverterWaitsCodes, since);
        if (ok) {
          since = timer.now();
          Program::widen_stage(in, staging.slot(staged.stage), ring.b(cursor.stage),
                               warp - kFirstConverter, lane);
          dev::fence_proxy_async_shared();  // the widened tile -> the consumers' wgmma
          timer.add(kTimeConverterWidening, since);
        }
      }
      if (!__all_sync(0xFFFFFFFFu, ok)) {
        if (lane == 0) record_fault(p, Program::kRoleRing, t);
        return;
      }
      __syncwarp();  // memory order: every lane's writes and fence before lane 0's arrivals
      if (lane == 0) {
        if (in.widen) dev::mbar_arrive(&staging.empty[staged.stage]);
        dev::mbar_arrive(&ring.full[cursor.stage]);
      }
      if (in.widen) staged.advance();
    }
  }
  timer.flush(p);
}

// ---- The GEMM consumers

// After a warpgroup's epilogue stores: its 128 threads meet, then one releases the counter (by
// `add`: a tile counts kConsumers, whether two warpgroups or one finished it).
__device__ __forceinline__ void publish_warpgroup(uint32_t* counter, int wg, uint32_t add = 1) {
  dev::named_barrier_sync(1 + wg, 128);
  if (threadIdx.x % 128 == 0) {
    dev::fence_proxy_async_global();  // cheap; the reader's fence is the one that matters
    dev::add_release_gpu(counter, add);
  }
}

// A consumer warpgroup's profile (one thread per warpgroup reports): time starved for loads (and
// the part of it on tiles' first stages), and first tile to the end of the sequence.
// Its SM clock cycles over the same span give the clock the SM ran at (the GPU is power-capped).
template <int kSlots>
struct ConsumerTimes {
  RoleTimer<kSlots> timer;
  uint64_t start = 0, start_cycles = 0, starved = 0, starved_first = 0;
  template <class P>
  __device__ explicit ConsumerTimes(const P& p) : timer(p) {
    timer.on = timer.on && threadIdx.x % 128 == 0;
    start = timer.now();
    start_cycles = timer.on ? clock64() : 0;
  }
  template <class P>
  __device__ void finish(const P& p) {
    timer.sums[kTimeConsumerWaitsLoads] = starved;
    timer.sums[kTimeConsumerStarvedFirst] = starved_first;
    if (timer.on) timer.sums[kTimeConsumerCycles] = uint64_t(clock64()) - start_cycles;
    timer.add(kTimeConsumerTotal, start);
    timer.flush(p);
  }
};

// Both consumer warpgroups work on every tile, 64 rows each. A tile's epilogue may leave work
// owed (Program::Owed, e.g. counts whose fence would stall the tensor cores): it is released
// after the next tile's mainloop, or at the end. Returns false if a bounded wait expired.
template <class Program>
__device__ __forceinline__ bool consumer_role(const typename Program::Params& p,
                                              const SmemRing<Program::kBlockN>& ring,
                                              const TileQueue& queue) {
  constexpr int kBlockN = Program::kBlockN;
  const typename Program::Tiles tiles = Program::Tiles::make(p);
  dev::RingCursor<TileShape<kBlockN>::kStages> cursor;
  const int wg = threadIdx.x / 128;
  float d[kBlockN / 2];
  ConsumerTimes<Program::kTimings> times(p);
  typename Program::Owed owed;
  auto release_owed = [&] {
    const uint64_t since = times.timer.now();
    Program::release(p, owed, times.timer, since);
    times.timer.add(kTimeConsumerEpilogue, since);
  };
  for (dev::RingCursor<kTileQueueDepth> q;; q.advance()) {
    int64_t t = 0;
    const uint64_t queue_since = times.timer.now();
    if (!next_consumer_tile(p, queue, q, &t, Program::kRoleConsumer)) return false;
    times.timer.add(kTimeConsumerWaitsTile, queue_since);
    if (t < 0) {
      release_owed();
      if constexpr (Program::kStoreWarp) Program::end_stores(p, owed);
      times.finish(p);
      return true;
    }
    if (threadIdx.x % 128 == 0) trace_start<Program::kTrace>(kTraceConsumer0 + wg);
    const typename Program::Work w = tiles.at(t, p);
    int row0 = int(w.m_block * kBlockM + wg * 64);
    if (Program::all_padding(p, w, row0)) {
      if (!skip_tile<kBlockN>(ring, cursor, w.k_blocks, p.wait_cycles)) {
        record_fault(p, Program::kRoleConsumer, t);
        return false;
      }
      release_owed();
      Program::skipped(p, w, wg);
      continue;
    }
    const bool gathered = Program::inputs_gathered(p, w);
    // Loaded before the mainloop: with the L2 saturated their latency would otherwise open the
    // epilogue while the tensor cores idle.
    const typename Program::Prefetch prefetch = Program::prefetch(p, w, row0);
    if (!Program::mainloop(d, ring, cursor, w, wg, p, times, gathered)) {
      record_fault(p, Program::kRoleConsumer, t);
      return false;
    }
    asm volatile("" : "+r"(row0));  // keeps row addresses out of the mainloop (pitfall 2)
    release_owed();
    const uint64_t epilogue_since = times.timer.now();
    Program::epilogue(p, w, d, row0, wg, prefetch, owed, times.timer, ring, cursor);
    times.timer.add(kTimeConsumerEpilogue, epilogue_since);
    if (threadIdx.x % 128 == 0)
      trace_event<Program::kTrace>(p, kTraceConsumer0 + wg, t, kTraceConsumer0 + wg, int(w.kind));
  }
}

// ---- The kernel body

// The persistent megakernel's CTA: the grid is split into launch.ranks contiguous shares, one per
// logical rank (one share for a real EP rank); inside a share the first dispatch_ctas CTAs move
// rows (Program::dispatch), then join the others in the GEMMs; the consumers then combine. The
// producer warpgroup keeps kProducerRegs registers, the consumers kConsumerRegs. kGroup: the
// ranks' shares (maps, params) are in device memory at launch.group, else launch.local.
template <class Program, int kProducerRegs, int kConsumerRegs, bool kGroup, class Launch>
__device__ __forceinline__ void run_megakernel(const Launch& launch) {
  constexpr int kBlockN = Program::kBlockN;
  const int per_rank = int(gridDim.x) / launch.ranks;
  const int rank = min(int(blockIdx.x) / per_rank, launch.ranks - 1);
  const int cta = int(blockIdx.x) - rank * per_rank;  // the last rank also takes the remainder
  const auto& share = [&]() -> const auto& {
    if constexpr (kGroup) return launch.group[rank];
    return launch.local;  // kernel parameters: the constant bank
  }
  ();
  const typename Program::Params& p = share.params;
  const typename Program::Maps& maps = share.maps;
  if (cta < p.dispatch_ctas) {
    // Once its rows are moved a dispatch CTA joins the GEMMs: its SM would otherwise only wait
    // for the combine. It claims tiles from the same counter, so the tile order's deadlock
    // argument holds; dispatch itself never waits on this CTA. A dispatch whose wait expired has
    // recorded the fault: the CTA stops.
    if (threadIdx.x == 0) trace_start<Program::kTrace>(kTraceDispatch);
    if (!Program::dispatch(p, cta, p.dispatch_ctas)) return;
    if (threadIdx.x == 0) trace_event<Program::kTrace>(p, kTraceDispatch, cta, kTraceDispatch);
    if (p.timings && threadIdx.x == 0) atomicAdd(p.timings + Program::kDispatchJoinedSlot, 1ull);
  }
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[TileShape<kBlockN>::kStages], empty[TileShape<kBlockN>::kStages];
  __shared__ int64_t queue_index[kTileQueueDepth];
  __shared__ uint64_t queue_full[kTileQueueDepth], queue_empty[kTileQueueDepth];
  __shared__ uint64_t staging_full[kWidenSlots], staging_empty[kWidenSlots];
  // Producer: one warp (its lane 0 arrives), or when the program gathers rows the whole
  // warpgroup (every thread arrives on every stage; warps 1-3 read the tile queue too), or when
  // it widens B tiles, the leader and the converter warps (one arrival each per stage).
  const bool gather = Program::gathering_warpgroup(p);
  constexpr int kConverters = widen_warps<Program>();
  const uint32_t full_arrivals = gather ? kGatherFullArrivals : 1 + kConverters;
  const auto ring = SmemRing<kBlockN>::make(smem_raw, full, empty, full_arrivals);
  const TileQueue queue{queue_index, queue_full, queue_empty};
  const StagingRing<Program> staging{
      ring.tiles_a + TileShape<kBlockN>::kStages * TileShape<kBlockN>::kStageBytes, staging_full,
      staging_empty};
  if (threadIdx.x == 0) {
    queue.init(gather ? kGatherWarps - 1 : kConverters);
    if constexpr (Program::kWidens) staging.init();
    dev::mbar_fence_init();
  }
  Program::prepare_cta(p);
  __syncthreads();
  if (threadIdx.x / 128 == kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if constexpr (kGroup) {  // the maps were written by launch_group_copies' kernels
      static_assert(sizeof(maps) % sizeof(CUtensorMap) == 0, "Maps: tensor maps only");
      const CUtensorMap* m = reinterpret_cast<const CUtensorMap*>(&maps);
      if (threadIdx.x % 128 < (Program::kStoreWarp ? 64 : 128))  // the TMA issuers
        for (int i = 0; i < int(sizeof(maps) / sizeof(CUtensorMap)); ++i)
          dev::fence_tensormap_acquire(m + i);
    }
    const int warp = int(threadIdx.x % 128 / 32);
    if (gather || warp == 0) {
      producer_role<Program>(maps, p, ring, queue, gather, staging);
      return;
    }
    if constexpr (Program::kWidens)
      if (warp >= 4 - kConverters) {
        converter_role<Program>(maps, p, ring, queue, staging);
        return;
      }
    if constexpr (Program::kStoreWarp)
      if (warp == 1) Program::store_role(maps, p, ring);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  if (consumer_role<Program>(p, ring, queue)) Program::combine(p);
}

}  // namespace mok::kern
