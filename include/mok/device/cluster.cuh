// Thread-block clusters (sm_90): a CTA's rank in its cluster, shared addresses of the other CTA,
// remote mbarrier arrivals and stores, TMA loads multicast into every CTA of a mask, and the
// cluster barrier. Two CTAs of a cluster share one TMA load of an operand both need: each loads
// half and multicasts it, so L2 sends each byte to the pair once.
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

// CTAs in this CTA's cluster (1 without clusters).
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// The shared::cluster address of `p` (this CTA's shared memory) in CTA `rank` of the cluster:
// the same offset in the other CTA's shared window.
__device__ __forceinline__ uint32_t cluster_smem_addr(const void* p, uint32_t rank) {
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
  return a;
}

// One arrival on an mbarrier of any CTA of the cluster (address from cluster_smem_addr), with
// release at cluster scope: this thread's earlier writes (stores into that CTA's shared memory
// included) are visible to whoever then completes an acquiring wait on the barrier's phase.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar)
               : "memory");
}

// A wait that acquires at cluster scope: pairs with mbar_arrive_cluster of the other CTA (the
// plain mbar_wait acquires at CTA scope, enough for TMA bytes and this CTA's arrivals).
__device__ __forceinline__ bool mbar_try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ bool mbar_wait_cluster(uint64_t* bar, uint32_t parity,
                                                  uint64_t max_cycles) {
  return spin_until([&] { return mbar_try_wait_cluster(bar, parity); }, max_cycles);
}

__device__ __forceinline__ void st_cluster_u64(uint32_t cluster_addr, uint64_t v) {
  asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(cluster_addr), "l"(v) : "memory");
}

// Box at (x, y, z) into `dst` of every CTA in `cta_mask` (same shared offset in each); each of
// them gets the box's bytes completed on its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int32_t x, int32_t y,
                                                      int32_t z, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y), "r"(z), "h"(cta_mask)
      : "memory");
}

// Every thread of every CTA of the cluster: writes before it (shared memory of any CTA of the
// cluster included) are visible after it. Also what keeps a CTA's shared memory alive until the
// other CTA no longer arrives on or copies into it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}

}  // namespace mok::dev
