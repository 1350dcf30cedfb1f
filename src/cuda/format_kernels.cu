// Device quantizers: one thread per block of elements. They exist so the shared block rules run
// (and are tested) on the GPU; the kernels fuse the same rules into dispatch and epilogues.
#include <algorithm>

#include "mok/formats/block_scale.hpp"
#include "mok/formats/fp8_block_device.cuh"
#include "mok/formats/mxfp8_widen.hpp"
#include "mok/formats/mx_device.cuh"
#include "mok/gpu/formats_gpu.hpp"

namespace mok::gpu {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return int((n + kThreads - 1) / kThreads); }

// BF16 element e (0-7) of a 16-byte load, widened (exact).
__device__ __forceinline__ float bf16_in(const uint4& q, int e) {
  const uint32_t w = e < 2 ? q.x : e < 4 ? q.y : e < 6 ? q.z : q.w;
  return bits_float(e % 2 ? w & 0xFFFF0000u : w << 16);
}

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

// One CTA per 128x128 block of one matrix: thread t holds columns 8 (t % 16) .. + 7 of rows
// t / 16 + 16 i (64 values in registers, 16-byte loads and 8-byte stores), so the block is read
// from global memory once. cols % 8 == 0: a group of 8 columns is inside the matrix or outside.
constexpr int kWeightBlock = 128, kWeightThreads = 256, kWeightVec = 8;
constexpr int kWeightRowStep = kWeightThreads / (kWeightBlock / kWeightVec);  // 16
constexpr int kWeightRowsPerThread = kWeightBlock / kWeightRowStep;           // 8

