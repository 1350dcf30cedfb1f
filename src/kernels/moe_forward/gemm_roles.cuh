// The GEMM roles of the forward megakernel, on the CTAs after the dispatch ones:
//  - producer (one thread): for each tile, waits until its A rows are published (dispatched rows
//    for gate/up, finished activations for down; acquire, then the proxy fence, since the loads go
//    through the async proxy), then TMA-loads A and B k-block by k-block into the ring;
//  - consumers (two warpgroups): wgmma over the ring, then the tile's epilogue:
//      gate/up: SwiGLU into act, then +1 on the row block's act counter (per warpgroup);
//      down:    each row into its (token, k) slot of y_slots (shared: y_shared), then, after the
//               next tile's mainloop, +1 on the counter of its token, which the combine waits for.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/mainloop_sm90.cuh"
#include "kernels/moe_forward/tile_schedule.cuh"
#include "mok/device/cp_async.cuh"
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

// With gather_rows the whole producer warpgroup runs: warp w gathers rows [32w, 32w + 32) of every
// routed gate/up tile (four warps' copies keep up with TMA where one warp's did not) into the
// stage's 128B-swizzled layout: rows of this rank's tokens straight from x, rows of peers' tokens
// (EP > 1) from the token ring, where the dispatch CTAs copied them; padding rows are zero-filled.
// Per k-block a row is one 128-byte line: lane l copies 16-byte chunk l % 8 of rows 32w + 4i + l /
// 8, i = 0..7, so each warp instruction reads 4 whole lines (one lane per row would fetch a 32-byte
// sector per 16 bytes). Without gather_rows only warp 0 runs and only its lane 0 arrives.
constexpr int kGatherWarps = 4;
constexpr uint32_t kGatherFullArrivals = kGatherWarps * 32;
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

// The next tile index for this producer warp: warp 0's lane 0 claims it from the global counter
// and publishes it in the queue (for the consumers and the other producer warps); the other warps'
// lane 0 read it there. -1 ends the sequence, -2: a bounded wait expired.
__device__ __forceinline__ int64_t next_producer_tile(const ForwardParams& p,
                                                      const TileQueue& queue,
                                                      const dev::RingCursor<kTileQueueDepth>& q,
                                                      int64_t tile_count, int warp) {
  int64_t t = 0;
  if (threadIdx.x % 32 == 0) {
    if (warp == 0) {
      t = atomicAdd(p.tile_next, 1u);
      if (t >= tile_count) t = -1;
      if (!dev::mbar_wait(&queue.empty[q.stage], q.phase ^ 1u, p.wait_cycles)) {
        record_fault(p, kRoleProducerRing, t);
        t = -2;
      } else {
        queue.index[q.stage] = t;
        dev::mbar_arrive(&queue.full[q.stage]);
      }
    } else if (!dev::mbar_wait(&queue.full[q.stage], q.phase, p.wait_cycles)) {
      record_fault(p, kRoleProducerRing, -1);
      t = -2;
    } else {
      t = queue.index[q.stage];
      dev::mbar_arrive(&queue.empty[q.stage]);
    }
  }
  return __shfl_sync(0xFFFFFFFFu, t, 0);
}

// True when rows [row0, row0 + 64) of the tile hold no token (routed: past the expert's count).
__device__ __forceinline__ bool all_padding(const ForwardParams& p, const TileWork& w, int row0) {
  if (w.kind == TileKind::shared_gate_up || w.kind == TileKind::shared_down)
    return row0 >= p.tokens;
  return row0 - p.seg_begin[w.expert] >= p.segment_rows[w.expert];
}

