#include "mok/gpu/mxfp8_experts.hpp"

#include <string>

#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/formats/mxfp8_widen.hpp"
#include "mok/gpu/formats_gpu.hpp"

namespace mok::gpu {
namespace {

constexpr int kThreads = 256;

// The factors of each matrix (fmt::mxfp8_widen_factor_offset's layout) from its scales
// [E, rows, cols / 32], one thread per scale.
__global__ void pack_factors_kernel(const uint8_t* scales, uint16_t* factors, int64_t experts,
                                    int64_t rows, int64_t cols) {
  const int64_t per_row = cols / 32, per_matrix = rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < experts * per_matrix;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / per_matrix, r = i % per_matrix / per_row, block = i % per_row;
    const int64_t at = fmt::mxfp8_widen_factor_offset(rows, r, block / 2, int(block % 2));
    factors[e * per_matrix + at / 2] = fmt::mxfp8_widen_factor(scales[i]);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

}  // namespace

Mxfp8Experts::Mxfp8Experts(const Config& c, bool backward)
    : experts_(c.experts_per_rank()),
      hidden_(c.hidden),
      intermediate_(c.intermediate),
      sets_(backward ? 6 : 3) {
  detail::require(hidden_ % 64 == 0 && intermediate_ % 64 == 0 && experts_ > 0,
                  ErrorCode::unsupported,
                  "mxfp8 packs the weights 64 columns (two 1x32 blocks) per GEMM stage: hidden "
                  "and intermediate must be multiples of 64, got H = " +
                      std::to_string(hidden_) + ", I = " + std::to_string(intermediate_));
  const size_t per_set = size_t(experts_) * size_t(hidden_ * intermediate_);
  const char* what = "cudaMalloc (mxfp8 expert weights)";
  try {
    codes_ = detail::device_alloc<uint8_t>(size_t(sets_) * per_set, what);
    scales_ = detail::device_alloc<uint8_t>(size_t(sets_) * per_set / 32, what);
    factors_ = detail::device_alloc<uint16_t>(size_t(sets_) * per_set / 32, what);
  } catch (...) {  // the destructor does not run for a constructor that throws
    for (void* p : {(void*)codes_, (void*)scales_}) cudaFree(p);
    throw;
  }
}

Mxfp8Experts::~Mxfp8Experts() {
  for (void* p : {(void*)codes_, (void*)scales_, (void*)factors_}) cudaFree(p);
}

Mxfp8Weights Mxfp8Experts::weights() const {
  const int64_t codes = experts_ * hidden_ * intermediate_, factors = codes / 32;
  Mxfp8Weights w{codes_,   codes_ + codes,     codes_ + 2 * codes,
                 factors_, factors_ + factors, factors_ + 2 * factors};
  if (sets_ == 6) {
    w.gate_t = codes_ + 3 * codes, w.up_t = codes_ + 4 * codes, w.down_t = codes_ + 5 * codes;
    w.gate_t_factors = factors_ + 3 * factors, w.up_t_factors = factors_ + 4 * factors;
    w.down_t_factors = factors_ + 5 * factors;
  }
  return w;
}

uint8_t* Mxfp8Experts::quantized_scales(int matrix) const {
  return scales_ + matrix * (experts_ * hidden_ * intermediate_ / 32);
}

DeviceLayerWeights Mxfp8Experts::with(const DeviceLayerWeights& w) const {
  DeviceLayerWeights out = w;
  out.mxfp8 = weights();
  return out;
}

void Mxfp8Experts::quantize(const DeviceLayerWeights& w, cudaStream_t stream) {
  detail::require_operand(w.gate, "gate weights");
  detail::require_operand(w.up, "up weights");
  detail::require_operand(w.down, "down weights");
  const Mxfp8Weights q = weights();
  // Each set from its BF16 matrices [E, rows, cols]; a transposed copy is [E, cols, rows], its
  // factors packed as a forward copy of that shape.
  const struct {
    const __nv_bfloat16* from;
    int64_t rows, cols;
    bool transposed;
    const uint8_t* codes;
    const uint16_t* factors;
  } parts[6] = {{w.gate, intermediate_, hidden_, false, q.gate, q.gate_factors},
                {w.up, intermediate_, hidden_, false, q.up, q.up_factors},
                {w.down, hidden_, intermediate_, false, q.down, q.down_factors},
                {w.gate, intermediate_, hidden_, true, q.gate_t, q.gate_t_factors},
                {w.up, intermediate_, hidden_, true, q.up_t, q.up_t_factors},
                {w.down, hidden_, intermediate_, true, q.down_t, q.down_t_factors}};
  for (int m = 0; m < sets_; ++m) {
    const auto& part = parts[m];
    uint8_t* scales = quantized_scales(m);
    detail::check_cuda(quantize_mxfp8_weights_packed(
                           part.from, experts_, part.rows, part.cols, MxScaleRule::rceil,
                           part.transposed, const_cast<uint8_t*>(part.codes), scales, stream),
                       "quantizing the expert weights to mxfp8");
    const int64_t rows = part.transposed ? part.cols : part.rows,
                  cols = part.transposed ? part.rows : part.cols;
    pack_factors_kernel<<<blocks_for(experts_ * rows * cols / 32), kThreads, 0, stream>>>(
        scales, const_cast<uint16_t*>(part.factors), experts_, rows, cols);
    detail::check_cuda(cudaGetLastError(), "packing the mxfp8 expert weights");
  }
}

}  // namespace mok::gpu
