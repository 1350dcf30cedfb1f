// Thin PTX wrappers for Ampere-style 16-byte asynchronous copies into shared memory whose
// completion is tracked by an mbarrier: how a producer gathers rows that TMA cannot address (one
// row per token, scattered). The data lands through the generic proxy: readers through the async
// proxy (wgmma) fence with fence.proxy.async.shared::cta after the barrier.
#pragma once
#include <cstdint>

#include "mok/device/sync.cuh"

namespace mok::dev {

// 16 bytes global -> shared, through L2 only; src_bytes = 0 writes zeros (src is not read).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src,
                                            uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// An L2 eviction policy for cache-hinted loads: `fraction` (0, 1] of the accesses get evict_last
// (kept over evict_normal data: rows that later tiles read again); the others leave the line's
// priority unchanged.
__device__ __forceinline__ uint64_t l2_policy_evict_last(float fraction) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, %1;"
               : "=l"(policy)
               : "f"(fraction));
  return policy;
}
// The default priority for every access (what an unhinted load gets).
__device__ __forceinline__ uint64_t l2_policy_evict_normal() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// cp_async_16 with an L2 eviction policy (l2_policy_*).
__device__ __forceinline__ void cp_async_16_hinted(void* smem_dst, const void* gmem_src,
                                                   uint32_t src_bytes, uint64_t policy) {
  asm volatile(
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(smem_addr(smem_dst)),
      "l"(gmem_src), "r"(src_bytes), "l"(policy)
      : "memory");
}

// When this thread's earlier cp.async copies have landed, one arrival on `bar`. Counted: it is one
// of the arrivals the barrier was initialised with.
__device__ __forceinline__ void cp_async_arrive_counted(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
// The same, but not one of the barrier's arrivals: the phase only also waits for the copies.
__device__ __forceinline__ void cp_async_arrive_extra(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

}  // namespace mok::dev
