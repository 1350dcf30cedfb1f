// Shared by the widening tests (nvfp4 and mxfp8 forward, nvfp4 backward): one staging slot widened
// on the GPU as kWarps converter warps of the megakernel widen it, the B tile copied out as it
// lies.
#pragma once
#include <cstdint>
#include <vector>

#include "gpu_test_util.hpp"
#include "kernels/gemm/widen_sm90.cuh"

namespace widen_test {

// kMnMajor: widen_tile_mn (the backward's Nvfp4MnStage); else widen_tile (K-major stages).
template <class Stage, int kWarps, int kTileBytes, bool kMnMajor>
__global__ void widen_kernel(const uint8_t* slot_in, uint8_t* tile_out) {
  __shared__ alignas(128) uint8_t slot[Stage::kSlotBytes];
  __shared__ alignas(1024) uint8_t tile[kTileBytes];
  for (uint32_t i = threadIdx.x; i < Stage::kSlotBytes; i += blockDim.x) slot[i] = slot_in[i];
  __syncthreads();
  if constexpr (kMnMajor)
    mok::kern::widen_tile_mn<Stage, kWarps>(slot, tile, int(threadIdx.x / 32),
                                            int(threadIdx.x % 32));
  else
    mok::kern::widen_tile<Stage, kWarps>(slot, tile, int(threadIdx.x / 32), int(threadIdx.x % 32));
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < uint32_t(kTileBytes); i += blockDim.x) tile_out[i] = tile[i];
}

// The BF16 tile (kTileBytes, swizzled as TMA would have written it) widened from `slot`.
template <class Stage, int kWarps, int kTileBytes, bool kMnMajor = false>
std::vector<uint8_t> widen_on_gpu(const std::vector<uint8_t>& slot) {
  DeviceBuffer<uint8_t> in(slot), out(size_t(kTileBytes), 0);
  widen_kernel<Stage, kWarps, kTileBytes, kMnMajor><<<1, 32 * kWarps>>>(in.ptr, out.ptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (a function returning a value: no ASSERT)
  return out.to_host();
}

}  // namespace widen_test
