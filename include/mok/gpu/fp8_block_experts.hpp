// The routed experts' weights in fp8_block on the device, quantized from their BF16 weights by a
// GPU kernel (gpu::quantize_fp8_block_weights: the codes and scales of the CPU's
// quantize_fp8_block in 128x128 blocks, bit for bit). Square blocks: one copy serves the forward;
// the transposed copies a backward reads are not made yet.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu {

class Fp8BlockExperts {
 public:
  // For the rank's local experts of c; throws mok::Error unless H and I are multiples of 128,
  // and for allocation failures.
  explicit Fp8BlockExperts(const Config& c);
  ~Fp8BlockExperts();
  Fp8BlockExperts(const Fp8BlockExperts&) = delete;
  Fp8BlockExperts& operator=(const Fp8BlockExperts&) = delete;

  // From w.gate, w.up and w.down (BF16), asynchronous on `stream`; throws for null or
  // misaligned weights. Run again after every optimizer step.
  void quantize(const DeviceLayerWeights& w, cudaStream_t stream);
  // What DeviceLayerWeights::fp8_block takes.
  Fp8BlockWeights weights() const;
  // w with its fp8_block weights set to these.
  DeviceLayerWeights with(const DeviceLayerWeights& w) const;

 private:
  int64_t experts_, hidden_, intermediate_;
  uint8_t* codes_ = nullptr;  // gate | up | down
  float* scales_ = nullptr;   // gate | up | down
};

}  // namespace mok::gpu
