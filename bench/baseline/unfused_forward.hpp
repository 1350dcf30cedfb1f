// The unfused baseline built from NVIDIA libraries, as a user writes it today: counts to the host
// (a synchronisation), gather, cuBLAS grouped GEMMs for gate and up, a SwiGLU kernel, a cuBLAS
// grouped GEMM for down, cuBLAS GEMMs for the shared experts, and a combine kernel.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <vector>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::bench {

class UnfusedForward {
 public:
  explicit UnfusedForward(const Config& c);
  ~UnfusedForward();
  UnfusedForward(const UnfusedForward&) = delete;
  UnfusedForward& operator=(const UnfusedForward&) = delete;
  // Synchronises with the host once (the expert counts), like every pipeline of this kind.
  void forward(const gpu::DeviceBatch& b, const gpu::DeviceLayerWeights& w, __nv_bfloat16* out);

 private:
  Config c_;
  cublasHandle_t handle_;
  int32_t *counts_, *offsets_, *sorted_, *sort_scratch_, *slot_position_;
  __nv_bfloat16 *rows_, *gate_, *up_, *act_, *y_, *shared_gate_, *shared_up_, *shared_act_,
      *shared_y_;
  void** pointers_;  // device pointer arrays of the grouped GEMMs
  std::vector<int32_t> host_counts_;
};

}  // namespace mok::bench
