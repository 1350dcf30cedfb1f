#include "mok/gpu/low_precision_experts.hpp"

namespace mok::gpu {

LowPrecisionExperts::LowPrecisionExperts(const Config& c, bool backward) {
  if (c.precision == Precision::fp8_block)
    fp8_block_ = std::make_unique<Fp8BlockExperts>(c, backward);
  if (c.precision == Precision::nvfp4) nvfp4_ = std::make_unique<Nvfp4Experts>(c);
  if (c.precision == Precision::mxfp8) mxfp8_ = std::make_unique<Mxfp8Experts>(c, backward);
}

void LowPrecisionExperts::quantize(const DeviceLayerWeights& w, cudaStream_t stream) {
  if (fp8_block_) fp8_block_->quantize(w, stream);
  if (nvfp4_) nvfp4_->quantize(w, stream);
  if (mxfp8_) mxfp8_->quantize(w, stream);
}

DeviceLayerWeights LowPrecisionExperts::with(const DeviceLayerWeights& w) const {
  if (fp8_block_) return fp8_block_->with(w);
  if (nvfp4_) return nvfp4_->with(w);
  if (mxfp8_) return mxfp8_->with(w);
  return w;
}

}  // namespace mok::gpu
