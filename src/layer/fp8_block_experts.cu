#include "mok/gpu/fp8_block_experts.hpp"

#include <string>

#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/gpu/formats_gpu.hpp"

namespace mok::gpu {

Fp8BlockExperts::Fp8BlockExperts(const Config& c)
    : experts_(c.experts_per_rank()), hidden_(c.hidden), intermediate_(c.intermediate) {
  detail::require(hidden_ % 128 == 0 && intermediate_ % 128 == 0 && experts_ > 0,
                  ErrorCode::unsupported,
                  "fp8_block quantizes the weights in 128x128 blocks: hidden and intermediate must "
                  "be multiples of 128, got H = " +
                      std::to_string(hidden_) + ", I = " + std::to_string(intermediate_));
  const size_t matrix = size_t(hidden_ * intermediate_), blocks = matrix / (128 * 128);
  codes_ = detail::device_alloc<uint8_t>(3 * size_t(experts_) * matrix,
                                         "cudaMalloc (fp8_block expert weights)");
  scales_ = detail::device_alloc<float>(3 * size_t(experts_) * blocks,
                                        "cudaMalloc (fp8_block expert weights)");
}

Fp8BlockExperts::~Fp8BlockExperts() {
  cudaFree(codes_);
  cudaFree(scales_);
}

Fp8BlockWeights Fp8BlockExperts::weights() const {
  const int64_t matrices = experts_ * hidden_ * intermediate_, blocks = matrices / (128 * 128);
  return {codes_,  codes_ + matrices, codes_ + 2 * matrices,
          scales_, scales_ + blocks,  scales_ + 2 * blocks};
}

DeviceLayerWeights Fp8BlockExperts::with(const DeviceLayerWeights& w) const {
  DeviceLayerWeights out = w;
  out.fp8_block = weights();
  return out;
}

void Fp8BlockExperts::quantize(const DeviceLayerWeights& w, cudaStream_t stream) {
  detail::require_operand(w.gate, "gate weights");
  detail::require_operand(w.up, "up weights");
  detail::require_operand(w.down, "down weights");
  const Fp8BlockWeights q = weights();
  const struct {
    const __nv_bfloat16* from;
    int64_t rows, cols;
    const uint8_t* codes;
    const float* scales;
  } parts[3] = {{w.gate, intermediate_, hidden_, q.gate, q.gate_scales},
                {w.up, intermediate_, hidden_, q.up, q.up_scales},
                {w.down, hidden_, intermediate_, q.down, q.down_scales}};
  for (const auto& m : parts)
    detail::check_cuda(quantize_fp8_block_weights(m.from, experts_, m.rows, m.cols, /*ue8m0=*/false,
                                                  false, const_cast<uint8_t*>(m.codes),
                                                  const_cast<float*>(m.scales), stream),
                       "quantizing the expert weights to fp8_block");
}

}  // namespace mok::gpu