// Warp 0's lane 0 (the leader) claims tiles, hands them on, waits for their inputs and issues the
// TMA loads. With gather_rows every producer thread also copies its A row of routed gate/up tiles
// and arrives on every stage (kGatherFullArrivals): on the stages of other tiles they simply
// arrive. A gathering thread's arrival is counted by cp.async (noinc) when its copies land; the
// leader's copies get an extra (uncounted) arrival before its arrive_expect_tx for B, so the phase
// cannot complete before they land either.
template <int kBlockN, int kProbe = 0>
__device__ __forceinline__ void producer_role(const ForwardMaps& maps, const ForwardParams& p,
                                              const SmemRing<kBlockN>& ring,
                                              const TileQueue& queue) {
  const ForwardTiles<kBlockN> tiles = ForwardTiles<kBlockN>::make(p);
  dev::RingCursor<TileShape<kBlockN>::kStages> cursor;
  const int lane = int(threadIdx.x % 32);
  const bool leader = threadIdx.x % 128 == 0;
  RoleTimer timer(p);
  timer.on = timer.on && leader;
  for (dev::RingCursor<kTileQueueDepth> q;; q.advance()) {
    // The warp index read afresh: kept through the loop, ptxas spilled it (96 registers).
    const int64_t t =
        next_producer_tile(p, queue, q, tiles.count(), int(dev::thread_index_here() % 128 / 32));
    if (t == -2) return;
    if (t < 0) {
      timer.flush(p);
      return;
    }
    const TileWork w = tiles.at(t, p);
    const bool gather = gathers_rows(p, w);
    const CUtensorMap *a_maps = nullptr, *b_map = nullptr, *b_up_map = nullptr;  // a_maps: [2]
    const uint32_t* ready = nullptr;
    uint32_t needed = 0;
    ForwardRole role = kRoleGateUpProducer;
    switch (w.kind) {
      case TileKind::shared_gate_up:
        a_maps = maps.x;
        b_map = &maps.shared_gate, b_up_map = &maps.shared_up;
        break;
      case TileKind::routed_gate_up:
        a_maps = maps.routed_x;
        b_map = &maps.gate, b_up_map = &maps.up;
        // Gathering at EP = 1 needs no dispatch; under EP the peers' rows come through the ring.
        if (!gather || p.ep_size > 1)
          ready = p.x_ready + w.m_block, needed = sched::kRingFilled, role = kRoleGateUpProducer;
        break;
      case TileKind::shared_down:
        a_maps = maps.act_shared;
        b_map = &maps.shared_down;
        ready = p.act_shared_ready + w.m_block;
        needed = uint32_t(kConsumers * tiles.shared_gate_up_tiles), role = kRoleSharedDownProducer;
        break;
      case TileKind::routed_down:
        a_maps = maps.act;
        b_map = &maps.down;
        ready = p.act_ready + w.m_block;
        needed = uint32_t(kConsumers * tiles.gate_up_tiles), role = kRoleDownProducer;
        break;
    }
    bool ok = true;  // a failed wait ends the warp (lanes stay converged for the shuffles); the
                     // other producer warps and the consumers stop at their own bounded waits
    // The leader waits for its TMA loads; when gathering, every warp's lane 0 acquires for its
    // warp's copies (the warp's lanes are ordered after it by the __syncwarp below).
    if (ready && (leader || (gather && lane == 0))) {
      const uint64_t since = timer.now();
      ok = wait_unless_aborted(p, [&] { return dev::load_acquire_gpu(ready) >= needed; });
      if (!ok) record_fault(p, role, w.m_block);
      if (w.kind == TileKind::routed_gate_up)
        timer.add(kTimeGateUpWaitsDispatch, since);
      else
        timer.add(kTimeDownWaitsGateUp, since);
      dev::fence_proxy_async_global();  // generic writes of other CTAs -> this thread's TMA reads
    }
    __syncwarp();  // memory order: lane 0's acquire before its lanes' cp.async reads of the ring
    if (!__all_sync(0xFFFFFFFFu, ok)) return;
    // Routed gate/up A rows live in the token ring; every other A is indexed by its block.
    const int64_t a_block =
        w.kind == TileKind::routed_gate_up ? sched::ring_tile(w.m_block, token_ring(p)) : w.m_block;
    const int32_t a_row = int32_t(a_block * kBlockM);
    GatherRows rows{};
    if (gather)
#pragma unroll
      for (int i = 0; i < kGatherRowsPerThread; ++i) {
        const int r = GatherRows::row(i);
        const int64_t d = p.row_destination[w.m_block * kBlockM + r];
        const int src = sched::RowDestination::rank(d);
        rows.src[i] =
            src < 0 ? nullptr
            : src == p.ep_rank
                ? p.peer_x[src] +
                      sched::slot_token(sched::RowDestination::slot(d), p.top_k) * p.hidden
                : p.routed_x + (int64_t(a_row) + r) * p.hidden;
      }
    // Nothing multiplies rows 64-127 of a tile that holds no token there (the cooperative
    // consumers' second warpgroup skips the tile, a ping-pong warpgroup its bottom half), so their
    // A rows are not loaded (the 64-row map): those shared-memory rows keep stale data that
    // nothing reads.
    static_assert(kBlockM == 2 * kRowsPerBoxA && kTileBytesA % 2 == 0);
    const bool a_top_only = !gather && all_padding(p, w, int(w.m_block * kBlockM) + kRowsPerBoxA);
    const CUtensorMap* a_map = a_maps + (a_top_only ? 1 : 0);
    const uint32_t bytes = (gather       ? 0u
                            : a_top_only ? kTileBytesA / 2
                                         : kTileBytesA) +
                           TileShape<kBlockN>::kBytesB;
    for (int kb = 0; kb < w.k_blocks; ++kb, cursor.advance()) {
      if (!leader && !p.gather_rows) continue;  // only the leader arrives
      const uint64_t since = timer.now();
      if (!dev::mbar_wait(&ring.empty[cursor.stage], cursor.phase ^ 1u, p.wait_cycles)) {
        record_fault(p, kRoleProducerRing, t);
        ok = false;
        break;
      }
      timer.add(kTimeProducerWaitsRing, since);
      uint64_t* bar = &ring.full[cursor.stage];
      if (gather) {
        if constexpr (!(kProbe & kProbeNoGemmLoads)) rows.copy(ring.a(cursor.stage), kb);
        if (leader)
          dev::cp_async_arrive_extra(bar);
        else
          dev::cp_async_arrive_counted(bar);
      } else if (!leader) {
        dev::mbar_arrive(bar);
      }
      if (!leader) continue;
      if constexpr (kProbe & kProbeNoGemmLoads) {  // a stage probe: arrive, load nothing
        dev::mbar_arrive(bar);
        continue;
      }
      dev::mbar_arrive_expect_tx(bar, bytes);
      uint8_t* tile_b = ring.b(cursor.stage);
      if (!gather) dev::tma_load_2d(ring.a(cursor.stage), a_map, bar, kb * kBlockK, a_row);
      if (b_up_map) {  // block_n / 2 gate rows, then the up rows of the same outputs
        const int32_t row = w.n_tile * (kBlockN / 2);
        dev::tma_load_3d(tile_b, b_map, bar, kb * kBlockK, row, w.expert);
        dev::tma_load_3d(tile_b + TileShape<kBlockN>::kBytesB / 2, b_up_map, bar, kb * kBlockK, row,
                         w.expert);
      } else {
        dev::tma_load_3d(tile_b, b_map, bar, kb * kBlockK, w.n_tile * kBlockN, w.expert);
      }
    }
    if (!__all_sync(0xFFFFFFFFu, ok)) return;
  }
}

