#include "mok/gpu/fp8_block_experts.hpp"

#include <string>

#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/gpu/formats_gpu.hpp"

namespace mok::gpu {

Fp8BlockExperts::Fp8BlockExperts(const Config& c, bool backward)
    : experts_(c.experts_per_rank()),
      hidden_(c.hidden),
      intermediate_(c.intermediate),
      backward_(backward),
      ue8m0_(c.fp8_ue8m0) {
  detail::require(hidden_ % 128 == 0 && intermediate_ % 128 == 0 && experts_ > 0,
                  ErrorCode::unsupported,
                  "fp8_block quantizes the weights in 128x128 blocks: hidden and intermediate must "
                  "be multiples of 128, got H = " +
                      std::to_string(hidden_) + ", I = " + std::to_string(intermediate_));
  const size_t matrix = size_t(hidden_ * intermediate_), blocks = matrix / (128 * 128);
  const size_t copies = backward ? 6 : 3;
  codes_ = detail::device_alloc<uint8_t>(copies * size_t(experts_) * matrix,
                                         "cudaMalloc (fp8_block expert weights)");
  try {
    scales_ = detail::device_alloc<float>(copies * size_t(experts_) * blocks,
                                          "cudaMalloc (fp8_block expert weights)");
  } catch (...) {  // the destructor does not run for a constructor that throws
    cudaFree(codes_);
    throw;
  }
}

Fp8BlockExperts::~Fp8BlockExperts() {
  cudaFree(codes_);
  cudaFree(scales_);
}

Fp8BlockWeights Fp8BlockExperts::weights() const {
  const int64_t matrices = experts_ * hidden_ * intermediate_, blocks = matrices / (128 * 128);
  Fp8BlockWeights q{codes_,  codes_ + matrices, codes_ + 2 * matrices,
                    scales_, scales_ + blocks,  scales_ + 2 * blocks};
  if (backward_) {
    q.gate_t = codes_ + 3 * matrices, q.up_t = codes_ + 4 * matrices,
    q.down_t = codes_ + 5 * matrices;
    q.gate_t_scales = scales_ + 3 * blocks, q.up_t_scales = scales_ + 4 * blocks,
    q.down_t_scales = scales_ + 5 * blocks;
  }
  return q;
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
    bool transposed;
    const uint8_t* codes;
    const float* scales;
  } parts[6] = {{w.gate, intermediate_, hidden_, false, q.gate, q.gate_scales},
                {w.up, intermediate_, hidden_, false, q.up, q.up_scales},
                {w.down, hidden_, intermediate_, false, q.down, q.down_scales},
                {w.gate, intermediate_, hidden_, true, q.gate_t, q.gate_t_scales},
                {w.up, intermediate_, hidden_, true, q.up_t, q.up_t_scales},
                {w.down, hidden_, intermediate_, true, q.down_t, q.down_t_scales}};
  for (const auto& m : parts) {
    if (m.codes == nullptr) continue;  // no backward copies
    detail::check_cuda(quantize_fp8_block_weights(m.from, experts_, m.rows, m.cols, ue8m0_,
                                                  m.transposed, const_cast<uint8_t*>(m.codes),
                                                  const_cast<float*>(m.scales), stream),
                       "quantizing the expert weights to fp8_block");
  }
}

}  // namespace mok::gpu
