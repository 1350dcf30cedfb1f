// The consumers' mainloop of a block-scaled FP8 tile (fp8_block: 1x128 scales along K for A's
// rows, 128x128 for B). Hopper's FP8 wgmma keeps fewer accumulator bits than FP32, so each
// k-block of 128 (one ring stage, one scale block) goes into fresh partial accumulators that are
// then promoted into the FP32 tile: d += partial * (scale of the A row * scale of the B block).
// A tile of kBlockN columns is multiplied in 64-column slices through one partial, so a consumer
// holds kBlockN / 2 + 32 accumulators.
#pragma once
#include <cstdint>

#include "kernels/gemm/mainloop_sm90.cuh"
#include "kernels/gemm/pipeline.cuh"

namespace mok::kern {

static_assert(TileShape<256, Fp8BlockKMajor>::kStageBytes == TileShape<256>::kStageBytes &&
                  TileShape<128, Fp8BlockKMajor>::kStageBytes == TileShape<128>::kStageBytes,
              "fp8_block tiles share the BF16 forward's ring");

// Scales: a(kb) -> float2, the scales of this thread's two rows (Fragment rows row_lo and
// row_lo + 8) for k-block kb, valid once the tile's first stage has landed (its producer waited
// for the rows, scales included, before loading any); b(kb, block) -> the scale of the tile's
// 128-column B block `block`. Both are loaded a k-block ahead, off the path to the promotions.
// Returns false if a bounded wait expired (the producer is gone); d is then meaningless.
template <int kBlockN, class Scales>
__device__ __forceinline__ bool mma_tile_fp8_block(
    float (&d)[kBlockN / 2], const SmemRing<kBlockN, Fp8BlockKMajor>& ring,
    dev::RingCursor<TileShape<kBlockN, Fp8BlockKMajor>::kStages>& c, int k_blocks, int wg,
    uint64_t wait_cycles, const Scales& scales, bool timed, uint64_t* waited_ns,
    uint64_t* first_waited_ns) {
  using T = Fp8BlockKMajor;
  using A = T::A;
  using B = T::B;
  // 64-column slices: a 32-register partial beside the tile's kBlockN / 2 accumulators (128-column
  // ones, a 64-register partial and half the waits, measured no faster: benchmarks.md).
  constexpr int kSliceN = 64;
  constexpr int kBlocks = kBlockN / 128, kSlices = kBlockN / kSliceN;
  constexpr int kSteps = T::kBlockK / T::kInstrK, kPart = kSliceN / 2;
  static_assert(kBlockN % 128 == 0 && 128 % kSliceN == 0, "slices inside 128-column B blocks");
  const bool arrives = threadIdx.x % 32 == 0;
#pragma unroll
  for (float& x : d) x = 0.0f;
  float2 sa = make_float2(0.0f, 0.0f);
  float sb[kBlocks];
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) sb[b] = k_blocks > 0 ? scales.b(0, b) : 0.0f;
  for (int kb = 0; kb < k_blocks; ++kb, c.advance()) {
    const uint64_t before = timed ? *waited_ns : 0;
    if (!wait_stage_full(ring, c, wait_cycles, timed, waited_ns, false)) return false;
    if (timed && kb == 0 && first_waited_ns) *first_waited_ns += *waited_ns - before;
    if (kb == 0) sa = scales.a(0);
    const bool more = kb + 1 < k_blocks;
    const float2 sa_next = more ? scales.a(kb + 1) : sa;
    float sb_next[kBlocks];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) sb_next[b] = more ? scales.b(kb + 1, b) : sb[b];
    const uint64_t da = A::desc(ring.a(c.stage) + A::row_offset(wg * 64));
    const uint64_t db = B::desc(ring.b(c.stage));
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
      float part[kPart];
      dev::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kSteps; ++k)
        T::mma<kSliceN>(
            part, dev::smem_desc_advance(da, A::k_offset<T::kInstrK>(k)),
            dev::smem_desc_advance(db, B::row_offset(kSliceN * s) + B::k_offset<T::kInstrK>(k)),
            k > 0);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::fence_accumulators(part);
      const float b = sb[s * kSliceN / 128], lo = sa.x * b, hi = sa.y * b;
#pragma unroll
      for (int i = 0; i < kPart; ++i)
        d[kPart * s + i] = fmaf(part[i], (i & 2) ? hi : lo, d[kPart * s + i]);
    }
    if (arrives) dev::mbar_arrive(&ring.empty[c.stage]);
    sa = sa_next;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) sb[b] = sb_next[b];
  }
  return true;
}

}  // namespace mok::kern