// After a warpgroup's epilogue stores: its 128 threads meet, then one releases the counter (by
// `add`: a tile counts kConsumers, whether two warpgroups or one finished it).
__device__ __forceinline__ void publish_warpgroup(uint32_t* counter, int wg, uint32_t add = 1) {
  dev::named_barrier_sync(1 + wg, 128);
  if (threadIdx.x % 128 == 0) {
    dev::fence_proxy_async_global();  // cheap; the reader's fence is the one that matters
    dev::add_release_gpu(counter, add);
  }
}

__device__ __forceinline__ bool is_gate_up(const TileWork& w) {
  return w.kind == TileKind::routed_gate_up || w.kind == TileKind::shared_gate_up;
}

// The row block's act counter that a gate/up tile publishes.
__device__ __forceinline__ uint32_t* act_counter(const ForwardParams& p, const TileWork& w) {
  return (w.kind == TileKind::routed_gate_up ? p.act_ready : p.act_shared_ready) + w.m_block;
}

// Gate/up epilogue of 64 rows from row0: SwiGLU into act (or act_shared); kKeepGateUp (a training
// forward, its own instantiation: in the inference kernel the extra stores made ptxas spill) also
// stores the pre-activations into gate_up (gate_up_shared): the tile's gate half at the row's
// column n_tile * kBlockN / 2, its up half `width` columns further.
template <int kBlockN, bool kKeepGateUp>
__device__ __forceinline__ void store_gate_up(const ForwardParams& p, const TileWork& w,
                                              const float (&d)[kBlockN / 2], int row0) {
  const int r = Fragment::mine().row_lo;
  const bool routed = w.kind == TileKind::routed_gate_up;
  const int64_t width = routed ? p.intermediate : p.shared_width;
  const int64_t col0 = int64_t(w.n_tile) * (kBlockN / 2);
  __nv_bfloat16* out = (routed ? p.act : p.act_shared) + row0 * width + col0;
  swiglu_tile<kBlockN>(d, out + r * width, out + (r + 8) * width);
  if constexpr (kKeepGateUp) {
    using Half = const float(&)[kBlockN / 4];
    __nv_bfloat16* g = (routed ? p.gate_up : p.gate_up_shared) + (row0 + r) * 2 * width + col0;
    const int64_t down8 = 8 * 2 * width;
    store_rows_vec16<kBlockN / 2>(reinterpret_cast<Half>(d[0]), g, g + down8, kBlockN / 2);
    g += width;
    store_rows_vec16<kBlockN / 2>(reinterpret_cast<Half>(d[kBlockN / 4]), g, g + down8,
                                  kBlockN / 2);
  }
}

