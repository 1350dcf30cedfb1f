// Host side of TMA: encoding tensor maps for K-major BF16 operands with the 128B swizzle, through
// the driver entry point (no -lcuda).
#pragma once
#include <cuda.h>

#include <cstdint>

namespace mok::dev {

// A row-major [rows, cols] BF16 matrix (cols contiguous, row stride `row_stride_elems`), read in
// boxes of box_rows x 64 columns (128 bytes, one swizzle span). Throws mok::Error on failure.
CUtensorMap make_bf16_map_2d(const void* base, uint64_t rows, uint64_t cols,
                             uint64_t row_stride_elems, uint32_t box_rows);

// [batches, rows, cols] BF16 (experts' weights), boxes of box_rows x 64 in one batch.
CUtensorMap make_bf16_map_3d(const void* base, uint64_t batches, uint64_t rows, uint64_t cols,
                             uint32_t box_rows);

}  // namespace mok::dev
