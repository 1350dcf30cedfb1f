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

// Expert weights x [batches, rows, cols] BF16 in MXFP8 (E4M3, E8M0 per 32; formats.md): the
// forward's copy, blocks of 32 along the columns: data [batches, rows, cols], scales [batches,
// rows, cols / 32] (as quantize_mxfp8(..., {1, 32}, rule) of each matrix); with `transposed` the
// backward's K-major copy, blocks of 32 along the rows, as each matrix's transpose quantized so:
// data [batches, cols, rows], scales [batches, cols, rows / 32]. The blocked dimension % 32 == 0,
// x and data 16-byte aligned (cudaErrorInvalidValue otherwise).
cudaError_t quantize_mxfp8_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                   int64_t cols, MxScaleRule rule, bool transposed, uint8_t* data,
                                   uint8_t* scales, cudaStream_t stream);
// The copies as the GPU widens them (gpu::Mxfp8Experts: the forward's, and with `transposed` the
// backward's): quantize_mxfp8_weights with each word of four codes permuted as
// fmt::mxfp8_packed_word (mok/formats/mxfp8_widen.hpp), in the same pass.
cudaError_t quantize_mxfp8_weights_packed(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                          int64_t cols, MxScaleRule rule, bool transposed,
                                          uint8_t* data, uint8_t* scales, cudaStream_t stream);

// Expert weights x [batches, rows, cols] BF16 in NVFP4 (E2M1, UE4M3 per 16x16 block, each
// matrix's FP32 per-tensor factor; formats.md), as quantize_nvfp4(..., {16, 16}) of each matrix:
// data [batches, rows, cols / 2] (two codes per byte along the columns), scales [batches,
// rows / 16, cols / 16], s_dec [batches]; with `transposed` the quantized transpose (the blocks
// are square): data [batches, cols, rows / 2], scales [batches, cols / 16, rows / 16].
// amax_scratch: [batches] uint32. rows % 16 == 0, cols % 16 == 0, x 16-byte and data 4-byte
// aligned (cudaErrorInvalidValue otherwise).
cudaError_t quantize_nvfp4_weights(const __nv_bfloat16* x, int64_t batches, int64_t rows,
                                   int64_t cols, bool transposed, uint8_t* data, uint8_t* scales,
                                   float* s_dec, uint32_t* amax_scratch, cudaStream_t stream);

// Two such sets x0, x1 (each [batches, rows, cols]) quantized as one matrix [2 rows, cols] per
// batch: one per-tensor factor s_dec [batches] from the amax over both (the experts' gate and up
// weights as the one fused [2I, H] matrix they are), codes and scales of each into its own arrays
// as quantize_nvfp4_weights lays them out. The same conditions.
cudaError_t quantize_nvfp4_weights_joint(const __nv_bfloat16* x0, const __nv_bfloat16* x1,
                                         int64_t batches, int64_t rows, int64_t cols,
                                         bool transposed, uint8_t* data0, uint8_t* data1,
                                         uint8_t* scales0, uint8_t* scales1, float* s_dec,
                                         uint32_t* amax_scratch, cudaStream_t stream);

}  // namespace mok::gpu
