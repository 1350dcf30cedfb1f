// Device quantizers: one thread per block of elements. They exist so the shared block rules run
// (and are tested) on the GPU; the kernels fuse the same rules into dispatch and epilogues.
#include <algorithm>

#include "mok/formats/block_scale.hpp"
#include "mok/gpu/formats_gpu.hpp"

namespace mok::gpu {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return int((n + kThreads - 1) / kThreads); }

__global__ void mxfp8_rows_kernel(const float* x, int64_t rows, int64_t cols, bool rceil,
                                  uint8_t* data, uint8_t* scales) {
  const int64_t blocks_per_row = cols / 32;
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= rows * blocks_per_row) return;
  const float* in = x + b * 32;  // row-major and cols % 32 == 0: block b is contiguous
  fmt::BlockAmax a;
  for (int i = 0; i < 32; ++i) a.add(in[i]);
  const uint8_t s = rceil ? fmt::mx_scale_rceil(a.amax) : fmt::mx_scale_floor(a.amax);
  scales[b] = fmt::mx_stored_scale(a, s);
  for (int i = 0; i < 32; ++i) data[b * 32 + i] = fmt::mx_element_in_block(in[i], s);
}

// amax over the finite values: non-negative floats order as their bits, so an integer max is
// exact and independent of the order threads arrive in.
__global__ void finite_amax_kernel(const float* x, int64_t n, uint32_t* amax_bits) {
  uint32_t local = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t a = float_bits(x[i]) & 0x7FFFFFFFu;
    if (is_finite_bits(a) && a > local) local = a;
  }
  atomicMax(amax_bits, local);
}

__global__ void nvfp4_rows_kernel(const float* x, int64_t rows, int64_t cols,
                                  const uint32_t* amax_bits, uint8_t* data, uint8_t* scales,
                                  float* s_dec) {
  const fmt::Nvfp4Global g = fmt::nvfp4_global(bits_float(*amax_bits));
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b == 0) *s_dec = g.s_dec;
  if (b >= rows * (cols / 16)) return;
  const float* in = x + b * 16;
  fmt::BlockAmax a;
  for (int i = 0; i < 16; ++i) a.add(in[i]);
  const uint8_t s = fmt::nvfp4_block_scale(a.amax, g);
  const float enc = fmt::nvfp4_block_encode_factor(s, g);
  scales[b] = fmt::nvfp4_stored_scale(a, s);
  for (int i = 0; i < 16; i += 2)
    data[b * 8 + i / 2] =
        uint8_t(fmt::nvfp4_element(in[i], enc) | (fmt::nvfp4_element(in[i + 1], enc) << 4));
}

__global__ void fp8_block_rows_kernel(const float* x, int64_t rows, int64_t cols, bool ue8m0,
                                      uint8_t* data, float* scales) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= rows * (cols / 128)) return;
  const float* in = x + b * 128;
  fmt::BlockAmax a;
  for (int i = 0; i < 128; ++i) a.add(in[i]);
  const fmt::Fp8BlockScale s = fmt::fp8_block_scale(a.amax, ue8m0);
  scales[b] = fmt::fp8_block_stored_scale(a, s);
  for (int i = 0; i < 128; ++i) data[b * 128 + i] = fmt::fp8_block_element(in[i], s);
}

cudaError_t check_cols(int64_t cols, int block) {
  return cols % block == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t quantize_mxfp8_rows(const float* x, int64_t rows, int64_t cols, MxScaleRule rule,
                                uint8_t* data, uint8_t* scales, cudaStream_t stream) {
  if (cudaError_t e = check_cols(cols, 32); e != cudaSuccess) return e;
  const int64_t n = rows * (cols / 32);
  if (n == 0) return cudaSuccess;
  mxfp8_rows_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      x, rows, cols, rule == MxScaleRule::rceil, data, scales);
  return cudaGetLastError();
}

cudaError_t quantize_nvfp4_rows(const float* x, int64_t rows, int64_t cols, uint8_t* data,
                                uint8_t* scales, float* s_dec, uint32_t* amax_scratch,
                                cudaStream_t stream) {
  if (cudaError_t e = check_cols(cols, 16); e != cudaSuccess) return e;
  if (cudaError_t e = cudaMemsetAsync(amax_scratch, 0, sizeof(uint32_t), stream); e != cudaSuccess)
    return e;
  const int64_t n = rows * cols;
  if (n > 0)
    finite_amax_kernel<<<std::min(1024, blocks_for(n)), kThreads, 0, stream>>>(x, n, amax_scratch);
  nvfp4_rows_kernel<<<std::max(1, blocks_for(rows * (cols / 16))), kThreads, 0, stream>>>(
      x, rows, cols, amax_scratch, data, scales, s_dec);
  return cudaGetLastError();
}

cudaError_t quantize_fp8_block_rows(const float* x, int64_t rows, int64_t cols, bool ue8m0,
                                    uint8_t* data, float* scales, cudaStream_t stream) {
  if (cudaError_t e = check_cols(cols, 128); e != cudaSuccess) return e;
  const int64_t n = rows * (cols / 128);
  if (n == 0) return cudaSuccess;
  fp8_block_rows_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, rows, cols, ue8m0, data, scales);
  return cudaGetLastError();
}

}  // namespace mok::gpu
