// Ping-pong consumers (ForwardOptions::pingpong_consumers, 128-wide tiles): the two consumer
// warpgroups take alternate tiles of the producer's sequence, each computing all 128 rows of its
// tile, so one warpgroup's epilogue (SwiGLU or the scattered down stores) runs while the other's
// wgmmas keep the tensor cores busy. The cooperative consumers (consumer_role) instead run both
// epilogues at once and leave the tensor cores idle meanwhile.
//
// Ordering: a warpgroup starts a tile's mainloop only after the other warpgroup's previous
// mainloop has ended (mainloop_done). Besides alternating the tensor cores, this keeps each
// warpgroup's ring waits within one lap of the producer: a warpgroup skips the other's stages
// (its cursor jumps over them), and an mbarrier parity wait cannot tell a phase from the one two
// laps later. Deadlock freedom is that of the cooperative order (tile_schedule.cuh): a mainloop
// waits only on the producer's loads and on the other warpgroup's earlier mainloop, which waits
// on nothing later; epilogues wait on nothing.
#pragma once
#include "kernels/moe_forward/gemm_roles.cuh"

namespace mok::kern {

// Per CTA: mainloop_done[wg], one arrival per warp of warpgroup wg when its tile's mainloop ends.
constexpr uint32_t kMainloopDoneArrivals = 4;

// ONE warpgroup computes all 128 rows of the tile, two m64 wgmmas per k-step (top: rows [0, 64),
// bottom: [64, 128); without kBottom the bottom rows are padding and are not multiplied: a
// separate instantiation, since a wgmma under a runtime branch makes ptxas serialize them all,
// C7520). Each of its 4 warps releases each stage (empty_arrivals 4). BF16 K-major only.
template <int kBlockN, bool kBottom>
__device__ __forceinline__ bool mma_tile_128(float (&top)[kBlockN / 2],
                                             float (&bottom)[kBlockN / 2],
                                             const SmemRing<kBlockN>& ring,
                                             dev::RingCursor<TileShape<kBlockN>::kStages>& c,
                                             int k_blocks, uint64_t wait_cycles, bool timed,
                                             uint64_t* waited_ns, bool gathered) {
  using A = Bf16KMajor::A;
  using B = Bf16KMajor::B;
  constexpr int kK = Bf16KMajor::kInstrK;
  const bool arrives = threadIdx.x % 32 == 0;
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    if (!wait_stage_full(ring, c, wait_cycles, timed, waited_ns, gathered)) return false;
    const uint64_t da = A::desc(ring.a(c.stage));
    const uint64_t da_bottom = A::desc(ring.a(c.stage) + A::row_offset(64));
    const uint64_t db = B::desc(ring.b(c.stage));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < Bf16KMajor::kBlockK / kK; ++k) {
      Bf16KMajor::mma<kBlockN>(top, dev::smem_desc_advance(da, A::k_offset<kK>(k)),
                               dev::smem_desc_advance(db, B::k_offset<kK>(k)), kb > 0 || k > 0);
      if constexpr (kBottom)
        Bf16KMajor::mma<kBlockN>(bottom, dev::smem_desc_advance(da_bottom, A::k_offset<kK>(k)),
                                 dev::smem_desc_advance(db, B::k_offset<kK>(k)), kb > 0 || k > 0);
    }
    dev::wgmma_commit();
    dev::wgmma_wait<0>();
    dev::fence_accumulators(top);
    if constexpr (kBottom) dev::fence_accumulators(bottom);
    if (arrives) dev::mbar_arrive(&ring.empty[c.stage]);
  }
  return true;
}

template <int kBlockN>
__device__ __forceinline__ bool pingpong_consumer_role(const ForwardParams& p,
                                                       const SmemRing<kBlockN>& ring,
                                                       const TileQueue& queue,
                                                       uint64_t* mainloop_done) {
  static_assert(kBlockN == 128, "two 64 x kBlockN accumulators per thread: 128 wide at most");
  const ForwardTiles<kBlockN> tiles = ForwardTiles<kBlockN>::make(p);
  dev::RingCursor<TileShape<kBlockN>::kStages> cursor;
  const int wg = threadIdx.x / 128;
  float top[kBlockN / 2], bottom[kBlockN / 2];
  ConsumerTimes times(p);
  uint32_t order_waits = 0;  // completions of the other warpgroup's mainloop_done waited for
  dev::RingCursor<kTileQueueDepth> q;
  for (int64_t seq = 0;; q.advance(), ++seq) {
    int64_t t = 0;
    if (!next_consumer_tile(p, queue, q, &t)) return false;
    if (t < 0) {
      times.finish(p);
      return true;
    }
    const TileWork w = tiles.at(t, p);
    if (int(seq % 2) != wg) {  // the other warpgroup's tile: pass over its stages
      for (int kb = 0; kb < w.k_blocks; ++kb) cursor.advance();
      continue;
    }
    if (seq > 0) {
      if (!dev::mbar_wait(&mainloop_done[1 - wg], order_waits & 1u, p.wait_cycles)) {
        record_fault(p, kRoleConsumer, t);
        return false;
      }
      ++order_waits;
    }
    int row0 = int(w.m_block * kBlockM);
    const bool top_live = !all_padding(p, w, row0), bottom_live = !all_padding(p, w, row0 + 64);
    const bool gathered = gathers_rows(p, w);
    bool ok;
    if (!top_live)
      ok = skip_tile<kBlockN>(ring, cursor, w.k_blocks, p.wait_cycles);
    else if (bottom_live)
      ok = mma_tile_128<kBlockN, true>(top, bottom, ring, cursor, w.k_blocks, p.wait_cycles,
                                       times.timer.on, &times.starved, gathered);
    else
      ok = mma_tile_128<kBlockN, false>(top, bottom, ring, cursor, w.k_blocks, p.wait_cycles,
                                        times.timer.on, &times.starved, gathered);
    if (threadIdx.x % 32 == 0) dev::mbar_arrive(&mainloop_done[wg]);
    if (!ok) {
      record_fault(p, kRoleConsumer, t);
      return false;
    }
    asm volatile("" : "+r"(row0));  // keeps row addresses out of the mainloop (pitfall 2)
    if (is_gate_up(w)) {  // padding rows' act stays unwritten: only skipped down rows read it
      if (top_live) store_gate_up<kBlockN>(p, w, top, row0);
      if (bottom_live) store_gate_up<kBlockN>(p, w, bottom, row0 + 64);
      publish_warpgroup(act_counter(p, w), wg, kConsumers);
    } else if (top_live) {
      // Released at once: the other warpgroup's mainloop keeps the tensor cores busy meanwhile.
      store_down<kBlockN>(p, w, top, down_rows(p, w, row0)).release(p);
      if (bottom_live) store_down<kBlockN>(p, w, bottom, down_rows(p, w, row0 + 64)).release(p);
    }
  }
}

}  // namespace mok::kern