__global__ void __launch_bounds__(kWeightThreads)
    fp8_block_weights_kernel(const __nv_bfloat16* x, int64_t rows, int64_t cols, bool ue8m0,
                             bool transposed, uint8_t* data, float* scales) {
  const int64_t block_rows = (rows + kWeightBlock - 1) / kWeightBlock;
  const int64_t block_cols = (cols + kWeightBlock - 1) / kWeightBlock;
  const int64_t batch = blockIdx.z, br = blockIdx.y, bc = blockIdx.x;
  const int64_t c0 = bc * kWeightBlock + (threadIdx.x % (kWeightBlock / kWeightVec)) * kWeightVec;
  const int64_t r0 = br * kWeightBlock + threadIdx.x / (kWeightBlock / kWeightVec);
  const __nv_bfloat16* in = x + batch * rows * cols;
  const bool inside = c0 < cols;
  float v[kWeightRowsPerThread][kWeightVec];
  fmt::BlockAmax a;
#pragma unroll
  for (int i = 0; i < kWeightRowsPerThread; ++i) {
    const int64_t r = r0 + kWeightRowStep * i;
    uint4 q = make_uint4(0, 0, 0, 0);
    if (inside && r < rows) q = __ldg(reinterpret_cast<const uint4*>(in + r * cols + c0));
#pragma unroll
    for (int e = 0; e < kWeightVec; ++e) {
      v[i][e] = bf16_in(q, e);
      a.add(v[i][e]);
    }
  }
  a = fmt::reduce_block_amax(a, 31);
  __shared__ uint32_t warp_amax[kWeightThreads / 32];
  __shared__ int warp_nonfinite[kWeightThreads / 32];
  if (threadIdx.x % 32 == 0) {
    warp_amax[threadIdx.x / 32] = float_bits(a.amax);
    warp_nonfinite[threadIdx.x / 32] = a.nonfinite;
  }
  __syncthreads();
  fmt::BlockAmax block;
  for (int w = 0; w < kWeightThreads / 32; ++w) {
    if (warp_amax[w] > float_bits(block.amax)) block.amax = bits_float(warp_amax[w]);
    block.nonfinite = block.nonfinite || warp_nonfinite[w];
  }
  const fmt::Fp8BlockScale s = fmt::fp8_block_scale(block.amax, ue8m0);
  if (threadIdx.x == 0) {
    const int64_t at = transposed ? (batch * block_cols + bc) * block_rows + br
                                  : (batch * block_rows + br) * block_cols + bc;
    scales[at] = fmt::fp8_block_stored_scale(block, s);
  }
  uint8_t* out = data + batch * rows * cols;
  // Transposed: the block's codes go through shared memory, [column][row], so that the output's
  // rows (the matrix's columns) leave in 8-byte stores, not one byte per row.
  __shared__ __align__(16) uint8_t transposed_tile[kWeightBlock][kWeightBlock + 8];
#pragma unroll
  for (int i = 0; i < kWeightRowsPerThread; ++i) {
    const int64_t r = r0 + kWeightRowStep * i;
    if (!inside || r >= rows) break;
    uint32_t word[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      word[h] = uint32_t(fmt::fp8_block_pair(v[i][4 * h], v[i][4 * h + 1], s.encode)) |
                uint32_t(fmt::fp8_block_pair(v[i][4 * h + 2], v[i][4 * h + 3], s.encode)) << 16;
    if (!transposed) {
      *reinterpret_cast<uint2*>(out + r * cols + c0) = make_uint2(word[0], word[1]);
    } else {
#pragma unroll
      for (int e = 0; e < kWeightVec; ++e)
        transposed_tile[c0 - bc * kWeightBlock + e][r - br * kWeightBlock] =
            uint8_t(word[e / 4] >> (8 * (e % 4)));
    }
  }
  if (!transposed) return;
  __syncthreads();
  // Output row c (a column of the block) holds the block's rows [br * 128, + valid_rows).
  const int valid_rows =
      int(rows - br * kWeightBlock < kWeightBlock ? rows - br * kWeightBlock : kWeightBlock);
  const int valid_cols =
      int(cols - bc * kWeightBlock < kWeightBlock ? cols - bc * kWeightBlock : kWeightBlock);
  const bool vectors = rows % 8 == 0;  // every output row starts 8-byte aligned (data is)
  constexpr int kChunks = kWeightBlock / 8;
  for (int i = int(threadIdx.x); i < kWeightBlock * kChunks; i += kWeightThreads) {
    const int c = i / kChunks, chunk = i % kChunks, first = 8 * chunk;
    if (c >= valid_cols || first >= valid_rows) continue;
    uint8_t* to = out + (bc * kWeightBlock + c) * rows + br * kWeightBlock + first;
    const uint8_t* from = &transposed_tile[c][first];
    if (vectors && first + 8 <= valid_rows) {
      *reinterpret_cast<uint2*>(to) = *reinterpret_cast<const uint2*>(from);
    } else {
      for (int e = 0; e < 8 && first + e < valid_rows; ++e) to[e] = from[e];
    }
  }
}

// BF16 weight value i of a matrix (the bits widened: exact).
__device__ __forceinline__ float bf16_at(const __nv_bfloat16* x, int64_t i) {
  return bits_float(uint32_t(reinterpret_cast<const uint16_t*>(x)[i]) << 16);
}

// MXFP8 weights along the columns (the forward's copy), one thread per 32-element block: its 64
// bytes in four 16-byte loads, held in registers from the amax to the codes (two 16-byte stores).
// x and data 16-byte aligned, cols % 32 == 0. kPacked: each word of four codes in the widening's
// order (fmt::mxfp8_packed_word).
template <bool kPacked>
__global__ void mxfp8_weights_rows_kernel(const __nv_bfloat16* x, int64_t blocks, bool rceil,
                                          uint8_t* data, uint8_t* scales) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const uint4* in = reinterpret_cast<const uint4*>(x + b * 32);
  uint4 q[4];
  fmt::BlockAmax a;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = __ldg(in + i);
#pragma unroll
    for (int e = 0; e < 8; ++e) a.add(bf16_in(q[i], e));
  }
  const uint8_t s = rceil ? fmt::mx_scale_rceil(a.amax) : fmt::mx_scale_floor(a.amax);
  scales[b] = fmt::mx_stored_scale(a, s);
  uint32_t words[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    const int e0 = 4 * (w % 2);
    const uint4& v = q[w / 2];
    words[w] = uint32_t(fmt::mx_element_pair(bf16_in(v, e0), bf16_in(v, e0 + 1), s)) |
               uint32_t(fmt::mx_element_pair(bf16_in(v, e0 + 2), bf16_in(v, e0 + 3), s)) << 16;
    if constexpr (kPacked) words[w] = fmt::mxfp8_packed_word(words[w]);
  }
  uint4* out = reinterpret_cast<uint4*>(data + b * 32);
  out[0] = make_uint4(words[0], words[1], words[2], words[3]);
  out[1] = make_uint4(words[4], words[5], words[6], words[7]);
}

