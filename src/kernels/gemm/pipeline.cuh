// The GEMM pipeline every sm_90a kernel of mok is built from: a 128 x kBlockN output tile per CTA
// step, one producer thread issuing TMA loads into a ring of shared-memory stages, and two
// consumer warpgroups (64 rows each) accumulating with wgmma into FP32 registers. Producer and
// consumers walk the same (tile, k-block) sequence, so the ring's stage and phase stay in step with
// no other synchronisation (hopper-gemm.md, sections 1 and 5). Traits (mma_traits.cuh) give the
// operand type, the k-block and the tiles' layouts.
#pragma once
#include <cstdint>

#include "kernels/gemm/mma_traits.cuh"
#include "kernels/gemm/tile_geometry.cuh"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"

namespace mok::kern {

// The forward's A tile (Bf16KMajor): its producer gathers and loads A itself.
constexpr uint32_t kTileBytesA = Bf16KMajor::A::bytes(kBlockM);

// Per tile width and traits: as many ring stages as 192 KB hold (the rest of the shared memory is
// left to the roles' static arrays), at most 8.
template <int kBlockN, class Traits = Bf16KMajor>
struct TileShape {
  static_assert(kBlockN == 64 || kBlockN == 128 || kBlockN == 192 || kBlockN == 256,
                "wgmma m64n64, n128, n192 or n256");
  static constexpr uint32_t kBytesA = Traits::A::bytes(kBlockM);
  static constexpr uint32_t kBytesB = Traits::B::bytes(kBlockN);
  static constexpr uint32_t kBytesScales = Traits::kBytesScales;
  static constexpr uint32_t kStageBytes = kBytesA + kBytesB + kBytesScales;
  static constexpr int kStages =
      int(192 * 1024 / kStageBytes) < 8 ? int(192 * 1024 / kStageBytes) : 8;
  static constexpr int kSmemBytes = kStages * int(kStageBytes) + 1024;  // + alignment
  static_assert(kStages >= 2, "a ring of at least two stages");
  static_assert(kSmemBytes <= 232448, "dynamic shared memory of one CTA");
  static_assert(kBytesA % 1024 == 0 && kBytesB % 1024 == 0 && kBytesScales % 1024 == 0,
                "tiles stay 1024-byte aligned");
};

// The ring in shared memory: kStages (A, B) tile pairs and their full / empty barriers.
template <int kBlockN, class Traits = Bf16KMajor>
struct SmemRing {
  using Shape = TileShape<kBlockN, Traits>;
  static constexpr int kStages = Shape::kStages;
  uint8_t* tiles_a;
  uint8_t* tiles_b;
  uint64_t* full;   // the producer's arrive_expect_tx + TMA bytes (+ gathering threads' copies)
  uint64_t* empty;  // one arrival per consumer warp

  __device__ uint8_t* a(int stage) const { return tiles_a + stage * Shape::kBytesA; }
  __device__ uint8_t* b(int stage) const { return tiles_b + stage * Shape::kBytesB; }

  // By the whole CTA, before any role starts. full_arrivals: 1 for one producer thread, more when
  // producer threads gather A rows themselves (each then arrives on every stage). empty_arrivals:
  // one per consumer warp that reads each stage (4 when one warpgroup takes a whole tile).
  __device__ static SmemRing make(uint8_t* smem_raw, uint64_t* full, uint64_t* empty,
                                  uint32_t full_arrivals = 1,
                                  uint32_t empty_arrivals = kConsumers * 4) {
    static_assert(Shape::kBytesScales == 0, "scale tiles: not laid out yet");
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                               ~uintptr_t(1023));
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        dev::mbar_init(&full[s], full_arrivals);
        dev::mbar_init(&empty[s], empty_arrivals);
      }
      dev::mbar_fence_init();
    }
    return {smem, smem + kStages * Shape::kBytesA, full, empty};
  }
};

// Producer side of one k-block: waits for a free stage, announces the bytes, and returns the stage
// the caller TMA-loads A and B into (false: the bounded wait expired).
template <int kBlockN, class Traits>
__device__ __forceinline__ bool acquire_stage(
    const SmemRing<kBlockN, Traits>& ring,
    const dev::RingCursor<TileShape<kBlockN, Traits>::kStages>& c, uint64_t wait_cycles) {
  if (!dev::mbar_wait(&ring.empty[c.stage], c.phase ^ 1u, wait_cycles)) return false;
  dev::mbar_arrive_expect_tx(&ring.full[c.stage], TileShape<kBlockN, Traits>::kStageBytes);
  return true;
}

}  // namespace mok::kern
