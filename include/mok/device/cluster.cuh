// Thread-block clusters (sm_90): a CTA's rank, another CTA's shared memory (mapa), arrivals on
// its mbarriers, the cluster-wide barrier, and TMA loads multicast into every CTA of a mask.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "mok/device/sync.cuh"

namespace mok::dev {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The shared::cluster address of `p` (a shared::cta pointer of this CTA) in CTA `rank`.
__device__ __forceinline__ uint32_t cluster_smem_addr(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(smem_addr(p)), "r"(rank));
  return remote;
}

// One arrival on the mbarrier at `bar`'s offset in CTA `rank`, releasing this thread's prior
// accesses at cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(
                   cluster_smem_addr(bar, rank))
               : "memory");
}

// try_wait on a barrier of this CTA that another CTA's threads arrive on: acquire at cluster
// scope, so what they released before arriving is visible after.
__device__ __forceinline__ bool mbar_try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
      "%2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Every non-exited thread of the cluster: barrier inits and shared memory visible cluster-wide
// before (arrive, then wait), or no CTA leaving while another may still address it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// A box at (x innermost, y) into the same shared-memory offset of every CTA in `cta_mask`,
// completing its bytes on the mbarrier at `bar`'s offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int32_t x, int32_t y,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y), "h"(cta_mask)
      : "memory");
}

// A box at (x innermost, y, z) into the same shared-memory offset of every CTA in `cta_mask`,
// completing its bytes on the mbarrier at `bar`'s offset in each of them.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int32_t x, int32_t y,
                                                      int32_t z, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y), "r"(z), "h"(cta_mask)
      : "memory");
}

}  // namespace mok::dev
