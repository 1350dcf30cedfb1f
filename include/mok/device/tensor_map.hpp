// Host side of TMA: encoding tensor maps for K-major BF16 operands, through the driver entry point
// (no -lcuda). A box row is one swizzle span: 64 columns with the 128B swizzle, or 32 with the 64B
// swizzle (wgmma.cuh's descriptors read either).
#pragma once
#include <cuda.h>

#include <cstdint>

namespace mok::dev {

// A row-major [rows, cols] BF16 matrix (cols contiguous, row stride `row_stride_elems`), read in
// boxes of box_rows x box_cols (64: 128 bytes, 128B swizzle; 32: 64 bytes, 64B swizzle). Throws
// mok::Error on failure.
CUtensorMap make_bf16_map_2d(const void* base, uint64_t rows, uint64_t cols,
                             uint64_t row_stride_elems, uint32_t box_rows, uint32_t box_cols = 64);

// [batches, rows, cols] BF16 (experts' weights), boxes of box_rows x box_cols in one batch.
CUtensorMap make_bf16_map_3d(const void* base, uint64_t batches, uint64_t rows, uint64_t cols,
                             uint32_t box_rows, uint32_t box_cols = 64);

}  // namespace mok::dev
