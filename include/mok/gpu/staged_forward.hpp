// The layer's forward on one GPU (EP = 1) as a sequence of launches: device schedule, gather,
// grouped GEMM with the SwiGLU epilogue, grouped GEMM, the shared experts, and the fixed-order
// combine. No host synchronisation: every size comes from the device schedule, and the grids cover
// the configured capacity. The persistent megakernel (mok/gpu/moe_forward.hpp) replaces it; it
// stays as the second GPU implementation the megakernel is checked against, bit for bit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu {

class StagedForward {
 public:
  // Throws mok::Error for configurations it does not take (ep_size != 1, precision other than
  // bf16) and for allocation failures.
  explicit StagedForward(const Config& c);
  ~StagedForward();
  StagedForward(const StagedForward&) = delete;
  StagedForward& operator=(const StagedForward&) = delete;

  // out [T, H] BF16. Asynchronous on `stream`; capturable in a CUDA graph.
  void forward(const DeviceBatch& batch, const DeviceLayerWeights& w, __nv_bfloat16* out,
               cudaStream_t stream);
  // After the stream has finished: throws mok::Error if the last forward found an expert id out of
  // range, needed more routed rows than the capacity (naming how many), or a wait expired.
  void check(cudaStream_t stream);

 private:
  struct Workspace;
  Config config_;
  Workspace* ws_;
};

}  // namespace mok::gpu