// MXFP8 weights along the rows (the backward's K-major copy: each matrix's transpose quantized
// along its columns), one thread per 32-element block: codes [cols, rows], scales likewise.
// Consecutive threads take consecutive columns of the same 32 rows (coalesced 2-byte reads).
// kPacked: each word of four codes in the widening's order (fmt::mxfp8_packed_word).
template <bool kPacked>
__global__ void mxfp8_weights_transposed_kernel(const __nv_bfloat16* x, int64_t batches,
                                                int64_t rows, int64_t cols, bool rceil,
                                                uint8_t* data, uint8_t* scales) {
  const int64_t per_matrix = cols * (rows / 32);
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batches * per_matrix) return;
  const int64_t batch = b / per_matrix, o = b % per_matrix % cols, block = b % per_matrix / cols,
                i0 = block * 32;
  const __nv_bfloat16* in = x + batch * rows * cols;
  float v[32];
  fmt::BlockAmax a;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    v[i] = bf16_at(in, (i0 + i) * cols + o);
    a.add(v[i]);
  }
  const uint8_t s = rceil ? fmt::mx_scale_rceil(a.amax) : fmt::mx_scale_floor(a.amax);
  scales[batch * per_matrix + o * (rows / 32) + block] = fmt::mx_stored_scale(a, s);
  uint32_t words[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    words[w] = uint32_t(fmt::mx_element_pair(v[4 * w], v[4 * w + 1], s)) |
               uint32_t(fmt::mx_element_pair(v[4 * w + 2], v[4 * w + 3], s)) << 16;
    if constexpr (kPacked) words[w] = fmt::mxfp8_packed_word(words[w]);
  }
  uint4* out = reinterpret_cast<uint4*>(data + batch * rows * cols + o * rows + i0);
  out[0] = make_uint4(words[0], words[1], words[2], words[3]);
  out[1] = make_uint4(words[4], words[5], words[6], words[7]);
}

// Each matrix's finite amax (NVFP4's per-tensor scale): amax_bits[batch], grid-stride per matrix
// in 16-byte loads (per_matrix % 8 == 0, x 16-byte aligned).
__global__ void finite_amax_batched_kernel(const __nv_bfloat16* x, int64_t per_matrix,
                                           uint32_t* amax_bits) {
  const int64_t batch = blockIdx.y;
  const uint4* in = reinterpret_cast<const uint4*>(x + batch * per_matrix);
  uint32_t local = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < per_matrix / 8;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 q = __ldg(in + i);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t a = float_bits(bf16_in(q, e)) & 0x7FFFFFFFu;
      if (is_finite_bits(a) && a > local) local = a;
    }
  }
  local = __reduce_max_sync(0xFFFFFFFFu, local);
  if (threadIdx.x % 32 == 0) atomicMax(amax_bits + batch, local);
}

// NVFP4 weights along the columns (not transposed): a warp per 16 rows x 256 columns of one
// matrix, lane l holding columns 8 l .. 8 l + 7 of the 16 rows (16-byte loads, one 32-bit store of
// eight codes per row), a 16x16 block in lanes 2b and 2b + 1: each value is read once. The same
// codes and scales as quantize_nvfp4's. x 16-byte and data 4-byte aligned, cols % 16 == 0.
constexpr int kNvfp4StripCols = 256;
__global__ void nvfp4_weights_strip_kernel(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                           int64_t cols, const uint32_t* amax_bits, uint8_t* data,
                                           uint8_t* scales, float* s_dec) {
  const int64_t strips = (cols + kNvfp4StripCols - 1) / kNvfp4StripCols;
  const int64_t per_matrix = rows / 16 * strips;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= batches * per_matrix) return;  // whole warps (blockDim % 32 == 0)
  const int lane = int(threadIdx.x % 32);
  const int64_t batch = warp / per_matrix, br = warp % per_matrix / strips;
  const int64_t c0 = warp % strips * kNvfp4StripCols + 8 * lane;
  const bool inside = c0 < cols;  // both lanes of a block alike (cols % 16 == 0)
  const fmt::Nvfp4Global g = fmt::nvfp4_global(bits_float(amax_bits[batch]));
  if (br == 0 && c0 == 0) s_dec[batch] = g.s_dec;
  const __nv_bfloat16* in = x + (batch * rows + br * 16) * cols + c0;
  uint4 q[16];
  fmt::BlockAmax a;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    q[r] = inside ? __ldg(reinterpret_cast<const uint4*>(in + r * cols)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < 8; ++e) a.add(bf16_in(q[r], e));
  }
  a = fmt::reduce_block_amax(a, 1);
  if (!inside) return;
  const uint8_t sc = fmt::nvfp4_block_scale(a.amax, g);
  const float enc = fmt::nvfp4_block_encode_factor(sc, g);
  if (lane % 2 == 0)
    scales[(batch * (rows / 16) + br) * (cols / 16) + c0 / 16] = fmt::nvfp4_stored_scale(a, sc);
  uint8_t* out = data + (batch * rows + br * 16) * (cols / 2) + c0 / 2;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      word |= uint32_t(fmt::nvfp4_element(bf16_in(q[r], e), enc)) << (4 * e);
    *reinterpret_cast<uint32_t*>(out + r * (cols / 2)) = word;
  }
}

