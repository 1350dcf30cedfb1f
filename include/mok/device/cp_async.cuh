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
