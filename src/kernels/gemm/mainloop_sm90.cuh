// The consumers' side of the ring (pipeline.cuh): waiting for stages, the wgmma mainloop of a
// tile, and passing a tile's stages on without multiplying.
#pragma once
#include <cstdint>

#include "kernels/gemm/pipeline.cuh"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/wgmma.cuh"

namespace mok::kern {

// A consumer's wait for stage c to land (false: the bounded wait expired). With `timed`
// (profiling) the wait adds to waited_ns; with `gathered`, A was written by cp.async (generic
// proxy), so the async proxy is fenced before wgmma reads it.
template <int kBlockN, class Traits>
__device__ __forceinline__ bool wait_stage_full(
    const SmemRing<kBlockN, Traits>& ring,
    const dev::RingCursor<TileShape<kBlockN, Traits>::kStages>& c, uint64_t wait_cycles, bool timed,
    uint64_t* waited_ns, bool gathered) {
  const uint64_t start = timed ? dev::global_ns() : 0;
  if (!dev::mbar_wait(&ring.full[c.stage], c.phase, wait_cycles)) return false;
  if (timed) *waited_ns += dev::global_ns() - start;
  if (gathered) dev::fence_proxy_async_shared();
  return true;
}

// Consumer side of a whole tile: d = A[64 rows of this warpgroup] * B^T over k_blocks stages
// (k_blocks = 0 leaves d as it was).
// kInFlight: one k-block of wgmma stays in flight while the next stage is awaited and issued (the
// tensor pipe does not drain at every stage boundary), and a stage is released only once the next
// group has been issued and wait_group 1 says its own is done, so the producer runs one stage
// less ahead. It pays where the rows come by TMA, not with the producer gather (lever index, "row
// path by rows per expert; one wgmma group in flight"): the forward picks it with the copy.
// Returns false if a bounded wait expired (the producer is gone); d is then meaningless.
// timed / waited_ns / gathered: as for wait_stage_full; first_waited_ns also gets the first
// stage's wait (starved at the tile boundary).
// kMultiply = false (a benchmark's stage probe): every stage is awaited and released, nothing is
// multiplied, and d is zero.
// held: the last `held` stages are not released (the epilogue stages its output there and
// releases them itself, hold_stage_output below); k_blocks >= held.
// Traits follow from the ring, so the BF16 forward's call sites name only kBlockN and the flags.
template <int kBlockN, bool kInFlight = false, bool kMultiply = true, class Traits = Bf16KMajor>
__device__ __forceinline__ bool mma_tile(float (&d)[kBlockN / 2],
                                         const SmemRing<kBlockN, Traits>& ring,
                                         dev::RingCursor<TileShape<kBlockN, Traits>::kStages>& c,
                                         int k_blocks, int wg, uint64_t wait_cycles,
                                         bool timed = false, uint64_t* waited_ns = nullptr,
                                         bool gathered = false, uint64_t* first_waited_ns = nullptr,
                                         int held = 0) {
  static_assert(!(kInFlight && Traits::kPromotes),
                "promotion reads each k-block's accumulators once its group has completed");
  using A = typename Traits::A;
  using B = typename Traits::B;
  constexpr int kSteps = Traits::kBlockK / Traits::kInstrK;
  const bool arrives = threadIdx.x % 32 == 0;
  const int release_below = k_blocks - held;  // k-blocks below this are released here
  int in_flight = -1;  // kInFlight: the stage the last issued wgmma group reads
  if constexpr (!kMultiply) {
#pragma unroll
    for (float& x : d) x = 0.0f;
  }
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    const uint64_t before = timed ? *waited_ns : 0;
    if (!wait_stage_full(ring, c, wait_cycles, timed, waited_ns, gathered)) {
      if constexpr (kInFlight) dev::wgmma_wait<0>();  // nothing reads the ring after giving up
      return false;
    }
    if (timed && kb == 0 && first_waited_ns) *first_waited_ns += *waited_ns - before;
    if constexpr (!kMultiply) {
      if (arrives && kb < release_below) dev::mbar_arrive(&ring.empty[c.stage]);
      continue;
    }
    // This warpgroup's 64 rows of the A tile.
    const uint64_t da = A::desc(ring.a(c.stage) + A::row_offset(wg * 64));
    const uint64_t db = B::desc(ring.b(c.stage));
    dev::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kSteps; ++k)
      Traits::template mma<kBlockN>(
          d, dev::smem_desc_advance(da, A::template k_offset<Traits::kInstrK>(k)),
          dev::smem_desc_advance(db, B::template k_offset<Traits::kInstrK>(k)), kb > 0 || k > 0);
    dev::wgmma_commit();
    if constexpr (kInFlight) {
      dev::wgmma_wait<1>();
      dev::fence_accumulators(d);
      if (arrives && in_flight >= 0 && kb - 1 < release_below)
        dev::mbar_arrive(&ring.empty[in_flight]);
      in_flight = int(c.stage);
    } else {
      dev::wgmma_wait<0>();
      dev::fence_accumulators(d);
      Traits::template promote<kBlockN>(d, c.stage);
      if (arrives && kb < release_below) dev::mbar_arrive(&ring.empty[c.stage]);
    }
  }
  if constexpr (kInFlight) {
    dev::wgmma_wait<0>();
    dev::fence_accumulators(d);
    if (arrives && in_flight >= 0 && held == 0) dev::mbar_arrive(&ring.empty[in_flight]);
  }
  return true;
}

// A warpgroup whose 64 rows are all padding passes the tile's stages on without multiplying: the
// other warpgroup then has the SM's tensor cores to itself. It still waits for each stage to land,
// so the producer never refills a stage the TMA is writing.
template <int kBlockN, class Traits = Bf16KMajor>
__device__ __forceinline__ bool skip_tile(const SmemRing<kBlockN, Traits>& ring,
                                          dev::RingCursor<TileShape<kBlockN, Traits>::kStages>& c,
                                          int k_blocks, uint64_t wait_cycles) {
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    if (!dev::mbar_wait(&ring.full[c.stage], c.phase, wait_cycles)) return false;
    if (threadIdx.x % 32 == 0) dev::mbar_arrive(&ring.empty[c.stage]);
  }
  return true;
}

}  // namespace mok::kern