// NVFP4 weights transposed: one thread per 16x16 block of one matrix, the matrix's own per-tensor
// scale; codes [cols, rows / 2] and scales [cols / 16, rows / 16] of the transpose (the blocks are
// square), pairs along the output's rows (the input's rows).
__global__ void nvfp4_weights_transposed_kernel(const __nv_bfloat16* x, int64_t batches,
                                                int64_t rows, int64_t cols,
                                                const uint32_t* amax_bits, uint8_t* data,
                                                uint8_t* scales, float* s_dec) {
  const int64_t brs = rows / 16, bcs = cols / 16, per_matrix = brs * bcs;
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batches * per_matrix) return;
  const int64_t batch = b / per_matrix, br = b % per_matrix / bcs, bc = b % bcs;
  const fmt::Nvfp4Global g = fmt::nvfp4_global(bits_float(amax_bits[batch]));
  if (br == 0 && bc == 0) s_dec[batch] = g.s_dec;
  const __nv_bfloat16* in = x + batch * rows * cols;
  fmt::BlockAmax a;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) a.add(bf16_at(in, (br * 16 + r) * cols + bc * 16 + c));
  const uint8_t sc = fmt::nvfp4_block_scale(a.amax, g);
  const float enc = fmt::nvfp4_block_encode_factor(sc, g);
  scales[batch * per_matrix + bc * brs + br] = fmt::nvfp4_stored_scale(a, sc);
  uint8_t* out = data + batch * rows * cols / 2;
  for (int o = 0; o < 16; ++o)
    for (int i = 0; i < 16; i += 2) {
      const int64_t r0 = br * 16 + i, c0 = bc * 16 + o;
      const float lo = bf16_at(in, r0 * cols + c0), hi = bf16_at(in, (r0 + 1) * cols + c0);
      out[c0 * (rows / 2) + r0 / 2] =
          uint8_t(fmt::nvfp4_element(lo, enc) | (fmt::nvfp4_element(hi, enc) << 4));
    }
}

cudaError_t check_cols(int64_t cols, int block) {
  return cols % block == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t quantize_fp8_block_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                       int64_t cols, bool ue8m0, bool transposed, uint8_t* data,
                                       float* scales, cudaStream_t stream) {
  if (batches < 0 || rows < 0 || cols < 0 || batches > 65535 || cols % kWeightVec != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(data) % 8 != 0)
    return cudaErrorInvalidValue;
  const int64_t block_rows = (rows + kWeightBlock - 1) / kWeightBlock;
  const int64_t block_cols = (cols + kWeightBlock - 1) / kWeightBlock;
  if (batches == 0 || block_rows == 0 || block_cols == 0) return cudaSuccess;
  if (block_rows > 65535 || block_cols > (int64_t(1) << 31) - 1) return cudaErrorInvalidValue;
  fp8_block_weights_kernel<<<dim3(unsigned(block_cols), unsigned(block_rows), unsigned(batches)),
                             kWeightThreads, 0, stream>>>(x, rows, cols, ue8m0, transposed, data,
                                                          scales);
  return cudaGetLastError();
}

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

namespace {
// quantize_mxfp8_weights; packed (not transposed): the codes' words as fmt::mxfp8_packed_word.
cudaError_t mxfp8_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows, int64_t cols,
                          MxScaleRule rule, bool transposed, bool packed, uint8_t* data,
                          uint8_t* scales, cudaStream_t stream) {
  if (batches < 0 || rows < 0 || cols < 0 || (transposed ? rows : cols) % 32 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(data) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t n = batches * rows * cols / 32;
  if (n == 0) return cudaSuccess;
  const bool rceil = rule == MxScaleRule::rceil;
  if (transposed && packed)
    mxfp8_weights_transposed_kernel<true>
        <<<blocks_for(n), kThreads, 0, stream>>>(x, batches, rows, cols, rceil, data, scales);
  else if (transposed)
    mxfp8_weights_transposed_kernel<false>
        <<<blocks_for(n), kThreads, 0, stream>>>(x, batches, rows, cols, rceil, data, scales);
  else if (packed)
    mxfp8_weights_rows_kernel<true>
        <<<blocks_for(n), kThreads, 0, stream>>>(x, n, rceil, data, scales);
  else
    mxfp8_weights_rows_kernel<false>
        <<<blocks_for(n), kThreads, 0, stream>>>(x, n, rceil, data, scales);
  return cudaGetLastError();
}
}  // namespace

