#include "mok/gpu/nvfp4_experts.hpp"

#include <string>

#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/formats/nvfp4_widen.hpp"
#include "mok/gpu/formats_gpu.hpp"

namespace mok::gpu {
namespace {

constexpr int kThreads = 256;

// Element k of each 8-element word (nibble k in the quantizer's layout) to its packed nibble, in
// place (each thread reads and rewrites its own words).
__global__ void pack_codes_kernel(uint32_t* codes, int64_t words) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t w = codes[i];
    uint32_t packed = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      packed |= ((w >> (4 * k)) & 0xFu) << (4 * fmt::nvfp4_packed_nibble(k));
    codes[i] = packed;
  }
}

// The factors of each matrix (fmt::nvfp4_widen_factor_offset's layout) from its scales
// [E, rows / 16, cols / 16], one thread per scale.
__global__ void pack_factors_kernel(const uint8_t* scales, uint16_t* factors, int64_t experts,
                                    int64_t rows, int64_t cols) {
  const int64_t per_row_block = cols / 16, per_matrix = rows / 16 * per_row_block;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < experts * per_matrix;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / per_matrix, rb = i % per_matrix / per_row_block,
                  block = i % per_row_block;  // the 16-column block along K
    const int64_t at = fmt::nvfp4_widen_factor_offset(rows, 16 * rb, block / 4, int(block % 4));
    factors[e * per_matrix + at / 2] = fmt::nvfp4_widen_factor(scales[i]);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

}  // namespace

Nvfp4Experts::Nvfp4Experts(const Config& c)
    : experts_(c.experts_per_rank()), hidden_(c.hidden), intermediate_(c.intermediate) {
  detail::require(hidden_ % 64 == 0 && intermediate_ % 64 == 0 && experts_ > 0,
                  ErrorCode::unsupported,
                  "nvfp4 packs the weights 64 columns per GEMM stage in 16x16 blocks: hidden and "
                  "intermediate must be multiples of 64, got H = " +
                      std::to_string(hidden_) + ", I = " + std::to_string(intermediate_));
  const size_t matrix = size_t(hidden_ * intermediate_), per_set = size_t(experts_) * matrix;
  const char* what = "cudaMalloc (nvfp4 expert weights)";
  try {
    codes_ = detail::device_alloc<uint8_t>(3 * per_set / 2, what);
    scales_ = detail::device_alloc<uint8_t>(3 * per_set / 256, what);
    factors_ = detail::device_alloc<uint16_t>(3 * per_set / 256, what);
    s_dec_ = detail::device_alloc<float>(2 * size_t(experts_), what);
    amax_ = detail::device_alloc<uint32_t>(size_t(experts_), what);
  } catch (...) {  // the destructor does not run for a constructor that throws
    for (void* p : {(void*)codes_, (void*)scales_, (void*)factors_, (void*)s_dec_}) cudaFree(p);
    throw;
  }
}

Nvfp4Experts::~Nvfp4Experts() {
  for (void* p : {(void*)codes_, (void*)scales_, (void*)factors_, (void*)s_dec_, (void*)amax_})
    cudaFree(p);
}

Nvfp4Weights Nvfp4Experts::weights() const {
  const int64_t codes = experts_ * hidden_ * intermediate_ / 2,
                factors = experts_ * hidden_ * intermediate_ / 256;
  return {codes_,   codes_ + codes,     codes_ + 2 * codes,
          factors_, factors_ + factors, factors_ + 2 * factors,
          s_dec_,   s_dec_ + experts_};
}

uint8_t* Nvfp4Experts::quantized_scales(int matrix) const {
  return scales_ + matrix * (experts_ * hidden_ * intermediate_ / 256);
}

DeviceLayerWeights Nvfp4Experts::with(const DeviceLayerWeights& w) const {
  DeviceLayerWeights out = w;
  out.nvfp4 = weights();
  return out;
}

void Nvfp4Experts::quantize(const DeviceLayerWeights& w, cudaStream_t stream) {
  detail::require_operand(w.gate, "gate weights");
  detail::require_operand(w.up, "up weights");
  detail::require_operand(w.down, "down weights");
  const Nvfp4Weights q = weights();
  const struct {
    int64_t rows, cols;
    const uint8_t* packed;
    const uint16_t* factors;
  } parts[3] = {{intermediate_, hidden_, q.gate, q.gate_factors},
                {intermediate_, hidden_, q.up, q.up_factors},
                {hidden_, intermediate_, q.down, q.down_factors}};
  auto codes = [&](int m) { return const_cast<uint8_t*>(parts[m].packed); };
  auto scales = [&](int m) { return quantized_scales(m); };
  // gate and up as one matrix (one factor per expert), down on its own.
  detail::check_cuda(quantize_nvfp4_weights_joint(
                         w.gate, w.up, experts_, intermediate_, hidden_, false, codes(0), codes(1),
                         scales(0), scales(1), const_cast<float*>(q.gate_up_s_dec), amax_, stream),
                     "quantizing the expert weights to nvfp4");
  detail::check_cuda(
      quantize_nvfp4_weights(w.down, experts_, hidden_, intermediate_, false, codes(2), scales(2),
                             const_cast<float*>(q.down_s_dec), amax_, stream),
      "quantizing the expert weights to nvfp4");
  const int64_t words = experts_ * hidden_ * intermediate_ / 8;
  for (int m = 0; m < 3; ++m) {
    const auto& part = parts[m];
    pack_codes_kernel<<<blocks_for(words), kThreads, 0, stream>>>(
        reinterpret_cast<uint32_t*>(codes(m)), words);
    pack_factors_kernel<<<blocks_for(experts_ * hidden_ * intermediate_ / 256), kThreads, 0,
                          stream>>>(scales(m), const_cast<uint16_t*>(part.factors), experts_,
                                    part.rows, part.cols);
    detail::check_cuda(cudaGetLastError(), "packing the nvfp4 expert weights");
  }
}

}  // namespace mok::gpu
