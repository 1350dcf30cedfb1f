// The consumers' mainloop over widened B tiles (NVFP4 / MXFP8 weights): both consumer warpgroups
// (eight warps) widen each stage's codes from its staging slot into the stage's B tile
// themselves, the next stage's while the current stage's wgmma runs, so the widening takes the
// slack of an asynchronous MMA instead of three producer warps' issue slots. The TMA leader loads
// A into the ring and the codes into the staging slots as before; no converter warp arrives.
#pragma once
#include <cstdint>

#include "kernels/gemm/mainloop_sm90.cuh"
#include "kernels/gemm/pipeline.cuh"
#include "kernels/gemm/widen_sm90.cuh"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/wgmma.cuh"

namespace mok::kern {

// Named barrier of the two consumer warpgroups between a stage's widening and its wgmma (1 and 2
// are the warpgroups' own publishing barriers).
constexpr uint32_t kWideningBarrier = 4;
// Steps of codes loaded ahead in a consumer's widening: its registers hold the accumulators.
constexpr int kConsumerWidenAhead = 1;

// d = A[this warpgroup's 64 rows] * B^T over k_blocks stages, B widened by the consumers: warp
// (0-7 over both warpgroups) widens its share of every stage. kMultiply = false: a warpgroup
// whose rows are all padding still widens its share (the other warpgroup multiplies) and passes
// the stages on, d untouched. Both warpgroups must call it for the same tiles. Returns false if a
// bounded wait expired. staged: the consumers' cursor over the staging slots (every thread keeps
// one).
template <class Stage, int kBlockN, bool kMultiply, class Staging>
__device__ __forceinline__ bool mma_tile_widening(
    float (&d)[kBlockN / 2], const SmemRing<kBlockN>& ring,
    dev::RingCursor<TileShape<kBlockN>::kStages>& c, const Staging& staging,
    dev::RingCursor<Staging::kSlotCount>& staged, int k_blocks, int wg, uint64_t wait_cycles,
    bool timed, uint64_t* waited_ns, uint64_t* first_waited_ns) {
  using A = Bf16KMajor::A;
  using B = Bf16KMajor::B;
  constexpr int kSteps = kBlockK / Bf16KMajor::kInstrK;
  static_assert(TileShape<kBlockN>::kStages >= 2, "a stage widened while the one before is read");
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const bool arrives = lane == 0;
  // Stage `at`'s codes into its B tile: this warp's share, fenced for wgmma, the slot released.
  auto widen = [&](uint32_t stage) {
    // Warp-uniform: a per-lane branch here, with wgmma in flight, serialises the wgmmas (C7518).
    if (!__all_sync(0xFFFFFFFFu,
                    dev::mbar_wait(&staging.full[staged.stage], staged.phase, wait_cycles)))
      return false;
    widen_tile<Stage, 2 * 4, kConsumerWidenAhead>(staging.slot(int(staged.stage)), ring.b(stage),
                                                  warp, lane);
    dev::fence_proxy_async_shared();  // the widened tile -> both warpgroups' wgmma
    __syncwarp();
    if (arrives) dev::mbar_arrive(&staging.empty[staged.stage]);
    staged.advance();
    return true;
  };
  if (k_blocks > 0 && !widen(c.stage)) return false;
  dev::named_barrier_sync(kWideningBarrier, 2 * 128);
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    const uint64_t before = timed ? *waited_ns : 0;
    if (!wait_stage_full(ring, c, wait_cycles, timed, waited_ns, false)) return false;
    if (timed && kb == 0 && first_waited_ns) *first_waited_ns += *waited_ns - before;
    if constexpr (kMultiply) {
      const uint64_t da = A::desc(ring.a(c.stage) + A::row_offset(wg * 64));
      const uint64_t db = B::desc(ring.b(c.stage));
      dev::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kSteps; ++k)
        Bf16KMajor::template mma<kBlockN>(
            d, dev::smem_desc_advance(da, A::template k_offset<Bf16KMajor::kInstrK>(k)),
            dev::smem_desc_advance(db, B::template k_offset<Bf16KMajor::kInstrK>(k)),
            kb > 0 || k > 0);
      dev::wgmma_commit();
    }
    // The next stage's B while this one's wgmma runs: its ring stage last held k-block
    // kb + 1 - kStages, which both warpgroups finished before the barrier of an earlier step.
    if (kb + 1 < k_blocks) {
      dev::RingCursor<TileShape<kBlockN>::kStages> next = c;
      next.advance();
      if (!widen(next.stage)) {
        if constexpr (kMultiply) dev::wgmma_wait<0>();  // nothing reads the ring after giving up
        return false;
      }
    }
    if constexpr (kMultiply) {
      dev::wgmma_wait<0>();
      dev::fence_accumulators(d);
    }
    if (arrives) dev::mbar_arrive(&ring.empty[c.stage]);
    // Both halves of the next B tile are written, and both warpgroups are done reading this one.
    dev::named_barrier_sync(kWideningBarrier, 2 * 128);
  }
  return true;
}

}  // namespace mok::kern
