// mbarriers in shared memory: init, arrivals (with or without a TMA byte count), parity waits.
// A fresh barrier is in phase 0; try_wait.parity(P) succeeds once the phase of parity P completed.
#pragma once
#include <cstdint>

#include "mok/device/sync.cuh"

namespace mok::dev {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// Once, after all inits and before the barriers are used by other threads or by TMA.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// `count` arrivals at once (one thread standing for several).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// One arrival, and `bytes` more transaction bytes the phase waits for (TMA completes them).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Bounded wait for the phase of `parity`; false on timeout.
__device__ __forceinline__ bool mbar_wait(uint64_t* bar, uint32_t parity, uint64_t max_cycles) {
  return spin_until([&] { return mbar_try_wait(bar, parity); }, max_cycles);
}

// A ring position shared by a producer and its consumers: both walk the same sequence, so stage
// and phase stay in step without extra synchronisation (hopper-gemm.md, section 5).
template <int kStages>
struct RingCursor {
  static_assert(kStages >= 1 && kStages <= 16, "a ring of 1 to 16 stages");
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1u;
  }
};

}  // namespace mok::dev
