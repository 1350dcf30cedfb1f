// The routed experts' weights in MXFP8 on the device (precision mxfp8's forward copy: E4M3 with an
// E8M0 scale per 32 along K, RCEIL): quantized from their BF16 weights by a GPU kernel (the codes
// and scales of quantize_mxfp8(..., {1, 32}) bit for bit), each word of four codes and the scales
// packed as the forward widens them (mok/formats/mxfp8_widen.hpp's packed words and BF16
// factors). Half the BF16 weights' bytes, plus 1/32 for the factors and 1/64 for the scales they
// are packed from; the backward's transposed copies (blocks along the dgrad GEMMs' K) as much
// again.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"

namespace mok::gpu {

class Mxfp8Experts {
 public:
  // For the rank's local experts of c; `backward`: the backward's transposed copies too.
  // Throws mok::Error unless H and I are multiples of 64, and for allocation failures.
  explicit Mxfp8Experts(const Config& c, bool backward = false);
  ~Mxfp8Experts();
  Mxfp8Experts(const Mxfp8Experts&) = delete;
  Mxfp8Experts& operator=(const Mxfp8Experts&) = delete;

  // From w.gate, w.up and w.down (BF16), asynchronous on `stream`; throws for null or misaligned
  // weights. Run again after every optimizer step.
  void quantize(const DeviceLayerWeights& w, cudaStream_t stream);
  // What DeviceLayerWeights::mxfp8 takes.
  Mxfp8Weights weights() const;
  // w with its mxfp8 weights set to these.
  DeviceLayerWeights with(const DeviceLayerWeights& w) const;

 private:
  // The quantizer's E8M0 scales of one matrix set (0 gate, 1 up, 2 down; 3-5 their transposed
  // copies), [E, rows, cols / 32], which the factors are packed from.
  uint8_t* quantized_scales(int matrix) const;

  int64_t experts_, hidden_, intermediate_;
  int sets_;                     // 3, or 6 with the backward's copies
  uint8_t* codes_ = nullptr;     // gate | up | down (| gate_t | up_t | down_t)
  uint8_t* scales_ = nullptr;    // the quantizer's, likewise
  uint16_t* factors_ = nullptr;  // likewise
};

}  // namespace mok::gpu