cudaError_t quantize_mxfp8_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                   int64_t cols, MxScaleRule rule, bool transposed, uint8_t* data,
                                   uint8_t* scales, cudaStream_t stream) {
  return mxfp8_weights(x, batches, rows, cols, rule, transposed, false, data, scales, stream);
}

cudaError_t quantize_mxfp8_weights_packed(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                          int64_t cols, MxScaleRule rule, bool transposed,
                                          uint8_t* data, uint8_t* scales, cudaStream_t stream) {
  return mxfp8_weights(x, batches, rows, cols, rule, transposed, true, data, scales, stream);
}

namespace {

// quantize_nvfp4_weights over `sets` matrix sets (1 or 2) with one per-tensor factor per batch
// from the amax over all of them.
cudaError_t nvfp4_weight_sets(const __nv_bfloat16* const* x, int sets, int64_t batches,
                              int64_t rows, int64_t cols, bool transposed, uint8_t* const* data,
                              uint8_t* const* scales, float* s_dec, uint32_t* amax_scratch,
                              cudaStream_t stream) {
  if (batches < 0 || rows < 0 || cols < 0 || batches > 65535 || rows % 16 != 0 || cols % 16 != 0)
    return cudaErrorInvalidValue;
  for (int m = 0; m < sets; ++m)
    if (reinterpret_cast<uintptr_t>(x[m]) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(data[m]) % 4 != 0)
      return cudaErrorInvalidValue;
  const int64_t per_matrix = rows * cols;
  if (batches == 0 || per_matrix == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemsetAsync(amax_scratch, 0, size_t(batches) * sizeof(uint32_t), stream);
      e != cudaSuccess)
    return e;
  const dim3 amax_grid(unsigned(std::min<int64_t>(256, blocks_for(per_matrix / 8))),
                       unsigned(batches));
  for (int m = 0; m < sets; ++m)
    finite_amax_batched_kernel<<<amax_grid, kThreads, 0, stream>>>(x[m], per_matrix, amax_scratch);
  const int64_t strips = (cols + kNvfp4StripCols - 1) / kNvfp4StripCols;
  for (int m = 0; m < sets; ++m) {
    if (transposed)
      nvfp4_weights_transposed_kernel<<<blocks_for(batches * per_matrix / 256), kThreads, 0,
                                        stream>>>(x[m], batches, rows, cols, amax_scratch, data[m],
                                                  scales[m], s_dec);
    else
      nvfp4_weights_strip_kernel<<<blocks_for(batches * rows / 16 * strips * 32), kThreads, 0,
                                   stream>>>(x[m], batches, rows, cols, amax_scratch, data[m],
                                             scales[m], s_dec);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t quantize_nvfp4_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                   int64_t cols, bool transposed, uint8_t* data, uint8_t* scales,
                                   float* s_dec, uint32_t* amax_scratch, cudaStream_t stream) {
  return nvfp4_weight_sets(&x, 1, batches, rows, cols, transposed, &data, &scales, s_dec,
                           amax_scratch, stream);
}

cudaError_t quantize_nvfp4_weights_joint(const __nv_bfloat16* x0, const __nv_bfloat16* x1,
                                         int64_t batches, int64_t rows, int64_t cols,
                                         bool transposed, uint8_t* data0, uint8_t* data1,
                                         uint8_t* scales0, uint8_t* scales1, float* s_dec,
                                         uint32_t* amax_scratch, cudaStream_t stream) {
  const __nv_bfloat16* x[2] = {x0, x1};
  uint8_t* data[2] = {data0, data1};
  uint8_t* scales[2] = {scales0, scales1};
  return nvfp4_weight_sets(x, 2, batches, rows, cols, transposed, data, scales, s_dec, amax_scratch,
                           stream);
}

}  // namespace mok::gpu
