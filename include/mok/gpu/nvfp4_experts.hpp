// The routed experts' weights in NVFP4 on the device (precision nvfp4, Hopper's recipe: NVFP4
// weights, BF16 activations): quantized from their BF16 weights by GPU kernels (each matrix as
// quantize_nvfp4(..., {16, 16}) quantizes it, gate and up as one [2I, H] matrix: the same codes,
// scales and per-tensor factors), then
// packed in place into the layout the forward widens from (mok/formats/nvfp4_widen.hpp). A quarter
// of the BF16 weights' bytes, plus 1/256 for the factors and 1/512 for the scales they come from.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu {

class Nvfp4Experts {
 public:
  // For the rank's local experts of c. Throws mok::Error unless H and I are multiples of 64, and
  // for allocation failures.
  explicit Nvfp4Experts(const Config& c);
  ~Nvfp4Experts();
  Nvfp4Experts(const Nvfp4Experts&) = delete;
  Nvfp4Experts& operator=(const Nvfp4Experts&) = delete;

  // From w.gate, w.up and w.down (BF16), asynchronous on `stream`; throws for null or misaligned
  // weights. Run again after every optimizer step.
  void quantize(const DeviceLayerWeights& w, cudaStream_t stream);
  // What DeviceLayerWeights::nvfp4 takes.
  Nvfp4Weights weights() const;
  // w with its nvfp4 weights set to these.
  DeviceLayerWeights with(const DeviceLayerWeights& w) const;

 private:
  // The quantizer's UE4M3 scales of one matrix set (0 gate, 1 up, 2 down), [E, rows / 16,
  // cols / 16], which the factors are packed from.
  uint8_t* quantized_scales(int matrix) const;

  int64_t experts_, hidden_, intermediate_;
  uint8_t* codes_ = nullptr;     // gate | up | down: the quantizer's codes, then packed in place
  uint8_t* scales_ = nullptr;    // the quantizer's UE4M3 scales, gate | up | down
  uint16_t* factors_ = nullptr;  // gate | up | down
  float* s_dec_ = nullptr;       // gate and up's, then down's, [E] each
  uint32_t* amax_ = nullptr;     // the quantizer's scratch, [E]
};

}  // namespace mok::gpu