// Where this thread's two rows of a down tile go (Fragment rows row_lo and row_lo + 8 from row0):
// sched::RowDestination, source rank and (token, k) slot (shared rows: this rank's token); -1
// for padding.
struct DownRows {
  int64_t lo, hi;
};
__device__ __forceinline__ DownRows down_rows(const ForwardParams& p, const TileWork& w, int row0) {
  const int row = row0 + Fragment::mine().row_lo;
  auto at = [&](int r) -> int64_t {
    if (w.kind == TileKind::routed_down) return p.row_destination[r];
    return r < p.tokens ? sched::RowDestination::pack(p.ep_rank, r) : -1;
  };
  return {at(row), at(row + 8)};
}

// +1 on the token counter of a stored down row on its source rank (padding: nothing), which the
// combine waits for. Relaxed: DownRowCounts::release fences once before both of a thread's rows.
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

// The token counts a thread owes for the rows of its last down tile (down_rows; its quad's first
// lane counts them). The fence before them waits until the tile's stores have landed, under EP
// across NVLink, while the tensor cores idle; nothing but the combine reads the counts, so the
// cooperative consumers release them after their next tile's mainloop, by which time the stores
// have drained. No deadlock: no tile waits on a token counter.
struct DownRowCounts {
  DownRows rows{-1, -1};
  bool routed = false;
  // By the whole warp, converged.
  __device__ __forceinline__ void release(const ForwardParams& p) {
    __syncwarp();  // memory order: a row's stores (its quad's) before the quad's first lane's fence
    if (threadIdx.x % 4 == 0 && (rows.lo >= 0 || rows.hi >= 0)) {
      if (p.ep_size > 1)
        dev::fence_acq_rel_sys();
      else
        dev::fence_acq_rel_gpu();
      count_down_row(p, routed, rows.lo);
      count_down_row(p, routed, rows.hi);
    }
    rows = {-1, -1};
  }
};

// Down epilogue of this thread's rows (down_rows): each row into its (token, k) slot on its
// source rank (shared rows: y_shared). Returns the token counts the rows then owe (a row lives in
// one quad of lanes: all its stores, and its count by the quad's first lane).
template <int kBlockN>
__device__ __forceinline__ DownRowCounts store_down(const ForwardParams& p, const TileWork& w,
                                                    const float (&d)[kBlockN / 2], DownRows rows) {
  const int64_t col0 = int64_t(w.n_tile) * kBlockN;
  auto row_ptr = [&](int64_t destination) -> __nv_bfloat16* {
    const int src = sched::RowDestination::rank(destination);
    if (src < 0) return nullptr;
    __nv_bfloat16* base = w.kind == TileKind::routed_down ? p.peer_y_slots[src] : p.y_shared;
    return base + sched::RowDestination::slot(destination) * p.hidden + col0;
  };
  static_assert(kBlockN % 32 == 0);  // valid = H - col0 is a multiple of 64
  store_rows_vec16<kBlockN>(d, row_ptr(rows.lo), row_ptr(rows.hi), p.hidden - int(col0));
  return {rows, w.kind == TileKind::routed_down};
}

// The next tile index from the producer's queue (every consumer thread reads every entry);
// false: the bounded wait expired (recorded).
__device__ __forceinline__ bool next_consumer_tile(const ForwardParams& p, const TileQueue& queue,
                                                   const dev::RingCursor<kTileQueueDepth>& q,
                                                   int64_t* t) {
  if (!dev::mbar_wait(&queue.full[q.stage], q.phase, p.wait_cycles)) {
    record_fault(p, kRoleConsumer, -1);
    return false;
  }
  *t = queue.index[q.stage];
  dev::mbar_arrive(&queue.empty[q.stage]);
  return true;
}

