// TMA (the bulk tensor copy engine): device-side copies between global memory and 128B-swizzled
// shared tiles, completing on an mbarrier (loads) or a bulk group (stores).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "mok/device/sync.cuh"

namespace mok::dev {

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Tensor maps written to global memory by generic stores (another kernel) and read by TMA: the
// writer releases after its stores, every thread that issues TMA with the map acquires it first.
__device__ __forceinline__ void fence_tensormap_release() {
  asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
}
__device__ __forceinline__ void fence_tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
}

// Box at (x innermost, y) into smem; completes `bytes` on `bar` (announced by arrive_expect_tx).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t x, int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4}], [%2];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t x, int32_t y, int32_t z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4, %5}], [%2];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

// Box from smem to (x, y); the caller fenced the generic writes (fence_proxy_async_shared).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int32_t x,
                                             int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
      "r"(smem_addr(src)), "r"(x), "r"(y)
      : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// The source smem of all committed stores may be reused (global writes may still be in flight).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// All committed stores have written global memory: required before a release that hands the
// data to another CTA (hopper-gemm.md, section 13).
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Byte offset of element (r, c) of a box with 128-byte rows, stored with the 128B swizzle from a
// 1024-byte aligned base: the eight 16-byte chunks of row r are permuted by XOR with r % 8.
__host__ __device__ __forceinline__ uint32_t swizzle128_offset(uint32_t row, uint32_t col_byte) {
  return row * 128u + (((col_byte / 16u) ^ (row % 8u)) * 16u) + col_byte % 16u;
}

}  // namespace mok::dev
