// The routed experts' weights in fp8_block on the device, quantized from their BF16 weights by a
// GPU kernel (gpu::quantize_fp8_block_weights: the codes and scales of the CPU's
// quantize_fp8_block in 128x128 blocks, bit for bit). The forward reads the weights as given; the
// backward's dgrad GEMMs read each one transposed (FP8 wgmma takes K-major operands only), which
// the same kernel writes from the BF16 weights: the blocks are square, so these are the codes and
// scales of the transposed matrix's quantization, and the two directions multiply the same numbers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu {

class Fp8BlockExperts {
 public:
  // For the rank's local experts of c; with `backward` also the transposed copies a backward
  // reads (twice the memory). Throws mok::Error unless H and I are multiples of 128, and for
  // allocation failures.
  explicit Fp8BlockExperts(const Config& c, bool backward = false);
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
  bool backward_, ue8m0_;
  uint8_t* codes_ = nullptr;  // gate | up | down, then (backward) gate_t | up_t | down_t
  float* scales_ = nullptr;   // likewise
};

}  // namespace mok::gpu