// A consumer warpgroup's profile (one thread per warpgroup reports): time starved for loads (and
// the part of it on tiles' first stages), and first tile to the end of the sequence.
// Its SM clock cycles over the same span give the clock the SM ran at (the GPU is power-capped).
struct ConsumerTimes {
  RoleTimer timer;
  uint64_t start = 0, start_cycles = 0, starved = 0, starved_first = 0;
  __device__ explicit ConsumerTimes(const ForwardParams& p) : timer(p) {
    timer.on = timer.on && threadIdx.x % 128 == 0;
    start = timer.now();
    start_cycles = timer.on ? clock64() : 0;
  }
  __device__ void finish(const ForwardParams& p) {
    timer.sums[kTimeConsumerWaitsLoads] = starved;
    timer.sums[kTimeConsumerStarvedFirst] = starved_first;
    if (timer.on) timer.sums[kTimeConsumerCycles] = uint64_t(clock64()) - start_cycles;
    timer.add(kTimeConsumerTotal, start);
    timer.flush(p);
  }
};

// Cooperative consumers: both warpgroups work on every tile, 64 rows each (kMmaInFlight: see
// mma_tile; kKeepGateUp: see store_gate_up).
template <int kBlockN, bool kMmaInFlight, bool kKeepGateUp, int kProbe = 0>
__device__ __forceinline__ bool consumer_role(const ForwardParams& p, const SmemRing<kBlockN>& ring,
                                              const TileQueue& queue) {
  const ForwardTiles<kBlockN> tiles = ForwardTiles<kBlockN>::make(p);
  dev::RingCursor<TileShape<kBlockN>::kStages> cursor;
  const int wg = threadIdx.x / 128;
  float d[kBlockN / 2];
  ConsumerTimes times(p);
  DownRowCounts owed;  // the last down tile's, released after the next mainloop (or at the end)
  auto release_owed = [&] {
    const uint64_t since = times.timer.now();
    owed.release(p);
    times.timer.add(kTimeConsumerEpilogueDown, since);
    times.timer.add(kTimeConsumerEpilogue, since);
  };
  for (dev::RingCursor<kTileQueueDepth> q;; q.advance()) {
    int64_t t = 0;
    const uint64_t queue_since = times.timer.now();
    if (!next_consumer_tile(p, queue, q, &t)) return false;
    times.timer.add(kTimeConsumerWaitsTile, queue_since);
    if (t < 0) {
      release_owed();
      times.finish(p);
      return true;
    }
    const TileWork w = tiles.at(t, p);
    int row0 = int(w.m_block * kBlockM + wg * 64);
    if (all_padding(p, w, row0)) {  // the last rows of an expert's segment, or past the tokens
      if (!skip_tile<kBlockN>(ring, cursor, w.k_blocks, p.wait_cycles)) {
        record_fault(p, kRoleConsumer, t);
        return false;
      }
      release_owed();
      if (is_gate_up(w))  // its act rows stay unwritten: only skipped down rows read them
        publish_warpgroup(act_counter(p, w), wg);
      continue;
    }
    const bool gathered = gathers_rows(p, w);
    // A down tile's row destinations are loaded before its mainloop: with the L2 saturated their
    // latency would otherwise open the epilogue while the tensor cores idle.
    const DownRows destinations = is_gate_up(w) ? DownRows{-1, -1} : down_rows(p, w, row0);
    if (!mma_tile<kBlockN, kMmaInFlight, !(kProbe & kProbeNoMma)>(
            d, ring, cursor, w.k_blocks, wg, p.wait_cycles, times.timer.on, &times.starved,
            gathered, &times.starved_first)) {
      record_fault(p, kRoleConsumer, t);
      return false;
    }
    asm volatile("" : "+r"(row0));  // keeps row addresses out of the mainloop (pitfall 2)
    release_owed();
    const uint64_t epilogue_since = times.timer.now();
    if (is_gate_up(w)) {
      store_gate_up<kBlockN, kKeepGateUp>(p, w, d, row0);
      const uint64_t publish_since = times.timer.now();
      publish_warpgroup(act_counter(p, w), wg);
      times.timer.add(kTimeConsumerPublish, publish_since);
    } else {
      owed = store_down<kBlockN>(p, w, d, destinations);
      times.timer.add(kTimeConsumerEpilogueDown, epilogue_since);
    }
    times.timer.add(kTimeConsumerEpilogue, epilogue_since);
  }
}

}  // namespace mok::kern
