// Quantizers on the device: the same bits as the host quantizers of mok/formats.hpp (both call the
// block rules of mok/formats/block_scale.hpp). Row-wise blocks along the contiguous dimension.
// Asynchronous on `stream`, no host synchronisation.
#pragma once
#include <cuda_runtime_api.h>

#include <cuda_bf16.h>

#include <cstdint>

#include "mok/formats.hpp"

namespace mok::gpu {

// x [rows, cols] FP32; data [rows, cols] E4M3; scales [rows, cols / 32] E8M0. cols % 32 == 0.
cudaError_t quantize_mxfp8_rows(const float* x, int64_t rows, int64_t cols, MxScaleRule rule,
                                uint8_t* data, uint8_t* scales, cudaStream_t stream);

// data [rows, cols / 2] packed E2M1; scales [rows, cols / 16] UE4M3; s_dec [1] FP32 (the per-tensor
// decode factor); amax_scratch [1] uint32. cols % 16 == 0.
cudaError_t quantize_nvfp4_rows(const float* x, int64_t rows, int64_t cols, uint8_t* data,
                                uint8_t* scales, float* s_dec, uint32_t* amax_scratch,
                                cudaStream_t stream);

// data [rows, cols] E4M3; scales [rows, cols / 128] FP32. cols % 128 == 0.
cudaError_t quantize_fp8_block_rows(const float* x, int64_t rows, int64_t cols, bool ue8m0,
                                    uint8_t* data, float* scales, cudaStream_t stream);

// A batch of BF16 matrices x [batches, rows, cols] (experts' weights) in 128x128 blocks, as
// quantize_fp8_block(..., {128, 128}, ue8m0) quantizes each matrix: data [batches, rows, cols]
// E4M3; scales [batches, ceil(rows / 128), ceil(cols / 128)] FP32 (edge blocks may be partial).
// With `transposed` the codes go out as each matrix's transpose, data [batches, cols, rows], and
// scales [batches, ceil(cols / 128), ceil(rows / 128)]: the blocks are square, so these are the
// quantized transpose (the backward's K-major copy of a weight). cols % 8 == 0, x 16-byte and
// data 8-byte aligned (cudaErrorInvalidValue otherwise).
cudaError_t quantize_fp8_block_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                       int64_t cols, bool ue8m0, bool transposed, uint8_t* data,
                                       float* scales, cudaStream_t stream);

}  // namespace mok::gpu
