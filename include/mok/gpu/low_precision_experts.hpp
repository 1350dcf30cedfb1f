// The routed experts' quantized copies a configuration's precision reads (Fp8BlockExperts,
// Nvfp4Experts or Mxfp8Experts; none for bf16) behind one interface, for callers that take any
// precision: `mok run`, `mok bench` and the Python layer.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "mok/config.hpp"
#include "mok/gpu/device_layer.hpp"
#include "mok/gpu/fp8_block_experts.hpp"
#include "mok/gpu/mxfp8_experts.hpp"
#include "mok/gpu/nvfp4_experts.hpp"

namespace mok::gpu {

class LowPrecisionExperts {
 public:
  // For c.precision's recipe; `backward`: fp8_block's and mxfp8's transposed copies too (their
  // backwards' dgrad GEMMs read them; nvfp4's backward reads the forward's copies).
  explicit LowPrecisionExperts(const Config& c, bool backward = false);
  // Whether the precision quantizes the routed weights (all but bf16).
  bool quantizes() const { return fp8_block_ || nvfp4_ || mxfp8_; }
  // From w's BF16 routed weights, asynchronous on `stream`; nothing for bf16. Again after every
  // change of the weights.
  void quantize(const DeviceLayerWeights& w, cudaStream_t stream);
  // w with its low-precision weights set to these copies; w itself for bf16.
  DeviceLayerWeights with(const DeviceLayerWeights& w) const;

 private:
  std::unique_ptr<Fp8BlockExperts> fp8_block_;
  std::unique_ptr<Nvfp4Experts> nvfp4_;
  std::unique_ptr<Mxfp8Experts> mxfp8_;
};

}  // namespace mok::gpu
